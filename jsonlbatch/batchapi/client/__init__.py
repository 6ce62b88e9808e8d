"""The client side: a request file sent through a provider's batch API.

`submit` (the `Submitter`: parts, state, watching, merging, exactly once) talks to a
provider only through `batch_api.BatchProvider`; `batch_api`, `anthropic_api` and
`gemini_api` are the providers; `providers` says which one and what it takes;
`provider_target` makes all this a run's target, `batch_result_check` checks its answers.
"""

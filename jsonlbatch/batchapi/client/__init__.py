"""The client side: a request file sent through a provider's batch API.

`provider_target` makes a provider's batch API a run's target (`exec --batch-api`,
`jsonlbatch.execute(..., batch_api=True)`): it gets the job the front door prepared, and
`submitter` (parts, state, watching, exactly once) sends it, talking to a provider only through
`batch_api.BatchProvider`; `part_merge` merges finished batches through the run's checks
(`batch_result_check`) and events. `batch_api`, `anthropic_api` and `gemini_api` are the
providers; `providers` says which one and what it takes; `submit` is the older one-call API.
"""

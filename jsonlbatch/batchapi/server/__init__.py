"""The server side: `serve --batch-api` in front of any OpenAI-compatible backend.

`batch_server` (the OpenAI routes and the app), `anthropic_routes`, `gemini_routes`;
`batch_intake` makes a batch, `batch_store` keeps files and batches, `batch_runner` runs
them through exec's `Job`; `json_api` is the errors and JSON answers they share.
"""

"""OpenAI-style Batch APIs, both sides of them.

`client/`: `exec --batch-api` and `jsonlbatch batches` (submit a request file through a
provider's batch API, exactly once); `server/`: `serve --batch-api` (the Files and Batches
APIs, and Anthropic's and Gemini's, in front of any backend, run through exec's `Job`);
`formats/`: what both sides agree on (objects, statuses, other providers' shapes). The
client and the server never import each other (tests/test_layout.py).
"""

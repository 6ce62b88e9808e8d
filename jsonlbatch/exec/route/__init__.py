"""Which server may take a request, and which one does.

`endpoints` (one per URL: address, credentials), `preflight` (are they up, do they serve
the models), `model_pools`/`model_routing`/`endpoints_file` (a pool of endpoints per
model), `endpoint_pool` and `router` (the endpoint in a pool, health), and how many
requests an endpoint may hold (`endpoint_concurrency`, `adaptive_concurrency`, which
reads `server_metrics`).
"""

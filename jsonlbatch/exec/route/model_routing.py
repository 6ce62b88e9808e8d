"""Requests routed by the model they name: endpoint pools from an endpoints map or from what
each `--url` serves, checked against the requests before anything is sent.

A mixed request file (an agent, an expert and a judge model in one file) is one run and one
output: each request goes to a pool of the endpoints serving its `body.model` (`model_pools.py`), with
the router's prefix/least-busy choice inside the pool. The pools come from

- an endpoints map (`--endpoints FILE`, `endpoints_file.py`), or a launched fleet;
- several `--url`s that serve different models: each is asked for its `/v1/models` (waiting for
  it as the preflight does), and the models are grouped by the URLs serving them.

A model no endpoint serves is refused here, with the served names listed, so a typo in one model
name costs nothing instead of a file of failed lines.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import aiohttp
import orjson

from jsonlbatch.batch_format.records import Request, Result
from jsonlbatch.errors import JsonlbatchError, ModelNotServedError, UsageError
from jsonlbatch.exec.route.endpoint_pool import EndpointPool
from jsonlbatch.exec.route.endpoints import auth_headers, parse_endpoint
from jsonlbatch.exec.route.endpoints_file import ModelEndpoints
from jsonlbatch.exec.route.model_pools import ModelPools, PoolSpec
from jsonlbatch.file_io.jsonl import read_lines_at
from jsonlbatch.redact import redact


def pools_from_map(models: Mapping[str, ModelEndpoints]) -> list[PoolSpec]:
    """One pool per set of URLs: names served by the same URLs (a vLLM with two served names)
    share a pool, so the router sees every request those servers get."""
    grouped: dict[tuple[str, ...], list[str]] = {}
    concurrency: dict[tuple[str, ...], int | None] = {}
    for name, entry in models.items():
        urls = tuple(entry.urls)
        grouped.setdefault(urls, []).append(name)
        if entry.concurrency is not None:
            concurrency[urls] = min(entry.concurrency, concurrency.get(urls) or entry.concurrency)
    for urls in grouped:
        for other in grouped:
            shared = set(urls) & set(other)
            if other != urls and shared:
                raise UsageError(
                    f"{sorted(shared)[0]} serves {', '.join(grouped[urls])} and also "
                    f"{', '.join(grouped[other])} with other URLs: give a server's names the "
                    "same URL list"
                )
    return [
        PoolSpec(urls, tuple(names), concurrency.get(urls), name=names[0])
        for urls, names in grouped.items()
    ]


def pools_from_listing(listing: Mapping[str, list[str] | None]) -> list[PoolSpec] | None:
    """Pools from what each URL lists; None when every URL serves the same models (one pool
    over all of them, as without this module) or a URL lists none (nothing to route by)."""
    if any(names is None for names in listing.values()):
        return None
    if len({frozenset(names or ()) for names in listing.values()}) <= 1:
        return None
    by_model: dict[str, list[str]] = {}
    for url, names in listing.items():
        for name in names or ():
            by_model.setdefault(name, []).append(url)
    return pools_from_map({m: ModelEndpoints(urls) for m, urls in by_model.items()})


def check_served(specs: Sequence[PoolSpec], models: Counter[str]) -> None:
    """ModelNotServedError, listing the served names, for a requested model no pool serves."""
    served = {m for spec in specs for m in spec.models or ()}
    if any(spec.models is None for spec in specs):
        return
    missing = [m for m, _ in models.most_common() if m not in served]
    if missing:
        uses = ", ".join(f"{m!r} ({models[m]} requests)" for m in missing[:5])
        raise ModelNotServedError(
            f"no endpoint serves {uses}{' and more' if len(missing) > 5 else ''}; served: "
            f"{', '.join(sorted(served)) or 'nothing'}. Nothing was sent"
        )


async def list_models(
    urls: Sequence[str],
    *,
    wanted: Sequence[str],
    ready_timeout: float,
    api_key: str | None,
    headers: Mapping[str, str],
    keys: Mapping[str, str | None],
    watchdog: Callable[[], None] | None = None,
) -> dict[str, list[str] | None]:
    """What each URL serves (`/v1/models`, plus the `wanted` models it answers for by name), as
    the preflight asks: waiting up to `ready_timeout` for the first answer, then a short grace
    for the others. A URL still silent then is left out of the result."""
    endpoints = [parse_endpoint(u) for u in urls]
    for url, ep in zip(urls, endpoints, strict=True):
        ep.launched = url in keys
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:
        heads = {
            ep: auth_headers(ep, keys[u]) if u in keys else auth_headers(ep, api_key, headers)
            for u, ep in zip(urls, endpoints, strict=True)
        }
        pool = EndpointPool(
            endpoints, session, heads, ready_timeout=ready_timeout, watchdog=watchdog
        )
        pool.wanted = list(wanted)
        try:
            answered = dict(await pool.preflight())
        finally:
            await pool.close()
    return {url: answered[ep] for url, ep in zip(urls, endpoints, strict=True) if ep in answered}


def split_pending(
    pools: ModelPools,
    source: str,
    pending: Sequence[int],
    override: str | None,
    concurrency: int,
) -> list[tuple[Sequence[int], int]]:
    """The pending lines of each pool, with its number of workers (the pool's own concurrency,
    else `-c`). Each pool then has its own reader, queue and workers, so a slow model's backlog
    never holds the workers, or the reading, of another model's requests."""
    index = {id(pool): i for i, pool in enumerate(pools.pools)}
    parts = [array("Q") for _ in pools.pools]
    for offset, raw in zip(pending, read_lines_at(source, pending), strict=True):
        model = override or orjson.loads(raw)["body"].get("model")
        parts[index[id(pools.route({"model": model}))]].append(offset)
    return [
        (part, min(spec.concurrency or concurrency, len(part)))
        for spec, part in zip(pools.specs, parts, strict=True)
        if part
    ]


def unavailable(request: Request, exc: JsonlbatchError) -> Result:
    """The failure line of a request whose model's servers are gone for good, while other
    models of the run go on (a fleet): it names the model."""
    first = str(exc).splitlines()[0]
    message = redact(f"model {request.body.get('model')!r} is unavailable: {first}")
    return Result(request.custom_id, None, error={"code": "model_unavailable", "message": message})

"""Per-model endpoint pools: which set of endpoints a request goes to, chosen by `body.model`.

A run has one or more pools (`PoolSpec`: URLs, the models they serve, an optional in-flight
cap). A request goes to the pool that names its model, else to the pool without a model list
(the catch-all); inside a pool the router and health checks of `endpoints.py` choose the
endpoint. The default is a single catch-all pool over the run's `--url`s, which is today's
behaviour (a fleet of several models, issue 30, declares one pool per model).

Every model the pending requests ask for must have a pool: that is checked before anything is
sent, so a missing route is a usage error, not a thousand failed lines.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from jsonlbatch.errors import UsageError
from jsonlbatch.exec.exec_options import ExecOptions
from jsonlbatch.exec.route.endpoint_concurrency import ConcurrencyController, FixedConcurrency
from jsonlbatch.exec.route.endpoint_pool import EndpointPool
from jsonlbatch.exec.route.endpoints import Endpoint, auth_headers, parse_endpoint
from jsonlbatch.exec.route.router import Router


@dataclass(frozen=True)
class PoolSpec:
    """One pool: `urls` (empty: the run's `--url`s), `models` it takes (None: every model no
    other pool names) and `concurrency` (requests in flight in this pool at most; None: only
    the run's `--concurrency` bounds it)."""

    urls: tuple[str, ...] = ()
    models: tuple[str, ...] | None = None
    concurrency: int | None = None
    name: str = ""
    #: Called while this pool waits for its servers, instead of the run's watchdog: a fleet's
    #: per-model restarts (it raises when the model cannot come back).
    watchdog: Callable[[], None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.concurrency < 1:
            raise UsageError(f"pool {self.name or self.urls}: concurrency must be at least 1")


def check_specs(specs: Sequence[PoolSpec]) -> None:
    """At most one catch-all pool, and no model named by two pools."""
    if sum(spec.models is None for spec in specs) > 1:
        raise UsageError("at most one endpoint pool may take every model (models=None)")
    seen: dict[str, PoolSpec] = {}
    for spec in specs:
        for model in spec.models or ():
            if model in seen:
                raise UsageError(f"model {model!r} is routed to two endpoint pools")
            seen[model] = spec


class ModelPools:
    """The run's pools, and the routing of a request body to one of them."""

    def __init__(self, pools: Sequence[tuple[PoolSpec, EndpointPool]]) -> None:
        check_specs([spec for spec, _ in pools])
        self.specs = [spec for spec, _ in pools]
        self.pools = [pool for _, pool in pools]
        self._by_model = {m: pool for spec, pool in pools for m in spec.models or ()}
        self._default = next((pool for spec, pool in pools if spec.models is None), None)
        only = len(pools) == 1 and pools[0][0].models is None
        self._single = self.pools[0] if only else None
        #: Each endpoint's request headers (credentials included), set by `build_pools`.
        self.headers: Mapping[Endpoint, dict[str, str]] = {}
        self._caps = {
            id(pool): asyncio.Semaphore(spec.concurrency)
            for spec, pool in pools
            if spec.concurrency is not None
        }

    def route(self, body: dict[str, Any]) -> EndpointPool:
        """The pool for a request body (models were checked by `check_models` beforehand)."""
        if self._single is not None:
            return self._single
        pool = self._by_model.get(body.get("model"), self._default)  # type: ignore[arg-type]
        if pool is None:  # a body edited by an on-answer check to a model without a pool
            raise UsageError(f"no endpoint pool serves model {body.get('model')!r}")
        return pool

    @property
    def status(self) -> str:
        """What the pools wait for now (shown by the progress bar), empty when sending."""
        return "; ".join(pool.status for pool in self.pools if pool.status)

    def cap(self, pool: EndpointPool) -> asyncio.Semaphore | None:
        """The pool's in-flight cap, if it has one."""
        return self._caps.get(id(pool)) if self._caps else None

    def models_for(self, pool: EndpointPool, models: Iterable[str]) -> list[str]:
        """Those of `models` that go to `pool`."""
        return [m for m in models if self._by_model.get(m, self._default) is pool]

    def check_models(self, models: Iterable[str]) -> None:
        """Refuse a run whose requests ask for a model no pool takes."""
        if self._default is not None:
            return
        missing = sorted(m for m in models if m not in self._by_model)
        if missing:
            raise UsageError(
                f"no endpoint pool serves {', '.join(map(repr, missing))}: add the model to a "
                "pool, or add a pool without a model list to take every other model"
            )

    async def close(self) -> None:
        for pool in self.pools:
            await pool.close()


def parse_endpoints(
    specs: Sequence[PoolSpec], urls: Sequence[str], keys: Mapping[str, str | None]
) -> dict[str, Endpoint]:
    """Every URL of every pool parsed once (a URL in two pools is one endpoint). A URL in
    `keys` is a server launched for this run: its port changes every run, so lines name it by
    its index, in a fleet by its model (`mid/0`)."""
    endpoints: dict[str, Endpoint] = {}
    for spec in specs:
        for i, url in enumerate(spec.urls or urls):
            if url not in endpoints:
                endpoint = endpoints[url] = parse_endpoint(url)
                if url in keys:
                    endpoint.launched = True
                    endpoint.name = (
                        f"{spec.name}/{i}" if spec.name and spec.urls
                        else f"server {list(keys).index(url)}"
                    )  # fmt: skip
    return endpoints


def build_pools(
    session: aiohttp.ClientSession,
    *,
    specs: Sequence[PoolSpec],
    urls: Sequence[str],
    by_url: Mapping[str, Endpoint],
    keys: Mapping[str, str | None],
    opts: ExecOptions,
    controller: Callable[[str], ConcurrencyController] | None,
    watchdog: Callable[[], None] | None,
) -> ModelPools:
    """The run's pools over `by_url`'s endpoints: each endpoint with its concurrency controller
    (the seam's, else a fixed limit) and its credentials (a launched server's own key; the
    user's key and headers for every other URL, never for a local server)."""
    for ep in by_url.values():
        ep.controller = (
            controller(ep.name) if controller else FixedConcurrency(opts.fixed_concurrency)
        )
    headers = {
        ep: (
            auth_headers(ep, keys[url])
            if url in keys
            else auth_headers(ep, opts.api_key, opts.headers)
        )
        for url, ep in by_url.items()
    }
    built = []
    for spec in specs:
        eps = [by_url[url] for url in spec.urls or urls]
        pool = EndpointPool(
            eps, session, headers, ready_timeout=opts.ready_timeout,
            watchdog=spec.watchdog or watchdog, router=Router(eps, opts.route_options()),
        )  # fmt: skip
        built.append((spec, pool))
    pools = ModelPools(built)
    pools.headers = headers
    return pools

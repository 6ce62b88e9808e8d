"""Admission of endpoints: which servers may take the run's requests, checked before sending.

`preflight` waits for each pool's servers, checks that they serve the models asked for and
resolves `--model auto`; an endpoint that comes up later is admitted by the same rule (the
`admit` callback it installs on the pool). Admission of a request (may it go now, and where)
is the meter's (`budget.py`: rate limits, `--max-cost`) and the pools' (`model_pools.py`), called by
`sender.Sender.send`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from jsonlbatch.errors import ModelNotServedError, UsageError
from jsonlbatch.exec.route.endpoint_pool import EndpointPool
from jsonlbatch.exec.route.endpoints import Endpoint
from jsonlbatch.exec.route.model_pools import ModelPools


async def preflight(
    pools: ModelPools, wanted: str | None, models: Counter[str], note: Callable[[str], None]
) -> str | None:
    """Wait for each pool's servers and check their models; returns the model that overrides
    every body's (`--model NAME`, or the one `--model auto` found), or None."""
    if wanted == "auto" and len(pools.pools) > 1:
        raise UsageError("--model auto needs a single endpoint pool")
    override = None
    for pool in pools.pools:
        asked = pools.models_for(pool, models) if len(pools.pools) > 1 else list(models)
        override = await _check_pool(pool, wanted, asked, models, note)
    return override


async def _check_pool(
    pool: EndpointPool,
    wanted: str | None,
    pool_models: list[str],
    counts: Counter[str],
    note: Callable[[str], None],
) -> str | None:
    if wanted != "auto":
        pool.wanted = [wanted] if wanted else pool_models
    answered = await pool.preflight()
    known = [(ep, names) for ep, names in answered if names is not None]
    for ep, names in answered:
        if names is None:
            note(f"{ep.name} lists no models; skipping the model check")
    if wanted == "auto":
        common = set.intersection(*(set(n) for _, n in known)) if known else set()
        if len(common) != 1:
            served = ", ".join(sorted({m for _, n in known for m in n})) or "none"
            raise ModelNotServedError(
                f"--model auto needs exactly one model served by every endpoint; served: {served}"
            )
        override: str | None = common.pop()
        note(f"--model auto: using {override}")
    else:
        override = wanted
    asked = [override] if override else pool_models

    def missing(names: list[str] | None) -> str | None:
        return next((m for m in asked if names is not None and m not in names), None)

    for ep, names in known:
        model = missing(names)
        if model is not None:
            uses = "" if wanted else f" ({counts[model]} requests use it)"
            raise ModelNotServedError(
                f"model {model!r}{uses} is not served by {ep.name}; it serves: "
                f"{', '.join(names or []) or 'nothing'}. Pass --model NAME to override "
                "every request's model, or --model auto to use the served one"
            )

    def admit(ep: Endpoint, names: list[str] | None) -> str | None:
        model = missing(names)
        if model is None:
            return None
        refusal = f"does not serve {model!r}"
        if ep.down_reason != refusal:  # say it once, not at every probe
            note(f"{ep.name} is up but {refusal}; not using it")
        return refusal

    pool.admit = admit
    return override

"""`exec` with several models: `--fleet`, `--endpoints`, and several `--url`s serving different
models. Each builds the run's per-model pools (`jsonlbatch.exec.modelroute`) and refuses a model
nobody serves before anything is sent (and, with `--fleet`, before any server starts)."""

from __future__ import annotations

import functools
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from jsonlbatch.errors import UsageError
from jsonlbatch.exec.job import Job, run_coroutine
from jsonlbatch.exec.modelmap import read_endpoints
from jsonlbatch.exec.modelroute import check_served, list_models, pools_from_listing, pools_from_map
from jsonlbatch.exec.pools import PoolSpec
from jsonlbatch.exec.summary import RunSummary


def run_with_endpoints(job: Job, files: Sequence[str]) -> RunSummary:
    """The run over an endpoints map: each model's requests to its URLs."""
    specs = pools_from_map(read_endpoints(files))
    _route(job, specs)
    urls = list(dict.fromkeys(u for spec in specs for u in spec.urls))
    return run_coroutine(job.run(urls, handle_signals=True))


def run_with_fleet(job: Job, plan: dict[str, Any]) -> RunSummary:
    """Launch the fleet, run over it with a pool per model, take it down."""
    from jsonlbatch.serve.fleetrun import serving_fleet

    fleet = plan.pop("fleet")
    elsewhere = [e.name for e in fleet.entries if e.node is not None]
    if elsewhere and not (plan.get("defaults") or {}).get("ray"):
        raise UsageError(
            f"exec --fleet launches every model here, but {', '.join(elsewhere)} run on other "
            "nodes (node:): start each node's models there with `jsonlbatch serve --fleet FILE "
            "--node NAME --endpoints-out DIR/NAME.json`, then run exec with --endpoints DIR"
        )
    if job.options.model is None:
        check_served([PoolSpec((), tuple(e.options.served_names)) for e in fleet.entries],
                     job.input.models if job.input else Counter())  # fmt: skip
    with serving_fleet(fleet, **plan) as servers:
        specs = [
            PoolSpec(
                tuple(group.urls),
                entry.options.served_names,
                entry.concurrency,
                name=entry.name,
                watchdog=functools.partial(servers.check_model, entry.name),
            )
            for entry, group in servers.groups
        ]
        _route(job, specs)
        return run_coroutine(
            job.run(servers.urls, keys=servers.keys, watchdog=servers.check, handle_signals=True)
        )


def route_by_listing(
    job: Job,
    urls: Sequence[str],
    keys: Mapping[str, str | None],
    watchdog: Callable[[], None] | None = None,
) -> None:
    """Several URLs: ask each what it serves; if they differ, a pool per model."""
    opts = job.options
    if len(urls) < 2 or opts.model is not None or job.input is None or not job.input.pending:
        return
    listing = run_coroutine(
        list_models(
            urls, wanted=list(job.input.models), ready_timeout=opts.ready_timeout,
            api_key=opts.api_key, headers=opts.headers, keys=keys, watchdog=watchdog,
        )
    )  # fmt: skip
    specs = pools_from_listing(listing)
    if specs is not None:
        silent = [u for u in urls if u not in listing]
        if silent and not opts.quiet:
            print(f"note: {', '.join(silent)} did not answer yet: left out of this run (the "
                  "others serve different models, so its models must be known)", file=sys.stderr)  # fmt: skip
        _route(job, specs)


def _route(job: Job, specs: list[PoolSpec]) -> None:
    if job.options.model is not None and len(specs) > 1:
        raise UsageError("--model overrides every request's model: it needs a single model")
    if job.options.model is None and job.input is not None:
        check_served(specs, job.input.models)
    job.seams = replace(job.seams, pools=specs)

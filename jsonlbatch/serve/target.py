"""Run targets that launch their servers (`exec --serve`, `exec --fleet`, an experiment's
`serve:`): a `RunSpec`'s `target` (exec/front_door.py) that starts the servers, runs the prepared
job over them and tears them down however the run ends (Ctrl-C, a launch that fails, a server
that dies). `KeptLaunch` keeps them for the runs after (an experiment's steps).

A job with nothing left to send launches nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jsonlbatch.errors import UsageError
from jsonlbatch.exec.front_door import Running, Urls, route, route_by_listing
from jsonlbatch.exec.output.run_summary import RunSummary
from jsonlbatch.exec.route.model_pools import PoolSpec
from jsonlbatch.exec.route.model_routing import check_served
from jsonlbatch.serve.backends import ServeOptions

if TYPE_CHECKING:  # launching is imported by the runs that launch (serve.start)
    from jsonlbatch.serve.launch import Servers


@dataclass(frozen=True)
class Launch:
    """Launch the server(s) `serve` describes (vLLM, SGLang or the mock; TP x DP, replicas,
    Ray) for the run, beside any already-running `urls`."""

    serve: ServeOptions
    urls: tuple[str, ...] = ()
    uses_job = True

    def start(self, running: Running, /) -> RunSummary:
        job = running.job
        assert job is not None and job.input is not None
        if not job.input.pending:  # nothing to send: no server to start
            return Urls(self.urls).start(running)
        serve = self.serve
        if serve.backend == "mock" and not serve.served_model_name:
            serve = dataclasses.replace(serve, served_model_name=tuple(job.models) or ("mock",))
        from jsonlbatch.serve.start import serving  # only a run that launches servers

        with serving(
            serve, quiet=job.options.quiet, log_stem=job.output, stop=running.stopped
        ) as servers:
            return run_on(running, servers, self.urls)


def run_on(running: Running, servers: Servers, urls: Sequence[str] = ()) -> RunSummary:
    """Run the prepared job over launched `servers`, beside already-running `urls`.

    Each endpoint gets its own key: the launched servers theirs, the `urls` the user's
    `--api-key` (which must never reach a local server's logs, nor the local key a remote
    host). Several endpoints that serve different models get a pool each (asked what they
    serve); the servers' `check` is the run's watchdog, so a server that dies for good ends
    the run while it waits instead of being waited for until `--ready-timeout`."""
    job = running.job
    assert job is not None
    keys = dict.fromkeys(servers.urls, servers.api_key)
    every = [*urls, *servers.urls]
    route_by_listing(job, every, keys, servers.check)
    return running.run_job(every, keys=keys, watchdog=servers.check)


@dataclass(eq=False)
class KeptLaunch:
    """`Launch`, for several runs in turn: the servers start with the first run that has
    something to send and stay up for the runs after it, until `stack` closes (an experiment
    condition's exec step and judge rounds share them; a server that loads for minutes loads
    once). Each run gets what `Launch` gives it: per-server keys, the watchdog, routing by
    listing (`run_on`). A run with nothing to send launches nothing."""

    serve: ServeOptions
    stack: contextlib.ExitStack  # the servers' teardown is pushed on it
    urls: tuple[str, ...] = ()
    log_stem: str | None = None  # the servers' logs beside it (default: the first run's output)
    servers: Servers | None = None  # once launched
    uses_job = True

    def start(self, running: Running, /) -> RunSummary:
        job = running.job
        assert job is not None and job.input is not None
        if not job.input.pending:
            return Urls(self.urls).start(running)
        if self.servers is None:
            from jsonlbatch.serve.start import serving

            log_stem = self.log_stem or job.output
            self.servers = self.stack.enter_context(
                serving(
                    self.serve, quiet=job.options.quiet, log_stem=log_stem, stop=running.stopped
                )
            )
        return run_on(running, self.servers, self.urls)


@dataclass(frozen=True)
class Fleet:
    """Launch every model of a fleet file (`plan`: `cli.serve_options.fleet_plan`'s, i.e.
    `serving_fleet`'s arguments) on disjoint GPUs; each request goes to the model it names."""

    plan: dict[str, Any]
    uses_job = True

    def start(self, running: Running, /) -> RunSummary:
        job = running.job
        assert job is not None and job.input is not None
        if not job.input.pending:
            return Urls().start(running)
        from jsonlbatch.serve.fleetrun import serving_fleet

        plan = dict(self.plan)
        fleet = plan.pop("fleet")
        elsewhere = [e.name for e in fleet.entries if e.node is not None]
        if elsewhere and not (plan.get("defaults") or {}).get("ray"):
            raise UsageError(
                f"exec --fleet launches every model here, but {', '.join(elsewhere)} run on "
                "other nodes (node:): start each node's models there with `jsonlbatch serve "
                "--fleet FILE --node NAME --endpoints-out DIR/NAME.json`, then run exec with "
                "--endpoints DIR"
            )
        if job.options.model is None:
            check_served([PoolSpec((), tuple(e.options.served_names)) for e in fleet.entries],
                         job.input.models if job.input else Counter())  # fmt: skip
        with serving_fleet(fleet, stop=running.stopped, **plan) as servers:
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
            route(job, specs)
            return running.run_job(servers.urls, keys=servers.keys, watchdog=servers.check)

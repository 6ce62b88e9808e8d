"""Run targets that launch their servers (`exec --serve`, `exec --fleet`): a `RunSpec`'s
`target` (exec/front_door.py) that starts the servers, runs the prepared job over them and tears
them down however the run ends (Ctrl-C, a launch that fails, a server that dies).

A job with nothing left to send launches nothing.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from dataclasses import dataclass
from typing import Any

from jsonlbatch.errors import UsageError
from jsonlbatch.exec.front_door import Running, Urls, route, route_by_listing
from jsonlbatch.exec.output.run_summary import RunSummary
from jsonlbatch.exec.route.model_pools import PoolSpec
from jsonlbatch.exec.route.model_routing import check_served
from jsonlbatch.serve.backends import ServeOptions


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

        with serving(serve, quiet=job.options.quiet, log_stem=job.output) as servers:
            # Each endpoint gets its own key: the launched servers theirs, the --urls the
            # user's --api-key (which must never reach a local server's logs, nor the local
            # key a remote host).
            keys = dict.fromkeys(servers.urls, servers.api_key)
            urls = [*self.urls, *servers.urls]
            route_by_listing(job, urls, keys, servers.check)
            return running.run_job(urls, keys=keys, watchdog=servers.check)


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
            route(job, specs)
            return running.run_job(servers.urls, keys=servers.keys, watchdog=servers.check)

"""Serving a fleet: every model of a fleet file up at once, one endpoints map, one teardown.

    fleet = load_fleet("fleet.yaml")
    with serving_fleet(fleet) as servers:
        write_endpoints("endpoints.json", servers.endpoints())

Each model is an ordinary `Servers` group (its replicas, restarts, logs, readiness), so a fleet
behaves as several `--serve` launches would, with what only the whole can do: GPUs and ports
decided for all models before any starts, starts in parallel (or staggered, `stagger:`), one wait,
one teardown of every group at once, and a model that dies for good set apart (`dead`) instead of
ending the others' work, where the caller asks for that (`keep_going`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from jsonlbatch.errors import LaunchError, UsageError
from jsonlbatch.exec.route.endpoints_file import ModelEndpoints
from jsonlbatch.redact import redact
from jsonlbatch.serve.backends import BACKENDS
from jsonlbatch.serve.fleet import Fleet, ServeEntry, place, slug
from jsonlbatch.serve.gpus import visible_gpus
from jsonlbatch.serve.launch import (
    STOP_GRACE,
    Servers,
    plan_servers,
    run_log_dir,
    running,
    stop_all,
    warn_gpu_holders,
)
from jsonlbatch.serve.readiness import wait_all

_WILDCARDS = ("", "0.0.0.0", "::")


class FleetServers:
    """The models of a fleet while they serve: URLs per model, keys per URL, a watchdog."""

    def __init__(
        self,
        groups: Sequence[tuple[ServeEntry, Servers]],
        *,
        quiet: bool = False,
        keep_going: bool = False,
        advertise: str | None = None,
    ) -> None:
        self.groups = list(groups)
        self.quiet = quiet
        self.keep_going = keep_going
        self.advertise = advertise
        self.dead: dict[str, str] = {}  # model -> why it is gone for good (keep_going)

    @property
    def processes(self) -> list[object]:
        return [p for _, g in self.groups for p in g.processes]

    @property
    def urls(self) -> list[str]:
        return [u for _, g in self.groups for u in g.urls]

    @property
    def keys(self) -> dict[str, str | None]:
        """Each launched URL's own key (None: the server wants none)."""
        return {u: g.api_key for _, g in self.groups for u in g.urls}

    def model_urls(self) -> dict[str, list[str]]:
        """Served name -> the URLs serving it (every name of a model with several)."""
        return {n: g.urls for e, g in self.groups for n in e.options.served_names}

    def endpoints(self) -> dict[str, ModelEndpoints]:
        """The endpoints map, with addresses other machines can reach (a wildcard bind is
        written as this host's name, or `advertise`)."""
        out = {}
        for entry, group in self.groups:
            o = entry.options
            urls = group.urls
            if o.host in _WILDCARDS:
                urls = [self._advertised(u) for u in urls]
            dp = o.dp_size
            for name in o.served_names:
                out[name] = ModelEndpoints(list(urls), o.backend, o.tp_size, dp)
        return out

    def _advertised(self, url: str) -> str:
        split = urllib.parse.urlsplit(url)
        host = self.advertise or socket.gethostname()
        return split._replace(netloc=f"{host}:{split.port}").geturl()

    def start(self) -> None:
        for _, group in self.groups:
            if group.start_delay <= 0:
                group.start()

    def wait_ready(self, stop: threading.Event | None = None) -> None:
        wait_all([g for _, g in self.groups], quiet=self.quiet, stop=stop)
        self.note(
            "every model serves: " + "; ".join(f"{e.name} {len(g.urls)}" for e, g in self.groups)
        )

    def check(self) -> None:
        """Restart what died while restarts are left. A model that cannot come back ends the
        run (LaunchError), or with `keep_going` is set apart in `dead` and noted once."""
        for entry, group in self.groups:
            if entry.name in self.dead:
                continue
            try:
                group.check()
            except LaunchError as exc:
                if not self.keep_going:
                    raise
                self.dead[entry.name] = str(exc).splitlines()[0]
                self.note(f"model {entry.name} is down for good: {exc}")

    def check_model(self, name: str) -> None:
        """The watchdog of one model's requests: restart its servers while restarts are left;
        LaunchError once the model is gone for good (its requests then fail, naming it)."""
        self.check()
        if name in self.dead:
            raise LaunchError(f"model {name} is down for good: {self.dead[name]}")

    def stop(self) -> None:
        """Take every model down at once (one grace period for all, not one per model)."""
        plain = [g for _, g in self.groups if type(g) is Servers]
        for group in plain:
            group._closing.set()
        if any(p.poll() is None for g in plain for p in g.processes):
            self.note("stopping the fleet's servers")
        stuck = stop_all([p for g in plain for p in g.processes], grace=STOP_GRACE)
        for _, group in self.groups:
            if group not in plain:
                group.stop()
        if stuck:
            self.note(f"warning: processes {stuck} did not exit after SIGKILL")

    def note(self, message: str) -> None:
        if not self.quiet:
            sys.stderr.write(redact(message) + "\n")
            sys.stderr.flush()


def plan_fleet(
    fleet: Fleet,
    *,
    quiet: bool = False,
    log_stem: str | None = None,
    node: str | None = None,
    gpus: Sequence[str] | None = None,
    defaults: dict[str, object] | None = None,
    keep_going: bool = False,
    advertise: str | None = None,
) -> FleetServers:
    """Every model's servers, GPUs, ports, caches and logs decided; nothing started.

    `defaults` are options for the entries that do not set them (the command line's
    `--restart-server`, `--ready-timeout`, `--server-log-dir`, `--ray`). UsageError for anything
    that cannot work, naming the models.
    """
    needs = any(BACKENDS[e.options.backend].needs_gpus for e in fleet.entries)
    ray = bool((defaults or {}).get("ray"))
    if ray and not ((defaults or {}).get("ray_address") or os.environ.get("RAY_ADDRESS")):
        raise UsageError(
            "--fleet with --ray places every model on one cluster: give --ray-address (or set "
            "RAY_ADDRESS); a cluster of its own per model is not what a fleet wants"
        )
    listed = visible_gpus(gpus, detect=needs and not ray)
    placed = place(fleet, listed, node=node, ray=ray)
    stem = log_stem or "jsonlbatch-fleet"
    if log_stem is None and not (defaults or {}).get("log_dir"):  # a bare `serve --fleet`
        stem = os.path.join(run_log_dir("fleet"), stem)
    taken: set[int] = set()
    groups = []
    for i, entry in enumerate(placed):
        overrides: dict[str, Any] = {
            k: v for k, v in (defaults or {}).items() if k not in entry.given
        }
        options = replace(entry.options, **overrides)
        entry = replace(entry, options=options)
        model_stem = f"{stem}.{slug(entry.name)}"
        if options.ray:
            from jsonlbatch.serve.raycluster import RayServers  # Ray is an optional extra

            group: Servers = RayServers(options, log_stem=model_stem, quiet=quiet)
        else:
            processes = plan_servers(options, log_stem=model_stem, taken=taken)
            stride = BACKENDS[options.backend].port_stride
            for p in processes:
                port = urllib.parse.urlsplit(p.url).port or 0
                taken.update(range(port, port + stride))
            group = Servers(options, processes, quiet=quiet)
        for p in group.processes:
            p.model = entry.name
        group.start_delay = i * fleet.stagger
        groups.append((entry, group))
    return FleetServers(groups, quiet=quiet, keep_going=keep_going, advertise=advertise)


@contextlib.contextmanager
def serving_fleet(
    fleet: Fleet, *, stop: threading.Event | None = None, **plan: object
) -> Iterator[FleetServers]:
    """Start every model `fleet` names (see `plan_fleet` for the options), wait until all
    serve, yield them, stop them all however the block ends (Ctrl-C and SIGTERM included;
    `stop` set from another thread while they start)."""
    servers = plan_fleet(fleet, **plan)  # type: ignore[arg-type]
    if any(BACKENDS[e.options.backend].needs_gpus and not e.options.ray for e, _ in servers.groups):
        warn_gpu_holders(servers)  # type: ignore[arg-type]
    with running(servers, stop):
        yield servers

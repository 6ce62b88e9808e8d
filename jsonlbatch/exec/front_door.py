"""One run, described in one value and started by one function: `RunSpec` and `start`.

Every way a run is asked for builds a `RunSpec` and hands it to `start` (or `astart`, from a
running event loop): `jsonlbatch exec`, `jsonlbatch.execute`/`aexecute` (the one public way in
from Python, which builds it from the command line's option names: `cli/library.py`), the
experiment runner, and the Batch API server's runner. A spec says what to send (`requests`),
where the answers go (`output`), how (`options`, `seams`) and where to (`target`):

- `Urls`: servers that are already running (also several, serving different models: a pool
  per model from what each lists);
- `EndpointsFiles`: a model -> URLs map (`serve --fleet --endpoints-out`);
- `serve.target.Launch` / `serve.target.Fleet`: servers launched for the run, torn down after;
- `batchapi.client.provider_target.ProviderBatch`: a provider's Batch API (submit, watch, merge).

A target is anything with `uses_job` and `start(running)`; a target that sends gets the prepared
`Job` (its input validated, its output locked, with the spec's options and seams) and runs it
(through `run_job`, or its own way: a provider's batch API), handling signals only where
`start` was asked to (`running.handle_signals`).
`dry_run` counts instead of sending, whatever the target. `watchers` live as long as the run
(the live page, the metrics endpoint) and add their subscribers to the run's events.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import difflib
import os
import sys
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from jsonlbatch.errors import Interrupted, UsageError
from jsonlbatch.exec.exec_options import ExecOptions
from jsonlbatch.exec.hooks.seams import NO_SEAMS, Seams
from jsonlbatch.exec.job import Job, refuse_running_loop, run_coroutine
from jsonlbatch.exec.output.run_outcome import RunOutcome
from jsonlbatch.exec.output.run_summary import RunSummary
from jsonlbatch.exec.route.endpoints_file import read_endpoints
from jsonlbatch.exec.route.model_pools import PoolSpec
from jsonlbatch.exec.route.model_routing import (
    check_served,
    list_models,
    pools_from_listing,
    pools_from_map,
)

#: A subscriber of the run's events, as `Seams.subscribers` holds them.
Subscription = tuple[Callable[[Any], None], tuple[type, ...]]


class Summary(Protocol):
    """What every target's run says at its end (`RunSummary`, a Batch API's `SubmitSummary`)."""

    failed: int
    failed_before: int
    budget_stopped: bool

    def format(self) -> str: ...


class Target(Protocol):
    """Where a run's requests go."""

    #: True: `start` prepares the `Job` (`running.job`: the output locked, the input checked,
    #: what is pending decided) and the target sends it (every target here, a provider's Batch
    #: API included); False: the target reads the request file itself and `running.job` is None.
    uses_job: bool

    def start(self, running: Running, /) -> Summary: ...


class Watcher(Protocol):
    """Something that watches a run while it lasts (view/watch.py: the page, the metrics)."""

    def watching(self, spec: RunSpec, /) -> AbstractContextManager[Sequence[Subscription]]: ...


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """A whole run, as a value: built by the CLI, the library, experiments, the Batch API."""

    requests: str
    output: str
    options: ExecOptions = field(default_factory=ExecOptions)
    target: Target = field(default_factory=lambda: Urls())
    seams: Seams = NO_SEAMS
    dry_run: bool = False  # validate and count what would be sent; send nothing
    watchers: tuple[Watcher, ...] = ()
    #: Called while servers are waited for; may raise to end the run (a launcher's check that
    #: its servers still live). A target that launches servers passes its own.
    watchdog: Callable[[], None] | None = None


@dataclass
class Running:
    """A spec being started: what a target's `start` gets."""

    spec: RunSpec
    job: Job | None
    handle_signals: bool  # Ctrl-C and SIGTERM stop the run cleanly (the main thread only)
    #: Set when the run is stopped from another thread (`StopHandle`: a cancelled `astart`);
    #: a target that launches servers ends their start with it (`serving(stop=...)`).
    stopped: threading.Event = field(default_factory=threading.Event)

    def run_job(
        self,
        urls: Sequence[str],
        *,
        keys: Mapping[str, str | None] | None = None,
        watchdog: Callable[[], None] | None = None,
    ) -> RunSummary:
        """Send the prepared job to `urls` (`keys`: credentials of launched servers) and wait."""
        assert self.job is not None, "a target that sends from here has uses_job = True"
        watchdog = watchdog or self.spec.watchdog
        return run_coroutine(
            self.job.run(urls, keys=keys, watchdog=watchdog, handle_signals=self.handle_signals)
        )


@dataclass(frozen=True)
class Urls:
    """Servers that already run. Several URLs that serve different models get a pool each
    (asked what they serve first); the same model everywhere is one pool."""

    urls: tuple[str, ...] = ()
    uses_job = True

    def start(self, running: Running, /) -> RunSummary:
        assert running.job is not None
        route_by_listing(running.job, self.urls, {})
        return running.run_job(self.urls)


@dataclass(frozen=True)
class EndpointsFiles:
    """An endpoints map (model -> URLs; files or folders of them): each request to the URLs of
    the model it names."""

    paths: tuple[str, ...]
    uses_job = True

    def start(self, running: Running, /) -> RunSummary:
        assert running.job is not None
        specs = pools_from_map(read_endpoints(self.paths))
        route(running.job, specs)
        return running.run_job(list(dict.fromkeys(u for spec in specs for u in spec.urls)))


def start(
    spec: RunSpec, *, handle_signals: bool = True, stop: StopHandle | None = None
) -> RunOutcome:
    """Run `spec` to its end (blocking) and return its outcome.

    Raises what the run raises: the package's errors (bad input, a server that never came,
    a launch that failed), `Interrupted` (with `.summary`) on Ctrl-C; the same spec started
    again resumes. `stop` lets another thread end the run as a first Ctrl-C does (`astart`).
    Signals reach the main thread only: a run started from another leaves them to the caller.
    """
    refuse_running_loop("jsonlbatch.exec.front_door.start", "jsonlbatch.exec.front_door.astart")
    handle_signals = handle_signals and threading.current_thread() is threading.main_thread()
    stopped = stop.event if stop is not None else threading.Event()  # a server start ends on it
    with contextlib.ExitStack() as stack:
        subscribers: list[Subscription] = list(spec.seams.subscribers)
        for watcher in spec.watchers:
            subscribers += stack.enter_context(watcher.watching(spec))
        seams = dataclasses.replace(spec.seams, subscribers=tuple(subscribers))
        if spec.dry_run:
            from jsonlbatch.exec.prepare.dry_run import dry_run

            with Job(spec.requests, spec.output, spec.options, seams=seams) as job:
                return RunOutcome(spec.output, dry=dry_run(job))
        if not spec.target.uses_job:
            if stop is not None:
                stop.attach(None)
            running = Running(spec, None, handle_signals, stopped)
            return RunOutcome(spec.output, spec.target.start(running))
        job = stack.enter_context(Job(spec.requests, spec.output, spec.options, seams=seams))
        job.prepare()  # bad input fails here, before any server boots
        if stop is not None:
            stop.attach(job)
        return RunOutcome(
            spec.output, spec.target.start(Running(spec, job, handle_signals, stopped))
        )
    raise AssertionError("unreachable")  # for type checkers: the block returns


def execute(
    requests: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    watchdog: Callable[[], None] | None = None,
    handle_signals: bool = True,
    seams: Seams | None = None,
    **options: Any,
) -> RunSummary:
    """Deprecated: use `jsonlbatch.execute`, which takes every mode of `jsonlbatch exec` (a
    launched server, a fleet, a Batch API) with the command line's option names and checks
    them as the command does; or build a `RunSpec` and `start` it.

    Runs a request file to running servers (`options.urls`, the fields of `ExecOptions`),
    blocking, as before. Kept for one release, for callers of earlier ones.
    """
    _deprecated("execute")
    refuse_running_loop("jsonlbatch.execute", "jsonlbatch.aexecute")  # before the output lock
    spec = _spec(requests, output, seams, watchdog, options)
    return start(spec, handle_signals=handle_signals).summary


async def aexecute(
    requests: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    watchdog: Callable[[], None] | None = None,
    seams: Seams | None = None,
    **options: Any,
) -> RunSummary:
    """Deprecated: use `jsonlbatch.aexecute` (see `execute`)."""
    _deprecated("aexecute")
    outcome = await astart(_spec(requests, output, seams, watchdog, options))
    return outcome.summary


def _deprecated(name: str) -> None:
    warnings.warn(
        f"jsonlbatch.exec.{name} is deprecated and goes in the next release: use "
        f"jsonlbatch.{name} (the command line's option names, every mode of `jsonlbatch exec`)",
        DeprecationWarning,
        stacklevel=3,
    )


def _spec(
    requests: str | os.PathLike[str],
    output: str | os.PathLike[str],
    seams: Seams | None,
    watchdog: Callable[[], None] | None,
    options: dict[str, Any],
) -> Any:
    fields = {f.name for f in dataclasses.fields(ExecOptions)}
    for name in options:
        if name not in fields:
            near = difflib.get_close_matches(name, fields, n=1, cutoff=0.6)
            hint = f": did you mean {near[0]!r}?" if near else ""
            raise UsageError(f"unknown option {name!r}{hint}")
    opts = ExecOptions(**options)
    return RunSpec(requests=os.fspath(requests), output=os.fspath(output), options=opts,
                   target=Urls(tuple(opts.urls)), seams=seams or NO_SEAMS, watchdog=watchdog)  # fmt: skip


class StopHandle:
    """Ends a run started in another thread, as a first Ctrl-C would (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._job: Job | None = None
        self._stopped = False
        #: Set by `stop`: a server start under way ends with it (`Running.stopped`).
        self.event = threading.Event()

    def attach(self, job: Job | None) -> None:
        with self._lock:
            self._job = job
            stopped = self._stopped
        if stopped and job is not None:
            job.stop()

    def stop(self) -> None:
        self.event.set()
        with self._lock:
            self._stopped = True
            job = self._job
        if job is not None:
            job.stop()


async def astart(spec: RunSpec) -> RunOutcome:
    """`start` for callers inside a running event loop (a notebook, an async application).

    The run goes on in a worker thread with its own loop, so nothing blocks the caller's loop
    (servers launched for it included). Cancelling the awaiting task stops the run as a first
    Ctrl-C does: no new requests, those in flight get `options.grace` seconds, servers still
    starting are stopped at once, launched servers are torn down; then the cancellation goes
    on, once the worker thread has ended, so nothing of the run (thread, server, the output's
    lock) outlives the task. Cancelled again meanwhile, it still waits for that end (bounded
    by the grace and the servers' teardown). Signals stay the caller's.
    """
    handle = StopHandle()
    future = asyncio.get_running_loop().run_in_executor(
        None, lambda: start(spec, handle_signals=False, stop=handle)
    )
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        handle.stop()
        while not future.done():
            try:
                await asyncio.shield(future)
            except asyncio.CancelledError:
                handle.stop()  # it is stopping already: wait for its end all the same
            except (Interrupted, Exception):
                break
        raise


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
        route(job, specs)


def route(job: Job, specs: list[PoolSpec]) -> None:
    """Give the job a pool per model (`specs`), refusing a model nobody serves now."""
    if job.options.model is not None and len(specs) > 1:
        raise UsageError("--model overrides every request's model: it needs a single model")
    if job.options.model is None and job.input is not None:
        check_served(specs, job.input.models)
    job.seams = dataclasses.replace(job.seams, pools=specs)

"""The run loop: one `Job.run`, from the pending lines to the last written result.

One request's path: the before-send lookup (`store_hook.answer_stored`) writes what a store
already answers; `RequestLines.read` (`request_lines.py`) reads each other pending line (in the
router's order) onto a bounded queue; a worker (`_work`) takes it and hands it to
`sender.Sender` (pool, meter, attempts, on-answer check); the result is given to the store, then
to `recorder.Recorder`, which appends its line. Around that, `main` opens the HTTP session, has
the pools built (`model_pools.build_pools`) and the rest the run needs (`run_setup.py`: meter,
hosted files, priority signs), runs the preflight (`preflight.py`), ticks the event stream
(`events.py`) and stops cleanly on Ctrl-C, a budget stop or a fatal error.

A run whose requests come from a source (`Seams.source`, `request_source.py`: a rollout) has
`RequestLines.feed` in place of `read`: the same queue, workers, checks and recorder, and each
result handed back to the source after its line is queued.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable

import aiohttp

from jsonlbatch.batch_format.records import Request, Result
from jsonlbatch.errors import (
    Interrupted,
    JsonlbatchError,
    LaunchError,
    ServerUnavailableError,
    UsageError,
)
from jsonlbatch.exec.exec_options import AUTO_MAX_CONCURRENCY
from jsonlbatch.exec.hooks.seams import Seams
from jsonlbatch.exec.hooks.store_hook import (
    AnswerStore,
    Vetter,
    answer_stored,
    occurrences,
)
from jsonlbatch.exec.output.events import EventBus, Snapshot
from jsonlbatch.exec.output.progress_bar import Progress
from jsonlbatch.exec.output.recorder import Recorder
from jsonlbatch.exec.output.run_summary import RunSummary
from jsonlbatch.exec.request_lines import RequestLines
from jsonlbatch.exec.route import adaptive_concurrency as adaptive
from jsonlbatch.exec.route.endpoints import Endpoint
from jsonlbatch.exec.route.model_pools import ModelPools, PoolSpec, build_pools, parse_endpoints
from jsonlbatch.exec.route.model_routing import unavailable
from jsonlbatch.exec.route.preflight import preflight
from jsonlbatch.exec.route.server_metrics import compare, keep_servers, scrape_all
from jsonlbatch.exec.run_setup import Prepared, hosted_files, make_meter, set_priority_signs
from jsonlbatch.exec.send.budget import BudgetReached
from jsonlbatch.exec.send.sender import Sender, Stop


class Run:
    """The state of one `Job.run`: queue, workers, sender, recorder, counters."""

    def __init__(
        self,
        job: Prepared,
        *,
        urls: list[str],
        keys: dict[str, str | None],
        watchdog: Callable[[], None] | None,
        handle_signals: bool,
        seams: Seams,
    ) -> None:
        self.job = job
        self.opts = opts = job.options
        self.scan = job.scan
        self.urls = urls
        self.keys = keys
        self.watchdog = watchdog
        self.handle_signals = handle_signals
        self.seams = seams
        self.summary = RunSummary(
            output=job.output,
            requests=self.scan.total,
            already_done=self.scan.already_done,
            failed_before=self.scan.failed_before,
            pending=len(self.scan.pending) + self.scan.answered,
        )
        self.bus = EventBus()
        #: Where the requests come from when not from the file's lines (a rollout).
        self.source = seams.source
        total = len(self.scan.pending) + self.scan.answered if self.source is None else None
        label = "exec" if self.source is None else "rollout"  # the only source today
        self.progress = Progress(total, quiet=opts.quiet, label=label)
        if not opts.quiet:
            self.progress.listen(self.bus, streams=opts.stream)
        for callback, types in seams.subscribers:
            self.bus.subscribe(callback, *types)
        self.meter = make_meter(opts, job.output, self.summary)
        self.stopping = asyncio.Event()
        #: The pending lines as requests, onto the queues (`request_lines.py`).
        self.lines = RequestLines(
            requests=job.requests, path=job.source, scan=self.scan, opts=opts,
            file_refs=job.file_refs, stopping=self.stopping,
        )  # fmt: skip
        self.abort: JsonlbatchError | None = None
        self.signals = 0
        self._cancel_scheduled = False
        self.recorder = Recorder(
            output=job.output, requests=job.requests, lock=job.lock, scan=self.scan,
            existing=job.existing, summary=self.summary, bus=self.bus, note=self.progress.note,
            changed_policy=opts.changed,
        )  # fmt: skip
        self.recorder.on_error = self._stop
        self.sender: Sender | None = None
        self.endpoints: list[Endpoint] = []
        self.n_workers = self.opts.fixed_concurrency  # workers; more when concurrency is tuned
        self.pools: ModelPools | None = None
        self.early = job.early
        # marks this run's lines (metrics.run); the early answers' lines have it already
        self.run_id = self.early.run_id if self.early is not None else os.urandom(4).hex()
        self.workers: list[asyncio.Task[None]] = []
        self.readers: list[asyncio.Task[None]] = []
        #: One queue per pool with its number of workers (one queue without several pools).
        self.queues: list[tuple[asyncio.Queue[Request | None], int]] = []
        self.preflight: asyncio.Task[str | None] | None = None
        self.repeats: dict[str, int] = {}  # custom_id -> occurrence, with a lookup only
        self.pending = self.scan.pending  # byte offsets of the lines still to send
        self.contract = job.contract
        #: The store (seams.py, completed) and the steps its answers take before their line.
        self.store = seams.the_store
        self.vetter = Vetter(self.store, job.checks) if self.store is not None else None

    # -- the run -------------------------------------------------------------------------------

    async def main(self) -> RunSummary:
        started = time.monotonic()
        specs = list(self.seams.pools or [PoolSpec()])
        if self.scan.pending and not (self.urls or all(spec.urls for spec in specs)):
            raise UsageError("no endpoint: give --url (or --serve to launch a server)")
        endpoints = parse_endpoints(specs, self.urls, self.keys)  # before the output is touched
        if not self.scan.pending:  # no server needed: the output may be written at once
            self._store_notes()
            self.recorder.prepare()
            self.recorder.write_early(self.early)
            self.recorder.close()
            self.contract.close(complete=True)
            self._close_store()
            answered = f", {self.scan.answered} of them now" if self.scan.answered else ""
            done = self.scan.done_words or "requests have a result"
            self.progress.note(f"nothing to send: all {self.scan.total} {done}{answered}")
            self.summary.wall_s = time.monotonic() - started
            self._snapshot(final=True)  # listeners (metrics, the live page) see the counts
            return self.summary
        self.summary.endpoints.update({ep.name: 0 for ep in endpoints.values()})  # --url order
        loop = asyncio.get_running_loop()
        if self.handle_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self._on_signal)
        try:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0, ttl_dns_cache=300)
            async with aiohttp.ClientSession(
                connector=connector, trust_env=False, read_bufsize=1 << 20
            ) as session:
                await self._run(session, specs, endpoints)
        finally:
            if self.handle_signals:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)
            self.recorder.close()
            self.contract.close(complete=self.summary.complete and self.abort is None)
            self.meter.summarize(self.summary)
            self._close_store()
            self._snapshot(final=True)
            self.progress.close()
            self.summary.wall_s = time.monotonic() - started
        if self.source is not None:  # counted in calls made, not in lines of the file
            self.summary.pending = self.summary.written + (not self.source.complete)
            self.summary.requests = self.summary.already_done + self.summary.pending
        if self.abort is not None:
            raise self.abort
        if self.signals and self.summary.remaining:
            self.summary.interrupted = True
            raise Interrupted(
                f"interrupted: {self.summary.written} results written; run the same command "
                "again to resume",
                summary=self.summary,
            )
        return self.summary

    async def _run(
        self, session: aiohttp.ClientSession, specs: list[PoolSpec], by_url: dict[str, Endpoint]
    ) -> None:
        make = self.seams.concurrency
        self.pools = pools = build_pools(
            session, specs=specs, urls=self.urls, by_url=by_url, keys=self.keys, opts=self.opts,
            controller=make, watchdog=self.watchdog,
        )  # fmt: skip
        headers = pools.headers
        if self.opts.model is None:
            pools.check_models(self.scan.models)
        endpoints = list(by_url.values())
        self.endpoints = endpoints
        ticker = asyncio.ensure_future(self._tick())
        syncer = asyncio.ensure_future(self.recorder.sync_every())
        tuners: list[asyncio.Task[None]] = []
        try:
            self.preflight = asyncio.ensure_future(
                preflight(pools, self.opts.model, self.scan.models, self.progress.note)
            )
            try:
                self.lines.model_override = await self.preflight
            except asyncio.CancelledError:
                if not self.signals:
                    raise
            if not self.stopping.is_set():
                self.recorder.prepare()  # servers are fine: only now touch the output
                self.recorder.write_early(self.early)
                self.summary.started_at = time.time()
                self.progress.start()
                before = await scrape_all(session, endpoints, headers)
                set_priority_signs(self.opts, endpoints, before, self.progress.note)
                if make is None:  # -c auto, or the default for launched and vLLM/SGLang servers
                    tuners = adaptive.start(self.opts.concurrency, AUTO_MAX_CONCURRENCY,
                                            endpoints, before, session, headers)  # fmt: skip
                self.n_workers = AUTO_MAX_CONCURRENCY if tuners else self.opts.fixed_concurrency
                self.sender = Sender(
                    opts=self.opts, session=session, pools=pools, meter=self.meter,
                    stopping=self.stopping, summary=self.summary, bus=self.bus,
                    check=self.job.checks,
                    files=hosted_files(self.opts, self.job.file_refs, self.job.output, session),
                )  # fmt: skip
                await self._send_all()
                if not self.signals and self.abort is None:
                    after = await scrape_all(session, endpoints, headers)
                    self.summary.servers = compare(endpoints, before, after)
                    if not keep_servers(self.job.output, self.summary):
                        self.progress.note("cannot keep the servers' metrics")
        finally:
            for task in (ticker, syncer, *tuners):
                task.cancel()
            await asyncio.gather(ticker, syncer, *tuners, return_exceptions=True)
            await pools.close()

    async def _send_all(self) -> None:
        store, source = self.store, self.source
        if source is not None:
            fed: asyncio.Queue[Request | None] = asyncio.Queue(maxsize=2 * self.n_workers)
            self.queues.append((fed, self.n_workers))
            feed = self.lines.feed(fed, source, self.pending, self.n_workers)
            self.readers.append(asyncio.ensure_future(feed))
            self.workers += [asyncio.ensure_future(self._work(fed)) for _ in range(self.n_workers)]
            try:
                await self._wait([*self.readers, *self.workers])
            finally:
                await source.close()
            return
        if store is not None and not store.counts_copies:
            self.repeats = occurrences(self.job.source)  # identical requests told apart
        if store is not None and self.early is not None:
            self._store_notes()  # every pending line was looked up in the scan (EarlyAnswers)
        elif store is not None:
            await self._answer(store)
            if self.stopping.is_set() or not self.pending:
                return
        for offsets, n_workers in self.lines.parts(self.pools, self.pending, self.n_workers):
            queue: asyncio.Queue[Request | None] = asyncio.Queue(maxsize=2 * n_workers)
            self.queues.append((queue, n_workers))
            read = self.lines.read(queue, n_workers, offsets)
            self.readers.append(asyncio.ensure_future(read))
            self.workers += [asyncio.ensure_future(self._work(queue)) for _ in range(n_workers)]
        await self._wait([*self.readers, *self.workers])

    async def _wait(self, tasks: list[asyncio.Task[None]]) -> None:
        """Until every reader and worker ends; the first error is raised, the rest cancelled."""
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _answer(self, store: AnswerStore) -> None:
        """Before anything is sent: write what the store answers (`store_hook.answer_stored`) and
        keep only the rest pending."""
        self.lines.check_unchanged()
        self._store_notes()
        assert self.vetter is not None
        self.pending = await answer_stored(
            store, self.vetter, self.job.source, self.pending, self.repeats, self.lines.request,
            self._record, self.stopping,
        )  # fmt: skip

    def _before_send(self, request: Request) -> Result | None:
        """A source's request (a turn, an `ask`) that needs no sending: a model no pool takes
        (a failed call for the source to see, not the run's end), or a stored answer."""
        try:
            assert self.pools is not None
            self.pools.route(request.body)
        except UsageError as exc:
            return unavailable(request, exc)
        if self.store is None:
            return None
        stored = self.store.lookup(request, 0)
        if stored is None:
            return None
        stored.custom_id = request.custom_id
        assert self.vetter is not None
        return stored if self.vetter(request, stored) else None

    async def _work(self, queue: asyncio.Queue[Request | None]) -> None:
        sender, store, repeats = self.sender, self.store, self.repeats
        assert sender is not None
        while True:
            request = await queue.get()
            if request is None or self.stopping.is_set():
                return
            try:
                result = self._before_send(request) if self.source is not None else None
                if result is None:
                    result = await sender.send(request)
                    if store is not None:  # looked up before sending began (`_answer`)
                        store.store(request, repeats.get(request.custom_id, 0), result)
            except BudgetReached:
                self._stop_for_budget()
                return
            except Stop:
                return
            except (ServerUnavailableError, LaunchError) as exc:
                if self.pools is None or len(self.pools.pools) < 2:
                    self._stop(exc)
                    return
                result = unavailable(request, exc)  # one model down: the others go on
            except JsonlbatchError as exc:
                self._stop(exc)
                return
            self._record(request, result)

    def _record(self, request: Request, result: Result) -> None:
        # which run wrote the line: report tells the runs of a resumed file apart
        result.metrics["run"] = self.run_id
        # last in metrics, where a resume reads it without decoding the line
        result.metrics["fingerprint"] = request.fingerprint
        self.recorder.emit(result)
        if self.source is not None:
            self.source.answered(request, result)

    def _store_notes(self) -> None:
        for note in self.store.notes() if self.store is not None else ():
            self.progress.note(note)

    def _close_store(self) -> None:
        if self.store is None:
            return
        self.summary.cache = self.store.describe()
        self.store.finish(self.job.output)  # the cache keeps this run's counts (`cache stats`)

    # -- progress ------------------------------------------------------------------------------

    def _snapshot(self, final: bool = False) -> None:
        if not self.bus.wants(Snapshot):
            return
        status = self.pools.status if self.pools is not None else ""
        retrying = self.sender.retrying if self.sender is not None and not final else 0
        extra = " ".join(p for p in (adaptive.shown(self.endpoints), self.meter.status()) if p)
        if self.store is not None:  # e.g. the cache's hits, savings
            extra = f"{extra} {self.store.progress()}".strip()
        self.bus.emit(Snapshot(self.summary, retrying, status, extra, final))

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            self._snapshot()

    # -- stopping ------------------------------------------------------------------------------

    def _stop_for_budget(self) -> None:
        """--max-cost: send nothing more; requests in flight finish (however long they take)."""
        if self.summary.budget_stopped or self.stopping.is_set():
            return
        self.summary.budget_stopped = True
        budget = self.meter.budget
        assert budget is not None
        self.progress.note(
            f"budget: ${budget.spent:,.4f} spent, nothing in flight, and the next request (up to "
            f"${budget.next_worst:,.4f}) could pass --max-cost ${budget.max_cost:,.2f}: sending "
            "nothing more"
        )
        self._stop(cancel=False)

    def _stop(self, abort: JsonlbatchError | None = None, cancel: bool = True) -> None:
        """Send nothing more; let requests in flight finish within the grace period (or
        without a limit, `cancel=False`)."""
        if abort is not None and self.abort is None:
            self.abort = abort
        if self.stopping.is_set():
            if cancel and not self._cancel_scheduled:  # Ctrl-C after a budget stop
                self._cancel_scheduled = True
                asyncio.get_running_loop().call_later(self.opts.grace, self._cancel_workers)
            return
        self.stopping.set()
        if self.preflight is not None and not self.preflight.done():
            self.preflight.cancel()
        for reader in self.readers:
            reader.cancel()
        for queue, n_workers in self.queues:  # wake idle workers: queued requests stay pending
            while not queue.empty():
                queue.get_nowait()
            for _ in range(n_workers):
                queue.put_nowait(None)
        if cancel or abort is not None:
            self._cancel_scheduled = True
            delay = 0.0 if abort is not None else self.opts.grace
            asyncio.get_running_loop().call_later(delay, self._cancel_workers)

    def _cancel_workers(self) -> None:
        for task in self.workers:
            task.cancel()

    def request_stop(self) -> None:
        """A stop asked by the caller (`Job.stop`): as the first Ctrl-C."""
        if not self.signals:
            self._on_signal()

    def _on_signal(self) -> None:
        self.signals += 1
        if self.signals == 1:
            self.progress.note(
                f"stopping: no new requests; waiting up to {self.opts.grace:g}s for those in "
                "flight (Ctrl-C again to stop now)"
            )
            self._stop()
        elif self.signals == 2:
            self._cancel_workers()
        else:  # the loop is wedged: leave now; only whole lines were ever written
            self.recorder.flush()
            os._exit(130)

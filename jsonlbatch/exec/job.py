"""`jsonlbatch exec` as a library: send a request file to OpenAI-compatible servers, crash-safely.

The shape of a run:

1. `Job.prepare()` scans the existing output (what is done) and validates the whole input (what
   is asked) before anything is sent or modified, so bad input changes nothing.
2. `Job.run()` cuts a torn last line, drops the lines about to be retried, checks that the
   servers serve the requested model, then streams the pending lines through a bounded queue to
   a fixed pool of worker tasks. Each finished request becomes one output line, appended with
   whole-line writes; a line is written only once its request is finished, so killing the
   process at any moment loses at most requests in flight, which the next run sends again.

Memory is bounded by the concurrency: the input is re-read line by line and only compact state
(ids as hashes in a compact table, byte offsets of pending lines) is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
import weakref
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
import orjson

from jsonlbatch.answers import unusable_reason
from jsonlbatch.cost import Price
from jsonlbatch.errors import (
    AuthenticationError,
    InputError,
    Interrupted,
    JsonlbatchError,
    ModelNotServedError,
    OutputError,
    UsageError,
)
from jsonlbatch.exec.budget import Budget, BudgetReached, Meter, Ticket, spent_in_output
from jsonlbatch.exec.endpoints import (
    Endpoint,
    EndpointPool,
    auth_headers,
    describe_exception,
    parse_endpoint,
)
from jsonlbatch.exec.limits import RateLimiter
from jsonlbatch.exec.progress import Progress
from jsonlbatch.exec.results import http_result
from jsonlbatch.exec.retry import Backoff, Verdict, parse_retry_after
from jsonlbatch.exec.router import RouteOptions, Router, ordered_lines
from jsonlbatch.exec.scan import (
    CHANGED_POLICIES,
    InputScan,
    OutputScan,
    line_custom_id,
    scan_input,
    scan_output,
    stat_input,
)
from jsonlbatch.exec.server_metrics import compare, keep_servers, scrape_all
from jsonlbatch.exec.streaming import (
    NO_STREAM_URLS,
    STREAM_URLS,
    StreamError,
    StreamReader,
    read_answer,
    stream_body,
)
from jsonlbatch.exec.summary import RunSummary
from jsonlbatch.jsonl import (
    AppendWriter,
    OutputLock,
    check_output,
    filter_lines,
    is_regular,
    prefetch,
    remove_stale_rewrites,
    repair_tail,
    rewrite_atomically,
    spool,
)
from jsonlbatch.records import COMPLETIONS_URL, Request, Result, fingerprint
from jsonlbatch.redact import redact

_T = TypeVar("_T")

_FSYNC_EVERY = 5.0  # seconds: durability against power loss without an fsync per line


@dataclass
class ExecOptions:
    """Everything that shapes a run besides its two files. Field docs are the CLI's help."""

    urls: Sequence[str] = ()
    concurrency: int = 256
    model: str | None = None  # override every body's model; "auto" = the one served
    api_key: str | None = field(default=None, repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    timeout: float = 1800.0  # per attempt; reasoning models and cold caches need long ones
    max_retries: int = 8
    ready_timeout: float = 1800.0  # how long a refusing or dead server is waited for
    retry_failed: bool = False
    changed: str = "refuse"  # requests edited since their result: refuse, resend or keep
    stream: bool = False
    shard: tuple[int, int] | None = None  # (k, n), k 0-based
    quiet: bool = False
    grace: float = 10.0  # seconds in-flight requests get after the first Ctrl-C
    backoff_base: float = 1.0
    backoff_cap: float = 60.0
    route: str = RouteOptions.policy  # prefix | least-busy | round-robin (see exec/router.py)
    order_window: int = RouteOptions.order_window
    balance_abs_threshold: int | None = RouteOptions.balance_abs_threshold
    balance_rel_threshold: float = RouteOptions.balance_rel_threshold
    rpm: float | None = None  # requests per minute, across all workers and endpoints
    tpm: float | None = None  # tokens per minute (prompt estimate + output cap, then real usage)
    rate_limits: bool = True  # learn limits from the providers' rate-limit headers
    price: Price | None = None  # dollars per million tokens: spend shown, --max-cost enforced
    max_cost: float | None = None  # dollars for the whole output file, resumed runs included

    def __post_init__(self) -> None:
        self.route_options()  # checks the routing options
        if self.concurrency < 1:
            raise UsageError("--concurrency must be at least 1")
        if self.max_retries < 0:
            raise UsageError("--max-retries must be 0 or more")
        if self.timeout <= 0 or self.ready_timeout < 0:
            raise UsageError("--timeout must be positive and --ready-timeout not negative")
        if self.changed not in CHANGED_POLICIES:
            raise UsageError(f"--changed must be one of: {', '.join(CHANGED_POLICIES)}")
        if (self.rpm is not None and self.rpm <= 0) or (self.tpm is not None and self.tpm <= 0):
            raise UsageError("--rpm and --tpm must be positive")
        if self.max_cost is not None:
            if self.max_cost < 0:
                raise UsageError("--max-cost must not be negative")
            if self.price is None:
                raise UsageError("--max-cost needs --price in=DOLLARS,out=DOLLARS (per 1M tokens)")

    def route_options(self) -> RouteOptions:
        return RouteOptions(
            self.route, self.balance_abs_threshold, self.balance_rel_threshold,
            order_window=self.order_window, concurrency=self.concurrency,
        )  # fmt: skip


#: Outputs locked by a prepared `Job` of this process (real path -> job), to tell a user whose
#: own earlier job still holds the lock that it is theirs, not another run's.
_PREPARED: weakref.WeakValueDictionary[str, Job] = weakref.WeakValueDictionary()


class Job:
    """One request file going to one response file.

    `prepare` takes the output's lock; `run` releases it when it ends, and so do `close`,
    leaving a `with Job(...) as job:` block, and dropping a job that was prepared but not run.
    """

    def __init__(
        self,
        requests: str | os.PathLike[str],
        output: str | os.PathLike[str],
        options: ExecOptions | None = None,
    ) -> None:
        self.requests = os.fspath(requests)
        self.output = os.fspath(output)
        self.options = options or ExecOptions()
        self.input: InputScan | None = None
        self.existing: OutputScan | None = None
        self.source = self.requests  # what is read: the request file, or a copy of a pipe
        check_output(self.output, [self.requests], exec_lock=False)  # the lock comes next
        self._lock = OutputLock(self.output)
        # Released when the job is garbage collected: a prepared job that is dropped must not
        # keep its output locked for the rest of the process.
        self._release_on_drop = weakref.finalize(self, self._lock.release)

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _acquire(self) -> None:
        key = os.path.realpath(self.output)
        try:
            self._lock.acquire()
        except OutputError:
            holder = _PREPARED.get(key)
            if holder is not None and holder is not self:
                raise OutputError(
                    f"{self.output} is locked by another Job of this same process, prepared "
                    "but not yet run or closed: run it, call its close(), or use "
                    "`with Job(...) as job:` so the lock is released when the block ends"
                ) from None
            raise
        _PREPARED[key] = self

    def prepare(self, *, lock: bool = True) -> InputScan:
        """Validate the options, the existing output and the whole input.

        Raises before anything is sent or modified. Takes the output's lock (so no second run
        writes it meanwhile) until `run` ends or `close` is called; `lock=False` only reads
        (a dry run, which must not even create the lock file).
        """
        opts = self.options
        for url in opts.urls:
            parse_endpoint(url)
        select = None
        if opts.shard is not None:
            from jsonlbatch.exec.shard import in_shard

            k, n = opts.shard
            select = lambda cid: in_shard(cid, k, n)  # noqa: E731
        if lock:
            self._acquire()
        try:
            removed = remove_stale_rewrites(self.output) if lock else 0
            if removed:
                self._note(f"removed {removed} temporary files left by killed rewrites")
            if self.source == self.requests and not is_regular(self.requests):
                self._note(
                    f"{self.requests} is not a regular file (a pipe?): copying it to a "
                    "temporary file first, to read it twice (needs as much free disk)"
                )
                self.source = spool(self.requests)
            prefetch(self.output)
            prefetch(self.source)  # read from disk while the output is scanned
            self.existing = scan_output(self.output)
            self.input = scan_input(
                self.source,
                name=self.requests,
                require_model=opts.model is None,
                existing=self.existing,
                retry_failed=opts.retry_failed,
                changed=opts.changed,
                select=select,
            )
        except BaseException:
            self.close()
            raise
        refused = sorted(u for u in self.input.urls if u in NO_STREAM_URLS) if opts.stream else []
        if refused:
            self.close()
            raise UsageError(
                f"--stream is not supported for {', '.join(refused)} (their typed event "
                "streams are not read yet): run these requests without --stream"
            )
        return self.input

    def _note(self, message: str) -> None:
        if not self.options.quiet:
            print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        """Release the output's lock (done by `run` itself; for a job prepared but not run).

        The scans are dropped too: what they found is stale once another run may write the
        output, so a later `run` scans again (and resumes) instead of resending.
        """
        self._lock.release()
        key = os.path.realpath(self.output)
        if _PREPARED.get(key) is self:
            del _PREPARED[key]
        self.input = self.existing = None
        if self.source != self.requests:  # the copy of a pipe: it cannot be re-read anyway
            with contextlib.suppress(OSError):
                os.unlink(self.source)
            self.source = self.requests

    @property
    def models(self) -> list[str]:
        """Model names the requests still to send ask for, most used first."""
        if self.input is None:
            raise RuntimeError("call Job.prepare() first")
        return [m for m, _ in self.input.models.most_common()]

    async def run(
        self,
        urls: Sequence[str] | None = None,
        *,
        keys: Mapping[str, str | None] | None = None,
        watchdog: Callable[[], None] | None = None,
        handle_signals: bool = False,
    ) -> RunSummary:
        """Send what is pending. `keys` gives some URLs credentials of their own (launched
        servers): that API key (None: none) and none of `options.headers`, which, like
        `options.api_key`, go to the other URLs only. `watchdog` is called while
        waiting for servers and may raise (a launcher uses it to end the run when its server
        died for good)."""
        if self.input is None:
            self.prepare()
        try:
            return await _Run(
                self, list(urls or self.options.urls), dict(keys or {}), watchdog, handle_signals
            ).main()
        finally:
            self.close()


def execute(
    requests: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    watchdog: Callable[[], None] | None = None,
    handle_signals: bool = True,
    **options: Any,
) -> RunSummary:
    """Run a request file to completion and return its summary (blocking).

    Options are the fields of `ExecOptions` (`urls=[...]`, `concurrency=`, `model=`, ...).
    Raises `Interrupted` (with `.summary`) on Ctrl-C; re-running with the same arguments resumes.
    """
    job = Job(requests, output, ExecOptions(**options))
    job.prepare()
    return run_coroutine(job.run(watchdog=watchdog, handle_signals=handle_signals))


async def aexecute(
    requests: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    watchdog: Callable[[], None] | None = None,
    **options: Any,
) -> RunSummary:
    """`execute` for callers that already run an event loop (signals are left to them)."""
    job = Job(requests, output, ExecOptions(**options))
    job.prepare()
    return await job.run(watchdog=watchdog)


def run_coroutine(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run on uvloop when it is installed (about a sixth faster here), else on asyncio's loop."""
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


class _Stop(Exception):
    """Raised inside a worker to drop its request unwritten (the run is stopping)."""


class _Run:
    """The state of one `Job.run`: queue, workers, writer, counters."""

    def __init__(
        self,
        job: Job,
        urls: list[str],
        keys: dict[str, str | None],
        watchdog: Callable[[], None] | None,
        handle_signals: bool,
    ) -> None:
        assert job.input is not None and job.existing is not None
        self.job = job
        self.opts = job.options
        self.scan = job.input
        self.urls = urls
        self.keys = keys
        self.watchdog = watchdog
        self.handle_signals = handle_signals
        self.summary = RunSummary(
            output=job.output,
            requests=self.scan.total,
            already_done=self.scan.already_done,
            failed_before=self.scan.failed_before,
            pending=len(self.scan.pending),
        )
        self.progress = Progress(len(self.scan.pending), quiet=self.opts.quiet)
        self.backoff = Backoff(self.opts.backoff_base, self.opts.backoff_cap)
        opts = self.opts
        budget = None
        if opts.price is not None:
            spent = spent_in_output(job.output, opts.price) if opts.max_cost is not None else 0.0
            budget = Budget(opts.price, opts.max_cost, spent)
            self.summary.spent_before = spent
        self.meter = Meter(RateLimiter(opts.rpm, opts.tpm, learn=opts.rate_limits), budget)
        self.progress.extra_source = self.meter.status
        self.model_override: str | None = None
        self.stopping = asyncio.Event()
        self.abort: JsonlbatchError | None = None
        self.signals = 0
        self.retrying = 0
        self._cancel_scheduled = False
        self._out: list[Result] = []
        self._flush_scheduled = False
        self.writer: AppendWriter | None = None
        self.workers: list[asyncio.Task[None]] = []
        self.reader: asyncio.Task[None] | None = None
        self.queue: asyncio.Queue[Request | None] | None = None
        self.preflight: asyncio.Task[None] | None = None

    # -- the run -------------------------------------------------------------------------------

    async def main(self) -> RunSummary:
        started = time.monotonic()
        if self.scan.pending and not self.urls:
            raise UsageError("no endpoint: give --url (or --serve to launch a server)")
        endpoints = [parse_endpoint(u) for u in self.urls]  # before the output is touched
        for url, ep in zip(self.urls, endpoints, strict=True):
            ep.launched = url in self.keys
        if not self.scan.pending:
            self._prepare_output()
            self._close_output()
            self.progress.note(f"nothing to send: all {self.scan.total} requests have a result")
            self.summary.wall_s = time.monotonic() - started
            return self.summary
        self.summary.endpoints.update({ep.name: 0 for ep in endpoints})  # in --url order
        loop = asyncio.get_running_loop()
        if self.handle_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self._on_signal)
        try:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0, ttl_dns_cache=300)
            async with aiohttp.ClientSession(
                connector=connector, trust_env=False, read_bufsize=1 << 20
            ) as session:
                headers = {
                    ep: (
                        auth_headers(ep, self.keys[url])
                        if url in self.keys
                        else auth_headers(ep, self.opts.api_key, self.opts.headers)
                    )
                    for url, ep in zip(self.urls, endpoints, strict=True)
                }
                pool = EndpointPool(
                    endpoints,
                    session,
                    headers,
                    ready_timeout=self.opts.ready_timeout,
                    watchdog=self.watchdog,
                    router=Router(endpoints, self.opts.route_options()),
                )
                self.progress.status_source = lambda: pool.status
                ticker = asyncio.ensure_future(self._tick())
                try:
                    self.preflight = asyncio.ensure_future(self._preflight(pool))
                    try:
                        await self.preflight
                    except asyncio.CancelledError:
                        if not self.signals:
                            raise
                    if not self.stopping.is_set():
                        self._prepare_output()  # servers are fine: only now touch the output
                        self.summary.started_at = time.time()
                        self.progress.start()
                        before = await scrape_all(session, endpoints, headers)
                        await self._send_all(session, pool)
                        if not self.signals and self.abort is None:
                            after = await scrape_all(session, endpoints, headers)
                            self.summary.servers = compare(endpoints, before, after)
                            if not keep_servers(self.job.output, self.summary):
                                self.progress.note("cannot keep the servers' metrics")
                finally:
                    ticker.cancel()
                    await asyncio.gather(ticker, return_exceptions=True)
                    await pool.close()
        finally:
            if self.handle_signals:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)
            self._close_output()
            self._meter_summary()
            self.progress.close(self.summary)
            self.summary.wall_s = time.monotonic() - started
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

    def _meter_summary(self) -> None:
        limiter, budget = self.meter.limiter, self.meter.budget
        self.summary.rate_limited = limiter.rate_limited
        self.summary.limits = limiter.describe()
        if budget is not None:
            self.summary.spent = budget.spent

    def _prepare_output(self) -> None:
        """Cut a torn tail and drop lines about to be retried; only now is the output touched."""
        existing = self.job.existing
        assert existing is not None
        if existing.torn:
            cut = repair_tail(self.job.output, existing.keep_bytes)
            self.summary.repaired_bytes = cut
            self.progress.note(f"repaired {self.job.output}: cut a torn last line ({cut} bytes)")
        if self.scan.already_done:
            self.progress.note(
                f"resuming: {self.scan.already_done} of {self.scan.total} requests already have "
                f"a result in {self.job.output}"
            )
        if self.scan.foreign:
            self.progress.note(
                f"warning: {self.scan.foreign} ids in {self.job.output} have no request in "
                f"{self.job.requests} (lines of another job?)"
            )
        if self.scan.unfingerprinted:
            self.progress.note(
                f"note: {self.scan.unfingerprinted} results in {self.job.output} were written "
                "without a request fingerprint (before jsonlbatch recorded them): accepted as "
                "they are, unchecked against the requests"
            )
        if self.scan.changed:
            verb = "re-sending" if self.opts.changed == "resend" else "keeping the old results of"
            self.progress.note(
                f"{verb} {self.scan.changed} requests changed since their results were written "
                f"({', '.join(self.scan.changed_ids)}{', ...' if self.scan.changed > 5 else ''})"
            )
        if self.scan.replace:
            replace = self.scan.replace

            def keep(line: bytes) -> bool:
                return line_custom_id(line) not in replace

            rewrite_atomically(self.job.output, filter_lines(self.job.output, keep))
            self.job._lock.hold_output()  # the lock on the replaced file went with it
            if self.scan.retried:
                self.progress.note(f"retrying {self.scan.retried} failed requests")
        self.writer = AppendWriter(self.job.output)
        self.job._lock.hold_output()  # now that the output exists (a first run creates it)

    def _close_output(self) -> None:
        self._flush()
        if self.writer is not None:
            self.writer.close()

    async def _preflight(self, pool: EndpointPool) -> None:
        """Wait for the servers and check they serve the models asked for.

        Endpoints that come up later are checked by the same rule before they get requests.
        """
        wanted = self.opts.model
        if wanted != "auto":
            pool.wanted = [wanted] if wanted else list(self.scan.models)
        answered = await pool.preflight()
        known = [(ep, names) for ep, names in answered if names is not None]
        for ep, names in answered:
            if names is None:
                self.progress.note(f"{ep.name} lists no models; skipping the model check")
        if wanted == "auto":
            common = set.intersection(*(set(n) for _, n in known)) if known else set()
            if len(common) != 1:
                served = ", ".join(sorted({m for _, n in known for m in n})) or "none"
                raise ModelNotServedError(
                    "--model auto needs exactly one model served by every endpoint; "
                    f"served: {served}"
                )
            self.model_override = common.pop()
            self.progress.note(f"--model auto: using {self.model_override}")
        else:
            self.model_override = wanted
        asked = [self.model_override] if self.model_override else list(self.scan.models)

        def missing(names: list[str] | None) -> str | None:
            return next((m for m in asked if names is not None and m not in names), None)

        for ep, names in known:
            model = missing(names)
            if model is not None:
                uses = "" if wanted else f" ({self.scan.models[model]} requests use it)"
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
                self.progress.note(f"{ep.name} is up but {refusal}; not using it")
            return refusal

        pool.admit = admit

    async def _send_all(self, session: aiohttp.ClientSession, pool: EndpointPool) -> None:
        n_workers = min(self.opts.concurrency, len(self.scan.pending))
        queue: asyncio.Queue[Request | None] = asyncio.Queue(maxsize=2 * n_workers)
        self.queue = queue
        self.reader = reader = asyncio.ensure_future(self._read(queue, n_workers))
        self.workers = [
            asyncio.ensure_future(self._work(queue, session, pool)) for _ in range(n_workers)
        ]
        try:
            done, _ = await asyncio.wait(
                [reader, *self.workers], return_when=asyncio.FIRST_EXCEPTION
            )
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            for task in (reader, *self.workers):
                task.cancel()
            await asyncio.gather(reader, *self.workers, return_exceptions=True)

    async def _read(self, queue: asyncio.Queue[Request | None], n_workers: int) -> None:
        override = self.model_override
        stat = stat_input(self.job.source)
        if (stat.st_size, stat.st_mtime_ns) != (self.scan.size, self.scan.mtime_ns):
            raise InputError(
                f"{self.job.requests} changed after it was checked; run the command again"
            )
        route = self.opts.route_options()
        for raw in ordered_lines(self.job.source, self.scan.pending, route):
            obj = orjson.loads(raw)
            url, body = obj["url"], obj["body"]
            mark = fingerprint(raw, url, body)  # of the request as the file asks it
            if override is not None:
                body["model"] = override
            await queue.put(Request(obj["custom_id"], url, body, fingerprint=mark))
            if self.stopping.is_set():
                break
        for _ in range(n_workers):
            await queue.put(None)

    async def _work(
        self,
        queue: asyncio.Queue[Request | None],
        session: aiohttp.ClientSession,
        pool: EndpointPool,
    ) -> None:
        while True:
            request = await queue.get()
            if request is None or self.stopping.is_set():
                return
            try:
                result = await self._attempts(request, session, pool)
            except _Stop:
                return
            except JsonlbatchError as exc:
                self._stop(exc)
                return
            # last in metrics, where a resume reads it without decoding the line
            result.metrics["fingerprint"] = request.fingerprint
            self._emit(result)

    async def _attempts(
        self, req: Request, session: aiohttp.ClientSession, pool: EndpointPool
    ) -> Result:
        """Send one request, metered: within the rate limits and the budget."""
        try:
            ticket = await self.meter.start(req)
        except BudgetReached:
            self._stop_for_budget()
            raise _Stop from None
        try:
            result = await self._send(req, session, pool, ticket)
        except BaseException:
            self.meter.abandon(ticket)
            raise
        self.meter.finish(ticket, result)
        return result

    async def _send(
        self, req: Request, session: aiohttp.ClientSession, pool: EndpointPool, ticket: Ticket
    ) -> Result:
        """Send one request until it succeeds, fails for good, or runs out of retries."""
        if self.opts.stream and req.url in STREAM_URLS:
            stream_body(req.body)
        payload = orjson.dumps(req.body)
        route_key = pool.router.key(req.body)
        streaming = req.body.get("stream") is True
        attempts = 0
        raced = False
        while True:
            await self.meter.before_send(ticket)
            endpoint = await pool.acquire(route_key)
            if self.stopping.is_set():
                pool.release(endpoint)
                raise _Stop
            attempts += 1
            start_wall, start = time.time(), time.perf_counter()
            retry_after = None
            streamed: StreamReader | None = None
            try:
                async with session.post(
                    endpoint.url_for(req.url),
                    data=payload,
                    headers=pool.headers[endpoint],
                    proxy=endpoint.proxy,
                    timeout=aiohttp.ClientTimeout(total=self.opts.timeout, sock_connect=30),
                    allow_redirects=False,  # a redirect could carry our credentials elsewhere
                ) as resp:
                    status = resp.status
                    if status == 200 and (streaming or resp.content_type == "text/event-stream"):
                        raw, streamed = await read_answer(
                            resp.content.iter_any(), chat=req.url != COMPLETIONS_URL
                        )
                    else:
                        raw = await resp.read()
                    request_id = resp.headers.get("x-request-id")
                    if status == 429 or status >= 500:
                        retry_after = parse_retry_after(resp.headers.get("Retry-After"))
                    self.meter.after_answer(ticket, status, resp.headers, retry_after)
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
                # Refused, unresolvable or silent: the server is down or cold, not this
                # request's fault. Wait for it without using an attempt.
                pool.set_aside(endpoint, describe_exception(exc))
                attempts -= 1
                continue
            except aiohttp.ServerDisconnectedError as exc:
                if not raced:  # a keep-alive connection closed under us: not an attempt
                    raced = True
                    attempts -= 1
                    continue
                failure = ("connection_error", describe_exception(exc))
            except asyncio.TimeoutError:
                failure = ("request_timeout", f"no response within {self.opts.timeout:g}s")
            except StreamError as exc:  # an error event or a cut stream after a 200
                failure = (exc.code, str(exc))
            except (aiohttp.ClientError, OSError) as exc:
                failure = ("connection_error", describe_exception(exc))
            else:
                failure = None
            finally:
                pool.release(endpoint)
            end = time.perf_counter()
            metrics = {
                "attempts": attempts,
                "endpoint": endpoint.name,
                "start_time": round(start_wall, 6),
                "latency_s": round(end - start, 6),
            }
            if failure is None and streamed is not None:
                body = streamed.body()
                reason = unusable_reason(req.url, body)
                if reason is None:
                    metrics.update(streamed.metrics(start, end))
                    pool.record_success(endpoint)
                    return Result(
                        req.custom_id, status, body, request_id or body["id"], None, metrics
                    )
                failure = ("invalid_response", f"HTTP {status} stream without an answer ({reason})")
            if failure is None:
                result, verdict = http_result(req, status, raw, request_id, metrics)
                if verdict is Verdict.OK:
                    pool.record_success(endpoint)
                    return result
                if verdict is Verdict.ABORT:
                    raise AuthenticationError(
                        f"{endpoint.name} rejected the credentials (HTTP {status}); check "
                        "--api-key or OPENAI_API_KEY. Nothing more was sent; re-run to resume"
                    )
                if verdict is Verdict.FINAL:
                    return result
                if status == 503:  # starting or overloaded: probe /health until it is ready
                    pool.set_aside(endpoint, "HTTP 503 (starting or overloaded)")
                elif status >= 500 or result.status_code is None:  # 5xx, or a 2xx that is no answer
                    pool.record_failure(endpoint, f"HTTP {status}")
            else:
                code, message = failure
                pool.record_failure(endpoint, message)
                result = Result(
                    req.custom_id, None, error={"code": code, "message": redact(message)}
                )
                result.metrics = metrics
            if attempts > self.opts.max_retries:
                return result
            self.summary.retries += 1
            if endpoint.up:  # a set-aside endpoint is waited for in acquire() instead
                await self._pause(self.backoff.delay(attempts, retry_after))

    async def _pause(self, seconds: float) -> None:
        """Back off before a retry; give up at once if the run is stopping."""
        self.retrying += 1
        try:
            await asyncio.wait_for(self.stopping.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            return
        finally:
            self.retrying -= 1
        raise _Stop

    # -- output --------------------------------------------------------------------------------

    def _emit(self, result: Result) -> None:
        self._out.append(result)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Write every result finished in this loop iteration with one os.write; count them
        only once written. A failed write stops the run (the next run resends)."""
        self._flush_scheduled = False
        if not self._out or self.writer is None:
            return
        results, self._out = self._out, []
        try:
            self.writer.write(b"".join(r.to_line() for r in results))
        except OutputError as exc:
            self._stop(exc)
            return
        for result in results:
            self.summary.count(result)
            if "ttft_s" in result.metrics:
                self.progress.record_ttft(result.metrics["ttft_s"])

    async def _tick(self) -> None:
        last_sync = time.monotonic()
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(0.5)
            self.progress.update(self.summary, self.retrying)
            if time.monotonic() - last_sync > _FSYNC_EVERY and self.writer is not None:
                last_sync = time.monotonic()
                await loop.run_in_executor(None, self.writer.fsync)

    # -- stopping ------------------------------------------------------------------------------

    def _stop_for_budget(self) -> None:
        """--max-cost: send nothing more; requests in flight finish (however long they take)."""
        if self.summary.budget_stopped or self.stopping.is_set():
            return
        self.summary.budget_stopped = True
        budget = self.meter.budget
        assert budget is not None
        self.progress.note(
            f"budget: ${budget.spent:,.4f} spent and up to ${budget.reserved:,.4f} in flight; the "
            f"next request could pass --max-cost ${budget.max_cost:,.2f}: sending nothing more"
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
        if self.reader is not None:
            self.reader.cancel()
        if self.queue is not None:  # wake idle workers: queued requests stay pending
            while not self.queue.empty():
                self.queue.get_nowait()
            for _ in self.workers:
                self.queue.put_nowait(None)
        if cancel or abort is not None:
            self._cancel_scheduled = True
            delay = 0.0 if abort is not None else self.opts.grace
            asyncio.get_running_loop().call_later(delay, self._cancel_workers)

    def _cancel_workers(self) -> None:
        for task in self.workers:
            task.cancel()

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
            self._flush()
            os._exit(130)

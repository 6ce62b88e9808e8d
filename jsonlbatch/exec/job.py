"""`jsonlbatch exec` as a library: a request file, its output file, and the run between them.

The shape of a run, each step in a module of its own:

1. `Job.prepare()` (here) takes the output's lock, scans the existing output (what is done) and
   validates the whole input (what is asked) before anything is sent or modified (`input_scan.py`),
   so bad input changes nothing.
2. `Job.run()` hands over to the run loop (`run_loop.py`): endpoint pools and the servers' model
   check (`model_pools.py`, `preflight.py`), then the pending lines through a bounded queue to a fixed
   pool of workers that send them (`sender.py`: meter, attempts, retries, on-answer check) and
   record each result as one whole output line (`recorder.py`). Killing the process at any moment
   loses at most requests in flight, which the next run sends again.

Memory is bounded by the concurrency: the input is re-read line by line and only compact state
(ids as hashes in a compact table, byte offsets of pending lines) is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
import weakref
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from jsonlbatch.errors import OutputError, UsageError
from jsonlbatch.exec.exec_options import ExecOptions
from jsonlbatch.exec.hooks.answer_cache import RunCache
from jsonlbatch.exec.hooks.check_hook import Check, chain
from jsonlbatch.exec.hooks.contract_check import AnswerChecker
from jsonlbatch.exec.hooks.seams import CACHE_AND_STORE, NO_SEAMS, Seams
from jsonlbatch.exec.hooks.store_hook import EarlyAnswers, Vetter
from jsonlbatch.exec.hooks.tool_call_parser import ToolCallParser
from jsonlbatch.exec.output.run_summary import RunSummary
from jsonlbatch.exec.prepare.file_refs import FileRefs
from jsonlbatch.exec.prepare.input_scan import InputScan, OutputScan, scan_input, scan_output
from jsonlbatch.exec.route.endpoints import parse_endpoint
from jsonlbatch.exec.route.router import window_group
from jsonlbatch.exec.run_loop import Run
from jsonlbatch.exec.run_setup import Prepared
from jsonlbatch.exec.send.file_collect import open_files_dir
from jsonlbatch.exec.send.streaming import NO_STREAM_URLS
from jsonlbatch.file_io.jsonl import (
    filter_lines,
    is_regular,
    prefetch,
    remove_stale_rewrites,
    rewrite_atomically,
    spool,
)
from jsonlbatch.file_io.output_guard import OutputLock, check_output

__all__ = ["ExecOptions", "Job", "refuse_running_loop", "run_coroutine"]

_T = TypeVar("_T")

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
        *,
        seams: Seams | None = None,
    ) -> None:
        self.requests = os.fspath(requests)
        self.output = os.fspath(output)
        self.options = options or ExecOptions()
        #: What plugs into the run (exec/hooks/seams.py): checks, a store, pools, listeners.
        self.seams = seams or NO_SEAMS
        if self.options.cache is not None and self.seams.store is not None:
            raise UsageError(CACHE_AND_STORE)
        self.input: InputScan | None = None
        self.existing: OutputScan | None = None
        self.early: EarlyAnswers | None = None  # lines the store answered during the scan
        #: The answer contract (contract_check.py) of this output: made once the output is
        #: scanned, it checks stored answers during the input scan and sent ones in the run.
        self.contract: AnswerChecker | None = None
        #: the loop the run goes on and what stops it there (`stop`, `stoppable`)
        self._running: tuple[asyncio.AbstractEventLoop, Callable[[], None]] | None = None
        #: The local files its requests name as `file://PATH` (prepare/file_refs.py).
        self.file_refs = FileRefs()
        self._stop_asked = False
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
            from jsonlbatch.exec.prepare.shard import in_shard

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
            if opts.cache is not None and self.seams.store is None and lock:
                self._open_cache()  # an unusable folder fails here, before anything runs
            if opts.files_dir is not None and lock:  # the same for --files-dir
                open_files_dir(opts.files_dir, self.output)
            prefetch(self.output)
            prefetch(self.source)  # read from disk while the output is scanned
            store = self.seams.the_store
            self.existing = scan_output(self.output)
            self.contract = AnswerChecker(
                self.output, reask=opts.reask, feedback=opts.reask_feedback,
                done=(self.existing.ok, self.existing.failed), enabled=opts.schema_check,
            )  # fmt: skip
            source = self.seams.source  # a rollout: its requests are made as it goes
            if (store is not None and lock and store.answers_early and not opts.cache_key_url
                    and source is None):  # fmt: skip
                vetter = Vetter(store, self.checks(schemas=True))
                self.early = EarlyAnswers(store, vetter, self.output, os.urandom(4).hex())
            if store is not None and len(self.existing.ok):
                store.resume_into(self.output)  # its draws are not given to other lines
            self.input = scan_input(
                self.source,
                name=self.requests,
                require_model=opts.model is None,
                existing=self.existing if source is None else None,
                retry_failed=opts.retry_failed,
                changed=opts.changed,
                select=select,
                answer=self.early,
                refs=self.file_refs,
                group=window_group(opts.route_options()),  # the look-ahead window's, per line
            )
            if self.early is not None:
                self.early.settle(self.input, self.source)
            if source is not None:  # what it has finished, what changed since
                source.prepare(self.input, self.existing)
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

    def checks(self, *, schemas: bool) -> Check | None:
        """Every check an answer passes, in order: the answer contract (when a request may
        declare a schema), then the caller's. Sent and stored answers alike."""
        parse = self.options.parse_tool_calls
        parser = ToolCallParser(parse) if parse is not None else None  # first: the others see calls
        return chain(parser, self.contract if schemas else None, self.seams.the_check)

    def _open_cache(self) -> None:
        """`--cache DIR`: the answer cache (jsonlbatch/cache/) as the run's before-send lookup
        and after-answer store."""
        opts = self.options
        assert opts.cache is not None
        cache = RunCache(
            opts.cache, self.source, mode=opts.cache_mode, model=opts.model, price=opts.price,
            key_urls=opts.urls if opts.cache_key_url else None,
        )  # fmt: skip
        self.seams = dataclasses.replace(self.seams, store=cache)

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
        if self.early is not None:
            self.early.discard()
            self.early = None
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
        run_urls = list(urls or self.options.urls)
        store = self.seams.the_store
        if self.options.cache_key_url and store is not None:
            store.key_by(run_urls)  # launched servers' URLs included
        try:
            assert self.input is not None and self.existing is not None
            assert self.contract is not None
            prepared = Prepared(
                requests=self.requests, output=self.output, source=self.source,
                options=self.options, scan=self.input, existing=self.existing, lock=self._lock,
                checks=self.checks(schemas=bool(self.input.schemas)), contract=self.contract,
                early=self.early, file_refs=self.file_refs,
            )  # fmt: skip
            run = Run(
                prepared,
                urls=run_urls,
                keys=dict(keys or {}),
                watchdog=watchdog,
                handle_signals=handle_signals,
                seams=self.seams,
            )
            with self.stoppable(run.request_stop):
                return await run.main()
        finally:
            self.close()

    @contextlib.contextmanager
    def stoppable(self, request_stop: Callable[[], None]) -> Iterator[None]:
        """While the block runs on this thread's event loop, `stop()` calls `request_stop`
        there: the run loop's, or a target that sends the prepared job itself (a provider's
        Batch API). A stop asked before the block calls it at once."""
        self._running = (asyncio.get_running_loop(), request_stop)
        try:
            if self._stop_asked:
                request_stop()
            yield
        finally:
            self._running = None

    def rewrite_output(self, keep: Callable[[bytes], bool]) -> None:
        """Drop the output's lines `keep` refuses, atomically, keeping the lock on the new
        file (a target that writes the output itself: a provider's batch results)."""
        rewrite_atomically(self.output, filter_lines(self.output, keep))
        self._lock.hold_output()

    def stop(self) -> None:
        """End the run as a first Ctrl-C does (no new requests; those in flight get
        `options.grace` seconds). Safe from any thread; before the run starts, it stops at once.
        """
        self._stop_asked = True
        running = self._running
        if running is not None:
            loop, request_stop = running
            loop.call_soon_threadsafe(request_stop)


def refuse_running_loop(blocking: str, awaitable: str) -> None:
    """A blocking call made where an event loop already runs (a Jupyter notebook, an async
    application) cannot start its own loop: say what to call instead, before anything starts."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise UsageError(
        f"{blocking}() cannot run inside a running event loop (a Jupyter notebook runs one): "
        f"use `await {awaitable}(...)` with the same arguments, or call {blocking}() in a "
        "worker thread"
    )


def run_coroutine(
    coro: Coroutine[Any, Any, _T], names: tuple[str, str] = ("run_coroutine", "the coroutine")
) -> _T:
    """Run on uvloop when it is installed (about a sixth faster here), else on asyncio's loop.
    `names` (the blocking call, its awaitable twin) go into the message when a loop already
    runs; the coroutine is then closed, so no "never awaited" warning follows the message."""
    try:
        refuse_running_loop(*names)
    except UsageError:
        coro.close()
        raise
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        # Ctrl-C held back while the loop is closed and freed: a KeyboardInterrupt raised
        # inside its `__del__` is printed as a traceback and lost; held, it comes right after.
        with _sigint_held():
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()
                del loop


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """Block SIGINT for the block (POSIX): one that arrives meanwhile is delivered after it."""
    block = getattr(signal, "pthread_sigmask", None)
    if block is None:
        yield
        return
    old = block(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        block(signal.SIG_SETMASK, old)

"""Recording: results become output lines, and the output is made ready for a resume.

The output is touched only once the servers are known to be fine (`prepare`): a torn last line
is cut and the lines about to be retried are dropped, atomically. Then each finished result is
appended as one whole line; results finished in the same loop iteration share one `os.write`,
and a result counts as done (summary, events) only once written. Killing the process at any
moment loses at most the results not yet written, which the next run sends again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import orjson

from jsonlbatch.batch_format.records import Result
from jsonlbatch.errors import OutputError
from jsonlbatch.exec.hooks.store_hook import EarlyAnswers
from jsonlbatch.exec.output.events import Answered, EventBus, Failed
from jsonlbatch.exec.output.run_summary import RunSummary
from jsonlbatch.exec.prepare.input_scan import InputScan, OutputScan, line_custom_id
from jsonlbatch.file_io.jsonl import AppendWriter, filter_lines, repair_tail, rewrite_atomically
from jsonlbatch.file_io.output_guard import OutputLock

FSYNC_EVERY = 5.0  # seconds: durability against power loss without an fsync per line


def answered_event(line: bytes) -> Answered:
    """The `Answered` event of a written answer line (a stored answer, written in a chunk)."""
    obj = orjson.loads(line)
    status = (obj.get("response") or {}).get("status_code") or 0
    return Answered(obj["custom_id"], status, obj.get("metrics") or {})


class Recorder:
    """Owns the output file during a run: preparation, appends, fsyncs, closing."""

    def __init__(
        self,
        *,
        output: str,
        requests: str,
        lock: OutputLock,
        scan: InputScan,
        existing: OutputScan,
        summary: RunSummary,
        bus: EventBus,
        note: Callable[[str], None],
        changed_policy: str,
    ) -> None:
        self.output = output
        self.requests = requests
        self.lock = lock
        self.scan = scan
        self.existing = existing
        self.summary = summary
        self.bus = bus
        self.note = note
        self.changed_policy = changed_policy
        self.writer: AppendWriter | None = None
        #: Called with the error when a write fails (the run stops; the next run resends).
        self.on_error: Callable[[OutputError], None] = lambda exc: None
        self._out: list[Result] = []
        self._flush_scheduled = False

    def prepare(self) -> None:
        """Cut a torn tail and drop lines about to be retried; only now is the output touched."""
        scan, output = self.scan, self.output
        if self.existing.torn:
            cut = repair_tail(output, self.existing.keep_bytes)
            self.summary.repaired_bytes = cut
            self.note(f"repaired {output}: cut a torn last line ({cut} bytes)")
        if scan.already_done:
            done = scan.done_words or f"requests already have a result in {output}"
            self.note(f"resuming: {scan.already_done} of {scan.total} {done}")
        if scan.foreign:
            self.note(
                f"warning: {scan.foreign} ids in {output} have no request in "
                f"{self.requests} (lines of another job?)"
            )
        if scan.unfingerprinted:
            self.note(
                f"note: {scan.unfingerprinted} results in {output} were written "
                "without a request fingerprint (before jsonlbatch recorded them): accepted as "
                "they are, unchecked against the requests"
            )
        if scan.changed:
            verb = "re-sending" if self.changed_policy == "resend" else "keeping the old results of"
            self.note(
                f"{verb} {scan.changed} requests changed since their results were written "
                f"({', '.join(scan.changed_ids)}{', ...' if scan.changed > 5 else ''})"
            )
        if scan.replace:
            replace = scan.replace

            def keep(line: bytes) -> bool:
                return line_custom_id(line) not in replace

            rewrite_atomically(output, filter_lines(output, keep))
            self.lock.hold_output()  # the lock on the replaced file went with it
            if scan.retried:
                self.note(f"retrying {scan.retried} failed requests")
        self.writer = AppendWriter(output)
        self.lock.hold_output()  # now that the output exists (a first run creates it)

    def emit(self, result: Result) -> None:
        """Queue a finished result; it is written at the end of this loop iteration."""
        self._out.append(result)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write every result finished in this loop iteration with one os.write; count them
        only once written. A failed write stops the run (the next run resends)."""
        self._flush_scheduled = False
        if not self._out or self.writer is None:
            return
        results, self._out = self._out, []
        try:
            self.writer.write(b"".join(r.to_line() for r in results))
        except OutputError as exc:
            self.on_error(exc)
            return
        answered, failed = self.bus.wants(Answered), self.bus.wants(Failed)
        for result in results:
            self.summary.count(result)
            if answered and result.ok:
                self.bus.emit(Answered(result.custom_id, result.status_code or 0, result.metrics))
            elif failed and not result.ok:
                error = result.error or {}
                code = error.get("code") or f"http_{result.status_code}"
                self.bus.emit(Failed(result.custom_id, code, str(error.get("message", ""))))

    def write_early(self, early: EarlyAnswers | None) -> None:
        """Append the lines a store answered during the input scan (`store_hook.EarlyAnswers`),
        in chunks of whole lines. A failed write stops the run, as for any result; the next
        run answers what was not written again."""
        if early is None or not early.count or self.writer is None:
            return
        self.flush()
        answered = self.bus.wants(Answered)
        for chunk in early.drain():
            try:
                self.writer.write(chunk)
            except OutputError as exc:
                self.on_error(exc)
                return
            if answered:  # as for a sent answer: one `Answered` per line, once written
                for line in chunk.splitlines():
                    self.bus.emit(answered_event(line))
        self.summary.succeeded += early.count
        self.summary.cache_hits += early.count
        self.summary.schema_valid += early.valid  # the answers the contract accepted

    async def sync_every(self, seconds: float = FSYNC_EVERY) -> None:
        """fsync the output every `seconds` (in a thread) until cancelled."""
        loop = asyncio.get_running_loop()
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.5)
            if time.monotonic() - last > seconds and self.writer is not None:
                last = time.monotonic()
                await loop.run_in_executor(None, self.writer.fsync)

    def close(self) -> None:
        self.flush()
        if self.writer is not None:
            self.writer.close()

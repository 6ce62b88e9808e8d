"""A finished batch into OUT: its results downloaded, each answer through the run's checks,
one line per request, and the run's events for each line written.

Every answer from a provider takes the steps an answer exec sent takes after it is read
(`batch_result_check.py`: the endpoint's shape, the answer contract unless `--no-schema-check`,
the caller's `Seams.check`), and each line written is told to the run's subscribers as exec's
are (`Answered`, `Failed`: the live counters, metrics and a caller's listeners count a Batch
API run too). Requests the batch ended without answering get a failure line saying how it
ended (`batch_expired`, ...), so OUT has exactly one line per request.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from typing import Any

import orjson

from jsonlbatch.batch_format.records import is_failure
from jsonlbatch.batchapi.client.batch_api import BatchProvider
from jsonlbatch.batchapi.client.batch_parts import marks_path, read_asked, read_marks
from jsonlbatch.batchapi.client.batch_result_check import ResultChecks
from jsonlbatch.batchapi.client.providers import Provider
from jsonlbatch.batchapi.client.result_merge import (
    Unreadable,
    chunks,
    merged_lines,
    missing_reason,
)
from jsonlbatch.batchapi.client.safe_names import safe_name
from jsonlbatch.batchapi.client.submit_options import SubmitSummary
from jsonlbatch.batchapi.client.submit_state import Part, State
from jsonlbatch.batchapi.formats.batch_objects import failure_line
from jsonlbatch.exec.job import Job
from jsonlbatch.exec.output.events import Answered, EventBus, Failed
from jsonlbatch.file_io.jsonl import AppendWriter
from jsonlbatch.pricing.prices import PriceBook


def run_events(job: Job) -> EventBus:
    """The run's event bus, with the caller's (and the watchers') subscribers."""
    bus = EventBus()
    for callback, types in job.seams.subscribers:
        bus.subscribe(callback, *types)
    return bus


class PartMerge:
    """Merges the parts of one run into its output."""

    def __init__(
        self,
        job: Job,
        state: State,
        provider: Provider,
        book: PriceBook,
        summary: SubmitSummary,
        present: Callable[[str], bool],
        note: Callable[[str], None],
    ) -> None:
        self.job, self.state, self.provider, self.book = job, state, provider, book
        self.summary, self.present, self.note = summary, present, note
        # the checks exec's answers take (the contract, as `--no-schema-check` says; then the
        # caller's); the contract's re-asks are refused with --batch-api (cli/option_use.py)
        self.check = job.checks(schemas=True)
        self.bus = run_events(job)

    async def merge(self, api: BatchProvider, part: Part, batch: dict[str, Any]) -> None:
        """Append a finished batch's lines to OUT, then mark the part merged."""
        folder, output = self.state.folder, self.job.output
        downloads = []
        for key in ("output_file_id", "error_file_id"):
            file_id = batch.get(key)
            if file_id:
                # the server's id is data: reduced to a name of ours, never a path
                dest = folder / f"{safe_name(part.batch_id)}.{key[:-8]}.jsonl"
                await api.download(file_id, dest)
                downloads.append(dest)
        left = read_marks(folder, part)  # id as sent -> (custom_id, fingerprint); what stays
        code, message = missing_reason(batch)  # there gets a failure line
        written = failed = 0
        batch_id = part.batch_id or ""
        unreadable = Unreadable()
        with AppendWriter(output) as writer:
            asked = read_asked(folder, part, self.job.requests, self.provider)
            checks = ResultChecks(self.check, asked)
            merged = merged_lines(downloads, left, batch_id, self.present, self.book, unreadable)
            for chunk in chunks(checks(merged)):
                lines = [m.line for m in chunk]
                writer.write(b"".join(lines))
                written += len(chunk)
                failed += sum(m.failed for m in chunk)
                for m in chunk:
                    self.summary.add_cost(m.cost, m.failed)
                self._tell(lines)
            if unreadable.count:
                message += f" ({unreadable.count} lines of its results could not be read)"
                self.summary.unreadable += unreadable.count
                print(unreadable.note(batch_id), file=sys.stderr, flush=True)
            missing = [(cid, mark) for cid, mark in left.values() if not self.present(cid)]
            for lines in chunks(
                failure_line(c, code, message, batch_id=batch_id, fingerprint=m) for c, m in missing
            ):
                writer.write(b"".join(lines))
                written += len(lines)
                failed += len(lines)
                self._tell(lines)
        part.merged = True
        self.state.save()
        self.summary.merged += written
        self.summary.failed += failed
        for path in (*downloads, folder / part.path, folder / marks_path(part)):
            path.unlink(missing_ok=True)
        if not self.state.open_parts:
            shutil.rmtree(folder, ignore_errors=True)
        self.note(f"{part.batch_id}: {batch.get('status')}; {written} lines added to {output}")

    def _tell(self, lines: list[bytes]) -> None:
        """`Answered` or `Failed` for each line written, as exec's recorder tells them."""
        answered, failed = self.bus.wants(Answered), self.bus.wants(Failed)
        if not (answered or failed):
            return
        for raw in lines:
            line = orjson.loads(raw)
            response = line.get("response") if isinstance(line.get("response"), dict) else {}
            status = response.get("status_code")
            bad = is_failure(line)
            if not bad and answered:
                metrics = line.get("metrics") if isinstance(line.get("metrics"), dict) else {}
                self.bus.emit(Answered(line["custom_id"], status if isinstance(status, int) else 0,
                                       metrics))  # fmt: skip
            elif bad and failed:
                error = line.get("error") if isinstance(line.get("error"), dict) else {}
                code = error.get("code") or f"http_{status}"
                self.bus.emit(Failed(line["custom_id"], str(code), str(error.get("message", ""))))

"""The `Recorder` (exec/output/recorder.py) on real files, without a run: preparing an output for a
resume, writing the results of one loop iteration at once, and what a failed write does."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from batchutil import read_results, write_requests

from jsonlbatch.batch_format.records import Result
from jsonlbatch.errors import OutputError
from jsonlbatch.exec.output.events import Answered, EventBus, Failed
from jsonlbatch.exec.output.recorder import Recorder
from jsonlbatch.exec.output.run_summary import RunSummary
from jsonlbatch.exec.prepare.input_scan import scan_input, scan_output
from jsonlbatch.file_io.output_guard import OutputLock


def ok(custom_id: str, endpoint: str = "http://a/v1", tokens: int = 2) -> Result:
    body = {"id": custom_id, "choices": [{"message": {"role": "assistant", "content": "hi"}}]}
    metrics = {"endpoint": endpoint, "prompt_tokens": 1, "completion_tokens": tokens}
    return Result(custom_id, 200, body, None, None, metrics)


def failed(custom_id: str, code: str = "http_400") -> Result:
    return Result(custom_id, 400, {"error": "no"}, None, {"code": code, "message": "no"}, {})


class Recording:
    """A Recorder over `tmp_path`'s files, with what it noted and emitted."""

    def __init__(self, tmp_path: Path, count: int, output: bytes = b"", **scan: object) -> None:
        self.requests, self.output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        write_requests(self.requests, count)
        if output:
            self.output.write_bytes(output)
        self.lock = OutputLock(self.output)
        self.lock.acquire()
        existing = scan_output(self.output)
        self.scan = scan_input(self.requests, existing=existing, **scan)  # type: ignore[arg-type]
        self.summary = RunSummary(output=str(self.output))
        self.bus = EventBus()
        self.events: list[object] = []
        self.bus.subscribe(self.events.append, Answered, Failed)
        self.notes: list[str] = []
        self.errors: list[OutputError] = []
        self.recorder = Recorder(
            output=str(self.output), requests=str(self.requests), lock=self.lock,
            scan=self.scan, existing=existing, summary=self.summary, bus=self.bus,
            note=self.notes.append, changed_policy="refuse",
        )  # fmt: skip
        self.recorder.on_error = self.errors.append

    def close(self) -> None:
        self.recorder.close()
        self.lock.release()


@pytest.fixture
def recording(tmp_path: Path) -> Iterator[type[Recording]]:
    made: list[Recording] = []

    def make(count: int, output: bytes = b"", **scan: object) -> Recording:
        made.append(Recording(tmp_path, count, output, **scan))
        return made[-1]

    yield make  # type: ignore[misc]
    for rec in made:
        rec.close()


def test_prepare_cuts_a_torn_tail_and_drops_the_lines_to_retry(recording) -> None:
    done = ok("req-0").to_line()
    torn = b'{"id": "batch_req_x", "custom_id": "req-2", "resp'
    rec = recording(3, done + failed("req-1").to_line() + torn, retry_failed=True)
    assert rec.output.read_bytes().endswith(torn)  # nothing touched before prepare
    rec.recorder.prepare()
    assert rec.output.read_bytes() == done  # the torn tail cut, the failure to retry dropped
    assert rec.summary.repaired_bytes == len(torn)
    assert rec.notes[0] == f"repaired {rec.output}: cut a torn last line ({len(torn)} bytes)"
    assert "resuming: 1 of 3 requests already have a result" in rec.notes[1]
    assert any("were written without a request fingerprint" in n for n in rec.notes)
    assert rec.notes[-1] == "retrying 1 failed requests"


def test_prepare_names_lines_of_another_job(recording) -> None:
    rec = recording(2, ok("someone-else").to_line())
    rec.recorder.prepare()
    assert any(
        n.startswith(f"warning: 1 ids in {rec.output} have no request in {rec.requests}")
        for n in rec.notes
    )


async def test_results_of_one_loop_iteration_go_out_in_one_write(recording) -> None:
    rec = recording(3)
    rec.recorder.prepare()
    writes: list[bytes] = []
    writer = rec.recorder.writer
    real_write = writer.write
    writer.write = lambda data: (writes.append(data), real_write(data))[1]  # type: ignore[method-assign]
    rec.recorder.emit(ok("req-0", tokens=5))
    rec.recorder.emit(failed("req-1"))
    rec.recorder.emit(ok("req-2", endpoint="http://b/v1", tokens=7))
    assert writes == [] and rec.summary.written == 0 and rec.events == []  # not yet written
    await asyncio.sleep(0)
    assert len(writes) == 1 and writes[0].count(b"\n") == 3
    lines = read_results(rec.output)
    assert list(lines) == ["req-0", "req-1", "req-2"]
    assert rec.summary.succeeded == 2 and rec.summary.failed == 1
    assert rec.summary.failures == {"http_400": 1} and rec.summary.completion_tokens == 12
    assert rec.summary.endpoints == {"http://a/v1": 1, "http://b/v1": 1}
    assert [(type(e).__name__, e.custom_id) for e in rec.events] == [
        ("Answered", "req-0"), ("Failed", "req-1"), ("Answered", "req-2"),
    ]  # fmt: skip
    assert rec.events[1].code == "http_400"
    rec.recorder.emit(ok("req-3"))
    await asyncio.sleep(0)
    assert len(writes) == 2  # the next iteration, the next write


async def test_a_failed_write_stops_the_run_and_counts_nothing(recording) -> None:
    rec = recording(2)
    rec.recorder.prepare()

    def full(data: bytes) -> None:
        raise OutputError(f"{rec.output}: No space left on device")

    rec.recorder.writer.write = full  # type: ignore[method-assign]
    rec.recorder.emit(ok("req-0"))
    rec.recorder.emit(ok("req-1"))
    await asyncio.sleep(0)
    assert [str(e) for e in rec.errors] == [f"{rec.output}: No space left on device"]
    assert rec.summary.written == 0 and rec.events == []
    assert rec.output.read_bytes() == b""


async def test_close_writes_what_is_still_queued(recording) -> None:
    rec = recording(1)
    rec.recorder.prepare()
    rec.recorder.emit(ok("req-0"))
    rec.recorder.close()  # before the loop ran the scheduled flush
    assert list(read_results(rec.output)) == ["req-0"] and rec.summary.succeeded == 1
    await asyncio.sleep(0)  # the scheduled flush finds nothing left to write
    assert rec.output.read_bytes().count(b"\n") == 1


async def test_the_output_is_synced_while_the_run_goes_on(recording) -> None:
    rec = recording(1)
    rec.recorder.prepare()
    synced: list[int] = []
    rec.recorder.writer.fsync = lambda: synced.append(1)  # type: ignore[method-assign]
    syncing = asyncio.ensure_future(rec.recorder.sync_every(0.0))
    while not synced:
        await asyncio.sleep(0.05)  # bounded by the test's timeout
    syncing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await syncing


def test_a_first_run_creates_the_output_only_in_prepare(recording) -> None:
    rec = recording(2)
    assert not rec.output.exists()
    rec.recorder.prepare()
    assert rec.output.exists() and rec.output.read_bytes() == b""

"""A provider's Batch API run is a `RunSpec` like any other (issue 45): started by the front
door with the spec's options, seams and signal choice, from a running event loop too; every
answer from the provider takes the steps a sent one takes and emits the same events.

Real runs: `jsonlbatch.execute`/`aexecute(..., batch_api=True)` against `serve --batch-api`
over 127.0.0.1 (batchapiutil.BatchServer), its upstream the mock.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from batchapiutil import BatchServer
from batchutil import read_results, write_requests

import jsonlbatch
from jsonlbatch.exec.hooks.check_hook import Accept, AnswerToCheck, Reject
from jsonlbatch.exec.hooks.seams import Seams
from jsonlbatch.exec.output.events import Answered, Failed

FAST = {"batch_api": True, "poll_interval": 0.1, "quiet": True}


def _state(out: Path) -> dict[str, Any]:
    path = out.with_name(out.name + ".batch-api.json")
    return orjson.loads(path.read_bytes()) if path.exists() else {"parts": []}


async def test_aexecute_with_batch_api_in_a_running_loop_takes_the_callers_check_and_events(
    tmp_path: Path, mock_server
) -> None:
    # before: `RuntimeError: set_wakeup_fd only works in main thread`
    server = await asyncio.to_thread(BatchServer(tmp_path / "state", mock_server()).start)
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 6)
    seen: Counter[str] = Counter()
    asked: list[str] = []

    def no_three(answer: AnswerToCheck) -> Accept | Reject:
        asked.append(answer.request.custom_id)
        if answer.request.custom_id == "req-3":
            return Reject("not this one", code="caller_said_no")
        return Accept()

    seams = Seams(
        check=no_three,
        subscribers=[(lambda event: seen.update([type(event).__name__]), (Answered, Failed))],
    )
    summary = await jsonlbatch.aexecute(requests, out, url=server.url, seams=seams, **FAST)
    assert type(summary).__name__ == "SubmitSummary" and summary.merged == 6
    assert sorted(asked) == [f"req-{i}" for i in range(6)]  # every answer, once
    results = read_results(out)
    assert results["req-3"]["error"]["code"] == "caller_said_no"
    assert all(results[f"req-{i}"]["error"] is None for i in (0, 1, 2, 4, 5))
    assert seen == {"Answered": 5, "Failed": 1}  # as exec's recorder tells them
    assert summary.failed == 1


def test_a_batch_run_installs_no_signal_handlers_unless_asked(tmp_path: Path, mock_server) -> None:
    server = BatchServer(tmp_path / "state", mock_server()).start()
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 2)
    during: list[Any] = []

    def look(event: Any) -> None:
        during.append(signal.getsignal(signal.SIGINT))

    seams = Seams(subscribers=[(look, (Answered,))])
    jsonlbatch.execute(requests, out, url=server.url, seams=seams, handle_signals=False, **FAST)
    assert during and all(h is signal.default_int_handler for h in during)  # the caller's
    again = tmp_path / "again.jsonl"
    during.clear()
    jsonlbatch.execute(requests, again, url=server.url, seams=seams, **FAST)
    assert during and all(h is not signal.default_int_handler for h in during)  # Ctrl-C: ours


async def test_cancel_stops_the_watch_and_a_part_without_marks_is_checked_when_collected(
    tmp_path: Path, mock_server
) -> None:
    """A cancelled `aexecute` stops watching (the batch runs on) and frees the output; the
    next run collects the batch, and a part saved before marks kept what was asked (an older
    release's) still has its answers checked: before, they skipped every check."""
    upstream = mock_server(latency=0.2)
    server = BatchServer(tmp_path / "state", upstream, "--batch-concurrency", "1")
    await asyncio.to_thread(server.start)
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 6)
    task = asyncio.ensure_future(jsonlbatch.aexecute(requests, out, url=server.url, **FAST))
    deadline = time.monotonic() + 30
    while not any(p.get("batch_id") for p in _state(out)["parts"]):
        assert time.monotonic() < deadline and not task.done()
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (part,) = _state(out)["parts"]
    assert not part["merged"]  # the watch stopped; the batch was not cancelled
    folder = out.with_name(out.name + ".batch-api")
    marks = next(folder.glob("*.marks.jsonl"))
    old = [orjson.loads(raw) for raw in marks.read_bytes().splitlines()]
    assert all("url" in m for m in old)
    marks.write_bytes(b"".join(orjson.dumps({k: m[k] for k in ("custom_id", "sent_as",
                                                               "fingerprint")}) + b"\n"
                               for m in old))  # fmt: skip
    checked: list[str] = []

    def refuse_all(answer: AnswerToCheck) -> Reject:
        checked.append(answer.request.custom_id)
        return Reject("checked", code="caller_checked")

    summary = await jsonlbatch.aexecute(
        requests, out, url=server.url, seams=Seams(check=refuse_all), **FAST
    )  # not locked
    results = read_results(out)
    assert len(results) == 6 and summary.merged == 6
    assert sorted(checked) == sorted(results)
    assert {line["error"]["code"] for line in results.values()} == {"caller_checked"}


def test_changed_requests_follow_the_changed_policy_as_any_run(tmp_path: Path, mock_server) -> None:
    """The job the front door prepared decides what is pending, `--changed` included (before:
    refused with --batch-api, the submitter's own job never knew the option)."""
    server = BatchServer(tmp_path / "state", mock_server()).start()
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = write_requests(requests, 3)
    jsonlbatch.execute(requests, out, url=server.url, **FAST)
    lines[1]["body"]["messages"][0]["content"] = "edited"
    requests.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    with pytest.raises(jsonlbatch.InputError, match="changed"):
        jsonlbatch.execute(requests, out, url=server.url, **FAST)
    summary = jsonlbatch.execute(requests, out, url=server.url, changed="resend", **FAST)
    assert summary.merged == 1 and summary.already_done == 2
    results = read_results(out)
    assert len(results) == 3  # one line per request, the edited one's anew
    assert results["req-1"]["metrics"]["batch_id"] != results["req-0"]["metrics"]["batch_id"]
    assert len(server.client().batches.list().data) == 2  # one more batch, for the edited one


def test_a_watcher_of_a_batch_run_sees_its_answers(tmp_path: Path, mock_server) -> None:
    """The spec's watchers live as long as the run and their subscribers get the merged
    answers' events, as for any target (exec/front_door.py's `Watcher`)."""
    import contextlib
    import dataclasses

    from jsonlbatch.exec.front_door import start

    server = BatchServer(tmp_path / "state", mock_server()).start()
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 3)
    seen: list[str] = []
    life: list[str] = []

    class Watch:
        @contextlib.contextmanager
        def watching(self, spec: Any):
            life.append("open")
            yield [(lambda event: seen.append(event.custom_id), (Answered,))]
            life.append("closed")

    spec = jsonlbatch.build_spec(requests, out, url=server.url, **FAST)
    outcome = start(dataclasses.replace(spec, watchers=(Watch(),)), handle_signals=False)
    assert outcome.summary.merged == 3 and sorted(seen) == ["req-0", "req-1", "req-2"]
    assert life == ["open", "closed"]

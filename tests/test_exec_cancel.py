"""Cancelling `aexecute` while its server is still starting, and how results print (issue 45,
item 4). A real launched mock (`--serve mock` with `--startup-delay`, a cold start) under its
reaper; the next run on the same output is a real run against an in-process mock."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from batchutil import read_results, write_requests
from procutil import pids_with

import jsonlbatch
from jsonlbatch.exec.output.run_outcome import Answer, Results
from jsonlbatch.exec.output.run_summary import RunSummary

COLD = 60.0  # seconds the mock waits before it binds: the run must not wait for it


def runs_alive() -> list[str]:
    """Threads still inside `front_door.start` (a run's worker)."""
    from jsonlbatch.exec import front_door

    alive = []
    for ident, frame in sys._current_frames().items():
        f: Any = frame
        while f is not None:
            if f.f_code is front_door.start.__code__:
                alive.append(str(ident))
                break
            f = f.f_back
    return alive


async def cancel_during_cold_start(
    tmp_path: Path, times: int, *, fleet: bool = False
) -> tuple[Path, Path, float]:
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 5)
    marker = f"--startup-delay={COLD + (os.getpid() % 1000) / 1000:.3f}"  # this test's server
    if fleet:  # the same through a fleet file (`serve.target.Fleet`)
        path = tmp_path / "fleet.yaml"
        path.write_text(f"models:\n  - {{backend: mock, served_model_name: mock, "
                        f"server_args: ['{marker}']}}\n")  # fmt: skip
        run = jsonlbatch.aexecute(requests, out, fleet=str(path), quiet=True)
    else:
        run = jsonlbatch.aexecute(requests, out, serve="mock", server_arg=marker, quiet=True)
    task = asyncio.ensure_future(run)
    for _ in range(300):  # until its server process runs (bounded: 30 s)
        await asyncio.sleep(0.1)
        if pids_with("jsonlbatch.mock", marker):
            break
    assert pids_with("jsonlbatch.mock", marker), "the mock did not start"
    await asyncio.sleep(0.5)  # well inside the cold start
    cancelled = time.monotonic()
    task.cancel()
    for _ in range(times - 1):
        await asyncio.sleep(0.05)
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    took = time.monotonic() - cancelled
    assert pids_with("jsonlbatch.mock", marker) == []  # the server is gone when the task is
    assert runs_alive() == []  # and so is the run's worker thread
    return requests, out, took


async def test_cancel_during_a_cold_start_stops_the_server_and_frees_the_output(
    tmp_path: Path, mock_server: Any
) -> None:
    requests, out, took = await cancel_during_cold_start(tmp_path, times=1)
    assert took < COLD / 4  # not after the start: the old wait lasted the whole cold start
    summary = await jsonlbatch.aexecute(requests, out, url=mock_server(), quiet=True)
    assert summary.succeeded == 5 and len(read_results(out)) == 5


async def test_cancelled_twice_nothing_of_the_run_lives_on(
    tmp_path: Path, mock_server: Any
) -> None:
    requests, out, _ = await cancel_during_cold_start(tmp_path, times=2)
    # the output's lock went with the run: no "locked by another Job of this same process"
    summary = await jsonlbatch.aexecute(requests, out, url=mock_server(), quiet=True)
    assert summary.succeeded == 5


async def test_cancel_during_a_fleets_cold_start_stops_it_too(
    tmp_path: Path, mock_server: Any
) -> None:
    requests, out, took = await cancel_during_cold_start(tmp_path, times=1, fleet=True)
    assert took < COLD / 4
    summary = await jsonlbatch.aexecute(requests, out, url=mock_server(), quiet=True)
    assert summary.succeeded == 5


def test_results_print_short_and_as_small_tables(tmp_path: Path, mock_server: Any) -> None:
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 12)
    summary = jsonlbatch.execute(requests, out, url=mock_server(), quiet=True)
    text = repr(summary)
    assert "\n" not in text and len(text) < 160, text
    assert text.startswith("<RunSummary ") and "12 requests" in text and "12 ok" in text
    assert "<table>" in summary._repr_html_() and "12 ok" in summary._repr_html_()

    results = summary.results
    assert repr(results) == f"<Results {out}: 12 answers>"
    page = results._repr_html_()
    assert page.count("<tr>") == 1 + 10  # a header and the first ten answers
    answer = results["req-0"]
    line = repr(answer)
    assert "\n" not in line and len(line) < 120 and line.startswith("<Answer req-0 ok: '")
    assert "body" not in line and "metrics" not in line
    assert "<table>" in answer._repr_html_()


def test_a_failure_and_hostile_text_print_escaped_and_cut(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    long = "<script>alert(1)</script> " + "word " * 500
    lines = [
        {"custom_id": "a", "response": {"status_code": 200, "body": {
            "choices": [{"message": {"content": long}, "finish_reason": "stop"}]}},
         "error": None, "metrics": {}},
        {"custom_id": "b", "response": None,
         "error": {"code": "http_500", "message": "server\nfell over " * 40}, "metrics": {}},
    ]  # fmt: skip
    out.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    results = Results(str(out))
    good, bad = results["a"], results["b"]
    assert isinstance(good, Answer) and len(repr(good)) < 120 and "…" in repr(good)
    assert repr(bad).startswith("<Answer b failed http_500: server fell over") and "\n" not in repr(
        bad
    )
    page = results._repr_html_()
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "<script>" not in good._repr_html_()
    empty = RunSummary(output=str(out), requests=2, succeeded=1, failed=1)
    empty.failures["http_500"] += 1
    assert "http_500 1" in empty._repr_html_()

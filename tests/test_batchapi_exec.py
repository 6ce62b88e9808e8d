"""`exec --batch-api` against `serve --batch-api`: each side tests the other, over 127.0.0.1."""

from __future__ import annotations

import signal
import time

import orjson
import pytest
from batchapiutil import BatchServer
from batchutil import cli, content, exec_cli, failures, read_results, start_exec, write_requests

from jsonlbatch.batch_format.records import fingerprint
from jsonlbatch.mock import reply_text

FAST = ("--batch-api", "--poll-interval", "0.1")


def _state(out) -> dict:
    path = out.with_name(out.name + ".batch-api.json")
    return orjson.loads(path.read_bytes()) if path.exists() else {"parts": []}


def _check(results: dict, lines: list[dict]) -> None:
    assert set(results) == {x["custom_id"] for x in lines}
    for x in lines:
        assert content(results[x["custom_id"]]) == reply_text(x["body"], 0)


def test_whole_run_in_parts_then_nothing_to_do(tmp_path, mock_server):
    server = BatchServer(tmp_path / "state", mock_server()).start()
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = write_requests(requests, 25)
    done = exec_cli(requests, out, "--url", server.url, *FAST, "--batch-max-requests", "10")
    assert done.returncode == 0, done.stderr
    results = read_results(out)
    _check(results, lines)
    batches = server.client().batches.list().data
    assert len(batches) == 3 and sorted(b.request_counts.total for b in batches) == [5, 10, 10]
    assert {r["metrics"]["batch_id"] for r in results.values()} == {b.id for b in batches}
    for raw in requests.read_bytes().splitlines():  # marked as exec marks its lines, so a
        x = orjson.loads(raw)  # later run sees edited requests
        assert results[x["custom_id"]]["metrics"]["fingerprint"] == fingerprint(
            raw, x["url"], x["body"]
        )
    assert all(p["merged"] for p in _state(out)["parts"])

    again = exec_cli(requests, out, "--url", server.url, *FAST)
    assert again.returncode == 0 and "nothing to submit" in again.stderr
    assert len(server.client().batches.list().data) == 3
    shown = cli("batches", "status", str(out))  # the state beside OUT says where to ask
    # issue 26: the placeholder "merged into OUT" was printed as it was
    assert shown.returncode == 0 and shown.stdout.count(f"merged into {out}\n") == 3, shown.stdout


def _started_watching(tmp_path, mock_server, count: int):
    """A slow batch server and an `exec --batch-api` that has created its batch and watches."""
    server = BatchServer(
        tmp_path / "state", mock_server(latency=0.1), "--batch-concurrency", "2"
    ).start()
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = write_requests(requests, count)
    proc = start_exec(requests, out, "--url", server.url, *FAST)
    deadline = time.monotonic() + 30
    while not any(p.get("batch_id") for p in _state(out)["parts"]):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    return server, requests, out, lines, proc


@pytest.mark.slow
def test_exec_killed_while_watching_then_same_command_makes_no_second_batch(tmp_path, mock_server):
    server, requests, out, lines, proc = _started_watching(tmp_path, mock_server, 30)
    proc.kill()
    proc.wait()
    # as if the crash had come between the create and the state write: the id is lost, the
    # mark that a create was under way is not
    state_path = out.with_name(out.name + ".batch-api.json")
    state = _state(out)
    assert state["parts"][0]["creating_since"]
    state["parts"][0]["batch_id"] = None
    state_path.write_bytes(orjson.dumps(state))

    again = exec_cli(requests, out, "--url", server.url, *FAST)
    assert again.returncode == 0, again.stderr
    assert "not creating it again" in again.stderr
    _check(read_results(out), lines)
    assert len(server.client().batches.list().data) == 1


@pytest.mark.slow
def test_ctrl_c_stops_watching_not_the_batch(tmp_path, mock_server):
    server, requests, out, lines, proc = _started_watching(tmp_path, mock_server, 20)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "keep running" in err and "batches cancel" in err
    (batch,) = server.client().batches.list().data
    assert batch.status in ("validating", "in_progress", "finalizing", "completed")
    again = exec_cli(requests, out, "--url", server.url, *FAST)
    assert again.returncode == 0, again.stderr
    _check(read_results(out), lines)
    # the resumed run merged them all: none had a result before it (it said "20 had", before)
    assert "20 requests; 0 had a result before; 20 results merged" in again.stderr, again.stderr


def test_expired_batch_gives_failure_lines_and_retry_failed_resubmits_only_them(
    tmp_path, mock_server
):
    # 16 answers one at a time, 0.5 s each, take 8 s; a 4 s window ends the batch part-way with
    # room for a slow start under load (a 1 s window at 0.15 s each expired before the first
    # answer once, with the whole suite running on two cores).
    server = BatchServer(
        tmp_path / "state", mock_server(latency=0.5), "--batch-concurrency", "1"
    ).start()
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = write_requests(requests, 16)
    first = exec_cli(requests, out, "--url", server.url, *FAST, "--completion-window", "4s")
    assert first.returncode == 3, first.stderr
    results = read_results(out)
    assert len(results) == 16
    failed = failures(results)
    assert failed and len(failed) < 16, "the window should end the batch part-way"
    assert {f["error"]["code"] for f in failed.values()} == {"batch_expired"}
    (expired,) = server.client().batches.list().data
    assert expired.status == "expired"

    retry = exec_cli(requests, out, "--url", server.url, *FAST, "--retry-failed")
    assert retry.returncode == 0, retry.stderr
    newest = server.client().batches.list(limit=1).data[0]
    assert newest.id != expired.id and newest.request_counts.total == len(failed)
    _check(read_results(out), lines)

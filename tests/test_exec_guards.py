"""What exec refuses to do: share an output, append to a file that is not a response file,
keep going after a failed write, accept a 200 that is an error, or follow a redirect."""

from __future__ import annotations

import time

import orjson
import pytest
from aiohttp import web
from batchutil import (
    cli,
    exec_cli,
    failures,
    odd_server,
    read_results,
    start_exec,
    write_requests,
)

import jsonlbatch
from jsonlbatch.errors import OutputError


@pytest.mark.slow
def test_a_second_run_on_the_same_output_is_refused(tmp_path, mock_server):
    url = mock_server(latency=0.3)  # about 10 s: a loaded machine starts the second run in time
    write_requests(tmp_path / "req.jsonl", 280)
    out = tmp_path / "out.jsonl"
    first = start_exec(tmp_path / "req.jsonl", out, "--url", url, "-c", "8")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not out.exists():
        time.sleep(0.05)
    second = exec_cli(tmp_path / "req.jsonl", out, "--url", url)
    assert second.returncode == 1
    assert "is being written by another jsonlbatch run" in second.stderr
    first.communicate(timeout=60)
    assert first.returncode == 0
    assert len(read_results(out)) == 280


def test_duplicated_successes_in_the_output_are_an_error(tmp_path, mock_server):
    url = mock_server()
    write_requests(tmp_path / "req.jsonl", 5)
    out = tmp_path / "out.jsonl"
    assert exec_cli(tmp_path / "req.jsonl", out, "--url", url).returncode == 0
    doubled = out.read_bytes() + out.read_bytes().splitlines(keepends=True)[0]
    out.write_bytes(doubled)
    proc = exec_cli(tmp_path / "req.jsonl", out, "--url", url)
    assert proc.returncode == 1
    assert "more than one successful line" in proc.stderr and f"{out}:6" in proc.stderr
    assert out.read_bytes() == doubled


def test_a_request_file_given_as_output_is_refused(tmp_path, mock_server):
    write_requests(tmp_path / "req.jsonl", 3)
    other = tmp_path / "other.jsonl"
    write_requests(other, 3)
    before = other.read_bytes()
    proc = exec_cli(tmp_path / "req.jsonl", other, "--url", mock_server())
    assert proc.returncode == 1
    assert f"{other}:1: not a response line" in proc.stderr
    assert other.read_bytes() == before


def test_a_failed_write_stops_the_run_without_a_half_line(tmp_path, mock_server, monkeypatch):
    """Disk full after some results: the run stops with an error, the file holds only whole
    lines, and the next run sends exactly what is missing."""
    import jsonlbatch.file_io.jsonl as jsonl

    url = mock_server(latency=0.01)
    write_requests(tmp_path / "req.jsonl", 100)
    out = tmp_path / "out.jsonl"
    real_write = jsonl.os.write
    budget = {"bytes": 20_000}

    def full_disk(fd, data):  # writes what fits, then fails like ENOSPC
        room = budget["bytes"]
        if room <= 0:
            raise OSError(28, "No space left on device")
        written = real_write(fd, bytes(data[:room]))
        budget["bytes"] -= written
        return written

    monkeypatch.setattr(jsonl.os, "write", full_disk)
    try:
        jsonlbatch.execute(tmp_path / "req.jsonl", out, urls=[url], concurrency=4, quiet=True)
    except OutputError as exc:
        assert "No space left on device" in str(exc)
    else:
        raise AssertionError("the run should have stopped")
    monkeypatch.setattr(jsonl.os, "write", real_write)
    partial = read_results(out)  # whole lines only
    assert 0 < len(partial) < 100
    summary = jsonlbatch.execute(tmp_path / "req.jsonl", out, urls=[url], quiet=True)
    assert summary.already_done == len(partial)
    assert len(read_results(out)) == 100


def test_a_200_carrying_an_error_is_retried_and_recorded_without_a_2xx(tmp_path):
    async def handler(request):
        return web.json_response({"error": {"message": "upstream overloaded"}})

    url, stop = odd_server(handler)
    try:
        write_requests(tmp_path / "req.jsonl", 2)
        out = tmp_path / "out.jsonl"
        proc = exec_cli(
            tmp_path / "req.jsonl",
            out,
            "--url",
            url,
            "--max-retries",
            "1",
            "--backoff",
            "0.01",
        )
    finally:
        stop()
    assert proc.returncode == 3
    for line in read_results(out).values():
        assert line["response"] is None
        assert line["error"]["code"] == "invalid_response"
        assert line["metrics"]["attempts"] == 2
    assert cli("validate", str(out)).returncode == 0


def test_redirects_are_not_followed(tmp_path):
    async def handler(request):
        raise web.HTTPFound("http://127.0.0.1:9/elsewhere")

    url, stop = odd_server(handler)
    try:
        write_requests(tmp_path / "req.jsonl", 1)
        out = tmp_path / "out.jsonl"
        proc = exec_cli(
            tmp_path / "req.jsonl",
            out,
            "--url",
            url,
            "--api-key",
            "sk-never-forwarded",
        )
    finally:
        stop()
    assert proc.returncode == 3
    line = read_results(out)["req-0"]
    assert line["response"]["status_code"] == 302
    assert "sk-never-forwarded" not in out.read_text()


def test_a_warming_server_is_waited_for_not_failed(tmp_path, mock_server):
    """Like SGLang: /v1/models answers at once, generation and /health say 503 until warm."""
    url = mock_server(warmup=3.0)
    write_requests(tmp_path / "req.jsonl", 40)
    out = tmp_path / "out.jsonl"
    proc = exec_cli(
        tmp_path / "req.jsonl",
        out,
        "--url",
        url,
        "--backoff",
        "0.05",
    )
    assert proc.returncode == 0, proc.stderr
    results = read_results(out)
    assert len(results) == 40 and not failures(results)


def test_success_then_failure_for_one_id_keeps_the_success(tmp_path, mock_server):
    url = mock_server()
    write_requests(tmp_path / "req.jsonl", 3)
    out = tmp_path / "out.jsonl"
    assert exec_cli(tmp_path / "req.jsonl", out, "--url", url).returncode == 0
    failed = {
        "custom_id": "req-0",
        "response": None,
        "error": {"code": "request_timeout", "message": "x"},
    }
    out.write_bytes(out.read_bytes() + orjson.dumps(failed) + b"\n")
    proc = exec_cli(tmp_path / "req.jsonl", out, "--url", url, "--retry-failed")
    assert proc.returncode == 0, proc.stderr
    assert "nothing to send" in proc.stderr


def test_failed_start_leaves_no_files_and_a_run_leaves_no_lock(tmp_path, mock_server):
    url = mock_server()
    write_requests(tmp_path / "req.jsonl", 3)
    out = tmp_path / "sub" / "out.jsonl"
    proc = exec_cli(tmp_path / "req.jsonl", out, "--url", url, "--model", "nope")
    assert proc.returncode == 1 and "not served" in proc.stderr
    assert not out.exists()
    assert exec_cli(tmp_path / "req.jsonl", out, "--url", url).returncode == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["out.jsonl"]


def test_ids_of_another_job_in_the_output_are_reported(tmp_path, mock_server):
    url = mock_server()
    write_requests(tmp_path / "req.jsonl", 4)
    out = tmp_path / "out.jsonl"
    assert exec_cli(tmp_path / "req.jsonl", out, "--url", url).returncode == 0
    other = {
        "custom_id": "other-job-7",
        "response": {"status_code": 200, "body": {}},
        "error": None,
    }
    out.write_bytes(out.read_bytes() + orjson.dumps(other) + b"\n")
    proc = exec_cli(tmp_path / "req.jsonl", out, "--url", url)
    assert proc.returncode == 0
    assert "1 ids in" in proc.stderr and "have no request" in proc.stderr


def test_a_byte_order_mark_is_accepted(tmp_path, mock_server):
    req = tmp_path / "req.jsonl"
    write_requests(req, 2)
    req.write_bytes(b"\xef\xbb\xbf" + req.read_bytes())
    out = tmp_path / "out.jsonl"
    proc = exec_cli(req, out, "--url", mock_server())
    assert proc.returncode == 0, proc.stderr
    assert set(read_results(out)) == {"req-0", "req-1"}


def test_problem_counts_say_when_they_stopped_counting(tmp_path):
    req = tmp_path / "req.jsonl"
    req.write_bytes(b"{bad\n" * 1500)
    proc = cli("validate", str(req))
    assert proc.returncode == 1 and "1000+ problems" in proc.stderr
    proc = exec_cli(req, tmp_path / "out.jsonl", "--url", "http://127.0.0.1:9/v1")
    assert "1000+ problems" in proc.stderr and "980+ more" in proc.stderr

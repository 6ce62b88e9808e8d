"""A job's lifecycle as a newcomer meets it: the output lock from `Job.prepare` to the end of the
process, the ready timeout against a dead port, and `serve --backend mock` answering any model."""

from __future__ import annotations

import gc
import socket
import time
import warnings

import orjson
import pytest
from batchutil import cli, exec_cli, read_results, start_cli, write_requests
from conftest import free_port

from jsonlbatch import aexecute, execute
from jsonlbatch.errors import OutputError, ServerUnavailableError, UsageError
from jsonlbatch.exec.job import ExecOptions, Job


def _lock_files(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".lock"))


def test_a_prepared_job_in_the_same_process_is_named_as_the_holder(tmp_path, mock_server):
    url = mock_server()
    requests, out = tmp_path / "req.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 3)
    job = Job(requests, out, ExecOptions(urls=[url], quiet=True))
    job.prepare()
    with pytest.raises(OutputError, match="another Job of this same process") as caught:
        execute(requests, out, urls=[url], quiet=True)
    assert "with Job(" in str(caught.value) and "pid" not in str(caught.value)
    job.close()
    assert execute(requests, out, urls=[url], quiet=True).succeeded == 3
    assert _lock_files(tmp_path) == []


def test_job_is_a_context_manager_and_a_dropped_job_frees_the_output(tmp_path, mock_server):
    url = mock_server()
    requests, out = tmp_path / "req.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 3)
    with Job(requests, out, ExecOptions(urls=[url], quiet=True)) as job:
        assert job.prepare().pending
        assert _lock_files(tmp_path) == [".out.jsonl.lock"]
    assert _lock_files(tmp_path) == []

    job = Job(requests, out, ExecOptions(urls=[url], quiet=True))
    job.prepare()
    del job  # prepared, never run, never closed
    gc.collect()
    assert _lock_files(tmp_path) == []
    assert execute(requests, out, urls=[url], quiet=True).succeeded == 3


def test_a_failed_serve_leaves_no_lock_file(tmp_path):
    write_requests(tmp_path / "req.jsonl", 2)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = exec_cli(
            tmp_path / "req.jsonl", tmp_path / "out.jsonl", "--serve", "mock", "--port", str(port)
        )
    assert proc.returncode == 2, proc.stderr
    assert "not available" in proc.stderr
    assert _lock_files(tmp_path) == []
    assert not (tmp_path / "out.jsonl").exists()


def test_ready_timeout_is_honoured_against_a_dead_port(tmp_path):
    port = free_port()  # nobody listens there
    write_requests(tmp_path / "req.jsonl", 2)
    started = time.monotonic()
    with pytest.raises(ServerUnavailableError, match="--ready-timeout 2s"):
        execute(
            tmp_path / "req.jsonl",
            tmp_path / "out.jsonl",
            urls=[f"http://127.0.0.1:{port}/v1"],
            ready_timeout=2.0,
            quiet=True,
        )
    # The backoff between probes used to run past the deadline (2 s took 3.75 s).
    assert time.monotonic() - started < 3.0


def test_serve_backend_mock_answers_the_models_requests_name(tmp_path):
    write_requests(tmp_path / "req.jsonl", 4, model="Qwen/Qwen3-8B")
    server = start_cli(
        "serve",
        "--backend",
        "mock",
        "--port",
        str(free_port()),
        "--server-log-dir",
        str(tmp_path),
        "-q",
    )
    url = server.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), server.stderr.read()
    proc = exec_cli(tmp_path / "req.jsonl", tmp_path / "out.jsonl", "--url", url, "-q")
    assert proc.returncode == 0, proc.stderr
    results = read_results(tmp_path / "out.jsonl")
    assert {r["response"]["body"]["model"] for r in results.values()} == {"Qwen/Qwen3-8B"}


def test_a_pinned_mock_name_still_refuses_other_models(tmp_path, mock_server):
    url = mock_server(served_models=("pinned",))
    write_requests(tmp_path / "req.jsonl", 2, model="Qwen/Qwen3-8B")
    proc = exec_cli(tmp_path / "req.jsonl", tmp_path / "out.jsonl", "--url", url)
    assert proc.returncode != 0
    assert "'Qwen/Qwen3-8B' (2 requests use it) is not served" in proc.stderr
    assert "it serves: pinned" in proc.stderr


async def test_execute_inside_a_running_loop_says_to_await_aexecute(tmp_path, mock_server):
    """Issue 26: in Jupyter (a loop already runs) execute() failed with asyncio's "Cannot run
    the event loop while another loop is running" and never-awaited warnings."""
    url = mock_server()
    requests, out = tmp_path / "req.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a never-awaited coroutine would fail the test
        with pytest.raises(UsageError, match=r"await jsonlbatch\.aexecute\(\.\.\.\)"):
            execute(requests, out, urls=[url], quiet=True)
        gc.collect()
    assert not out.exists() and _lock_files(tmp_path) == []
    summary = await aexecute(requests, out, urls=[url], quiet=True)  # the advice works
    assert summary.succeeded == 3


def test_a_resumed_serve_run_names_its_servers_by_index_not_by_port(tmp_path):
    """Issue 26: each `exec --serve` run gets fresh ports, so `report --by endpoint` on a resumed
    file listed the ephemeral port of every run."""
    requests = tmp_path / "req.jsonl"
    lines = write_requests(requests, 6)
    part = tmp_path / "part.jsonl"
    part.write_bytes(b"".join(requests.read_bytes().splitlines(keepends=True)[:3]))
    out = tmp_path / "out.jsonl"
    for source in (part, requests):  # two runs, two launches, two ports
        done = exec_cli(source, out, "--serve", "mock", "--dp-size", "2", "--dp-mode", "replicas")
        assert done.returncode == 0, done.stderr
        assert "server 0" in done.stderr  # the summary's per-endpoint counts use the name
    results = read_results(out)
    assert set(results) == {x["custom_id"] for x in lines}
    assert {r["metrics"]["endpoint"] for r in results.values()} <= {"server 0", "server 1"}
    report = cli("report", str(out), "--by", "endpoint", "--format", "json")
    assert report.returncode == 0, report.stderr
    groups = orjson.loads(report.stdout)["runs"][0]["breakdown"]["endpoint"]
    assert set(groups) <= {"server 0", "server 1"} and sum(g["lines"] for g in groups.values()) == 6

"""Retries, final errors, aborts, dead and cold servers, several endpoints."""

from __future__ import annotations

import socket
import time

import pytest
from batchutil import (
    ENV,
    cli,
    content,
    exec_cli,
    failures,
    read_results,
    start_cli,
    start_exec,
    write_requests,
)
from conftest import free_port

from jsonlbatch.mock import BackgroundMock, MockConfig, reply_text


def test_transient_errors_are_retried_until_success(tmp_path, mock_server):
    url = mock_server(fail_rate=0.15, rate_limit_rate=0.1, retry_after=0.05, drop_rate=0.05, seed=7)
    requests = write_requests(tmp_path / "req.jsonl", 200)
    out = tmp_path / "out.jsonl"
    proc = exec_cli(
        tmp_path / "req.jsonl",
        out,
        "--url",
        url,
        "--max-retries",
        "30",
        "-c",
        "16",
        "--backoff",
        "0.01",
    )
    assert proc.returncode == 0, proc.stderr
    results = read_results(out)
    assert not failures(results)
    attempts = [r["metrics"]["attempts"] for r in results.values()]
    assert max(attempts) > 1
    for r in requests:
        assert content(results[r["custom_id"]]) == reply_text(r["body"], 0)


def test_retries_exhausted_give_a_failed_line_and_exit_3(tmp_path, mock_server):
    url = mock_server(fail_rate=1.0)
    write_requests(tmp_path / "req.jsonl", 3)
    out = tmp_path / "out.jsonl"
    proc = exec_cli(
        tmp_path / "req.jsonl",
        out,
        "--url",
        url,
        "--max-retries",
        "2",
        "--backoff",
        "0.01",
    )
    assert proc.returncode == 3, proc.stderr
    results = read_results(out)
    assert len(results) == 3
    for line in results.values():
        assert line["response"]["status_code"] == 500
        assert line["error"]["code"] == "http_500"
        assert "injected" in line["response"]["body"]["error"]["message"]
        assert line["metrics"]["attempts"] == 3
    assert "--retry-failed" in proc.stderr


def test_a_burst_of_fast_errors_does_not_set_a_healthy_server_aside(tmp_path):
    """Errors come back at once, answers after 0.3 s: at 128 in flight a 25% error rate yields
    dozens of failures before the first success. That is no reason to stop using the server."""
    with BackgroundMock(MockConfig(latency=0.3, fail_rate=0.25)) as mock:
        write_requests(tmp_path / "req.jsonl", 128)
        out = tmp_path / "out.jsonl"
        proc = exec_cli(
            tmp_path / "req.jsonl", out, "--url", mock.url, "-c", "128", "--backoff", "0.01"
        )
        assert proc.returncode == 0, proc.stderr
        assert mock.stats.responses[500] >= 8  # the burst happened
        assert mock.stats.requests["/health"] == 0  # and was never taken for a dead server
    assert not failures(read_results(out))


@pytest.mark.slow
def test_a_server_failing_everything_for_seconds_is_set_aside_and_probed(tmp_path):
    with BackgroundMock(MockConfig(latency=0.05, fail_rate=1.0)) as mock:
        write_requests(tmp_path / "req.jsonl", 4)
        out = tmp_path / "out.jsonl"
        proc = exec_cli(
            tmp_path / "req.jsonl",
            out,
            "--url",
            mock.url,
            "--max-retries",
            "7",
            "--backoff",
            "0.15",  # doubling up to 1.2 s: the last attempts come 3.4 to 6.9 s after the first
        )
        assert proc.returncode == 3, proc.stderr
        assert mock.stats.requests["/health"] >= 1
    assert len(failures(read_results(out))) == 4


def test_retry_failed_replaces_failed_lines(tmp_path, mock_server):
    bad = mock_server(fail_rate=1.0)
    good = mock_server()
    write_requests(tmp_path / "req.jsonl", 10)
    out = tmp_path / "out.jsonl"
    assert exec_cli(tmp_path / "req.jsonl", out, "--url", good).returncode == 0
    # Make four of the ten lines failures by re-running them against the failing server.
    lines = out.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join(lines[4:]))
    proc = exec_cli(
        tmp_path / "req.jsonl",
        out,
        "--url",
        bad,
        "--max-retries",
        "0",
        "--backoff",
        "0.01",
    )
    assert proc.returncode == 3
    assert len(failures(read_results(out))) == 4
    proc = exec_cli(tmp_path / "req.jsonl", out, "--url", good)
    # failures count as done: nothing is sent, but the exit status still says they failed
    assert proc.returncode == 3 and "nothing to send" in proc.stderr
    assert "4 of them failed" in proc.stderr
    proc = exec_cli(tmp_path / "req.jsonl", out, "--url", good, "--retry-failed")
    assert proc.returncode == 0, proc.stderr
    assert "retrying 4 failed requests" in proc.stderr
    results = read_results(out)
    assert len(results) == 10 and not failures(results)


def test_context_length_error_is_final_at_once(tmp_path, mock_server):
    url = mock_server(max_model_len=8)
    write_requests(tmp_path / "req.jsonl", 2, max_tokens=100)
    out = tmp_path / "out.jsonl"
    proc = exec_cli(tmp_path / "req.jsonl", out, "--url", url)
    assert proc.returncode == 3
    for line in read_results(out).values():
        assert line["response"]["status_code"] == 400
        assert line["metrics"]["attempts"] == 1
        assert "maximum context length" in line["error"]["message"]


def test_bad_key_aborts_and_never_shows_the_key(tmp_path, mock_server):
    url = mock_server(api_key="right-key-1234")
    write_requests(tmp_path / "req.jsonl", 5)
    out = tmp_path / "out.jsonl"
    proc = exec_cli(
        tmp_path / "req.jsonl",
        out,
        "--url",
        url,
        "--api-key",
        "wrong-key-5678",
    )
    assert proc.returncode == 1
    assert "rejected the credentials (HTTP 401)" in proc.stderr
    assert "wrong-key-5678" not in proc.stderr + proc.stdout
    assert not out.exists() or out.read_bytes() == b""
    proc = exec_cli(
        tmp_path / "req.jsonl",
        out,
        "--url",
        url,
        env={**ENV, "OPENAI_API_KEY": "right-key-1234"},
    )
    assert proc.returncode == 0, proc.stderr
    assert b"right-key-1234" not in out.read_bytes()
    assert "right-key-1234" not in proc.stderr


def test_timeouts_become_failed_lines(tmp_path, mock_server):
    url = mock_server(latency=3.0)
    write_requests(tmp_path / "req.jsonl", 2)
    out = tmp_path / "out.jsonl"
    proc = exec_cli(
        tmp_path / "req.jsonl",
        out,
        "--url",
        url,
        "--timeout",
        "0.3",
        "--max-retries",
        "1",
        "--backoff",
        "0.01",
    )
    assert proc.returncode == 3
    for line in read_results(out).values():
        assert line["response"] is None
        assert line["error"]["code"] == "request_timeout"
        assert line["metrics"]["attempts"] == 2


@pytest.mark.slow
def test_cold_server_is_waited_for(tmp_path, mock_process):
    server = mock_process("--startup-delay", "2", wait=False)
    write_requests(tmp_path / "req.jsonl", 20)
    out = tmp_path / "out.jsonl"
    proc = exec_cli(tmp_path / "req.jsonl", out, "--url", server.url)
    assert proc.returncode == 0, proc.stderr
    assert "waiting for" in proc.stderr
    assert len(read_results(out)) == 20


@pytest.mark.slow
def test_server_down_mid_run_pauses_instead_of_failing(tmp_path, mock_process):
    server = mock_process("--latency", "0.05")
    write_requests(tmp_path / "req.jsonl", 300)
    out = tmp_path / "out.jsonl"
    exec_proc = start_exec(tmp_path / "req.jsonl", out, "--url", server.url, "-c", "8")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not out.exists() or out.stat().st_size < 2000):
        time.sleep(0.05)
    server.kill()
    time.sleep(2.0)
    server.restart()
    _, stderr = exec_proc.communicate(timeout=90)
    assert exec_proc.returncode == 0, stderr
    results = read_results(out)
    assert len(results) == 300
    assert not failures(results)


def test_ready_timeout_ends_the_run_with_a_resumable_file(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    write_requests(tmp_path / "req.jsonl", 3)
    proc = exec_cli(
        tmp_path / "req.jsonl",
        tmp_path / "o.jsonl",
        "--url",
        f"http://127.0.0.1:{port}/v1",
        "--ready-timeout",
        "1",
    )
    assert proc.returncode == 1
    assert "did not answer within --ready-timeout" in proc.stderr


def test_requests_spread_over_endpoints_and_skip_a_dead_one(tmp_path, mock_server):
    a, b = mock_server(latency=0.01), mock_server(latency=0.01)
    write_requests(tmp_path / "req.jsonl", 200)
    out = tmp_path / "out.jsonl"
    proc = exec_cli(tmp_path / "req.jsonl", out, "--url", a, "--url", b, "-c", "16")
    assert proc.returncode == 0, proc.stderr
    used = [r["metrics"]["endpoint"] for r in read_results(out).values()]
    assert used.count(a) > 50 and used.count(b) > 50

    dead = f"http://127.0.0.1:{free_port()}/v1"  # refuses connections
    out2 = tmp_path / "out2.jsonl"
    proc = exec_cli(
        tmp_path / "req.jsonl",
        out2,
        "--url",
        a,
        "--url",
        dead,
        "-c",
        "16",
    )
    assert proc.returncode == 0, proc.stderr
    results = read_results(out2)
    assert len(results) == 200 and not failures(results)
    assert {r["metrics"]["endpoint"] for r in results.values()} == {a}


@pytest.mark.slow
def test_endpoint_that_comes_back_rejoins(tmp_path, mock_server, mock_process):
    alive = mock_server(latency=0.05)
    late = mock_process("--latency", "0.05")
    late.kill()
    write_requests(tmp_path / "req.jsonl", 300)
    out = tmp_path / "out.jsonl"
    proc = start_exec(
        tmp_path / "req.jsonl",
        out,
        "--url",
        alive,
        "--url",
        late.url,
        "-c",
        "8",
    )
    time.sleep(1.0)
    late.restart()
    _, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 0, stderr
    used = [r["metrics"]["endpoint"] for r in read_results(out).values()]
    assert used.count(late.url) > 20, "the endpoint that came back got no requests"


@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_signal_stops_cleanly_and_resume_finishes(tmp_path, mock_server, signame):
    import signal

    url = mock_server(latency=0.2)
    write_requests(tmp_path / "req.jsonl", 400)
    out = tmp_path / "out.jsonl"
    args = ("exec", str(tmp_path / "req.jsonl"), "-o", str(out), "--url", url, "-c", "8")
    proc = start_cli(*args)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not out.exists() or out.stat().st_size == 0):
        time.sleep(0.05)
    proc.send_signal(getattr(signal, signame))
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "run the same command again to resume" in stderr
    assert "Traceback" not in stderr
    partial = read_results(out)
    assert 0 < len(partial) < 400
    assert cli(*args).returncode == 0
    assert len(read_results(out)) == 400


def _resolver_standin(monkeypatch) -> None:
    """A resolver that knows no `*.invalid` name (RFC 6761), answered in-process so the test
    sends no DNS query anywhere; every other name resolves as usual."""
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name.endswith(".invalid"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def test_a_host_that_does_not_resolve_fails_at_once(tmp_path, mock_server, monkeypatch):
    """Issue 26: a typo'd host is not a cold server; it used to be waited for 30 minutes."""
    _resolver_standin(monkeypatch)
    write_requests(tmp_path / "req.jsonl", 3)
    out = tmp_path / "o.jsonl"
    typo = "http://my-sever.invalid:8000/v1"
    # the default --ready-timeout (30 minutes) would outlast the test's timeout
    proc = exec_cli(tmp_path / "req.jsonl", out, "--url", typo)
    assert proc.returncode == 2, proc.stderr
    assert "'my-sever.invalid' does not resolve" in proc.stderr and "--url" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()
    # among good servers too: the typo is named, nothing is sent
    both = exec_cli(tmp_path / "req.jsonl", out, "--url", mock_server(), "--url", typo)
    assert both.returncode == 2 and "does not resolve" in both.stderr

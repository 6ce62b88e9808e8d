"""Kill -9 a running `jsonlbatch exec` at arbitrary moments; the same command must finish the job
with exactly one line per request, each belonging to its request."""

from __future__ import annotations

import signal
import time

import pytest
from batchutil import (
    cli,
    content,
    failures,
    kill_at_random,
    read_results,
    start_cli,
    write_requests,
)

from jsonlbatch.mock import reply_text


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_is_exactly_once(tmp_path, mock_server):
    url = mock_server(latency=0.05, latency_jitter=0.05)
    requests = write_requests(tmp_path / "req.jsonl", 1000)
    out = tmp_path / "out.jsonl"
    args = ("exec", str(tmp_path / "req.jsonl"), "-o", str(out), "--url", url, "-c", "16")
    kills = kill_at_random(  # four crashes at random points, then a clean finish
        args,
        rounds=4,
        seed=1234,
        wait=(0.6, 2.0),
        after_kill=lambda: (
            read_results(out) if out.exists() else None
        ),  # each leaves a readable file
    )
    assert kills >= 2, "the run finished before it could be killed; slow the mock down"
    final = cli(*args)
    assert final.returncode == 0, final.stderr
    results = read_results(out)
    assert set(results) == {r["custom_id"] for r in requests}
    assert not failures(results)
    for r in requests:
        assert content(results[r["custom_id"]]) == reply_text(r["body"], 0)


@pytest.mark.slow
def test_kill_during_retry_failed_rewrite_loses_nothing(tmp_path, mock_server):
    """--retry-failed rewrites the output; a crash right after must still resume exactly-once."""
    bad, good = mock_server(fail_rate=1.0), mock_server(latency=0.02)
    requests = write_requests(tmp_path / "req.jsonl", 200)
    out = tmp_path / "out.jsonl"
    base = ("exec", str(tmp_path / "req.jsonl"), "-o", str(out), "--backoff", "0.01")
    assert cli(*base, "--url", bad, "--max-retries", "0").returncode == 3
    assert len(failures(read_results(out))) == 200
    proc = start_cli(*base, "--url", good, "--retry-failed", "-c", "4")
    deadline = time.monotonic() + 30  # kill it once the rewrite dropped the failed lines
    while time.monotonic() < deadline and out.read_bytes().count(b"\n") >= 200:
        time.sleep(0.02)
    time.sleep(0.3)  # and some requests went out again
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    results = read_results(out)
    assert len(results) < 200  # failed lines were dropped, some re-sent, the rest pending
    assert cli(*base, "--url", good, "--retry-failed").returncode == 0
    results = read_results(out)
    assert set(results) == {r["custom_id"] for r in requests}
    assert not failures(results)

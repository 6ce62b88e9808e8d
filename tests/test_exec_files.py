"""Files and the file system: the lock on the real file, links planted at the lock's name,
rewrites that fail or were killed, links as outputs, pipes and odd whitespace as input."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import orjson
import pytest
from batchutil import ENV, exec_cli, read_results, start_exec, write_requests

import jsonlbatch
from jsonlbatch.batch_format.records import Result
from jsonlbatch.errors import OutputError


def _wait_for_lines(path, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size > 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} never got a line")


@pytest.mark.slow
@pytest.mark.parametrize("alias", ["symlink", "hardlink"])
def test_two_runs_on_one_file_under_two_names_exclude_each_other(tmp_path, mock_server, alias):
    url = mock_server(latency=0.3)  # about 10 s: the second run starts well before the end
    write_requests(tmp_path / "req.jsonl", 280)
    out, other = tmp_path / "out.jsonl", tmp_path / "alias.jsonl"
    if alias == "symlink":
        other.symlink_to(out)
    first = start_exec(tmp_path / "req.jsonl", out, "--url", url, "-c", "8")
    _wait_for_lines(out)
    if alias == "hardlink":
        os.link(out, other)
    second = exec_cli(tmp_path / "req.jsonl", other, "--url", url)
    assert second.returncode == 1, second.stderr
    assert "is being written by another jsonlbatch run" in second.stderr
    first.communicate(timeout=90)
    assert first.returncode == 0
    assert len(read_results(out)) == 280


@pytest.mark.parametrize("planted", ["symlink", "hardlink"])
def test_a_link_planted_at_the_lock_is_never_followed_or_truncated(tmp_path, mock_server, planted):
    url = mock_server()
    write_requests(tmp_path / "req.jsonl", 2)
    victim = tmp_path / "precious.txt"
    victim.write_text("do not touch\n")
    lock = tmp_path / ".out.jsonl.lock"
    if planted == "symlink":
        lock.symlink_to(victim)
    else:
        os.link(victim, lock)
    proc = exec_cli(tmp_path / "req.jsonl", tmp_path / "out.jsonl", "--url", url)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "lock file" in proc.stderr
    assert victim.read_text() == "do not touch\n"
    assert not (tmp_path / "out.jsonl").exists()


def _failed_then_retry(tmp_path, url, out):
    req = tmp_path / "req.jsonl"
    write_requests(req, 4)
    lines = [Result(f"req-{i}", 200, {"choices": []}).to_line() for i in range(3)]
    lines.append(Result("req-3", None, error={"code": "request_timeout", "message": "t"}).to_line())
    out.write_bytes(b"".join(lines))
    return req


def test_retry_failed_through_a_symlink_rewrites_the_real_file(tmp_path, mock_server):
    real = tmp_path / "data" / "real.jsonl"
    real.parent.mkdir()
    link = tmp_path / "out.jsonl"
    link.symlink_to(real)
    req = _failed_then_retry(tmp_path, mock_server(), real)
    stale = real.parent / ".real.jsonl.k1l2m3n4.tmp"  # left by a rewrite killed with SIGKILL
    stale.write_bytes(b"x" * 1000)
    proc = exec_cli(req, link, "--url", mock_server(), "--retry-failed")
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and os.readlink(link) == str(real)
    results = read_results(real)
    assert len(results) == 4 and results["req-3"]["error"] is None
    assert sorted(p.name for p in real.parent.iterdir()) == ["real.jsonl"]


@pytest.mark.parametrize(
    ("where", "errno_", "words"),
    [("replace", 28, "No space left on device"), ("ftruncate", 30, "Read-only file system")],
)
def test_failing_rewrites_are_clean_errors_and_change_nothing(
    tmp_path, mock_server, monkeypatch, where, errno_, words
):
    """ENOSPC while --retry-failed rewrites the output; EROFS while a torn tail is cut."""
    import jsonlbatch.file_io.jsonl as jsonl

    out = tmp_path / "out.jsonl"
    req = _failed_then_retry(tmp_path, mock_server(), out)
    if where == "ftruncate":
        out.write_bytes(out.read_bytes() + b'{"id": "batch_req_torn')
    before = out.read_bytes()

    def fail(*args, **kwargs):
        raise OSError(errno_, os.strerror(errno_))

    monkeypatch.setattr(jsonl.os, where, fail)
    with pytest.raises(OutputError, match=words):
        jsonlbatch.execute(req, out, urls=[mock_server()], retry_failed=True, quiet=True)
    monkeypatch.undo()
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "req.jsonl"]


def test_a_pipe_and_odd_whitespace_are_read_like_a_file(tmp_path, mock_server):
    """Form feeds and vertical tabs around lines pass validation and are sent as checked; a
    request file that is a pipe is copied once, so both passes read the same lines."""
    url = mock_server()
    lines = write_requests(tmp_path / "plain.jsonl", 6)
    data = b"".join(b"\x0c" + orjson.dumps(x) + b"\x0b \n" for x in lines)
    (tmp_path / "req.jsonl").write_bytes(data)
    proc = exec_cli(tmp_path / "req.jsonl", tmp_path / "out.jsonl", "--url", url)
    assert proc.returncode == 0, proc.stderr
    assert len(read_results(tmp_path / "out.jsonl")) == 6
    for name in ("-", "/dev/stdin"):
        out = tmp_path / f"piped{len(name)}.jsonl"
        piped = subprocess.run(
            [sys.executable, "-m", "jsonlbatch", "exec", name, "-o", str(out), "--url", url],
            input=data,
            capture_output=True,
            env=ENV,
            timeout=120,
        )
        assert piped.returncode == 0, piped.stderr.decode()
        assert b"copying it to a temporary file" in piped.stderr
        assert len(read_results(out)) == 6


def test_a_json_array_is_refused_from_its_first_bytes(tmp_path, mock_server):
    lines = write_requests(tmp_path / "plain.jsonl", 3)
    (tmp_path / "req.json").write_bytes(b"\n  " + orjson.dumps(lines))
    proc = exec_cli(tmp_path / "req.json", tmp_path / "out.jsonl", "--url", mock_server())
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "holds a JSON array, not JSON Lines" in proc.stderr
    assert not (tmp_path / "out.jsonl").exists()

"""A real vLLM launched by `exec --serve vllm`, stopped in every way: Ctrl-C, kill -9 of
jsonlbatch, the engine killed under it (replicas: test_real_vllm_exec.py)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

from real_vllm import vllmtier
from real_vllm.vllmtier import (
    Tracker,
    cli_argv,
    count_lines,
    read_lines,
    serve_flags,
    wait_for,
    write_chat_requests,
)

START_TIMEOUT = 240  # one start is ~30 s on 2 idle cores; other work on the machine slows it


def _all_ok_once(out: Path, ids: list[str]) -> None:
    lines = read_lines(out)
    seen = [line["custom_id"] for line in lines]
    assert sorted(seen) == sorted(ids), "exactly one line per request"
    bad = [line for line in lines if line["error"] is not None]
    assert not bad, bad[:3]


def _start(argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def _wait_some_written(proc: subprocess.Popen[str], out: Path, more_than: int) -> int:
    wait_for(
        lambda: count_lines(out) > more_than or proc.poll() is not None,
        START_TIMEOUT,
        f"more than {more_than} lines in {out}",
    )
    assert proc.poll() is None, f"exec ended early: {proc.communicate()[1][-3000:]}"
    return count_lines(out)


def test_ctrl_c_and_kill_9_mid_run_leave_no_vllm_and_the_same_command_finishes(
    vllm_setup: dict[str, Any], vllm_env: dict[str, str], procs: Tracker, tmp_path: Path
) -> None:
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_chat_requests(requests, 600, max_tokens=48)
    argv = cli_argv("exec", str(requests), "-o", str(out), "-c", "16", *serve_flags(vllm_setup))

    # Ctrl-C: jsonlbatch stops the server, exits 130; nothing of vLLM is left.
    proc = _start(argv, vllm_env)
    first = _wait_some_written(proc, out, 10)
    assert procs.engine(), "the engine runs while requests are answered"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 130, err[-3000:]
    assert procs.vllm() == [], "no vLLM process after Ctrl-C"
    after_int = count_lines(out)
    assert first <= after_int < len(ids)

    # kill -9 of jsonlbatch itself: the reaper takes the server down.
    proc = _start(argv, vllm_env)
    _wait_some_written(proc, out, after_int + 10)
    proc.kill()
    proc.communicate(timeout=30)
    wait_for(lambda: procs.vllm() == [], 60, "vLLM gone after kill -9 of jsonlbatch")
    after_kill = count_lines(out)
    assert after_kill < len(ids)

    # The same command again: exactly one line per request.
    done = subprocess.run(
        argv, capture_output=True, text=True, env=vllm_env, timeout=600, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming: {after_kill} of {len(ids)} requests already have" in done.stderr
    _all_ok_once(out, ids)


def test_restart_server_after_the_engine_is_killed(
    vllm_setup: dict[str, Any], vllm_env: dict[str, str], procs: Tracker, tmp_path: Path
) -> None:
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_chat_requests(requests, 300, max_tokens=32)
    argv = cli_argv(
        "exec",
        str(requests),
        "-o",
        str(out),
        "-c",
        "16",
        "--restart-server",
        "1",
        "--backoff",
        "0.5",
        *serve_flags(vllm_setup),
    )
    proc = _start(argv, vllm_env)
    _wait_some_written(proc, out, 10)
    engine = procs.engine()
    assert engine, "VLLM::EngineCore and its worker run"
    vllmtier.kill_all(engine)  # as the OOM killer or a GPU fault would
    _, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err[-4000:]
    assert "restarting it (1 of 1)" in err and "is serving again" in err, err[-4000:]
    _all_ok_once(out, ids)
    log = (tmp_path / "out.jsonl.server.log").read_text(errors="replace")
    assert log.count("start 2:") == 1, "one restart, logged in the same file"
    assert not any(pid in engine for pid in procs.vllm())

"""Helpers of the real-vLLM tier (`pytest -m vllm`): where the setup is, how to start things.

The setup (`scripts/setup_vllm_cpu.py`) writes `setup.json` into its home directory
(`JSONLBATCH_VLLM_HOME`, default `~/.cache/jsonlbatch/vllm-cpu`); without it the tier skips.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DEFAULT_HOME = Path.home() / ".cache" / "jsonlbatch" / "vllm-cpu"
SERVED = "tiny"
MAX_MODEL_LEN = 512
#: Flags every test server gets: float32 on any CPU; -O0 skips torch.compile, which halves the
#: start on 2 cores (about 30 s instead of 60 s) and changes nothing a client can see.
SERVER_ARGS = ("--dtype", "float32", "-O0")


def home() -> Path:
    return Path(os.environ.get("JSONLBATCH_VLLM_HOME", DEFAULT_HOME)).expanduser()


def load_setup() -> dict[str, Any] | None:
    """setup.json, or None when the setup has not run (or its venv is gone)."""
    path = home() / "setup.json"
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not Path(info.get("vllm", "")).exists() or not Path(info.get("model", "")).is_dir():
        return None
    return info


SKIP_REASON = (
    f"real vLLM is not set up ({home() / 'setup.json'} missing): run "
    "`python3 scripts/setup_vllm_cpu.py` (JSONLBATCH_VLLM_HOME moves it)"
)


def free_port() -> int:
    """A port the kernel just handed out: far from 8000, where other launch tests start."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_flags(setup: dict[str, Any], *extra: str) -> list[str]:
    """`--serve vllm` and the flags every launched test server shares."""
    flags = [
        "--port",
        str(free_port()),
        "--serve",
        "vllm",
        "--model-path",
        setup["model"],
        "--served-model-name",
        SERVED,
        "--max-model-len",
        str(MAX_MODEL_LEN),
    ]
    flags += [f"--server-arg={arg}" for arg in SERVER_ARGS]
    return flags + list(extra)


def write_chat_requests(
    path: Path, count: int, *, model: str = SERVED, max_tokens: int = 16, **extra: Any
) -> list[str]:
    """`count` chat requests; returns their custom_ids."""
    ids = [f"req-{i}" for i in range(count)]
    with open(path, "wb") as f:
        for i, cid in enumerate(ids):
            body = {
                "model": model,
                "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": f"question {i}: add {i} and 2"}],
                **extra,
            }
            line = {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}
            f.write(orjson.dumps(line) + b"\n")
    return ids


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "jsonlbatch", *args]


def run_cli(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        cli_argv(*args),
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _proc(pid: str) -> tuple[bytes, bytes, int] | None:
    """(cmdline, environ, session id) of a live process; None if gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        if fields[0] == b"Z":
            return None
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:
        return None
    return cmdline, environ, int(fields[3])  # fields: state ppid pgrp session ...


class Tracker:
    """The processes a test started, vLLM's renamed ones included.

    vLLM renames its engine processes with setproctitle (`VLLM::EngineCore`), which wipes what
    /proc shows of their environment: a JSONLBATCH_TEST_TAG no longer finds them. They stay in
    the session the launcher gave the server, so a thread notes the sessions of tagged
    processes while the test runs, and a process in one of those sessions is the test's too.
    """

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.needle = f"JSONLBATCH_TEST_TAG={tag}".encode()
        self.sessions: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            self.pids()

    def pids(self, *, vllm_only: bool = False) -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            info = _proc(entry)
            if info is None:
                continue
            cmdline, environ, sid = info
            if self.needle in environ.split(b"\0"):
                if sid == int(entry):  # a tagged session leader: the launcher's reaper
                    self.sessions.add(sid)
            elif sid not in self.sessions:
                continue
            if not vllm_only or cmdline.startswith(b"VLLM::") or b"vllm" in cmdline:
                found.append(int(entry))
        return found

    def vllm(self) -> list[int]:
        """Live vLLM processes of the test: `vllm serve`, `VLLM::*`, their resource tracker."""
        return self.pids(vllm_only=True)

    def engine(self) -> list[int]:
        """The engine's processes (`VLLM::EngineCore`, `VLLM::Worker`)."""
        out = []
        for pid in self.vllm():
            info = _proc(str(pid))
            if info is not None and info[0].startswith(b"VLLM::"):
                out.append(pid)
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def wait_for(condition: Any, timeout: float, what: str, poll: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        time.sleep(poll)


def kill_all(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def parse_with_real_parsers(setup: dict[str, Any], items: list[dict]) -> list[dict]:
    """Run parse_cli.py in the vLLM venv on [{"kind", "argv"}, ...]."""
    env = {**os.environ, **setup["env"]}
    out = subprocess.run(
        [setup["python"], str(HERE / "parse_cli.py")],
        input=json.dumps(items),
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)

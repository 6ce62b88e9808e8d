"""Run stand-in servers in tests and prove that none of their processes outlives a test.

Every process a test starts inherits a unique `JSONLBATCH_TEST_TAG`; after the test,
`standin_session` looks for any live process whose environment carries the tag (reapers,
servers, their workers, a CLI child) and fails the test if one survives a bounded wait.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.machinery import SourceFileLoader
from pathlib import Path

import orjson
import pytest

STANDINS = Path(__file__).resolve().parent
ROOT = STANDINS.parent.parent
SERVERS_MD = Path("/work/shared/reference/servers.md")
_SURVIVOR_WAIT = 20.0  # longer than the reaper's grace in these tests


@dataclass
class Standins:
    """The current test's stand-in setup."""

    tag: str
    record: Path  # one JSON line per server start (see standin.py)
    tmp: Path

    def records(self, *, moved: bool = False) -> list[dict]:
        """One record per server start, in order. A start whose port another process took
        before it could bind it (the launcher then starts it again on another port,
        serve/ports.py) is left out unless `moved`: on this shared machine that can happen to
        any test, and it is no start the test made."""
        if not self.record.exists():
            return []
        lines = [orjson.loads(line) for line in self.record.read_bytes().splitlines()]
        lost = {r["pid"] for r in lines if "lost_port" in r}
        return [r for r in lines if "lost_port" not in r and (moved or r["pid"] not in lost)]

    def env(self, **knobs: object) -> dict[str, str]:
        """The environment for a CLI subprocess, with STANDIN_* knobs (READY_DELAY=2, ...)."""
        env = dict(os.environ)
        env.update({f"STANDIN_{k.upper()}": str(v) for k, v in knobs.items()})
        return env


def standin_parser(kind: str) -> argparse.ArgumentParser:
    """The argparse parser of the `vllm` or `sglang` stand-in: the real flags, rejecting
    unknown ones (for `vllm`, the top-level parser with its `serve` subcommand)."""
    path = STANDINS / "vllm" if kind == "vllm" else STANDINS / "sglang" / "launch_server.py"
    name = f"{kind}_standin"
    sys.path.insert(0, str(STANDINS))
    try:
        loader = SourceFileLoader(name, str(path))
        spec = importlib.util.spec_from_loader(name, loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    finally:
        sys.path.remove(str(STANDINS))
    return module.parser()


def tagged_pids(tag: str) -> list[int]:
    """Live processes started under `tag` (zombies hold nothing and are left out)."""
    needle = f"JSONLBATCH_TEST_TAG={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and needle in environ.split(b"\0"):
            found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def wait_until(condition: Callable[[], bool], timeout: float = 60.0) -> bool:
    """Poll `condition` until it holds (True) or `timeout` passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def wait_no_survivors(tag: str, timeout: float = _SURVIVOR_WAIT) -> list[int]:
    """Wait (bounded) until no tagged process is left; returns the survivors, if any."""
    deadline = time.monotonic() + timeout
    while True:
        left = tagged_pids(tag)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def standin_session(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Standins]:
    """The body of each launch test file's autouse fixture: stand-ins first on PATH and
    PYTHONPATH, a tag on every child, and after the test a check that none survives."""
    tag = uuid.uuid4().hex
    paths = [str(STANDINS), str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    monkeypatch.setenv("PATH", os.pathsep.join(paths))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(STANDINS), str(ROOT)]))
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    monkeypatch.setenv("JSONLBATCH_TEST_TAG", tag)
    monkeypatch.setenv("STANDIN_RECORD", str(tmp_path / "record.jsonl"))
    for name in [k for k in os.environ if k.startswith("STANDIN_") and k != "STANDIN_RECORD"]:
        monkeypatch.delenv(name)
    for name in ("CUDA_VISIBLE_DEVICES", "VLLM_API_KEY", "JSONLBATCH_SERVER_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    yield Standins(tag, tmp_path / "record.jsonl", tmp_path)
    survivors = wait_no_survivors(tag)
    for pid in survivors:  # do not leak them into the next test, then fail this one
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not survivors, f"processes survived the test: {survivors}"

"""Shared fixtures: real mock servers over real HTTP on 127.0.0.1.

- `mock_server(**MockConfig fields) -> base URL ending in /v1`: an in-process server on its
  own thread and loop, usable from sync tests, async tests and subprocess-based tests alike.
- `mock_process(*args, wait=True, env=None) -> MockProcess`: `python -m jsonlbatch.mock` as a
  child process on a free port, for tests that kill, restart or signal the server.
- `free_port()`: a port nothing listens on right now.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

import pytest

from jsonlbatch.mock import BackgroundMock, MockConfig

READY_TIMEOUT = 30.0  # a cold interpreter on a busy 2-core machine can be slow to import


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (free when asked: bind it soon)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def mock_server() -> Iterator[Callable[..., str]]:
    """Factory: `url = mock_server(**MockConfig fields)`; every server stops at teardown."""
    started: list[BackgroundMock] = []

    def factory(**fields: object) -> str:
        server = BackgroundMock(MockConfig(**fields))  # type: ignore[arg-type]
        started.append(server)
        return server.url

    yield factory
    for server in started:
        server.close()


class MockProcess:
    """`python -m jsonlbatch.mock` on a fixed port, which survives `kill()` + `restart()`."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.args = list(args)
        self.env = env
        self.port = free_port()
        self.proc: subprocess.Popen[str] | None = None
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, wait: bool = True) -> MockProcess:
        command = [sys.executable, "-m", "jsonlbatch.mock", "--port", str(self.port), *self.args]
        environ = {**os.environ, **(self.env or {})}
        self._stderr.seek(0)
        self._stderr.truncate()
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=environ
        )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> str:
        """Block until the ready line; return it. Fails with the server's stderr if it died."""
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"mock exited with {self.proc.returncode}: {self.stderr()}")
            readable, _, _ = select.select([self.proc.stdout], [], [], 0.05)
            if readable:
                line = self.proc.stdout.readline()
                if "ready on" in line:
                    return line.strip()
        raise AssertionError(f"mock not ready after {timeout} s: {self.stderr()}")

    def stderr(self) -> str:
        self._stderr.flush()
        self._stderr.seek(0)
        return self._stderr.read()

    def send(self, sig: int, timeout: float = 10.0) -> int:
        """Send `sig` and return the exit code once the process is gone."""
        assert self.proc is not None
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL, as a crash would: no cleanup, the port is simply gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def restart(self, wait: bool = True) -> MockProcess:
        """Start again on the same port (killing the old process if it still runs)."""
        self.kill()
        return self.start(wait)

    def close(self) -> None:
        self.kill()
        self._stderr.close()


@pytest.fixture
def mock_process() -> Iterator[Callable[..., MockProcess]]:
    """Factory: `mock_process("--latency", "0.1", wait=True, env=None)`; killed at teardown."""
    started: list[MockProcess] = []

    def factory(*args: str, wait: bool = True, env: dict[str, str] | None = None) -> MockProcess:
        process = MockProcess(list(args), env)
        started.append(process)
        return process.start(wait)

    yield factory
    for process in started:
        process.close()


@pytest.fixture(autouse=True)
def _reap_started_cli() -> Iterator[None]:
    """No `jsonlbatch` process or in-process batch front started by a test outlives it, even
    when the test fails."""
    yield
    import batchutil

    batchutil.kill_started()
    if "batchapiutil" in sys.modules:  # the batch fronts a test ran in this process
        sys.modules["batchapiutil"].stop_fronts()


# The work tree stays clean: a test writes only under its temporary directories. The session
# compares the repository's `git status` (ignored files included: a test writing into an ignored
# folder such as examples/post/out/ is caught too) at its start and end, and fails when a test
# created or changed a file. Caches that Python and the tools write are not a test's doing.
_TOOL_LITTER = ("__pycache__/", ".pytest_cache/", ".ruff_cache/", ".mypy_cache/", ".venv/",
                ".egg-info/", ".pyc")  # fmt: skip
_TREE_KEY = pytest.StashKey[dict[str, str] | None]()


def _tree_state() -> dict[str, str] | None:
    """Each path git reports as untracked, changed or ignored -> a digest of its content;
    None outside a git checkout (an sdist, a copy): there is nothing to compare against."""
    import hashlib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "-z", "--untracked-files=all",
             "--ignored=matching"],
            capture_output=True, timeout=120,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    state: dict[str, str] = {}
    for entry in done.stdout.decode("utf-8", "replace").split("\0"):
        path = entry[3:]
        if not path or any(part in path or path.endswith(part) for part in _TOOL_LITTER):
            continue
        target, digest = root / path, hashlib.sha256(entry[:2].encode())
        if target.is_dir():  # an ignored folder: what lies in it
            for sub in sorted(target.rglob("*")):
                with contextlib.suppress(OSError):
                    stat = sub.stat()
                    digest.update(f"{sub}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
        elif target.is_file():
            digest.update(target.read_bytes())
        state[path] = digest.hexdigest()
    return state


def pytest_sessionstart(session: pytest.Session) -> None:
    session.stash[_TREE_KEY] = _tree_state()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.stash.get(_TREE_KEY, None)
    after = _tree_state() if before is not None else None
    if before is None or after is None:
        return
    changed = sorted(p for p in after.keys() | before.keys() if after.get(p) != before.get(p))
    if changed:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = (
            "the tests changed the work tree (a test must write only under its tmp_path): "
            + ", ".join(changed[:20])
        )
        if reporter is not None:
            reporter.write("\n")  # after the progress dots
            reporter.write_line(message, red=True)
        else:
            sys.stderr.write(message + "\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

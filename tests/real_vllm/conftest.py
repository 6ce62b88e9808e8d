"""Fixtures of the real-vLLM tier: the setup, a per-test environment, one shared server.

Every test here is marked `vllm` and so left out of the default run (`addopts = -m 'not vllm'`);
`pytest -m vllm` runs them, and they skip with the reason when the setup has not run.
Each test's processes carry a JSONLBATCH_TEST_TAG (see `vllmtier.Tracker`); after the test
none may be left.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from real_vllm import vllmtier

_SURVIVOR_WAIT = 40.0  # vLLM's engine takes some seconds to go after SIGTERM


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = str(vllmtier.HERE)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.vllm)
            item.add_marker(pytest.mark.timeout(600))  # three server starts in the longest


@pytest.fixture(scope="session")
def vllm_setup() -> dict[str, Any]:
    setup = vllmtier.load_setup()
    if setup is None:
        pytest.skip(vllmtier.SKIP_REASON)
    return setup


@pytest.fixture(scope="session")
def vllm_bin(vllm_setup: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with `vllm` in it, for PATH: the launcher runs `vllm` as a user's would."""
    folder = tmp_path_factory.mktemp("bin")
    (folder / "vllm").symlink_to(vllm_setup["vllm"])
    return folder


def _env(setup: dict[str, Any], bin_dir: Path, tag: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "VLLM_API_KEY")}
    env.update(setup["env"])
    env.update(
        PATH=os.pathsep.join([str(bin_dir), env.get("PATH", "")]),
        PYTHONUNBUFFERED="1",
        HF_HUB_OFFLINE="1",
        JSONLBATCH_TEST_TAG=tag,
    )
    return env


def _no_survivors(tracker: vllmtier.Tracker) -> None:
    """Wait (bounded) until none of the test's processes is left; kill and fail if one is."""
    with contextlib.suppress(AssertionError):
        vllmtier.wait_for(lambda: not tracker.pids(), _SURVIVOR_WAIT, "", poll=0.5)
    survivors = tracker.pids()
    tracker.close()
    vllmtier.kill_all(survivors)
    assert not survivors, f"processes survived: {survivors}"


@pytest.fixture
def procs() -> Iterator[vllmtier.Tracker]:
    """The processes this test starts (vLLM's renamed engine too); none may outlive it."""
    tracker = vllmtier.Tracker(uuid.uuid4().hex)
    yield tracker
    _no_survivors(tracker)


@pytest.fixture
def vllm_env(
    vllm_setup: dict[str, Any],
    vllm_bin: Path,
    procs: vllmtier.Tracker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> dict[str, str]:
    """The environment for this test's CLI runs, tagged for `procs`."""
    monkeypatch.chdir(tmp_path)
    return _env(vllm_setup, vllm_bin, procs.tag)


class SharedServer:
    """`jsonlbatch serve --serve vllm ...` kept up for the whole session."""

    def __init__(self, setup: dict[str, Any], bin_dir: Path, workdir: Path) -> None:
        self.procs = vllmtier.Tracker(uuid.uuid4().hex)
        self.env = _env(setup, bin_dir, self.procs.tag)
        argv = vllmtier.cli_argv(
            "serve", *vllmtier.serve_flags(setup), "--server-log-dir", str(workdir)
        )
        self.log = workdir / "jsonlbatch-vllm.server.log"
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
        )
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(
            target=lambda: [lines.put(x) for x in self.proc.stdout], daemon=True
        ).start()  # type: ignore[union-attr]
        try:
            self.url = lines.get(timeout=240).strip()
        except queue.Empty:
            self.stop()
            raise AssertionError(f"`jsonlbatch serve` printed no URL: {self.proc.stderr}") from None
        assert self.url.startswith("http://127.0.0.1:") and self.url.endswith("/v1"), self.url

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=60)
        return err


@pytest.fixture(scope="session")
def shared_server(
    vllm_setup: dict[str, Any], vllm_bin: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SharedServer]:
    """One real server for the tests that need a running one (starting one takes ~30 s)."""
    server = SharedServer(vllm_setup, vllm_bin, tmp_path_factory.mktemp("shared"))
    yield server
    err = server.stop()
    assert server.proc.returncode == 0, err
    _no_survivors(server.procs)

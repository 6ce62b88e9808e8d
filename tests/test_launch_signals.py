"""Whatever ends jsonlbatch (Ctrl-C, SIGTERM, SIGKILL, an error), no server process survives."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from batchutil import read_results, write_requests
from standins.harness import (
    Standins,
    standin_session,
    tagged_pids,
    wait_no_survivors,
    wait_until,
)

pytestmark = pytest.mark.timeout(120, method="thread")


@pytest.fixture(autouse=True)
def standins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Standins]:
    yield from standin_session(monkeypatch, tmp_path)


class Lines:
    """A child's output, line by line, read with a deadline (no read can hang a test)."""

    def __init__(self, stream) -> None:  # type: ignore[no-untyped-def]
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream) -> None:  # type: ignore[no-untyped-def]
        for line in stream:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, text: str, timeout: float = 60.0, count: int = 1) -> str:
        """The `count`-th line containing `text` (the first by default)."""
        while True:
            found = [line for line in self.seen if text in line]
            if len(found) >= count:
                return found[count - 1]
            try:
                line = self._queue.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"{text!r} not seen in {timeout}s: {self.seen}") from None
            if line is None:
                raise AssertionError(f"{text!r} not seen before EOF: {self.seen}")
            self.seen.append(line)

    def rest(self, timeout: float = 30.0) -> str:
        while True:
            line = self._queue.get(timeout=timeout)
            if line is None:
                return "".join(self.seen)
            self.seen.append(line)


def start(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Lines, Lines]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "jsonlbatch", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    return proc, Lines(proc.stdout), Lines(proc.stderr)


def models_of(url: str) -> bytes:
    with urllib.request.urlopen(url + "/models", timeout=5) as resp:
        return resp.read()


def _fake_nvidia_smi(folder: Path) -> None:
    script = folder / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        '  --query-gpu=index,uuid) echo "0, GPU-aaa" ;;\n'
        "  --query-gpu=index) echo 0 ;;\n"
        '  *) echo "4242, python3, 70000 MiB, GPU-aaa" ;;\n'
        "esac\n"
    )
    script.chmod(0o755)


@pytest.mark.slow
def test_ctrl_c_stops_jsonlbatch_serve_and_its_servers(
    standins: Standins, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = standins.tmp / "bin"
    bin_dir.mkdir()
    _fake_nvidia_smi(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN_GRANDCHILD", "1")
    proc, out, err = start("serve", "--backend", "vllm", "--model-path", "M", "--gpus", "0")
    url = out.wait_for("http://").strip()
    assert b'"id":"M"' in models_of(url)
    warning = err.wait_for("already use the GPUs")
    assert "pid 4242 python3 (70000 MiB)" in warning
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0
    assert "stopping server(s)" in err.rest()
    (record,) = standins.records()
    assert record["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert wait_no_survivors(standins.tag) == []


@pytest.mark.slow
def test_sigterm_stops_mock_replicas_started_by_serve(standins: Standins) -> None:
    proc, out, err = start(
        "serve", "--backend", "mock", "--served-model-name", "m", "--dp-size", "2",
        "--dp-mode", "replicas", "--server-log-dir", "logs",
    )  # fmt: skip
    urls = [out.wait_for("http://", count=i).strip() for i in (1, 2)]
    assert urls[0] != urls[1] and all(b'"id":"m"' in models_of(u) for u in urls)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    err.rest()
    assert sorted(p.name for p in (standins.tmp / "logs").iterdir()) == [
        "jsonlbatch-mock.server-0.log",
        "jsonlbatch-mock.server-1.log",
    ]


@pytest.mark.slow
def test_ctrl_c_while_the_server_is_still_loading(standins: Standins) -> None:
    env = standins.env(ready_delay=120, grandchild=1)
    proc, _, err = start("serve", "--backend", "sglang", "--model-path", "M", env=env)
    err.wait_for("waiting for server")
    assert tagged_pids(standins.tag)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    assert "interrupted; the server(s) were stopped" in err.rest()


@pytest.mark.slow
def test_sigkill_of_the_parent_still_takes_the_servers_down(standins: Standins) -> None:
    script = (
        "import time\n"
        "from jsonlbatch.serve.start import ServeOptions, serving\n"
        "with serving(ServeOptions('vllm', model_path='M', dp_size=2, dp_mode='replicas',\n"
        "             gpus=('0', '1')), quiet=True) as servers:\n"
        "    print('READY', flush=True)\n"
        "    time.sleep(600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        env=standins.env(grandchild="1"),
    )
    Lines(proc.stdout).wait_for("READY")
    records = standins.records()
    pids = [pid for r in records for pid in (r["pid"], r["grandchild"])]
    assert len(pids) == 4 and all(pid in tagged_pids(standins.tag) for pid in pids)
    proc.kill()  # no cleanup code runs in the parent: the reapers see their pipe close
    proc.wait(timeout=10)
    assert wait_no_survivors(standins.tag) == []


def test_bad_gpu_fit_fails_before_anything_starts(standins: Standins) -> None:
    proc, _, err = start(
        "serve", "--backend", "vllm", "--model-path", "M", "--tp-size", "2", "--dp-size", "4",
        "--gpus", "0,1,2",
    )  # fmt: skip
    assert proc.wait(timeout=60) == 2
    assert "needs 8 GPUs, but --gpus gives 3 (0,1,2)" in err.rest()
    assert standins.records() == []


def test_serve_reports_a_crash_at_start_in_the_servers_words(standins: Standins) -> None:
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB"
    env = standins.env(crash_at_start=oom)
    proc, _, err = start("serve", "--backend", "vllm", "--model-path", "M", env=env)
    assert proc.wait(timeout=60) == 1
    text = err.rest()
    assert "Error: server 0" in text and oom in text and "Traceback" not in text


@pytest.mark.slow
def test_exec_serve_interrupted_mid_run_then_resumed(standins: Standins) -> None:
    requests, output = standins.tmp / "req.jsonl", standins.tmp / "resp.jsonl"
    write_requests(requests, 200, model="M")
    args = ("exec", str(requests), "-o", str(output), "--serve", "vllm", "--model-path", "M")
    env = standins.env(latency=0.05, grandchild=1)
    proc, _, err = start(*args, "-c", "2", "--server-arg=--max-num-seqs=4", env=env)
    err.wait_for("ready after")
    assert wait_until(lambda: output.exists() and output.read_bytes().count(b"\n") >= 4)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    err.rest()
    assert wait_no_survivors(standins.tag) == []
    assert 4 <= len(read_results(output)) < 200
    proc, _, err = start(*args, "-q", env=standins.env())
    assert proc.wait(timeout=90) == 0, err.rest()
    assert len(read_results(output)) == 200
    log = (standins.tmp / "resp.jsonl.server.log").read_text()
    assert log.count("start 1: vllm serve M") == 2  # one server per run, logged beside the output
    assert "--max-num-seqs=4" in standins.records()[0]["argv"]


@pytest.mark.slow
def test_ctrl_c_right_after_startup_is_a_clean_interrupt(standins: Standins) -> None:
    requests, output = standins.tmp / "req.jsonl", standins.tmp / "resp.jsonl"
    write_requests(requests, 50, model="M")
    args = ("exec", str(requests), "-o", str(output), "--serve", "sglang", "--model-path", "M")
    proc, _, err = start(*args, env=standins.env(latency=0.2))
    err.wait_for("ready after")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    assert "Traceback" not in err.rest()


@pytest.mark.slow
def test_a_sigkilled_reaper_still_takes_its_server_down(standins: Standins) -> None:
    """Ray SIGKILLs the children of an actor that ends; the server below the reaper must not be
    orphaned: it gets SIGTERM through the kernel's parent-death signal. (A server that writes
    nothing, so no broken pipe ends it instead.)"""
    from jsonlbatch.serve.backends import Command
    from jsonlbatch.serve.launch import ServerProcess
    from jsonlbatch.serve.reaper import group_pids

    sleeper = Command((sys.executable, "-c", "import time; time.sleep(300)"), ())
    server = ServerProcess(0, sleeper, "http://127.0.0.1:1/v1", str(standins.tmp / "s.log"),
                           served_name="x")  # fmt: skip
    server.start()
    try:
        reaper = server.pid
        assert reaper is not None
        assert wait_until(lambda: len(group_pids(reaper)) == 2, timeout=30)
        (child,) = [pid for pid in group_pids(reaper) if pid != reaper]
        os.kill(reaper, signal.SIGKILL)  # the reaper only, not its group
        assert wait_until(lambda: not _alive(child), timeout=30)
    finally:
        server.kill_group(signal.SIGKILL)
        server.release()
    assert wait_no_survivors(standins.tag) == []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_ray_without_the_extra_says_how_to_install_it(standins: Standins) -> None:
    shadow = standins.tmp / "shadow" / "ray"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no ray here')\n")
    env = dict(os.environ, PYTHONPATH=f"{shadow.parent}{os.pathsep}{os.environ['PYTHONPATH']}")
    requests = standins.tmp / "req.jsonl"
    write_requests(requests, 2)
    done = subprocess.run(
        [sys.executable, "-m", "jsonlbatch", "exec", str(requests), "-o",
         str(standins.tmp / "out.jsonl"), "--serve", "mock", "--ray"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "pip install 'jsonlbatch[ray]'" in done.stderr and "Traceback" not in done.stderr
    assert not (standins.tmp / "out.jsonl").exists()


@pytest.mark.slow
def test_serve_keeps_its_logs_out_of_the_current_directory(
    standins: Standins, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26: a bare `serve` wrote jsonlbatch-<backend>.server.log into the current
    directory; its logs go to a fresh per-run directory under the temp dir, named on stderr."""
    temp = standins.tmp / "systemp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    before = sorted(p.name for p in standins.tmp.iterdir())
    proc, out, err = start("serve", "--backend", "mock", "--served-model-name", "m")
    out.wait_for("http://")
    line = err.wait_for("(log: ")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    err.rest()
    log = Path(line.rsplit("(log: ", 1)[1].rstrip().rstrip(")"))
    assert log.parent.parent == temp and log.parent.name.startswith("jsonlbatch-serve-mock-")
    assert log.name == "jsonlbatch-mock.server.log" and log.stat().st_size > 0
    assert sorted(p.name for p in standins.tmp.iterdir()) == before  # nothing new here

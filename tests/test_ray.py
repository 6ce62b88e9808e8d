"""Replicas placed by Ray (`--ray`, `--ray-address`), against a real local Ray cluster.

The tier `pytest -m ray` (run by .ci/run after the default suite): one Ray head for the module,
started here on the loopback address with 4 declared GPUs on this CPU-only machine and token
authentication (a token file of the module's own, never ~/.ray), and the stand-in vLLM and
SGLang servers (tests/standins) as replicas. The drivers get the token but not the mode: they
read it from the cluster. Every test checks that no server, reaper or actor process survives
it, and that the cluster's GPUs are all free again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from batchutil import read_results, write_requests
from standins.harness import Standins, standin_session, tagged_pids, wait_no_survivors, wait_until

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'jsonlbatch[ray]'")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300, method="thread")]
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
_TOKEN: list[str] = []  # the module's token file, for _ray_python


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def token(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The cluster's token file (RAY_AUTH_TOKEN_PATH), made here: a fresh machine has none."""
    path = tmp_path_factory.mktemp("token") / "auth_token"
    path.write_text(uuid.uuid4().hex + uuid.uuid4().hex)
    path.chmod(0o600)
    _TOKEN[:] = [str(path)]
    return str(path)


def _ray_python(address: str, code: str, timeout: float = 90) -> str:
    """Run `code` in a fresh driver joined to the cluster; its stdout."""
    prelude = f"import ray\nray.init(address={address!r}, log_to_driver=False)\n"
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": _TOKEN[0]}
    done = subprocess.run(
        [sys.executable, "-c", prelude + code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **RAY_ENV, **auth},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, token: str) -> Iterator[str]:
    """A Ray head on 127.0.0.1 with 4 declared GPUs and token authentication; its whole process
    group goes at the end."""
    port = _free_port()
    home = tmp_path_factory.mktemp("ray")
    log = home / "head.log"
    with open(log, "wb") as out:
        head = subprocess.Popen(
            [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
             f"--port={port}", "--num-gpus=4", "--num-cpus=2", "--include-dashboard=false",
             "--disable-usage-stats"],
            stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, **RAY_ENV, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token},
            start_new_session=True, cwd=home,  # the workers' cwd: never the work tree
        )  # fmt: skip
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                _ray_python(address, "print(ray.cluster_resources()['GPU'])", timeout=60)
                break
            except (AssertionError, subprocess.TimeoutExpired):
                if time.monotonic() > deadline or head.poll() is not None:
                    pytest.fail("the Ray head did not start:\n" + log.read_text()[-3000:])
                time.sleep(2)
        yield address
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()


@pytest.fixture(autouse=True)
def standins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, token: str) -> Iterator[Standins]:
    for name, value in RAY_ENV.items():
        monkeypatch.setenv(name, value)
    for name in AUTH_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", token)  # the token, not the mode: that is read
    # forwarded to the replicas' actors (JSONLBATCH_* and server settings go by default)
    monkeypatch.setenv("JSONLBATCH_RAY_ENV", "PATH,PYTHONPATH,PYTHONUNBUFFERED,STANDIN_RECORD")
    yield from standin_session(monkeypatch, tmp_path)


def _free_gpus(address: str) -> float:
    return float(_ray_python(address, "print(ray.available_resources().get('GPU', 0))"))


def _all_gpus_free(address: str) -> bool:
    return wait_until(lambda: _free_gpus(address) == 4.0, timeout=60)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "jsonlbatch", *args]


def test_replicas_get_their_own_gpu_groups_and_serve_one_output(
    cluster: str, standins: Standins
) -> None:
    requests, output = standins.tmp / "req.jsonl", standins.tmp / "resp.jsonl"
    write_requests(requests, 40, model="M")
    done = subprocess.run(
        _cli("exec", str(requests), "-o", str(output), "--serve", "vllm", "--model-path", "M",
             "--tp-size", "2", "--dp-size", "2", "--dp-mode", "replicas", "--ray-address", cluster,
             "-q"),
        capture_output=True, text=True, timeout=240, env=dict(os.environ),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = read_results(output)
    assert len(results) == 40 and all(r["error"] is None for r in results.values())
    records = standins.records()
    assert sorted(r["env"]["CUDA_VISIBLE_DEVICES"] for r in records) == ["0,1", "2,3"]
    # launched servers are named by index in the lines (their ports change every run)
    assert {r["metrics"]["endpoint"] for r in results.values()} == {"server 0", "server 1"}
    assert wait_no_survivors(standins.tag) == []
    assert _all_gpus_free(cluster)


def test_a_replica_killed_mid_run_is_restarted_in_place(cluster: str, standins: Standins) -> None:
    requests, output = standins.tmp / "req.jsonl", standins.tmp / "resp.jsonl"
    write_requests(requests, 30, model="M")
    env = {**os.environ, "STANDIN_CRASH_AFTER": "4",
           "STANDIN_CRASH_MARKER": str(standins.tmp / "crashed")}  # fmt: skip
    env["JSONLBATCH_RAY_ENV"] += ",STANDIN_CRASH_AFTER,STANDIN_CRASH_MARKER"
    done = subprocess.run(
        _cli("exec", str(requests), "-o", str(output), "--serve", "vllm", "--model-path", "M",
             "--dp-size", "2", "--dp-mode", "replicas", "--restart-server", "1",
             "--ray-address", cluster, "-c", "4"),
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "restarting it (1 of 1)" in done.stderr
    results = read_results(output)
    assert len(results) == 30 and all(r["error"] is None for r in results.values())
    starts = standins.records()
    assert len(starts) in (3, 4)  # two replicas, one or both (a race at request 5) restarted
    ports = [r["argv"][r["argv"].index("--port") + 1] for r in starts]
    assert len(set(ports)) == 2  # the restart kept its port, so exec's endpoint came back
    assert wait_no_survivors(standins.tag) == []
    assert _all_gpus_free(cluster)


def test_a_port_taken_before_the_bind_moves_the_replica_and_port_is_a_base(
    cluster: str, standins: Standins
) -> None:
    """`--port` with several replicas is the first of their ports; a replica whose port another
    process took before its server bound it is started again by its actor on another."""
    requests, output = standins.tmp / "req.jsonl", standins.tmp / "resp.jsonl"
    write_requests(requests, 20, model="M")
    env = {**os.environ, "STANDIN_PORT_TAKEN": str(standins.tmp / "taken")}
    env["JSONLBATCH_RAY_ENV"] += ",STANDIN_PORT_TAKEN"
    base = _free_port()
    done = subprocess.run(
        _cli("exec", str(requests), "-o", str(output), "--serve", "vllm", "--model-path", "M",
             "--dp-size", "2", "--dp-mode", "replicas", "--port", str(base),
             "--ray-address", cluster),
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = read_results(output)
    assert len(results) == 20 and all(r["error"] is None for r in results.values())
    starts = [r["argv"][r["argv"].index("--port") + 1] for r in standins.records(moved=True)]
    assert str(base) in starts and len(starts) >= 3
    assert "was taken before it could bind it; starting it again on port" in done.stderr
    assert len({r["metrics"]["endpoint"] for r in results.values()}) == 2
    assert wait_no_survivors(standins.tag) == []
    assert _all_gpus_free(cluster)


def test_serve_prints_replica_urls_and_ctrl_c_removes_everything(
    cluster: str, standins: Standins
) -> None:
    proc = subprocess.Popen(
        _cli("serve", "--backend", "sglang", "--model-path", "/ckpt/m", "--dp-size", "2",
             "--dp-mode", "replicas", "--ray-address", cluster),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )  # fmt: skip
    try:
        urls = [proc.stdout.readline().strip() for _ in range(2)]
        assert all(u.startswith("http://127.0.0.1:") and u.endswith("/v1") for u in urls), urls
        assert _free_gpus(cluster) == 2.0  # each replica holds one GPU (TP 1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert wait_no_survivors(standins.tag) == []
    assert _all_gpus_free(cluster)


def test_sigkill_of_the_driver_leaves_no_server_and_no_reserved_gpu(
    cluster: str, standins: Standins
) -> None:
    requests, output = standins.tmp / "req.jsonl", standins.tmp / "resp.jsonl"
    write_requests(requests, 400, model="M")
    env = {**os.environ, "STANDIN_LATENCY": "0.2"}
    env["JSONLBATCH_RAY_ENV"] += ",STANDIN_LATENCY"
    proc = subprocess.Popen(
        _cli("exec", str(requests), "-o", str(output), "--serve", "vllm", "--model-path", "M",
             "--tp-size", "2", "--dp-size", "2", "--dp-mode", "replicas", "--ray-address", cluster,
             "-c", "4", "-q"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    try:
        assert wait_until(lambda: output.exists() and output.stat().st_size > 0, timeout=180)
        assert len(standins.records()) == 2 and tagged_pids(standins.tag)
    finally:
        proc.kill()
        proc.wait()
    assert wait_no_survivors(standins.tag, timeout=60) == []  # Ray ended the orphaned actors
    assert _all_gpus_free(cluster)
    done = len(read_results(output))
    assert 0 < done < 400  # killed mid-run; the same command would resume


def _fresh_machine(standins: Standins) -> dict[str, str]:
    """The environment of a machine that never ran Ray: an empty HOME (no ~/.ray, no token),
    no cluster address, no authentication settings."""
    home = standins.tmp / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in (*AUTH_VARS, "RAY_ADDRESS")}
    return {**env, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_CONFIG_HOME": str(home / ".config")}  # fmt: skip


def test_a_fresh_laptop_gets_a_local_cluster_that_goes_with_the_run(standins: Standins) -> None:
    """`--ray` without an address on a machine where ~/.ray never existed: a one-machine cluster
    on 127.0.0.1 with a token of its own (Ray refuses a token-mode head without one), torn down
    at the end with its token."""
    requests, output = standins.tmp / "req.jsonl", standins.tmp / "resp.jsonl"
    write_requests(requests, 10)
    env = _fresh_machine(standins)
    done = subprocess.run(
        _cli("exec", str(requests), "-o", str(output), "--serve", "mock", "--dp-size", "3",
             "--dp-mode", "replicas", "--ray"),
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "starting a local Ray cluster" in done.stderr
    results = read_results(output)
    assert len(results) == 10 and all(r["error"] is None for r in results.values())
    assert len({r["metrics"]["endpoint"] for r in results.values()}) == 3
    assert wait_no_survivors(standins.tag, timeout=60) == []  # the head ran under our reaper
    assert not (Path(env["HOME"]) / ".ray" / "auth_token").exists()


def test_a_cluster_that_wants_a_token_the_driver_lacks_is_named(
    cluster: str, standins: Standins
) -> None:
    if not hasattr(ray.exceptions, "AuthenticationError"):
        pytest.skip(f"Ray {ray.__version__} has no token authentication (2.52 added it)")
    requests = standins.tmp / "req.jsonl"
    write_requests(requests, 2, model="M")
    done = subprocess.run(
        _cli("exec", str(requests), "-o", str(standins.tmp / "resp.jsonl"), "--serve", "vllm",
             "--model-path", "M", "--dp-size", "2", "--dp-mode", "replicas",
             "--ray-address", cluster),
        capture_output=True, text=True, timeout=120, env=_fresh_machine(standins),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"the Ray cluster at {cluster} uses token authentication and this driver has no " in (
        done.stderr
    )
    assert "RAY_AUTH_TOKEN_PATH" in done.stderr and "Traceback" not in done.stderr
    assert standins.records() == [] and not (standins.tmp / "resp.jsonl").exists()

"""exec over several models: `--fleet`, `--endpoints`, several `--url`s. Each request goes to the
model its body names, exactly once; one model's failure stays that model's."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from batchutil import cli, read_results
from standins.harness import Standins, standin_session, wait_no_survivors, wait_until
from test_launch_signals import start

pytestmark = pytest.mark.timeout(180, method="thread")

MODELS = ("fast", "mid", "slow")
# vLLM stand-ins on fake GPUs: each answers only its own name (a misrouted request is a 404).
FLEET = """\
models:
  - {{backend: vllm, model_path: /m/fast, served_model_name: fast, gpu_count: 1,
     env: {{STANDIN_LATENCY: 0.002}}}}
  - {{backend: vllm, model_path: /m/mid, served_model_name: mid, gpus: [3], concurrency: {mid_c},
     env: {{STANDIN_LATENCY: {mid_latency}}}}}
  - {{backend: vllm, model_path: /m/slow, served_model_name: slow, dp_size: 2, dp_mode: replicas,
     gpu_count: 2, env: {{STANDIN_LATENCY: 0.01}}}}
"""


@pytest.fixture(autouse=True)
def standins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Standins]:
    session = standin_session(monkeypatch, tmp_path)
    standins = next(session)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # fake GPU ids, as SLURM sets them
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    yield standins
    with contextlib.suppress(StopIteration):
        next(session)  # the check that no process outlived the test


def mixed(path: Path, n: int, models: tuple[str, ...] = MODELS) -> dict[str, str]:
    """`n` requests naming the models in turn; custom_id -> model."""
    lines, asked = [], {}
    for i in range(n):
        model = models[i % len(models)]
        asked[f"r{i}"] = model
        body = {"model": model, "messages": [{"role": "user", "content": f"q {i}"}]}
        lines.append({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                      "body": {**body, "max_tokens": 4}})  # fmt: skip
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return asked


def fleet(tmp: Path, mid_latency: float = 0.02, mid_c: int = 8, *, two: bool = False) -> Path:
    """The three-model fleet; `two`: fast and mid only (fewer servers to start)."""
    path = tmp / "fleet.yaml"
    text = FLEET.format(mid_latency=mid_latency, mid_c=mid_c)
    path.write_text(text[: text.index("  - {backend: vllm, model_path: /m/slow")] if two else text)
    return path


def server_pid(standins: Standins, model: str) -> int:
    (pid,) = [
        r["pid"] for r in standins.records()
        if r["argv"][r["argv"].index("--served-model-name") + 1] == model
    ]  # fmt: skip
    return pid


def done_by_model(output: Path) -> Counter[str]:
    if not output.exists():
        return Counter()
    data = output.read_bytes()
    data = data[: data.rfind(b"\n") + 1]  # a line being written may be read half
    return Counter(
        orjson.loads(line)["response"]["body"]["model"]
        for line in data.splitlines()
        if b'"status_code":200' in line
    )


def run(*args: str) -> subprocess.CompletedProcess:
    """The CLI (in-process: `batchutil.cli`) in this test's environment: the stand-ins first
    on PATH and PYTHONPATH for the servers it launches."""
    return cli(*args, env=dict(os.environ), timeout=150)


def check_routed(
    output: Path, asked: dict[str, str], ports: dict[str, set[int]] | None = None
) -> None:
    """Exactly one line per request, each answered by a server of the model it names."""
    results = read_results(output)
    assert set(results) == set(asked)
    for cid, line in results.items():
        model = asked[cid]
        assert line["response"]["body"]["model"] == model, line
        endpoint = line["metrics"]["endpoint"]
        if ports:  # servers already running: named by URL
            port = int(endpoint.rsplit(":", 1)[1].split("/")[0])
            assert port in ports[model], (cid, model, endpoint)
        else:  # launched by the run: named by model and replica (`slow/1`)
            assert endpoint.split("/")[0] == model, (cid, model, endpoint)


@pytest.mark.slow
def test_a_mixed_file_over_a_fleet_survives_a_kill_9_of_one_model(standins: Standins) -> None:
    requests, output = standins.tmp / "req.jsonl", standins.tmp / "out.jsonl"
    asked = mixed(requests, 3000)
    proc, _, err = start(
        "exec", str(requests), "-o", str(output), "--fleet", str(fleet(standins.tmp)),
        "-c", "16", "--restart-server", "1",
    )  # fmt: skip
    err.wait_for("every model serves")
    assert wait_until(lambda: done_by_model(output)["mid"] >= 100, timeout=60)
    pid = server_pid(standins, "mid")
    os.kill(pid, signal.SIGKILL)
    assert proc.wait(timeout=120) == 0, err.rest()
    text = err.rest()
    assert "server mid/0" in text and "restarting it (1 of 1)" in text
    assert "server fast/0" not in text.split("restarting it")[0].rsplit("\n", 1)[-1]
    assert len(standins.records()) == 5  # fast, mid, slow x2, and mid once more
    check_routed(output, asked)
    assert {line["metrics"]["endpoint"] for line in read_results(output).values()} == {
        "fast/0", "mid/0", "slow/0", "slow/1"}  # fmt: skip
    assert wait_no_survivors(standins.tag) == []
    envs = {r["pid"]: r["env"] for r in standins.records()}
    pinned = sorted(e["CUDA_VISIBLE_DEVICES"] for e in envs.values())
    assert pinned == ["0", "1", "2", "3", "3"]  # fast 0, slow 1 and 2, mid 3 (twice)
    roots = {e["VLLM_CACHE_ROOT"] for e in envs.values()}  # a restart keeps its instance's
    assert len(roots) == 4 and all(r.startswith(str(standins.tmp / "cache")) for r in roots)
    assert len({e["TRITON_CACHE_DIR"] for e in envs.values()}) == 4


@pytest.mark.slow
def test_a_model_that_cannot_come_back_fails_its_requests_and_the_others_finish(
    standins: Standins,
) -> None:
    requests, output = standins.tmp / "req.jsonl", standins.tmp / "out.jsonl"
    asked = mixed(requests, 200, ("fast", "mid"))
    args = ("exec", str(requests), "-o", str(output), "--fleet",
            str(fleet(standins.tmp, mid_latency=0.1, mid_c=2, two=True)))  # fmt: skip
    proc, _, err = start(*args)
    err.wait_for("every model serves")
    assert wait_until(lambda: done_by_model(output)["mid"] >= 4, timeout=60)
    os.kill(server_pid(standins, "mid"), signal.SIGKILL)
    assert proc.wait(timeout=120) == 3, err.rest()  # finished, some requests failed
    err.rest()
    results = read_results(output)
    assert set(results) == set(asked)
    failed = {cid for cid, line in results.items() if line["error"] is not None}
    assert failed and {asked[cid] for cid in failed} == {"mid"}
    assert all(asked[c] != "mid" or c in failed or results[c]["response"] for c in results)
    message = results[sorted(failed)[0]]["error"]
    assert message["code"] == "model_unavailable"
    assert "model 'mid' is unavailable: model mid is down for good" in message["message"]
    assert done_by_model(output)["fast"] == 100
    assert wait_no_survivors(standins.tag) == []


@pytest.mark.slow
def test_ctrl_c_tears_every_model_down_and_the_same_command_resumes(standins: Standins) -> None:
    requests, output = standins.tmp / "req.jsonl", standins.tmp / "out.jsonl"
    asked = mixed(requests, 40, ("fast", "mid"))
    args = ("exec", str(requests), "-o", str(output), "--fleet",
            str(fleet(standins.tmp, mid_latency=0.2, mid_c=4, two=True)))  # fmt: skip
    proc, _, err = start(*args)
    err.wait_for("every model serves")
    assert wait_until(lambda: done_by_model(output)["mid"] >= 2, timeout=60)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    assert "stopping the fleet's servers" in err.rest()
    assert wait_no_survivors(standins.tag) == []
    assert 0 < len(read_results(output)) < 40
    done = run(*args, "-q")
    assert done.returncode == 0, done.stderr
    check_routed(output, asked)


def test_mistakes_are_refused_before_any_server_starts(standins: Standins) -> None:
    requests, output = standins.tmp / "req.jsonl", standins.tmp / "out.jsonl"
    mixed(requests, 30, ("fast", "nope", "mid"))
    done = run("exec", str(requests), "-o", str(output), "--fleet", str(fleet(standins.tmp)))
    assert done.returncode == 1
    assert "no endpoint serves 'nope' (10 requests); served: fast, mid, slow" in done.stderr
    overlap = standins.tmp / "overlap.yaml"
    overlap.write_text(FLEET.format(mid_latency=0, mid_c=1).replace("gpu_count: 1", "gpus: [3]"))
    mixed(requests, 30)
    done = run("exec", str(requests), "-o", str(output), "--fleet", str(overlap))
    assert done.returncode == 2
    assert "Error: GPU 3 is given to both fast and mid" in done.stderr
    assert "Traceback" not in done.stderr
    placed = standins.tmp / "nodes.yaml"
    placed.write_text(FLEET.format(mid_latency=0, mid_c=1).replace("gpus: [3]", "node: n2"))
    done = run("exec", str(requests), "-o", str(output), "--fleet", str(placed))
    assert done.returncode == 2
    assert "exec --fleet launches every model here, but mid run on other nodes" in done.stderr
    assert standins.records() == [] and not output.exists()


def test_endpoints_file_and_several_urls_route_by_model(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    urls = {m: mock_server(served_models=(m,), latency=0.001) for m in ("a", "b")}
    both = mock_server(served_models=("c", "c-alias"))
    requests, output = tmp_path / "req.jsonl", tmp_path / "out.jsonl"
    asked = mixed(requests, 90, ("a", "b", "c"))
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(orjson.dumps({
        "a": {"urls": [urls["a"]], "concurrency": 2}, "b": {"urls": [urls["b"]]},
        "c": {"urls": [both]}, "c-alias": {"urls": [both]},
    }).decode())  # fmt: skip
    done = run("exec", str(requests), "-o", str(output), "--endpoints", str(endpoints), "-q")
    assert done.returncode == 0, done.stderr
    port_of = {m: {int(u.rsplit(":", 1)[1].split("/")[0])} for m, u in urls.items()}
    port_of["c"] = {int(both.rsplit(":", 1)[1].split("/")[0])}
    check_routed(output, asked, port_of)
    output.unlink()
    done = run("exec", str(requests), "-o", str(output), "--url", urls["a"], "--url",
               urls["b"], "--url", both, "-q")  # fmt: skip
    assert done.returncode == 0, done.stderr
    check_routed(output, asked, port_of)
    output.unlink()
    mixed(requests, 9, ("a", "b", "zz"))
    done = run("exec", str(requests), "-o", str(output), "--url", urls["a"], "--url", urls["b"])
    assert done.returncode == 1 and not output.exists()
    assert "no endpoint serves 'zz' (3 requests); served: a, b. Nothing was sent" in done.stderr

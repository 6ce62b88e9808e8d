"""A fleet file: checked with lines, GPUs placed without overlap, served and torn down as one."""

from __future__ import annotations

import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from standins.harness import Standins, standin_session, wait_no_survivors
from test_launch_signals import start

from jsonlbatch.errors import InputError, UsageError
from jsonlbatch.exec.route.endpoints_file import read_endpoints
from jsonlbatch.experiment.spec import load_experiment
from jsonlbatch.serve.fleet import SERVE_KEYS, load_fleet, place
from jsonlbatch.serve.fleetrun import plan_fleet
from jsonlbatch.serve.gpus import GpuList

pytestmark = pytest.mark.timeout(120, method="thread")

FLEET = """\
cache_dir: caches
models:
  - backend: vllm
    model_path: /ckpt/agent
    served_model_name: agent
    dp_size: 2
    dp_mode: replicas
    tool_call_parser: hermes
    env: {STANDIN_LATENCY: 0.01}
  - {backend: vllm, model_path: /ckpt/expert, served_model_name: [expert, expert-2],
     gpus: [4, 5], tp_size: 2, server_seed: 7, gpu_memory_utilization: 0.88}
  - {backend: mock, served_model_name: small, gpu_count: 1, server_args: "--latency 0.02"}
"""


@pytest.fixture(autouse=True)
def standins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Standins]:
    yield from standin_session(monkeypatch, tmp_path)


def write(tmp: Path, text: str, name: str = "fleet.yaml") -> str:
    path = tmp / name
    path.write_text(text)
    return str(path)


def test_counts_are_placed_on_the_gpus_no_entry_names(tmp_path: Path) -> None:
    fleet = load_fleet(write(tmp_path, FLEET))
    placed = place(fleet, GpuList(tuple("01234567"), "CUDA_VISIBLE_DEVICES"))
    assert [e.options.gpus for e in placed] == [("0", "1"), ("4", "5"), ("2",)]
    assert [e.name for e in placed] == ["agent", "expert", "small"]
    expert = placed[1].options
    assert expert.seed == 7 and expert.served_model_name == ("expert", "expert-2")
    assert placed[2].options.server_args == ("--latency", "0.02")


def test_overlap_and_shortfall_are_errors_naming_the_models(tmp_path: Path) -> None:
    overlap = FLEET.replace("dp_mode: replicas", "dp_mode: replicas\n    gpus: [3, 4]")
    fleet = load_fleet(write(tmp_path, overlap))
    with pytest.raises(UsageError, match="GPU 4 is given to both agent and expert"):
        place(fleet, GpuList(tuple("01234567"), "--gpus"))
    fleet = load_fleet(write(tmp_path, FLEET))
    with pytest.raises(UsageError, match=r"needs 5 GPUs \(agent 2, small 1, 2 listed by gpus:\)"):
        place(fleet, GpuList(("0", "1", "4", "5"), "--gpus"))
    with pytest.raises(UsageError, match="expert asks for GPU 4, but --gpus gives 0,1,2"):
        place(fleet, GpuList(("0", "1", "2"), "--gpus"))
    with pytest.raises(UsageError, match="placing agent, small on GPUs of their own needs a GPU"):
        place(fleet, None)


def test_every_problem_of_a_fleet_file_is_listed_with_its_line(tmp_path: Path) -> None:
    bad = """\
models:
  - {backend: vllm, model_path: m, served_model_name: a, tp_size: two}
  - {backend: vllm, model_path: m, served_model_name: a, colour: red}
  - {backend: mock, served_model_name: b, gpus: [1, 1]}
  - {backend: tgi, model_path: m, served_model_name: c}
  - {backend: mock, served_model_name: d, gpus: [0], gpu_count: 1}
"""
    with pytest.raises(InputError) as info:
        load_fleet(write(tmp_path, bad))
    text = str(info.value)
    assert "fleet.yaml:2: models.0.tp_size: must be a integer, got str 'two'" in text
    assert "fleet.yaml:3: models.1.colour: unknown key (known: backend, model_path," in text
    assert "fleet.yaml:4: models.2.gpus: gpus names a GPU twice: 1,1" in text
    assert "fleet.yaml:5: models.3: unknown server 'tgi'" in text
    assert "fleet.yaml:6: models.4: give gpus (a list) or gpu_count, not both" in text
    twice = "models:\n  - {backend: mock, served_model_name: a}\n  - {backend: mock, served_model_name: [b, a]}\n"
    with pytest.raises(
        InputError, match=r"fleet.yaml:3: .*'a' is served by an earlier entry too \(line 2\)"
    ):
        load_fleet(write(tmp_path, twice))


def test_an_experiment_serve_mapping_takes_the_fleet_names(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text('{"q": 1}\n')
    exp = """\
experiment: {id: e}
data: {file: d.jsonl}
prompt: {text: "{{ q }}"}
conditions:
  a: {model: m, serve: {backend: mock, served_model_name: m, server_seed: 3, env: {X: 1}}}
  b: {model: m, serve: {backend: mock, seed: 3}}
"""
    with pytest.raises(InputError) as info:
        write(tmp_path, exp, "e.yaml")
        load_experiment("e.yaml")  # the test runs in tmp_path
    known = ", ".join(SERVE_KEYS)
    assert str(info.value).splitlines()[1:] == [
        f"  e.yaml:6: conditions.b.serve.seed: unknown key (known: {known})"
    ]


def test_each_instance_gets_its_gpus_ports_caches_and_log(tmp_path: Path) -> None:
    fleet = load_fleet(write(tmp_path, FLEET))
    servers = plan_fleet(fleet, log_stem=str(tmp_path / "out.jsonl"), gpus=("0,1,2,3,4,5,6",))
    procs = [p for _, g in servers.groups for p in g.processes]
    envs = [dict(p.command.env) for p in procs]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1", "4,5", "2"]
    roots = [e["VLLM_CACHE_ROOT"] for e in envs[:3]]
    assert len(set(roots)) == 3 and all(r.startswith(str(tmp_path / "caches")) for r in roots)
    assert len({e["TRITON_CACHE_DIR"] for e in envs[:3]}) == 3
    assert "VLLM_CACHE_ROOT" not in envs[3]  # the mock compiles nothing
    assert envs[0]["STANDIN_LATENCY"] == "0.01" and "STANDIN_LATENCY" not in envs[2]
    assert len({p.url for p in procs}) == 4
    assert [Path(p.log_path).name for p in procs] == [
        "out.jsonl.agent.server-0.log",
        "out.jsonl.agent.server-1.log",
        "out.jsonl.expert.server.log",
        "out.jsonl.small.server.log",
    ]
    no_cache = FLEET.replace(
        "tool_call_parser: hermes", "tool_call_parser: hermes\n    caches: false"
    )
    servers = plan_fleet(load_fleet(write(tmp_path, no_cache)), gpus=("0,1,2,3,4,5",))
    assert "VLLM_CACHE_ROOT" not in dict(servers.groups[0][1].processes[0].command.env)


def models_of(url: str) -> list[str]:
    with urllib.request.urlopen(url + "/models", timeout=5) as resp:
        return [m["id"] for m in orjson.loads(resp.read())["data"]]


@pytest.mark.slow
def test_serve_fleet_writes_the_endpoints_file_and_sigterm_stops_every_model(
    standins: Standins,
) -> None:
    write(standins.tmp, FLEET)
    proc, _out, err = start(
        "serve", "--fleet", "fleet.yaml", "--endpoints-out", "endpoints.json",
        "--gpus", "0,1,2,3,4,5", "--server-log-dir", "logs",
    )  # fmt: skip
    err.wait_for("serving the fleet")
    endpoints = read_endpoints([str(standins.tmp / "endpoints.json")])
    assert sorted(endpoints) == ["agent", "expert", "expert-2", "small"]
    agent = endpoints["agent"]
    assert (len(agent.urls), agent.backend, agent.tp, agent.dp) == (2, "vllm", 1, 2)
    assert endpoints["expert-2"].urls == endpoints["expert"].urls
    for name in ("agent", "expert", "small"):
        for url in endpoints[name].urls:
            assert name in models_of(url)
    pinned = sorted(r["env"]["CUDA_VISIBLE_DEVICES"] for r in standins.records())
    assert pinned == ["0", "1", "4,5"]  # the mock is no stand-in: it records nothing
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert "stopping the fleet's servers" in err.rest()
    assert wait_no_survivors(standins.tag) == []
    logs = sorted(p.name for p in (standins.tmp / "logs").iterdir())
    assert logs == [
        "jsonlbatch-fleet.agent.server-0.log",
        "jsonlbatch-fleet.agent.server-1.log",
        "jsonlbatch-fleet.expert.server.log",
        "jsonlbatch-fleet.small.server.log",
    ]


@pytest.mark.slow
def test_stagger_starts_models_one_after_another_and_ctrl_c_stops_them(
    standins: Standins,
) -> None:
    text = "stagger: 30\nmodels:\n" + "".join(
        f"  - {{backend: mock, served_model_name: m{i}}}\n" for i in range(2)
    )
    write(standins.tmp, text)
    proc, _out, err = start("serve", "--fleet", "fleet.yaml")
    status = err.wait_for("waiting for server", timeout=30)  # shown from the 3rd second on
    assert "1/2 ready) 1 starting later (stagger)" in status  # m1 starts 30 s after m0
    assert any("starting server m0/0" in line for line in err.seen)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    assert "starting server m1/0" not in err.rest()
    assert wait_no_survivors(standins.tag) == []


def test_nodes_choose_what_runs_where(tmp_path: Path) -> None:
    text = FLEET.replace("served_model_name: agent", "served_model_name: agent\n    node: n1")
    fleet = load_fleet(write(tmp_path, text))
    gpus = GpuList(tuple("01234567"), "CUDA_VISIBLE_DEVICES")
    assert [e.name for e in place(fleet, gpus, node="n1")] == ["agent"]
    assert [e.name for e in place(fleet, gpus)] == ["expert", "small"]
    with pytest.raises(UsageError, match=r"no model of the fleet runs on node 'n2' \(nodes: n1\)"):
        place(fleet, gpus, node="n2")

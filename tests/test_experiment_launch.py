"""`jsonlbatch run` on the launch target (issue 45, item 1): a condition's `serve:` servers are
a `RunSpec` target (`serve.target.KeptLaunch`), so an experiment keeps the launcher's watchdog
and per-server keys, over a real launched mock (a subprocess under its reaper)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from batchutil import cli, read_results, start_cli
from conftest import free_port
from procutil import pids_with

pytest.importorskip("yaml", reason="experiment files need PyYAML: pip install -e '.[test]'")
from jsonlbatch.serve.gpus import port_is_free


def experiment(folder: Path, serve: dict, *, rows: int, judge: bool = False) -> Path:
    folder.mkdir(exist_ok=True)
    data = [{"id": f"t{i}", "q": f"question {i}"} for i in range(rows)]
    (folder / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    steps: list[dict] = [{"exec": {"concurrency": 2}}]
    if judge:
        (folder / "judge.j2").write_text("Grade {{ q }}\n")
        steps.append({"judge": {"template": "judge.j2", "extract": "regex:mock-[a-f]*(\\d)",
                                "pass": "score >= 0", "rounds": 1}})  # fmt: skip
    spec = {
        "experiment": {"id": "e"},
        "data": {"file": "tasks.jsonl", "id": "{{ id }}"},
        "prompt": {"text": "Q: {{ q }}"},
        "defaults": {"model": "mock", "max_tokens": 4, "serve": serve},
        "conditions": {"a": {"temperature": 0.0}},
        "steps": steps,
    }
    path = folder / "experiment.yaml"
    path.write_text(json.dumps(spec))
    return path


def test_launched_servers_get_their_own_key_in_every_step(tmp_path: Path) -> None:
    """The server's key (`serve: api_key_env`) goes to the launched mock, which refuses any
    request without it: exec and the judge round both answer, through one launch."""
    port = free_port()
    serve = {"backend": "mock", "port": port, "api_key_env": "EXP_SERVER_KEY"}
    path = experiment(tmp_path / "exp", serve, rows=4, judge=True)
    env = {**os.environ, "EXP_SERVER_KEY": "sk-exp-server-key-1234"}
    env.pop("JSONLBATCH_CONFIG", None)
    runs = tmp_path / "runs"
    done = cli("run", str(path), "--runs", str(runs), env=env)
    assert done.returncode == 0, done.stderr
    answers = read_results(runs / "e" / "a" / "responses.jsonl")
    assert len(answers) == 4 and all(line["error"] is None for line in answers.values())
    judged = read_results(runs / "e" / "a" / "judge" / "round-1" / "judge-responses.jsonl")
    assert len(judged) == 4 and all(line["error"] is None for line in judged.values())
    assert done.stderr.count("starting server 0") == 1  # one launch for both steps
    assert "sk-exp-server-key-1234" not in done.stderr
    assert port_is_free("127.0.0.1", port)


@pytest.mark.slow
def test_a_launched_server_that_dies_ends_the_run_promptly(tmp_path: Path) -> None:
    """The mock the experiment launched is killed mid-exec: the launcher's watchdog ends the run
    at once (not after the 1800 s ready timeout), naming the server; the rerun resumes."""
    port = free_port()
    serve = {"backend": "mock", "port": port, "server_args": ["--latency", "0.2"]}
    path = experiment(tmp_path / "exp", serve, rows=40)
    runs = tmp_path / "runs"
    responses = runs / "e" / "a" / "responses.jsonl"
    proc = start_cli("run", str(path), "--runs", str(runs), "-q")
    deadline = time.monotonic() + 60
    while not (responses.exists() and responses.read_bytes().count(b"\n") >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    pids = pids_with("jsonlbatch.mock", "--port", str(port))
    assert pids, "the launched mock is not found"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    _, err = proc.communicate(timeout=90)  # the old runner waited up to 1800 s here
    assert time.monotonic() - killed < 60
    assert proc.returncode not in (0, None), err
    assert "exited with status" in err and "Traceback" not in err, err
    assert port_is_free("127.0.0.1", port)
    written = responses.read_bytes().count(b"\n")
    assert 3 <= written < 40
    again = cli("run", str(path), "--runs", str(runs))
    assert again.returncode == 0, again.stderr
    assert sorted(read_results(responses)) == sorted(f"t{i}" for i in range(40))


def test_a_url_and_a_launched_server_of_different_models_get_a_pool_each(
    tmp_path: Path, mock_server: Any
) -> None:
    """The condition's `url` serves the judge's model only, its launched mock (which wants its
    own key) the answers' model only: each is asked what it serves with its own key, and each
    request goes to the one that serves its model."""
    judge_url = mock_server(served_models=("judge-model",))
    port = free_port()
    serve = {"backend": "mock", "port": port, "served_model_name": "mock",
             "api_key_env": "EXP_SERVER_KEY"}  # fmt: skip
    path = experiment(tmp_path / "exp", serve, rows=6, judge=True)
    spec = json.loads(path.read_text())
    spec["defaults"]["url"] = judge_url
    spec["steps"][1]["judge"]["model"] = "judge-model"
    path.write_text(json.dumps(spec))
    runs = tmp_path / "runs"
    env = {**os.environ, "EXP_SERVER_KEY": "sk-exp-server-key-5678"}
    env.pop("JSONLBATCH_CONFIG", None)
    done = cli("run", str(path), "--runs", str(runs), env=env)
    assert done.returncode == 0, done.stderr
    answers = read_results(runs / "e" / "a" / "responses.jsonl")
    assert {line["response"]["body"]["model"] for line in answers.values()} == {"mock"}
    judged = read_results(runs / "e" / "a" / "judge" / "round-1" / "judge-responses.jsonl")
    assert {line["response"]["body"]["model"] for line in judged.values()} == {"judge-model"}
    assert port_is_free("127.0.0.1", port)

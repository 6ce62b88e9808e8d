"""`jsonlbatch run experiment.yaml`: checking, skipping by hash, re-running dependants, resuming.

Request counts come from the mock's own `/mock/stats`, so "sends nothing" is what the server saw.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import orjson
import pytest
from batchutil import cli, failures, read_results, start_cli
from conftest import free_port

from jsonlbatch.errors import InputError

pytest.importorskip("yaml", reason="experiment files need PyYAML: pip install -e '.[test]'")
from jsonlbatch.experiment.runner import run_experiment
from jsonlbatch.experiment.spec import load_experiment
from jsonlbatch.serve.gpus import port_is_free


def sent(url: str) -> int:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/mock/stats", timeout=5) as resp:
        return orjson.loads(resp.read())["requests"].get("/v1/chat/completions", 0)


def write_experiment(folder: Path, url: str, *, rows: int = 6, b_temperature: float = 0.7,
                     gold: str = "gold.jsonl", concurrency: int = 8, judge: bool = True) -> Path:  # fmt: skip
    folder.mkdir(exist_ok=True)
    data = [{"id": f"t{i}", "q": f"question {i}", "answer": str(i)} for i in range(rows)]
    (folder / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    (folder / "gold.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    (folder / "gold2.jsonl").write_text(
        "".join(json.dumps({**r, "answer": "0"}) + "\n" for r in data)
    )
    (folder / "prompt.j2").write_text("Q: {{ q }}\n")
    (folder / "judge.j2").write_text("Grade {{ q }} -> {{ answer }}\n")
    steps = [{"exec": {"concurrency": concurrency}}]
    if judge:
        steps.append(
            {
                "judge": {
                    "template": "judge.j2",
                    "extract": "regex:mock-[a-f]*(\\d)",
                    "pass": "score >= 5",
                    "rounds": 2,
                }
            }
        )
    (folder / "files.json").write_text(json.dumps({r["id"]: {"a.py": "x = 1\n"} for r in data}))
    post = {"votes": {"extract": ["last-number"], "gold": gold}, "files": None,
            "patches": {"files_json": "files.json"}}  # fmt: skip
    steps += [{"post": post}, {"export": {"format": "csv"}},
              {"report": {"compare": ["a", "b"]}}]  # fmt: skip
    spec = {
        "experiment": {"id": "exp1"},
        "data": {"file": "tasks.jsonl", "id": "{{ id }}"},
        "prompt": {"template": "prompt.j2", "system": "Be brief."},
        "defaults": {"model": "mock", "url": url, "max_tokens": 8},
        "conditions": {
            "a": {"temperature": 0.0, "seed": 1},
            "b": {"temperature": b_temperature, "suffix": " /no_think"},
        },
        "steps": steps,
    }
    path = folder / "experiment.yaml"
    path.write_text(json.dumps(spec, indent=1))  # JSON is YAML
    return path


def statuses(result) -> dict[tuple[str, str], str]:
    return {(o.condition, o.step): o.status for o in result.outcomes}


def test_rerun_sends_nothing_and_a_changed_setting_reruns_only_its_dependants(
    tmp_path, mock_server
):
    url = mock_server()
    path = write_experiment(tmp_path / "exp", url)
    runs = str(tmp_path / "runs")
    first = run_experiment(str(path), runs_dir=runs, quiet=True)
    assert set(statuses(first).values()) == {"ran"}
    after_first = sent(url)
    assert after_first >= 2 * (6 + 6)  # answers and judge prompts of both conditions, round 1
    root = tmp_path / "runs" / "exp1"
    for name in ("a", "b"):
        assert len(read_results(root / name / "responses.jsonl")) == 6
        assert len((root / name / "judge" / "final.jsonl").read_bytes().splitlines()) == 6
        assert len((root / name / "votes.jsonl").read_bytes().splitlines()) == 6
    assert (root / "a" / "files" / "manifest.jsonl").exists()
    assert len((root / "a" / "predictions.jsonl").read_bytes().splitlines()) == 6
    with open(root / "a" / "results.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["custom_id"] for r in table] == [f"t{i}" for i in range(6)]
    assert {"answer", "voted_answer", "correct", "patch", "files"} <= set(table[0])
    report = (root / "report.md").read_text()
    assert "instances with a patch" in report and "files written" in report
    assert "| a |" in report and "| b |" in report and "judge passed" in report
    compared = orjson.loads((root / "report.json").read_bytes())["conditions"]
    assert compared["a"]["requests"] == 6 and compared["b"]["settings"]["temperature"] == 0.7

    # the same file again: every step skipped, not one request sent
    second = run_experiment(str(path), runs_dir=runs, quiet=True)
    assert set(statuses(second).values()) == {"skipped"} and sent(url) == after_first

    # b's temperature changes b's requests: b runs again from gen on, a is left alone
    write_experiment(tmp_path / "exp", url, b_temperature=0.3)
    a_before = (root / "a" / "responses.jsonl").read_bytes()
    third = statuses(run_experiment(str(path), runs_dir=runs, quiet=True))
    assert {k: v for k, v in third.items() if k[0] == "a"} == {
        ("a", s): "skipped"
        for s in ("gen", "exec", "judge", "post.votes", "post.files", "post.patches", "export")
    }
    assert {k: v for k, v in third.items() if k[0] == "b"} == {
        ("b", s): "ran"
        for s in ("gen", "exec", "judge", "post.votes", "post.files", "post.patches", "export")
    }
    assert (root / "a" / "responses.jsonl").read_bytes() == a_before
    assert sent(url) > after_first
    body = orjson.loads((root / "b" / "requests.jsonl").read_bytes().splitlines()[0])["body"]
    assert body["temperature"] == 0.3

    # a new gold file changes only post's inputs: post runs, nothing is sent
    before = sent(url)
    write_experiment(tmp_path / "exp", url, b_temperature=0.3, gold="gold2.jsonl")
    fourth = statuses(run_experiment(str(path), runs_dir=runs, quiet=True))
    # (and only the votes part of post: the extracted files do not depend on the gold file)
    # (and the export, which joins the votes)
    assert [k for k, v in fourth.items() if v == "ran"] == [
        (c, s) for c in ("a", "b") for s in ("post.votes", "export")
    ]
    assert sent(url) == before


@pytest.mark.slow
def test_kill_9_mid_exec_then_the_same_command_resumes(tmp_path, mock_process):
    mock = mock_process("--latency", "0.25")  # 4 in flight: about 16 results/s, 4 s in all
    path = write_experiment(tmp_path / "exp", mock.url, rows=60, concurrency=4, judge=False)
    responses = tmp_path / "runs" / "exp1" / "a" / "responses.jsonl"
    proc = start_cli("run", str(path), "--runs", str(tmp_path / "runs"), "--condition", "a", "-q")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if responses.exists() and len(responses.read_bytes().splitlines()) >= 8:
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.kill()  # SIGKILL: no cleanup at all
    proc.wait()
    # whole lines only: the kill may in principle land mid-write (the resume cuts a torn tail)
    done_before = responses.read_bytes().count(b"\n")
    assert 8 <= done_before < 60
    steps = orjson.loads((responses.parent / "steps.json").read_bytes())
    assert steps["exec"]["status"] == "running"
    sent_before = sent(mock.url)

    again = cli("run", str(path), "--runs", str(tmp_path / "runs"), "--condition", "a")
    assert again.returncode == 0, again.stderr
    assert "[a] gen: unchanged, skipped" in again.stderr and "exec: resuming" in again.stderr
    results = read_results(responses)
    assert sorted(results) == sorted(f"t{i}" for i in range(60))  # exactly one line each
    # only what had no result was sent again (plus at most the 4 that were in flight)
    assert sent(mock.url) - sent_before == 60 - done_before
    assert sent_before <= done_before + 4
    steps = orjson.loads((responses.parent / "steps.json").read_bytes())
    assert steps["exec"]["status"] == "done" and steps["post.votes"]["status"] == "done"


def test_the_file_is_checked_first_with_key_and_line(tmp_path):
    (tmp_path / "prompt.j2").write_text("{{ q }}")
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "experiment: {id: e1}\n"
        "data: {file: tasks.jsonl, sample: 0}\n"
        "prompt: {template: prompt.j2}\n"
        "conditions:\n"
        "  a: {model: m, url: http://127.0.0.1:9/v1, temperature: hot, colour: red}\n"
        "steps:\n"
        "  - exec: {concurrency: 4}\n"
        "  - judge: {text: 'x', pass: 'score >= 6 and __import__(\"os\")'}\n"
    )
    with pytest.raises(InputError) as err:
        load_experiment(str(bad))
    found = {(p.line, p.field) for p in err.value.problems}
    assert (2, "data.file") in found and (2, "data.sample") in found
    assert (5, "conditions.a.temperature") in found and (5, "conditions.a.colour") in found
    assert (8, "steps.1.judge") in found
    proc = cli("run", str(bad), "--runs", str(tmp_path / "runs"))
    assert (
        proc.returncode == 1
        and "bad.yaml:5: conditions.a.temperature: must be a number" in proc.stderr
    )
    assert "Traceback" not in proc.stderr and not os.path.exists(tmp_path / "runs")
    (tmp_path / "dup.yaml").write_text("experiment: {id: e}\nexperiment: {id: f}\n")
    proc = cli("run", "--check", str(tmp_path / "dup.yaml"))
    assert proc.returncode == 1 and "dup.yaml:2: experiment: appears twice" in proc.stderr
    (tmp_path / "broken.yaml").write_text("experiment: {id: e\n")
    proc = cli("run", str(tmp_path / "broken.yaml"))
    assert (
        proc.returncode == 1 and "broken.yaml:2" in proc.stderr and "Traceback" not in proc.stderr
    )


@pytest.mark.slow
def test_ctrl_c_mid_exec_tears_down_the_launched_server_and_the_rerun_finishes(tmp_path):
    """SIGINT to `jsonlbatch run`: exit 130, the mock it launched is gone, the run resumes."""
    port = free_port()
    path = write_experiment(
        tmp_path / "exp", "http://unused/v1", rows=60, concurrency=4, judge=False
    )
    spec = json.loads(path.read_text())
    del spec["defaults"]["url"]
    spec["defaults"]["serve"] = {
        "backend": "mock",
        "port": port,
        "server_args": ["--latency", "0.25"],
    }
    path.write_text(json.dumps(spec))
    runs = str(tmp_path / "runs")
    responses = tmp_path / "runs" / "exp1" / "a" / "responses.jsonl"
    proc = start_cli("run", str(path), "--runs", runs, "--condition", "a", "-q")
    deadline = time.monotonic() + 60
    while not (responses.exists() and responses.read_bytes().count(b"\n") >= 4):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "run the same command again to resume" in err and "Traceback" not in err
    assert port_is_free("127.0.0.1", port)  # the launched mock was torn down
    written = responses.read_bytes().count(b"\n")
    assert 4 <= written < 60

    again = cli("run", str(path), "--runs", runs, "--condition", "a")
    assert again.returncode == 0, again.stderr
    assert "exec: resuming" in again.stderr
    assert sorted(read_results(responses)) == sorted(f"t{i}" for i in range(60))
    assert port_is_free("127.0.0.1", port)


def test_failed_requests_make_exit_status_3_as_exec_does(tmp_path, mock_server):
    url = mock_server(fail_rate=0.5, seed=3)
    path = write_experiment(tmp_path / "exp", url, judge=False)
    spec = json.loads(path.read_text())
    spec["steps"][0]["exec"]["max_retries"] = 0  # record the injected 500s at once
    path.write_text(json.dumps(spec))
    proc = cli("run", str(path), "--runs", str(tmp_path / "runs"), "--condition", "a")
    assert proc.returncode == 3, proc.stderr
    assert "some requests failed (a: " in proc.stderr
    results = read_results(tmp_path / "runs" / "exp1" / "a" / "responses.jsonl")
    assert len(results) == 6 and 0 < len(failures(results)) < 6


def test_alias_bombs_recursive_aliases_and_deep_rules_are_refused_with_the_line(tmp_path):
    """`run --check` on hostile YAML: an alias bomb (36 s and 4 GB before), a value holding
    itself (RecursionError before) and a 3,000-deep pass rule: a located error, no traceback."""
    bomb = ["experiment: {id: e}", "data: {file: t.jsonl}", "x0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    bomb += [f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    (tmp_path / "bomb.yaml").write_text("\n".join(bomb) + "\n")
    proc = cli("run", "--check", str(tmp_path / "bomb.yaml"), timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "bomb.yaml:" in proc.stderr and "alias bomb" in proc.stderr
    (tmp_path / "self.yaml").write_text("experiment: {id: e}\ndata: &d\n  file: t.jsonl\n  x: *d\n")
    with pytest.raises(InputError) as err:
        load_experiment(str(tmp_path / "self.yaml"))
    [problem] = err.value.problems
    assert problem.line == 2 and "holds it (a recursion)" in problem.message
    deep = "not " * 3000 + "score >= 6"
    (tmp_path / "prompt.j2").write_text("{{ q }}")
    (tmp_path / "deep.yaml").write_text(
        "experiment: {id: e}\ndata: {file: t.jsonl}\nprompt: {template: prompt.j2}\n"
        "conditions: {a: {model: m, url: 'http://127.0.0.1:9/v1'}}\n"
        f"steps:\n  - judge: {{text: 'x', pass: '{deep}'}}\n"
    )
    with pytest.raises(InputError) as err:
        load_experiment(str(tmp_path / "deep.yaml"))
    found = {(p.line, p.field): p.message for p in err.value.problems}
    assert "more than 2000" in found[(6, "steps.0.judge")]
    from jsonlbatch.errors import UsageError
    from jsonlbatch.experiment.rules import PassRule

    with pytest.raises(UsageError, match="nested more than 32 deep"):
        PassRule("not " * 400 + "score >= 6", ["score"])


def test_a_typo_in_defaults_serve_is_reported_once_at_its_own_line(tmp_path):
    """Issue 26: a typo in `defaults.serve` was reported at every condition's line, once each."""
    (tmp_path / "prompt.j2").write_text("{{ q }}")
    (tmp_path / "tasks.jsonl").write_text('{"q": "x"}\n')
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "experiment: {id: e1}\n"
        "data: {file: tasks.jsonl}\n"
        "prompt: {template: prompt.j2}\n"
        "defaults:\n"
        "  model: m\n"
        "  serve:\n"
        "    {backend: mock, prot: 8000}\n"
        "conditions:\n"
        "  a: {temperature: 0.1}\n"
        "  b: {temperature: 0.2, serve: {backend: mokc}}\n"
    )
    with pytest.raises(InputError) as err:
        load_experiment(str(bad))
    found = sorted((p.line, p.field) for p in err.value.problems)
    assert found == [(7, "defaults.serve.prot"), (10, "conditions.b.serve")], found
    proc = cli("run", "--check", str(bad))
    assert proc.returncode == 1 and "(2 problems)" in proc.stderr
    (tmp_path / "one.yaml").write_text(bad.read_text().replace("mokc", "mock"))
    one = cli("run", "--check", str(tmp_path / "one.yaml"))
    assert "(1 problem)" in one.stderr and "1 problems" not in one.stderr


def test_experiment_id_that_is_not_a_string_is_a_located_problem(tmp_path):
    (tmp_path / "prompt.j2").write_text("{{ q }}")
    (tmp_path / "num.yaml").write_text(
        "experiment: {id: 5}\ndata: {file: t.jsonl}\nprompt: {template: prompt.j2}\n"
        "conditions: {a: {model: m, url: 'http://127.0.0.1:9/v1'}}\n"
    )
    with pytest.raises(InputError) as err:
        load_experiment(str(tmp_path / "num.yaml"))
    assert any(p.field == "experiment.id" and "string" in p.message for p in err.value.problems)

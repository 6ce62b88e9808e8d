"""examples/experiments/ runs as its README says, on the mock the experiment file launches."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
from batchutil import cli
from conftest import free_port

pytest.importorskip("yaml", reason="experiment files need PyYAML: pip install -e '.[test]'")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "experiments" / "experiment.yaml"


def copy_on_a_free_port(tmp_path: Path) -> Path:
    """The example as it is, but its mock on a free port: other test runs on this machine may
    hold the launcher's default port (8000 on) at the moment it binds."""
    folder = shutil.copytree(EXAMPLE.parent, tmp_path / "example")
    path = folder / EXAMPLE.name
    text = path.read_text()
    assert text.count("serve: mock") == 1
    path.write_text(text.replace("serve: mock", f"serve: {{backend: mock, port: {free_port()}}}"))
    return path


def test_the_example_runs_its_judge_loop_and_reruns_nothing(tmp_path):
    runs = tmp_path / "runs"
    example = copy_on_a_free_port(tmp_path)
    first = cli("run", str(example), "--runs", str(runs), timeout=180)
    assert first.returncode == 0, first.stderr
    # issue 26: a step's result was printed as a Python dict, and "asking 1 items again"
    assert "[a] post.votes: 5 groups, 5 samples, 5 scored, maj@1 " in first.stderr
    assert "{'" not in first.stderr and "asking 1 item again" in first.stderr
    root = runs / "exp001-baseline"
    summary = {
        name: orjson.loads((root / name / "judge" / "judge-summary.json").read_bytes())
        for name in ("a", "b")
    }
    # as the README shows: b has items passing in rounds 1, 2 and 3; a keeps three that never pass
    assert summary["b"]["passed_by_round"] == [3, 1, 1] and summary["b"]["passed"] == 5
    assert summary["a"]["passed_by_round"] == [2, 0, 0] and summary["a"]["passed"] == 2
    judged = [
        orjson.loads(x) for x in (root / "b" / "judge" / "judge.jsonl").read_bytes().splitlines()
    ]
    assert sorted(j["rounds"] for j in judged) == [1, 1, 1, 2, 3]
    assert all(j["passed"] and j["round"] == j["rounds"] for j in judged)
    assert (root / "b" / "results.csv").read_text().count("\n") == 1 + 5  # header + a row a task
    report = (root / "report.md").read_text()
    assert "| a | 0.0 | 42 | - |" in report and "3 + 1 + 1" in report

    again = cli("run", str(example), "--runs", str(runs), timeout=120)
    assert again.returncode == 0, again.stderr
    assert "starting server" not in again.stderr  # nothing to send: no server was even launched
    assert "0 steps ran, 10 unchanged" in again.stderr

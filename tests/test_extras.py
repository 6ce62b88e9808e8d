"""Optional extras: a command that needs one says which, before it reads or writes anything.

Each command runs in a real subprocess where the extra's library is made unimportable: a folder
first on PYTHONPATH holds a package of that name whose import raises ImportError, as an absent
(or broken) install would. Nothing is uninstalled.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from batchutil import write_requests

from jsonlbatch.extras import MissingExtra, hint, require


def _without(tmp_path: Path, *modules: str) -> dict[str, str]:
    """An environment in which `modules` (top-level packages) cannot be imported."""
    shadow = tmp_path / "shadow"
    for module in modules:
        (shadow / module).mkdir(parents=True, exist_ok=True)
        (shadow / module / "__init__.py").write_text(f"raise ImportError('no {module} here')\n")
    path = os.pathsep.join(p for p in (str(shadow), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def _run(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jsonlbatch", *args],
        capture_output=True, text=True, timeout=60, env=env, cwd=cwd,
    )  # fmt: skip


def _refused(done: subprocess.CompletedProcess[str], extra: str, package: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"needs {package}, which is not installed: pip install 'jsonlbatch[{extra}]'" in (
        done.stderr
    ), done.stderr


def _responses(tmp_path: Path) -> Path:
    path = tmp_path / "responses.jsonl"
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "42"},
                         "finish_reason": "stop"}]}  # fmt: skip
    line = {"id": "r1", "custom_id": "q1", "response": {"status_code": 200, "body": body},
            "error": None}  # fmt: skip
    path.write_bytes(orjson.dumps(line) + b"\n")
    return path


def test_the_message_names_the_package_and_the_extra() -> None:
    with pytest.raises(MissingExtra) as caught:
        require("json", "no_such_x", "yaml", "no_such_y.z", extra="demo", for_what="a demo")
    assert str(caught.value) == (
        "a demo needs no_such_x, no_such_y, which are not installed: pip install 'jsonlbatch[demo]'"
    )
    assert caught.value.exit_code == 2 and hint("ray") == "pip install 'jsonlbatch[ray]'"


def test_export_to_parquet_without_pyarrow(tmp_path: Path) -> None:
    responses = _responses(tmp_path)
    env = _without(tmp_path, "pyarrow")
    done = _run(env, tmp_path, "export", str(responses), "-o", "results.parquet")
    _refused(done, "parquet", "pyarrow")
    assert not (tmp_path / "results.parquet").exists()
    done = _run(env, tmp_path, "export", str(responses), "-o", "results.csv")  # needs none
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "results.csv").read_text().count("\n") == 2


def test_gen_from_parquet_without_pyarrow_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "rows.parquet").write_bytes(b"PAR1")  # never opened: the check comes first
    done = _run(_without(tmp_path, "pyarrow"), tmp_path, "gen", "--data", "rows.parquet",
                "--prompt", "{{ q }}", "--model", "m", "-o", "requests.jsonl")  # fmt: skip
    _refused(done, "parquet", "pyarrow")
    assert not (tmp_path / "requests.jsonl").exists()


def test_run_checks_every_step_before_the_first(tmp_path: Path) -> None:
    """An export to Parquet at the end of an experiment fails before gen and exec run."""
    (tmp_path / "data.jsonl").write_text('{"q": "1+1?"}\n')
    (tmp_path / "exp.yaml").write_text(
        "experiment: {id: e1}\n"
        "data: {file: data.jsonl}\n"
        "prompt: {text: '{{ q }}'}\n"
        "conditions: {a: {model: m, serve: mock}}\n"
        "steps: [exec: {}, export: {format: parquet}]\n"
    )
    done = _run(_without(tmp_path, "pyarrow"), tmp_path, "run", "exp.yaml")
    _refused(done, "parquet", "pyarrow")
    assert not (tmp_path / "runs").exists()


def test_serve_names_the_server_extra_before_starting_anything(tmp_path: Path) -> None:
    write_requests(tmp_path / "requests.jsonl", 2)
    env = {**os.environ, "PATH": str(tmp_path / "empty")}  # no `vllm` program anywhere
    done = _run(env, tmp_path, "exec", "requests.jsonl", "-o", "out.jsonl", "--serve", "vllm",
                "--model-path", "m", "--gpus", "0")  # fmt: skip
    _refused(done, "vllm", "vllm")
    assert "--server-executable" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["requests.jsonl"]  # no log, no output

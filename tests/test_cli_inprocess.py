"""`batchutil.cli` runs the CLI in the test's process: it must show what a subprocess would, or
the suite's "exit status N" and "no traceback" checks would lose their strength."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from batchutil import ENV, PROG, cli, cli_process

import jsonlbatch.cli.validate


def test_an_exception_that_escapes_the_cli_is_a_traceback_and_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(jsonlbatch.cli.validate, "validate_file", broken)
    (tmp_path / "r.jsonl").write_text("")
    done = cli("validate", str(tmp_path / "r.jsonl"))
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert "RuntimeError: a bug of ours" in done.stderr


def test_status_streams_and_usage_lines_are_a_processs(tmp_path: Path) -> None:
    done = cli("validate", str(tmp_path / "none.jsonl"))
    assert done.returncode == 1 and "cannot read" in done.stderr and done.stdout == ""
    usage, process = cli("exec"), cli_process("exec")
    assert usage.returncode == process.returncode == 2
    assert usage.stderr == process.stderr
    assert usage.stderr.startswith(f"Usage: {PROG} exec [OPTIONS] REQUESTS")


def test_the_environment_is_the_given_one_and_comes_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-of-the-test-process")
    before = dict(os.environ)
    (tmp_path / "r.jsonl").write_text("")
    env = {**ENV, "JSONLBATCH_CONFIG_PROBE": "1"}
    seen: dict[str, str] = {}

    def spy(*args: object, **kwargs: object) -> None:
        seen.update(os.environ)
        raise SystemExit(0)

    monkeypatch.setattr(jsonlbatch.cli.validate, "validate_file", spy)
    assert cli("validate", str(tmp_path / "r.jsonl"), env=env).returncode == 0
    assert seen == env and "OPENAI_API_KEY" not in seen
    assert dict(os.environ) == before

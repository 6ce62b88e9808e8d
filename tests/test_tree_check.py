"""The end-of-session check in tests/conftest.py: a test that writes into the work tree fails
the run (the check itself must be able to fail), and outside a git checkout it stands aside."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
LITTER = "from pathlib import Path\n\ndef test_it():\n    Path(__file__).parent.parent.joinpath({name!r}).write_text('x')\n"


def _project(root: Path, body: str, *, git: bool) -> Path:
    """A small project with this suite's conftest and one test."""
    (root / "tests").mkdir(parents=True)
    for name in ("conftest.py", "batchutil.py"):
        shutil.copy(TESTS / name, root / "tests" / name)
    (root / "tests" / "test_one.py").write_text(body)
    if git:
        env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
        for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "x"]):
            subprocess.run(["git", *args], cwd=root, check=True, env=env, capture_output=True)
    return root


def _pytest(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
         "tests/test_one.py"],
        cwd=root, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_test_that_writes_into_the_tree_fails_the_run(tmp_path: Path) -> None:
    root = _project(tmp_path / "repo", LITTER.format(name="left-behind.log"), git=True)
    done = _pytest(root)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 passed" in done.stdout  # the test itself passed: the session check failed it
    assert "the tests changed the work tree" in done.stdout and "left-behind.log" in done.stdout


def test_outside_a_git_checkout_the_check_stands_aside(tmp_path: Path) -> None:
    done = _pytest(_project(tmp_path / "copy", LITTER.format(name="x.log"), git=False))
    assert done.returncode == 0, done.stdout + done.stderr

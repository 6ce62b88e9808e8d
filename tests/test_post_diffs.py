"""Git-style diffs that real `git apply` accepts, and the normalized patch used for votes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from jsonlbatch.post import make_diff, normalize_code, normalized_diff
from jsonlbatch.post.diffs import syntax_errors


def git(cwd: Path, *args: str, patch: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", *args], cwd=cwd, input=patch, capture_output=True, text=True, timeout=30
    )


def make_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "base")


CASES = {
    "modify": ({"a.py": "x = 1\ny = 2\n"}, {"a.py": "x = 1\ny = 3\n"}),
    "no newline at end": ({"a.txt": "one\ntwo"}, {"a.txt": "one\nTWO"}),
    "add newline at end": ({"a.txt": "one\ntwo"}, {"a.txt": "one\ntwo\n"}),
    "create": ({"a.py": None}, {"a.py": "print(1)\n"}),
    "create empty": ({"pkg/__init__.py": None}, {"pkg/__init__.py": ""}),
    "delete": ({"a.py": "x = 1\n"}, {"a.py": None}),
    "several files": (
        {"b/c.py": "c = 1\n", "a.py": "a = 1\n"},
        {"b/c.py": "c = 2\n", "a.py": "a = 2\n"},
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_git_apply_accepts_and_reproduces_the_edit(tmp_path: Path, case: str) -> None:
    original, updated = CASES[case]
    make_tree(tmp_path, {p: t for p, t in original.items() if t is not None} or {"keep": ""})
    patch = make_diff(original, updated)
    assert patch.startswith("diff --git a/")
    check = git(tmp_path, "apply", "--check", "-", patch=patch)
    assert check.returncode == 0, check.stderr + patch
    assert git(tmp_path, "apply", "-", patch=patch).returncode == 0
    for path, text in updated.items():
        assert ((tmp_path / path).read_text() if (tmp_path / path).exists() else None) == text


def test_no_change_no_diff() -> None:
    assert make_diff({"a.py": "x\n"}, {"a.py": "x\n"}) == ""


def test_normalization_ignores_comments_docstrings_and_blank_lines() -> None:
    original = {"m.py": 'def f(x):\n    """Doc."""\n    return x\n'}
    plain = {"m.py": "def f(x):\n    return x + 1\n"}
    decorated = {
        "m.py": 'def f(x):\n    """Doc, reworded."""\n\n    # add one\n    return (x + 1)  # why\n'
    }
    assert normalized_diff(original, plain) == normalized_diff(original, decorated) != ""
    assert make_diff(original, plain) != make_diff(original, decorated)
    only_comment = {"m.py": 'def f(x):\n    """Doc."""\n    # just a comment\n    return x\n'}
    assert normalized_diff(original, only_comment) == ""


def test_normalize_non_python_drops_blank_lines_and_trailing_spaces() -> None:
    assert normalize_code("a.txt", "a  \n\n\nb\n") == "a\nb\n"
    assert normalize_code("broken.py", "def (:\n  # c\n\n  x\n") == "def (:\n  x\n"


def test_syntax_errors_blame_only_edits_that_broke_parsing() -> None:
    assert syntax_errors({"a.py": "x = 1\n"}, {"a.py": "x = (\n"}) == [
        "a.py: line 1: '(' was never closed"
    ]
    # a file that did not parse before (e.g. Python 2 code) is not the edit's fault
    assert syntax_errors({"p2.py": "print 'x'\n"}, {"p2.py": "print 'y'\n"}) == []
    assert syntax_errors({"a.txt": "x"}, {"a.txt": "x = ("}) == []

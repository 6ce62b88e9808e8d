"""scripts/regroup.py: the shared core grouped into packages, two modules split, every import and
mention rewritten, also in files the script has never seen; a second run changes nothing.

regroup: skip-file  (these tests write the old paths on purpose)

The first tests build a small tree of their own, so they hold before the lead runs the script on
the real tree and after; the slow one runs it on a copy of the real package.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "regroup.py"


def _script():
    spec = importlib.util.spec_from_file_location("regroup_script", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["regroup_script"] = module
    spec.loader.exec_module(module)
    return module


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")


def _tree(root: Path) -> None:
    """A package with the old layout: a core module to move, one to split, and importers the
    script's tables do not know."""
    _write(root, "jsonlbatch/__init__.py", '"""The package."""\n')
    _write(root, "jsonlbatch/errors.py", "class UsageError(Exception):\n    pass\n")
    _write(root, "jsonlbatch/records.py", 'CHAT_URL = "/v1/chat/completions"\n')
    _write(
        root,
        "jsonlbatch/jsonl.py",
        '''
        """Old docstring."""

        from __future__ import annotations

        import os

        from jsonlbatch.errors import UsageError

        _BUFFER = 1 << 20
        _NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


        def iter_lines(path):
            return open(path, "rb", buffering=_BUFFER)


        def same_file(a, b):
            return os.path.realpath(a) == os.path.realpath(b)


        def check_output(output, inputs=()):
            if any(same_file(output, i) for i in inputs):
                raise UsageError("the output is an input")
            OutputLock(output)


        #: One run per output.
        class OutputLock:
            def __init__(self, output):
                self.flags = _NOFOLLOW | _BUFFER * 0
        ''',
    )
    _write(root, "jsonlbatch/exec/__init__.py", '"""exec."""\n')
    _write(
        root,
        "jsonlbatch/exec/newcomer.py",
        '''
        """A module added on another branch (see jsonlbatch/jsonl.py, `jsonl.check_output`)."""

        from jsonlbatch import errors, jsonl
        from jsonlbatch.jsonl import check_output, iter_lines
        from jsonlbatch.records import CHAT_URL

        _LAZY = {"OutputLock": "jsonlbatch.jsonl", "iter_lines": "jsonlbatch.jsonl"}


        def where():
            from ..records import CHAT_URL as url

            return (url, CHAT_URL, errors, jsonl, check_output, iter_lines,
                    "jsonlbatch.records.CHAT_URL", "jsonlbatch.jsonl.same_file")
        ''',
    )
    _write(
        root,
        "docs/architecture.md",
        """
        # Architecture

        ```
             shared core: records  jsonl  errors
                          lazy
        ```

        Lines are `records.py`'s.

        ## The shared core (`jsonlbatch/*.py`)

        | module | holds |
        | --- | --- |
        | `records.py` | the line formats |
        | `jsonl.py` | crash-safe I/O and the output lock |
        | `errors.py` | the exception tree |

        ## The stages

        `jsonlbatch.jsonl.check_output` guards; `jsonl.iter_lines` reads; see jsonlbatch/records.py.
        """,
    )
    _write(
        root,
        "tests/test_layout.py",
        """
        CORE = {
            "errors", "jsonl", "records", "lazy",
        }  # fmt: skip
        """,
    )


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def _imported(path: Path) -> set[tuple[str, str]]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            found |= {("." * node.level + (node.module or ""), a.name) for a in node.names}
    return found


def test_moves_splits_and_rewrites_files_it_never_saw(tmp_path, capsys):
    _tree(tmp_path)
    assert _script().main(["--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    pkg = tmp_path / "jsonlbatch"
    assert "move    jsonlbatch/jsonl.py -> jsonlbatch/file_io/jsonl.py" in out
    assert not (pkg / "jsonl.py").exists() and not (pkg / "records.py").exists()
    assert (pkg / "batch_format" / "records.py").exists()
    assert (pkg / "file_io" / "__init__.py").exists()

    # the split: the guard and its private helper went, the reader and its buffer stayed
    guard = (pkg / "file_io" / "output_guard.py").read_text()
    kept = (pkg / "file_io" / "jsonl.py").read_text()
    assert "def check_output" in guard and "class OutputLock" in guard and "_NOFOLLOW =" in guard
    assert "#: One run per output." in guard  # the comment travels with its class
    assert "from jsonlbatch.file_io.jsonl import _BUFFER" in guard  # used by both: imported
    assert "def iter_lines" in kept and "check_output" not in kept and "UsageError" not in kept

    newcomer = pkg / "exec" / "newcomer.py"
    assert _imported(newcomer) == {
        ("jsonlbatch", "errors"),
        ("jsonlbatch.file_io", "jsonl"),
        ("jsonlbatch.file_io.output_guard", "check_output"),
        ("jsonlbatch.file_io.jsonl", "iter_lines"),
        ("jsonlbatch.batch_format.records", "CHAT_URL"),
    }
    text = newcomer.read_text()
    assert '"OutputLock": "jsonlbatch.file_io.output_guard"' in text
    assert '"iter_lines": "jsonlbatch.file_io.jsonl"' in text
    assert '"jsonlbatch.batch_format.records.CHAT_URL"' in text
    assert '"jsonlbatch.file_io.output_guard.same_file"' in text
    assert "see jsonlbatch/file_io/jsonl.py, `output_guard.check_output`" in text
    assert "warning: jsonlbatch/exec/newcomer.py" not in out  # no alias use of a moved name

    # it imports, in a fresh interpreter, from the new places
    subprocess.run(
        [sys.executable, "-c", "import jsonlbatch.exec.newcomer as m; print(m.where())"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)}, check=True,
    )  # fmt: skip

    doc = (tmp_path / "docs" / "architecture.md").read_text()
    assert "shared core: batch_format/  file_io/" in doc
    assert "Lines are `batch_format/records.py`'s." in doc
    assert "| `file_io/output_guard.py` |" in doc and "| `errors.py` |" in doc
    assert "`jsonlbatch.file_io.output_guard.check_output` guards" in doc
    assert "`jsonl.iter_lines` reads; see\njsonlbatch/batch_format/records.py." in doc  # wrapped
    assert all(len(line) <= 100 for line in doc.splitlines() if not line.startswith("|"))
    layout = (tmp_path / "tests" / "test_layout.py").read_text()
    assert '"batch_format", "errors", "file_io", "lazy"' in layout

    # a second run changes nothing, and --check agrees
    before = _digest(tmp_path)
    assert _script().main(["--root", str(tmp_path)]) == 0
    assert "regroup: nothing to do" in capsys.readouterr().out
    assert _digest(tmp_path) == before
    assert _script().main(["--root", str(tmp_path), "--check"]) == 0


def test_check_changes_nothing_and_says_there_is_work(tmp_path, capsys):
    _tree(tmp_path)
    before = _digest(tmp_path)
    assert _script().main(["--root", str(tmp_path), "--check"]) == 1
    assert "split   jsonlbatch/jsonl.py: OutputLock" in capsys.readouterr().out
    assert _digest(tmp_path) == before


def test_a_module_it_cannot_place_is_named(tmp_path, capsys):
    _tree(tmp_path)
    _write(tmp_path, "jsonlbatch/newthing.py", "X = 1\n")
    _script().main(["--root", str(tmp_path)])
    assert "warning: jsonlbatch/newthing.py is a top-level module" in capsys.readouterr().out


def test_a_split_that_would_make_a_circle_is_refused(tmp_path):
    _tree(tmp_path)
    path = tmp_path / "jsonlbatch" / "jsonl.py"
    path.write_text(path.read_text() + "\n\ndef reader(a, b):\n    return same_file(a, b)\n")
    with pytest.raises(SystemExit, match="would make a circle"):
        _script().main(["--root", str(tmp_path)])


@pytest.mark.slow
def test_the_real_package_regrouped_keeps_its_layout_rules(tmp_path):
    """The script on a copy of this package: its layout rules hold, every core module imports
    from its new place, and a second run has nothing to do."""
    for part in ("jsonlbatch", "docs", "scripts", "examples", "tests"):
        shutil.copytree(REPO / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    run = [sys.executable, str(SCRIPT), "--root", str(tmp_path)]
    subprocess.run(run, check=True, capture_output=True)
    assert "nothing to do" in subprocess.run(run, check=True, capture_output=True, text=True).stdout
    top = sorted(p.name for p in (tmp_path / "jsonlbatch").glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "errors.py", "extras.py", "lazy.py", "redact.py",
                   "stats.py"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    code = (
        "import jsonlbatch.file_io.output_guard, jsonlbatch.answer_contract.schema_forms, "
        "jsonlbatch.pricing.prices, jsonlbatch.batch_format.samples, jsonlbatch.cli, "
        "jsonlbatch.exec.run_loop"
    )
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True)
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
         "tests/test_layout.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert tests.returncode == 0, tests.stdout[-3000:]

"""Applying edits to original files: exact, whitespace-tolerant, ambiguous, unsafe."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jsonlbatch.post import Edit, MappedFiles, RepoFiles, UnsafePathError, apply_edits, safe_relpath

SOURCE = """import os


class Box:
    def size(self):
        return 1

    def empty(self):
        return 1
"""


def one(edit: Edit, files: dict[str, str] | None = None) -> tuple[str | None, str]:
    result = apply_edits([edit], MappedFiles(files or {"box.py": SOURCE}))
    [r] = result.results
    return (result.updated.get(safe_relpath(edit.path)) if r.ok else None), (r.how or r.reason)


def test_exact_whole_line_match() -> None:
    new, how = one(Edit("box.py", "import os\n", "import os\nimport sys\n"))
    assert how == "exact" and new == SOURCE.replace("import os\n", "import os\nimport sys\n")


def test_whitespace_tolerant_match_reindents_the_replacement() -> None:
    # The model dropped the class indentation in both SEARCH and REPLACE.
    edit = Edit(
        "box.py",
        "\ndef size(self):\n    return 1\n\n",
        "def size(self):\n    if self.full:\n        return 2\n    return 1\n",
    )
    new, how = one(edit)
    assert how == "whitespace"
    assert (
        "    def size(self):\n        if self.full:\n            return 2\n        return 1\n"
        in new
    )
    assert "    def empty(self):\n        return 1\n" in new


def test_reindent_tabs_to_spaces_and_over_indented_answers() -> None:
    files = {"m.py": "def f(x):\n    if x:\n        return 1\n"}
    tabs = Edit(
        "m.py", "\tif x:\n\t\treturn 1\n", "\tif x:\n\t\tif y:\n\t\t\treturn 2\n\t\treturn 1\n"
    )
    new, how = one(tabs, files)
    assert how == "whitespace"
    assert new == "def f(x):\n    if x:\n        if y:\n            return 2\n        return 1\n"
    deep = Edit(
        "m.py", "        if x:\n            return 1\n", "        if x:\n            return 3\n"
    )
    assert one(deep, files)[0] == "def f(x):\n    if x:\n        return 3\n"


def test_ambiguous_search_is_reported_not_applied() -> None:
    new, reason = one(Edit("box.py", "        return 1\n", "        return 0\n"))
    assert new is None
    assert reason == "box.py: text to replace matches 2 times (lines 6, 9)"


def test_hunk_line_picks_between_matches() -> None:
    new, how = one(Edit("box.py", "        return 1\n", "        return 0\n", "diff", 9))
    assert how == "nearest-to-hunk"
    assert new.endswith("    def empty(self):\n        return 0\n")
    assert "    def size(self):\n        return 1\n" in new


def test_no_match_and_missing_file() -> None:
    assert one(Edit("box.py", "def nothing():\n", "x\n"))[1] == (
        "box.py: text to replace not found: 'def nothing():'"
    )
    assert one(Edit("nope.py", "a\n", "b\n"))[1] == "nope.py: no such file"


def test_create_append_insert_delete() -> None:
    assert one(Edit("new.py", "", "x = 1\n"))[0] == "x = 1\n"
    assert one(Edit("box.py", "", "TAIL = 1\n"))[0] == SOURCE + "TAIL = 1\n"
    new, how = one(Edit("box.py", "", "# head\n", "insert", 0))
    assert how == "inserted" and new == "# head\n" + SOURCE
    assert one(Edit("box.py", "", "", "delete"))[1] == "deleted"
    assert one(Edit("box.py", "", "x\n", "create"))[1] == (
        "box.py: cannot create, the file already exists"
    )


def test_str_replace_is_a_unique_substring() -> None:
    new, how = one(Edit("box.py", "import os", "import os.path", "str_replace"))
    assert how == "exact" and new.startswith("import os.path\n")
    _, reason = one(Edit("box.py", "return 1", "return 2", "str_replace"))
    assert reason == "box.py: old_str occurs 2 times; it must be unique"


def test_crlf_file_keeps_its_line_endings() -> None:
    files = {"w.txt": "a\r\nb\r\nc"}
    new, how = one(Edit("w.txt", "c\n", "C\n"), files)
    assert how == "exact" and new == "a\r\nb\r\nC"  # and still no newline at the end


def test_later_edits_see_earlier_ones() -> None:
    result = apply_edits(
        [
            Edit("box.py", "import os\n", "import re\n"),
            Edit("box.py", "import re\n", "import io\n"),
        ],
        MappedFiles({"box.py": SOURCE}),
    )
    assert [r.ok for r in result.results] == [True, True]
    assert result.updated["box.py"].startswith("import io\n")
    assert result.original["box.py"] == SOURCE and result.changed == ["box.py"]


@pytest.mark.parametrize(
    "name",
    [
        "../secret.txt",
        "/etc/passwd",
        "a/../../x",
        "~/.ssh/id_rsa",
        "C:/x",
        "a\\..\\b",
        ".git/config",
        "",
    ],
)
def test_unsafe_names_are_refused(name: str) -> None:
    with pytest.raises(UnsafePathError):
        safe_relpath(name)


def test_strip_prefix_maps_tool_paths_into_the_repo() -> None:
    assert safe_relpath("/testbed/pkg/a.py", ["/testbed/"]) == "pkg/a.py"
    assert safe_relpath("./pkg//a.py") == "pkg/a.py"


def test_repo_reads_never_leave_the_root_or_follow_symlinks(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "secret.txt").write_text("token\n")
    os.symlink(tmp_path / "secret.txt", repo / "pkg" / "link.py")
    os.symlink(tmp_path, repo / "up")
    source = RepoFiles(str(repo))
    edits = [
        Edit("../secret.txt", "token\n", "stolen\n"),
        Edit("pkg/link.py", "token\n", "stolen\n"),
        Edit("up/secret.txt", "token\n", "stolen\n"),
        Edit("pkg/a.py", "x = 1\n", "x = 2\n"),
    ]
    result = apply_edits(edits, source)
    reasons = [r.reason for r in result.results]
    assert "'..'" in reasons[0]
    assert reasons[1] == "pkg/link.py is a symlink"
    assert reasons[2] == "up/secret.txt: 'up' is a symlink"
    assert result.results[3].ok and result.updated["pkg/a.py"] == "x = 2\n"
    # read-only use: the user's checkout and the outside file are untouched
    assert (repo / "pkg" / "a.py").read_text() == "x = 1\n"
    assert (tmp_path / "secret.txt").read_text() == "token\n"


@pytest.mark.timeout(20)
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_repo_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    os.mkfifo(repo / "pipe.py")  # nobody ever writes to it: a blocking open would hang
    result = apply_edits([Edit("pipe.py", "x\n", "y\n")], RepoFiles(str(repo)))
    [r] = result.results
    assert not r.ok and r.reason == "pipe.py is not a regular file"


@pytest.mark.parametrize(
    "name",
    [
        "a\x85b.txt",  # NEL, a C1 control
        "evil\u202egpj.exe",  # RIGHT-TO-LEFT OVERRIDE: shows as evilexe.jpg
        "a\u200bb.py",  # ZERO WIDTH SPACE
        "a\u2028b",  # LINE SEPARATOR
        "\u2066x\u2069.py",  # bidi isolates
        "a\ufeffb",  # a BOM inside a name
    ],
)
def test_control_format_and_bidi_characters_are_refused(name: str) -> None:
    """Issue 11, item 20: every Unicode control, format and bidi character, not only C0."""
    with pytest.raises(UnsafePathError, match="control or invisible character"):
        safe_relpath(name)


def test_ordinary_unicode_names_pass() -> None:
    assert safe_relpath("données/résumé é 数据.txt") == "données/résumé é 数据.txt"

"""Applying edits to original files, read-only from the user's repository or a JSON map.

Matching is exact (whole lines) first; failing that, whitespace-tolerant (lines compared
stripped, leading/trailing blank lines of the SEARCH ignored) with the replacement re-indented
to the file. An edit that matches nothing, or more than once with nothing to choose between
the matches, fails with a reason: silently applying it somewhere would make a wrong patch
look like a right one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from jsonlbatch.post.edits import Edit
from jsonlbatch.post.paths import UnsafePathError, read_inside, safe_relpath

MAX_FILE_BYTES = 8 * 1024 * 1024


class FileSource(Protocol):
    """Where original files come from. `read` returns None for a file that does not exist."""

    def read(self, path: str) -> str | None: ...


class RepoFiles:
    """Original files in a directory, read only, never through a symlink or outside it."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)

    def read(self, path: str) -> str | None:
        data = read_inside(self.root, path, max_bytes=MAX_FILE_BYTES)
        if data is None:
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise UnsafePathError(f"{path} is not UTF-8 text") from None


class MappedFiles:
    """Original files given as a `{path: content}` map (e.g. loaded from JSON)."""

    def __init__(self, files: Mapping[str, str]) -> None:
        self.files: dict[str, str] = {}
        for name, content in files.items():
            try:
                self.files[safe_relpath(name)] = content
            except UnsafePathError:
                continue  # an unusable name can never be asked for

    def read(self, path: str) -> str | None:
        return self.files.get(path)


@dataclass
class EditResult:
    """What happened to one edit: `how` it applied, or the `reason` it did not."""

    edit: Edit
    ok: bool
    how: str = ""  # exact | nearest-to-hunk | whitespace | created | appended | inserted | deleted
    reason: str = ""


@dataclass
class AppliedEdits:
    """Originals and edited contents of every file the edits touched (None: no such file)."""

    original: dict[str, str | None] = field(default_factory=dict)
    updated: dict[str, str | None] = field(default_factory=dict)
    results: list[EditResult] = field(default_factory=list)

    @property
    def failed(self) -> list[EditResult]:
        return [r for r in self.results if not r.ok]

    @property
    def changed(self) -> list[str]:
        return sorted(p for p in self.updated if self.updated[p] != self.original[p])


class _EditFailed(Exception):
    pass


def apply_edits(
    edits: Iterable[Edit], source: FileSource, *, strip_prefixes: Sequence[str] = ()
) -> AppliedEdits:
    """Apply edits in order; each edit sees the result of the ones before it."""
    out = AppliedEdits()
    crlf: dict[str, bool] = {}
    current: dict[str, str | None] = {}
    for edit in edits:
        try:
            path = safe_relpath(edit.path, strip_prefixes)
            if path not in current:
                text = source.read(path)
                out.original[path] = text
                crlf[path] = text is not None and "\r\n" in text
                current[path] = text.replace("\r\n", "\n") if text is not None else None
            current[path], how = _apply_one(edit, path, current[path])
            out.results.append(EditResult(edit, True, how))
        except (_EditFailed, UnsafePathError) as exc:
            out.results.append(EditResult(edit, False, reason=str(exc)))
    for path, text in current.items():
        out.updated[path] = text.replace("\n", "\r\n") if text is not None and crlf[path] else text
    return out


def _apply_one(edit: Edit, path: str, text: str | None) -> tuple[str | None, str]:
    if edit.kind == "delete":
        if text is None:
            raise _EditFailed(f"{path}: cannot delete, no such file")
        return None, "deleted"
    if edit.kind == "create":
        if text:
            raise _EditFailed(f"{path}: cannot create, the file already exists")
        return edit.replace, "created"
    if edit.kind == "insert":
        if text is None:
            raise _EditFailed(f"{path}: cannot insert, no such file")
        lines = text.splitlines(keepends=True)
        at = edit.line or 0
        if not 0 <= at <= len(lines):
            raise _EditFailed(f"{path}: insert line {at} is outside the file ({len(lines)} lines)")
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        return "".join(lines[:at]) + edit.replace + "".join(lines[at:]), "inserted"
    if not edit.search.strip():
        if text is None:
            return edit.replace, "created"
        if text and not text.endswith("\n"):
            text += "\n"
        return text + edit.replace, "appended"
    if text is None:
        raise _EditFailed(f"{path}: no such file")
    if edit.kind == "str_replace":
        count = text.count(edit.search)
        if count == 1:
            return text.replace(edit.search, edit.replace, 1), "exact"
        if count > 1:
            raise _EditFailed(f"{path}: old_str occurs {count} times; it must be unique")
    return _replace_lines(path, text, edit)


def _replace_lines(path: str, text: str, edit: Edit) -> tuple[str, str]:
    lines = text.splitlines(keepends=True)
    bare = [line.rstrip("\n") for line in lines]
    search = edit.search.splitlines()
    replace = edit.replace.splitlines()
    hits = _find(bare, search, lambda a, b: a == b)
    how = "exact"
    if not hits:
        # Blank lines at the edges are layout, not content: the file keeps its own.
        search, replace = _trim_blank(search), _trim_blank(replace)
        if search:
            hits = _find(bare, search, lambda a, b: a.strip() == b.strip())
            how = "whitespace"
    if not hits:
        raise _EditFailed(f"{path}: text to replace not found: {_preview(search)}")
    if len(hits) > 1:
        if edit.line is None:
            where = ", ".join(str(h + 1) for h in hits[:5])
            raise _EditFailed(f"{path}: text to replace matches {len(hits)} times (lines {where})")
        line = edit.line
        hits = [min(hits, key=lambda h: abs(h + 1 - line))]
        how = "nearest-to-hunk" if how == "exact" else how
    at = hits[0]
    if how != "exact":
        replace = _reindent(search, bare[at : at + len(search)], replace)
    end = at + len(search)
    block = "".join(line + "\n" for line in replace)
    if block and end == len(lines) and not lines[-1].endswith("\n"):
        block = block[:-1]
    return "".join(lines[:at]) + block + "".join(lines[end:]), how


def _find(lines: list[str], search: list[str], same: Callable[[str, str], bool]) -> list[int]:
    if not search:
        return []
    k = len(search)
    return [
        i
        for i in range(len(lines) - k + 1)
        if same(lines[i], search[0]) and all(same(lines[i + j], search[j]) for j in range(1, k))
    ]


def _trim_blank(lines: list[str]) -> list[str]:
    lo, hi = 0, len(lines)
    while lo < hi and not lines[lo].strip():
        lo += 1
    while hi > lo and not lines[hi - 1].strip():
        hi -= 1
    return lines[lo:hi]


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _reindent(search: list[str], found: list[str], replace: list[str]) -> list[str]:
    """Re-indent the replacement the way the file indents what the SEARCH indented.

    Each indentation seen in the SEARCH maps to the file's indentation of the matched line;
    a deeper replacement line keeps what is beyond the longest mapped prefix, with tabs turned
    into the file's spaces when the SEARCH used tabs and the file spaces.
    """
    mapping: dict[str, str] = {}
    for s, f in zip(search, found, strict=True):
        if s.strip():
            mapping.setdefault(_indent(s), _indent(f))
    if all(k == v for k, v in mapping.items()):
        return replace
    unit = next(
        (
            " " * (len(v) // len(k))
            for k, v in mapping.items()
            if k and set(k) == {"\t"} and v and set(v) == {" "} and len(v) % len(k) == 0
        ),
        None,
    )
    out = []
    for line in replace:
        if not line.strip():
            out.append(line)
            continue
        indent = _indent(line)
        prefix = max((k for k in mapping if indent.startswith(k)), key=len, default=None)
        if prefix is None:  # shallower than the SEARCH: shift by the difference of the first level
            first = min(mapping, key=len)
            have = mapping[first]
            new = (have[: len(have) - len(first)] if have.endswith(first) else "") + line
        else:
            new = mapping[prefix] + line[len(prefix) :]
        if unit:
            lead = _indent(new)
            new = lead.replace("\t", unit) + new[len(lead) :]
        out.append(new)
    return out


def _preview(lines: list[str]) -> str:
    first = next((line.strip() for line in lines if line.strip()), "")
    return repr(first[:60]) + (f" (+{len(lines) - 1} lines)" if len(lines) > 1 else "")

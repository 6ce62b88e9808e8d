"""Code edits as models write them: SEARCH/REPLACE blocks, unified diffs, str_replace tools.

All three become `Edit`s (a file, text to find, text to put instead) so that one applier
serves them. Parsing is liberal, because real outputs vary (4 to 7+ marker characters, any
fence language or none, a REPLACE marker glued to the last line, hunk headers with wrong
counts); what cannot be parsed is reported as a problem, not dropped silently.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from jsonlbatch.post.markdown import file_name_in, iter_fences

_HEAD = re.compile(r"^\s*<{4,}\s*SEARCH\b.*$")
_DIV = re.compile(r"^\s*={4,}\s*$")
_TAIL = re.compile(r"^(.*?)>{4,}\s*REPLACE\s*$")
_FENCE_LINE = re.compile(r"^\s*(`{3,}|~{3,})")
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")
_DIFF_LANGS = frozenset({"diff", "patch", "udiff"})


@dataclass(frozen=True)
class Edit:
    """One change to one file.

    `search` is the text to find (whole lines, or a substring for `str_replace`); an empty
    `search` creates the file, or appends to it. `line` is the hunk's start line (a hint that
    picks between several matches) or, for `insert`, the line after which to insert.
    """

    path: str
    search: str
    replace: str
    kind: str = "search-replace"  # search-replace | diff | str_replace | insert | create | delete
    line: int | None = None


@dataclass
class ParsedEdits:
    """The edits found in one answer, and what could not be parsed."""

    edits: list[Edit] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def __iadd__(self, other: ParsedEdits) -> ParsedEdits:
        self.edits += other.edits
        self.problems += other.problems
        return self


def extract_edits(text: str, tool_calls: Sequence[dict[str, Any]] = ()) -> ParsedEdits:
    """Every edit in an answer: SEARCH/REPLACE blocks, then ```diff blocks, then tool calls."""
    found = parse_search_replace(text)
    found += parse_unified_diffs(text)
    found += parse_tool_calls(tool_calls)
    return found


def _joined(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


def _path_before(lines: list[str], i: int) -> str | None:
    """The path named just before a SEARCH marker (inside the fence, or above its opener)."""
    j = i - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    if j >= 0 and _FENCE_LINE.match(lines[j]) and lines[j].strip().strip("`~"):
        j -= 1  # an opening fence with a language: the path may stand above it
        while j >= 0 and not lines[j].strip():
            j -= 1
    elif j >= 0 and _FENCE_LINE.match(lines[j]):
        # a bare fence: an opener (path above) or a closer of the previous block (no path)
        opener = sum(1 for k in range(j) if _FENCE_LINE.match(lines[k])) % 2 == 0
        if not opener:
            return None
        j -= 1
        while j >= 0 and not lines[j].strip():
            j -= 1
    return file_name_in(lines[j]) if j >= 0 else None


def parse_search_replace(text: str) -> ParsedEdits:
    """SEARCH/REPLACE blocks (Agentless and Aider formats)."""
    lines = text.splitlines()
    found = ParsedEdits()
    current: str | None = None
    i = 0
    while i < len(lines):
        if not _HEAD.match(lines[i]):
            i += 1
            continue
        start = i + 1
        path = _path_before(lines, i) or current
        search, replace, i, problem = _read_block(lines, i + 1)
        if problem:
            found.problems.append(f"SEARCH/REPLACE block at line {start}: {problem}")
        elif path is None:
            found.problems.append(f"SEARCH/REPLACE block at line {start}: no file path before it")
        else:
            found.edits.append(Edit(path, _joined(search), _joined(replace)))
            current = path
    return found


def _read_block(lines: list[str], j: int) -> tuple[list[str], list[str], int, str]:
    """(search lines, replace lines, next index, problem) of the block starting at line j."""
    search: list[str] = []
    while j < len(lines) and not _DIV.match(lines[j]):
        if _HEAD.match(lines[j]) or _TAIL.match(lines[j]):
            return [], [], j, "no ======= divider before the next marker"
        search.append(lines[j])
        j += 1
    if j == len(lines):
        return [], [], j, "text ends before the ======= divider (truncated?)"
    j += 1
    replace: list[str] = []
    while j < len(lines):
        tail = _TAIL.match(lines[j])
        if tail:
            if tail[1].strip():  # `>>>>>>> REPLACE` glued to the last line
                replace.append(tail[1])
            return search, replace, j + 1, ""
        if _HEAD.match(lines[j]) or _DIV.match(lines[j]):
            return [], [], j, "no >>>>>>> REPLACE marker before the next block"
        replace.append(lines[j])
        j += 1
    return [], [], j, "text ends before >>>>>>> REPLACE (truncated?)"


def parse_unified_diffs(text: str) -> ParsedEdits:
    """Unified diffs in ```diff blocks (or a whole answer that is a bare diff).

    Hunk header counts are ignored (recounted from the hunk body, which is what `patch`
    needs and what models get wrong); the start line is kept as a hint.
    """
    found = ParsedEdits()
    blocks = [f.lines for f in iter_fences(text) if f.language in _DIFF_LANGS]
    stripped = text.lstrip()
    if not blocks and (stripped.startswith("diff --git") or stripped.startswith("--- ")):
        blocks = [text.splitlines()]
    for block in blocks:
        found += _parse_diff(block)
    return found


def _diff_path(header: str) -> str:
    path = header.split("\t", 1)[0].strip().strip('"')
    if path != "/dev/null" and path[:2] in ("a/", "b/"):
        path = path[2:]
    return path


def _file_header(lines: list[str], i: int) -> bool:
    return lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")


def _parse_diff(lines: list[str]) -> ParsedEdits:
    found = ParsedEdits()
    old = new = None
    i = 0
    while i < len(lines):
        if _file_header(lines, i):
            old, new = _diff_path(lines[i][4:]), _diff_path(lines[i + 1][4:])
            if new == "/dev/null":
                found.edits.append(Edit(old, "", "", "delete"))
            elif old not in ("/dev/null", new):
                found.problems.append(f"diff renames {old} to {new}: renames are not supported")
            i += 2
            continue
        if not lines[i].startswith("@@"):
            i += 1
            continue
        m = _HUNK.match(lines[i])
        hint = (int(m[2]) or int(m[1])) if m else None
        body: list[str] = []
        i += 1
        while i < len(lines) and (lines[i][:1] in (" ", "-", "+", "\\") or not lines[i]):
            if _file_header(lines, i) or lines[i].startswith("@@"):
                break
            body.append(lines[i])
            i += 1
        if new is None:
            found.problems.append("diff hunk without a ---/+++ file header")
        elif new != "/dev/null":
            found.edits.append(_hunk_edit(old, new, body, hint))
    return found


def _hunk_edit(old: str | None, new: str, body: list[str], hint: int | None) -> Edit:
    while body and not body[-1]:
        body.pop()  # blank lines after a hunk are spacing, not context
    before = [line[1:] for line in body if line[:1] in (" ", "-") or not line]
    after = [line[1:] for line in body if line[:1] in (" ", "+") or not line]
    if old == "/dev/null":
        return Edit(new, "", _joined(after), "create")
    if not before:
        return Edit(new, "", _joined(after), "insert", max((hint or 1) - 1, 0))
    return Edit(new, _joined(before), _joined(after), "diff", hint)


def parse_tool_calls(tool_calls: Sequence[dict[str, Any]]) -> ParsedEdits:
    """str_replace-editor tool calls (`str_replace`, `insert`, `create`); others are ignored."""
    found = ParsedEdits()
    for n, call in enumerate(tool_calls):
        fn = call.get("function")
        if not isinstance(fn, dict):
            fn = call
        args = fn.get("arguments", fn.get("input"))
        if isinstance(args, str):
            try:
                args = orjson.loads(args)
            except orjson.JSONDecodeError:
                found.problems.append(f"tool call {n}: arguments are not valid JSON")
                continue
        if not isinstance(args, dict) or args.get("command") not in (
            "str_replace",
            "insert",
            "create",
        ):
            continue
        command, path = args["command"], args.get("path")
        if not isinstance(path, str):
            found.problems.append(f"tool call {n} ({command}): no path")
            continue
        if command == "str_replace":
            old, new = args.get("old_str"), args.get("new_str") or ""
            if not isinstance(old, str) or not old or not isinstance(new, str):
                found.problems.append(
                    f"tool call {n} (str_replace {path}): old_str missing or empty"
                )
                continue
            found.edits.append(Edit(path, old, new, "str_replace"))
        elif command == "insert":
            line, new = args.get("insert_line"), args.get("new_str")
            if not isinstance(line, int) or not isinstance(new, str):
                found.problems.append(
                    f"tool call {n} (insert {path}): needs insert_line and new_str"
                )
                continue
            found.edits.append(
                Edit(path, "", new if new.endswith("\n") else new + "\n", "insert", line)
            )
        else:
            content = args.get("file_text", args.get("new_str", args.get("content")))
            if not isinstance(content, str):
                found.problems.append(f"tool call {n} (create {path}): no file_text")
                continue
            found.edits.append(Edit(path, "", content, "create"))
    return found

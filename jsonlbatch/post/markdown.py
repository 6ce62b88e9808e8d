"""Fenced code blocks in model output, found the way Markdown renderers find them.

Edits and deliverable files both live in fenced blocks. A block that itself contains a fence
(a README with examples) is only closed by a fence at least as long, as in CommonMark, so such
files come out whole.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

_COMMENT = re.compile(r"^(?:#{1,6}|//|--|;|<!--)\s*(.*?)\s*(?:-->)?$")
_LABEL = re.compile(r"^(?:file|filename|path)\s*:\s*", re.IGNORECASE)
_PATH = re.compile(r"[\w.+@~-]+(?:/[\w.+@~-]+)*")
_EXTENSION = re.compile(r"\.[A-Za-z][\w]*$")
_NO_EXTENSION = frozenset({"Makefile", "Dockerfile", "Gemfile", "Rakefile", "LICENSE", "Procfile"})
_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Fence:
    """One fenced block: its info string, content lines and the line above it."""

    info: str
    lines: list[str]
    before: str  # the last non-blank line before the opening fence, stripped ("" if none)

    @property
    def language(self) -> str:
        """The first word of the info string, lower-cased (`python`, `diff`, ...)."""
        words = self.info.split(maxsplit=1)
        word = words[0] if words else ""
        return word.split(":", 1)[0].lower()

    @property
    def text(self) -> str:
        return "".join(line + "\n" for line in self.lines)


def iter_fences(text: str) -> Iterator[Fence]:
    """Yield the fenced blocks of `text` in order."""
    lines = text.splitlines()
    i = 0
    before = ""
    while i < len(lines):
        m = _OPEN.match(lines[i])
        if not m or (m["fence"][0] == "`" and "`" in m["info"]):
            if lines[i].strip():
                before = lines[i].strip()
            i += 1
            continue
        fence, indent = m["fence"], len(m["indent"])
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            line = lines[j]
            strip = min(indent, len(line) - len(line.lstrip(" \t")))
            body.append(line[strip:])
            j += 1
        yield Fence(m["info"].strip(), body, before)
        before = ""
        i = j + 1


def json_chunks(text: str, fences: Iterable[Fence]) -> Iterator[Any]:
    """The JSON values of the whole `text` (stripped), then of its ```json blocks, in that order;
    chunks that do not decode are skipped."""
    for chunk in (text.strip(), *(f.text for f in fences if f.language == "json")):
        try:
            value = json.loads(chunk)
        except (ValueError, RecursionError):  # a model's JSON nested past the recursion limit
            continue
        yield value


def file_name_in(line: str) -> str | None:
    """The file path a line names, or None.

    Recognizes `### a/b.py`, `# file: a/b.py`, `// filename: x.js`, `<!-- file: x.html -->`,
    `**a/b.py**`, `` `a/b.py`: ``, or a bare path. Without a `file:` label the name must look
    like a path (an extension, a `/`, or a known name such as Makefile), so a comment line
    like `# helpers` is not mistaken for one.
    """
    s = line.strip()
    m = _COMMENT.match(s)
    if m:
        s = m[1]
    s = s.strip("*` ")
    labelled = bool(_LABEL.match(s))
    s = _LABEL.sub("", s).strip("`*'\" ").rstrip(":").strip("`*")
    if not _PATH.fullmatch(s) or s.strip(".") == "":
        return None
    if labelled or _EXTENSION.search(s) or "/" in s or s in _NO_EXTENSION:
        return s
    return None

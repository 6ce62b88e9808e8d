"""Local files named as `file://PATH` where the API takes a file id.

A request may name a reference file by its path in the places OpenAI's APIs take a Files API id:
a code interpreter container's `tools[].container.file_ids[]`, a Responses `input_file` part's
`file_id`, a chat `file` part's `file.file_id`. Before anything is sent, each such file is
checked (there, readable, a regular file, within the Files API's size limit) and hashed, and the
request is read with `file://sha256:<hex>` in the path's place: the answer cache's key and the
resume fingerprint see the file's content, not where it lies nor the id it gets. The sender
swaps that for an uploaded file's id (`send/file_uploads.py`) just before the request goes out;
the request line on disk is never changed.

A path is the user's (relative ones from the current directory); it is read, never written.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

#: What marks a local path, and what takes its place once hashed.
SCHEME = "file://"
HASHED = "file://sha256:"
#: The Files API's limit on one file (OpenAI: 512 MB); a larger one is refused before sending.
MAX_REFERENCE_BYTES = 512 << 20
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Reference:
    """One hashed local file: where it is and what it holds."""

    path: str
    sha256: str
    size: int

    @property
    def filename(self) -> str:
        return os.path.basename(self.path) or "file"


@dataclass
class FileRefs:
    """The local files a run's requests name, checked and hashed once per path (a path whose
    size or time changes is hashed again)."""

    max_bytes: int = MAX_REFERENCE_BYTES
    by_hash: dict[str, Reference] = field(default_factory=dict)
    _by_path: dict[str, tuple[int, int, Reference]] = field(default_factory=dict)

    def resolve(self, body: Any) -> list[tuple[str, str]]:
        """Put each `file://PATH` of `body` (changed in place) as `file://sha256:<hex>`; the
        (field, message) problems of the paths that cannot be used, which stay as they are."""
        problems = []
        for where, holder, key in file_slots(body):
            value = holder[key]
            if not value.startswith(SCHEME) or value.startswith(HASHED):
                continue
            found = self.reference(value[len(SCHEME) :])
            if isinstance(found, str):
                problems.append((where, found))
            else:
                holder[key] = HASHED + found.sha256
        return problems

    def reference(self, path: str) -> Reference | str:
        """The hashed file at `path`, or why it cannot be sent."""
        shown = f"file://{path}"
        if not path or "\0" in path:
            return f"{shown!r} names no file"
        try:
            st = os.stat(path)
        except OSError as exc:
            return f"cannot read {shown}: {exc.strerror}"
        if stat.S_ISDIR(st.st_mode):
            return f"{shown} is a directory, not a file"
        if not stat.S_ISREG(st.st_mode):
            return f"{shown} is not a regular file"
        if st.st_size > self.max_bytes:
            return (
                f"{shown} is {st.st_size:,} bytes, over the Files API's limit of {self.max_bytes:,}"
            )
        known = self._by_path.get(path)
        if known is not None and known[:2] == (st.st_size, st.st_mtime_ns):
            return known[2]
        digest = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                while chunk := f.read(_CHUNK):
                    digest.update(chunk)
        except OSError as exc:
            return f"cannot read {shown}: {exc.strerror}"
        ref = Reference(os.path.abspath(path), digest.hexdigest(), st.st_size)
        self._by_path[path] = (st.st_size, st.st_mtime_ns, ref)
        self.by_hash.setdefault(ref.sha256, ref)
        return ref


def file_slots(body: Any) -> Iterator[tuple[str, dict[str, Any] | list[Any], Any]]:
    """(field path, container, key) of every string where `body` takes a file id."""
    if not isinstance(body, dict):
        return
    for i, tool in enumerate(body.get("tools") or ()):
        spec = tool.get("container") if isinstance(tool, dict) else None
        ids = spec.get("file_ids") if isinstance(spec, dict) else None
        if isinstance(ids, list):
            for j, value in enumerate(ids):
                if isinstance(value, str):
                    yield f"body.tools[{i}].container.file_ids[{j}]", ids, j
    turns = body.get("input") if isinstance(body.get("input"), list) else body.get("messages")
    name = "input" if isinstance(body.get("input"), list) else "messages"
    for i, turn in enumerate(turns if isinstance(turns, list) else ()):
        parts = turn.get("content") if isinstance(turn, dict) else None
        for j, part in enumerate(parts if isinstance(parts, list) else ()):
            if not isinstance(part, dict):
                continue
            if part.get("type") == "input_file" and isinstance(part.get("file_id"), str):
                yield f"body.{name}[{i}].content[{j}].file_id", part, "file_id"
            inner = part.get("file") if part.get("type") == "file" else None
            if isinstance(inner, dict) and isinstance(inner.get("file_id"), str):
                yield f"body.{name}[{i}].content[{j}].file.file_id", inner, "file_id"


def has_refs(raw: bytes) -> bool:
    """Whether a request line may name a local file (a cheap test before decoding it)."""
    return SCHEME.encode() in raw

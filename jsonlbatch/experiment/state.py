"""What each step of a condition last did, by content hash: the basis of skipping and resuming.

A step's hash covers its settings and the bytes of its input files (never their paths or times),
so a step is skipped exactly when it would compute the same thing again, and a changed setting
re-runs only the steps whose inputs it changes: a new temperature changes the request file, so
exec, judge and post run again; a new gold file changes only post's inputs.

`steps.json` in the condition's folder holds, per step, the hash, `running` or `done`, and the
step's summary (which the comparison report reads). A step is marked `running` before it starts:
a run killed then finds `running` with the same hash and resumes (exec sends only what has no
result), or another hash, and starts that step over.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from jsonlbatch.errors import OutputError


def file_digest(path: str) -> str:
    """sha256 of a file's bytes, streamed ("missing" for a file that is not there)."""
    if not os.path.isfile(path):
        return "missing"
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def step_hash(kind: str, settings: Mapping[str, Any], files: Iterable[str | None]) -> str:
    """The hash of one step: its kind, its settings (canonical JSON) and its inputs' bytes."""
    h = hashlib.sha256(kind.encode())
    h.update(orjson.dumps(settings, option=orjson.OPT_SORT_KEYS, default=str))
    for path in files:
        h.update(b"\0" + (file_digest(path) if path else "none").encode())
    return h.hexdigest()


class StepState:
    """The `steps.json` of one condition's folder."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, "steps.json")
        try:
            with open(self.path, "rb") as f:
                self._steps: dict[str, dict[str, Any]] = orjson.loads(f.read())
        except FileNotFoundError:
            self._steps = {}
        except (OSError, orjson.JSONDecodeError):
            self._steps = {}  # unreadable: every step runs again, which is always safe

    def status(self, step: str, digest: str) -> str:
        """`done` (skip), `running` (resume) or `new` (start over) for a step with this hash."""
        entry = self._steps.get(step)
        if entry is None or entry.get("hash") != digest:
            return "new"
        return "done" if entry.get("status") == "done" else "running"

    def summary(self, step: str) -> dict[str, Any] | None:
        entry = self._steps.get(step)
        return entry.get("summary") if entry and entry.get("status") == "done" else None

    def start(self, step: str, digest: str) -> None:
        self._steps[step] = {"hash": digest, "status": "running"}
        self._save()

    def finish(self, step: str, digest: str, summary: Mapping[str, Any]) -> None:
        self._steps[step] = {"hash": digest, "status": "done", "summary": dict(summary)}
        self._save()

    def _save(self) -> None:
        directory = os.path.dirname(self.path)
        try:
            fd, tmp = tempfile.mkstemp(prefix=".steps.", dir=directory)
            with os.fdopen(fd, "wb") as f:
                f.write(
                    orjson.dumps(self._steps, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
                )
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            raise OutputError(f"cannot write {self.path}: {exc.strerror}") from None

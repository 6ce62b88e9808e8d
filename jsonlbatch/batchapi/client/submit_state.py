"""The submit side's memory: which parts of a run went where, kept beside the output.

`OUT.batch-api.json` lists every part (its request file under `OUT.batch-api/`, the remote
file id, the batch id, whether its results are in OUT). It is rewritten atomically around each
remote call that creates something: `uploading` / `creating` are saved *before* the call and
the new id *after* it, so a crash in between leaves a mark that makes the next run look for
what may have been made (by file name, by batch metadata) instead of making it twice.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from jsonlbatch.errors import OutputError
from jsonlbatch.file_io.jsonl import rewrite_atomically

VERSION = 1


@dataclass
class Part:
    """One uploaded file and the one batch made from it."""

    tag: str  # the submitting round's random tag: names the upload, marks the batch
    index: int
    path: str  # the part's request lines, relative to the state's folder
    endpoint: str
    count: int
    bytes: int
    file_id: str | None = None
    uploading: bool = False
    batch_id: str | None = None
    creating_since: float | None = None  # set before a create: look the batch up on resume
    status: str | None = None
    completed: int = 0
    failed: int = 0
    merged: bool = False
    #: the provider's queue refused the part: it is created once earlier batches end
    waiting: bool = False

    @property
    def filename(self) -> str:
        return f"jsonlbatch-{self.tag}-part{self.index:04d}.jsonl"

    @property
    def metadata(self) -> dict[str, str]:
        return {"jsonlbatch_run": self.tag, "jsonlbatch_part": str(self.index)}


@dataclass
class State:
    path: Path
    url: str = ""
    requests: str = ""
    provider: str = ""  # openai, anthropic or gemini: the one the parts went to
    parts: list[Part] = field(default_factory=list)

    @classmethod
    def for_output(cls, output: str | os.PathLike[str]) -> State:
        """The state beside `output` (empty when there is none yet)."""
        path = Path(f"{os.fspath(output)}.batch-api.json")
        state = cls(path)
        if not path.exists():
            return state
        try:
            data = orjson.loads(path.read_bytes())
            state.url = data.get("url", "")
            state.requests = data.get("requests", "")
            state.provider = data.get("provider", "")
            state.parts = [Part(**p) for p in data["parts"]]
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise OutputError(
                f"{path} is not a batch state file jsonlbatch can read ({exc}); move it away "
                "only if none of its batches is still running"
            ) from None
        return state

    @property
    def folder(self) -> Path:
        """Where the parts' request files and downloads live."""
        return self.path.with_suffix("")

    @property
    def open_parts(self) -> list[Part]:
        return [p for p in self.parts if not p.merged]

    def save(self) -> None:
        data: dict[str, Any] = {
            "version": VERSION,
            "url": self.url,
            "requests": self.requests,
            "provider": self.provider,
            "parts": [asdict(p) for p in self.parts],
        }
        rewrite_atomically(self.path, [orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n"])

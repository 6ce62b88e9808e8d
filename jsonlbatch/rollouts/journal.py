"""A rollout's files and what a resume reads back from them.

    conv.jsonl         one line per conversation, written once when it ends
    conv.calls.jsonl   every model call (turns and asks), as exec writes response lines
    conv.tools.jsonl   every tool result (and user turn), appended before the conversation
                       moves on

A resume streams the three once: the ids of the finished conversations, then for the others
the byte offsets of their answered calls and journaled tool results, read back when each
conversation is rebuilt. Only offsets are kept, not lines; a conversation's entries are loaded
when it runs again and dropped when it ends.
"""

from __future__ import annotations

import contextlib
import os
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from jsonlbatch.batch_format.idset import IdSet
from jsonlbatch.errors import OutputError
from jsonlbatch.exec.prepare.input_scan import line_custom_id
from jsonlbatch.file_io.jsonl import AppendWriter, read_lines_at, repair_tail

_TURN_MARK = "#t"


def conversation_of(custom_id: str) -> str:
    return custom_id[: custom_id.rfind(_TURN_MARK)] if _TURN_MARK in custom_id else custom_id


def iter_journal(path: str) -> Iterator[tuple[int, int, bytes]]:
    """(line number, byte offset, line) of each whole line; a final fragment without its
    newline (a kill mid-write) is left out and measured, to be cut (`repair`)."""
    try:
        f = open(path, "rb", buffering=1 << 20)  # noqa: SIM115
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputError(f"cannot read {path}: {exc.strerror}") from None
    offset = 0
    with f:
        for number, raw in enumerate(f, 1):
            start, offset = offset, offset + len(raw)
            if not raw.endswith(b"\n"):
                return
            if raw.strip():
                yield number, start, raw


def repair(path: str) -> None:
    """Cut a torn last line (a kill mid-append) before anything is appended."""
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return
    keep = size
    with open(path, "rb") as f:
        while keep > 0:
            start = max(0, keep - (1 << 16))
            f.seek(start)
            chunk = f.read(keep - start)
            if keep == size and chunk.endswith(b"\n"):
                return
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                break
            keep = start
    repair_tail(path, keep)


def _object(path: str, number: int, raw: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise OutputError(f"{path}:{number}: not JSON ({exc}); was it edited by hand?") from None
    if type(obj) is not dict or type(obj.get("custom_id")) is not str:
        raise OutputError(f"{path}:{number}: custom_id: missing or not a string")
    return obj


def finished_ids(output: str) -> IdSet:
    """The conversations that have their final line in `output`."""
    done = IdSet()
    ids = [_object(output, n, raw)["custom_id"] for n, _, raw in iter_journal(output)]
    done.update(ids)
    return done


#: The fields of a tool journal entry a resume relies on, and their types.
_ENTRY_FIELDS: tuple[tuple[str, type, str], ...] = (
    ("turn", int, "an integer"),
    ("i", int, "an integer"),
    ("content", str, "a string"),
    ("error", bool, "true or false"),
    ("asks", int, "an integer"),
)


def _check_entry(path: str, number: int, entry: dict[str, Any]) -> None:
    """A journaled tool result is reused as it is: one edited by hand stops the resume,
    naming its line, rather than fail mid-run or be taken as another call's."""
    for name, kind, said in _ENTRY_FIELDS:
        value = entry.get(name)
        if type(value) is not kind:
            raise OutputError(
                f"{path}:{number}: {name}: not {said} ({value!r}); was it edited by hand? "
                "Restore it, or remove the line to run that tool again"
            )


@dataclass
class ResumeIndex:
    """Where the answered calls and journaled tool results of unfinished conversations are."""

    calls_path: str
    tools_path: str
    calls: dict[str, int] = field(default_factory=dict)  # call custom_id -> offset
    tools: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))

    @classmethod
    def read(cls, calls_path: str, tools_path: str, finished: IdSet) -> ResumeIndex:
        index = cls(calls_path, tools_path)
        for _, offset, raw in iter_journal(calls_path):
            cid = line_custom_id(raw)
            if cid is not None and conversation_of(cid) not in finished:
                index.calls[cid] = offset
        for number, offset, raw in iter_journal(tools_path):
            entry = _object(tools_path, number, raw)
            if entry["custom_id"] not in finished:
                _check_entry(tools_path, number, entry)
                index.tools[entry["custom_id"]].append(offset)
        return index

    def recorded_call(self, custom_id: str) -> dict[str, Any] | None:
        """The calls file's line for `custom_id`, decoded, or None if it has none."""
        offset = self.calls.pop(custom_id, None)
        if offset is None:
            return None
        for raw in read_lines_at(self.calls_path, [offset]):
            line = _object(self.calls_path, 0, raw)
            if type(line.get("metrics", {})) is not dict:  # exec's scan checked the rest
                raise OutputError(f"{self.calls_path}: the line of {custom_id}: metrics: not an "
                                  "object; was it edited by hand?")  # fmt: skip
            return line
        return None

    def journaled(self, conversation: str) -> dict[tuple[int, int], dict[str, Any]]:
        """A conversation's journaled tool results by (turn, index in the turn)."""
        offsets = self.tools.pop(conversation, None)
        if not offsets:
            return {}
        entries = {}
        for raw in read_lines_at(self.tools_path, offsets):
            entry = orjson.loads(raw)
            entries[entry["turn"], entry["i"]] = entry
        return entries


class Journal:
    """The appending side: tool results and final conversation lines, one `os.write` each."""

    def __init__(self, output: str, tools_path: str) -> None:
        repair(output)
        repair(tools_path)
        self.conversations = AppendWriter(output)
        self.tools = AppendWriter(tools_path)

    def tool(self, entry: dict[str, Any]) -> None:
        self.tools.write(orjson.dumps(entry) + b"\n")

    def conversation(self, line: dict[str, Any]) -> None:
        self.conversations.write(orjson.dumps(line) + b"\n")

    def close(self) -> None:
        for writer in (self.tools, self.conversations):
            with contextlib.suppress(OutputError):  # what was written stays; a resume reads it
                writer.close()

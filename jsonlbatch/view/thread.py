"""The other lines of a conversation, for the detail pane of a calls file's line.

A rollout's calls file has one response line per model call, named `<conversation>#t<N>` for
turn N and `<conversation>#t<N>.ask<K>` for the asks made during it (report/conversations.py).
Opening one of them shows the whole conversation in order: each turn's answer (its calls by
name, or the start of its text), a link to open it, and the line open now marked. The rows are
found through the file's id index, one lookup per turn (and per ask), at most `MAX_LINES` of
them, within `MAX_LINES` turns of the open one.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from jsonlbatch.batch_format.call_ids import call_id, conversation_of, turn_of
from jsonlbatch.batch_format.samples import samples_of
from jsonlbatch.redact import redact

MAX_LINES = 200  # the longest conversation listed (turns and asks together)
_SNIPPET = 120  # characters of a text answer shown


class _Lines(Protocol):
    """What the thread reads of a file's index (`view.index.LineIndex`)."""

    def find(self, custom_id: str) -> list[int]: ...

    def read(self, row: int) -> bytes: ...


def conversation_lines(index: _Lines, custom_id: str) -> list[dict[str, Any]]:
    """The lines of `custom_id`'s conversation in turn order (asks after their turn), each
    `{custom_id, row, turn, ask, summary}`; empty for a line of no conversation."""
    conversation, place = conversation_of(custom_id), turn_of(custom_id)
    if conversation is None or place is None:
        return []
    out: list[dict[str, Any]] = []
    turn = max(0, place[0] - MAX_LINES)  # a huge turn number costs no huge scan
    while len(out) < MAX_LINES and turn <= place[0] + MAX_LINES:
        rows = index.find(call_id(conversation, turn))
        if not rows and turn > place[0]:  # a gap after the line's own turn: the end
            break
        for row in rows[-1:]:
            out.append(_entry(index, call_id(conversation, turn), row, turn, None))
        ask = 1
        while len(out) < MAX_LINES:
            asked = index.find(call_id(conversation, turn, ask))
            if not asked:
                break
            out.append(_entry(index, call_id(conversation, turn, ask), asked[-1], turn, ask))
            ask += 1
        turn += 1
    return out


def _entry(index: _Lines, cid: str, row: int, turn: int, ask: int | None) -> dict[str, Any]:
    return {"custom_id": redact(cid), "row": row, "turn": turn, "ask": ask,
            "summary": _summary(index.read(row))}  # fmt: skip


def _summary(raw: bytes) -> str:
    """One line saying what the turn answered: its calls by name, else its text's start."""
    try:
        samples = samples_of(orjson.loads(raw))
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return "(not a response line)"
    first = samples[0] if samples else None
    if first is None or first.failed:
        return redact(f"failed: {first.error}") if first is not None else ""
    if first.tool_calls:
        return "calls " + ", ".join(_call_name(c) for c in first.tool_calls)
    text = " ".join(first.text.split())
    return redact(text if len(text) <= _SNIPPET else text[:_SNIPPET] + "...")


def _call_name(call: dict[str, Any]) -> str:
    function = call.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return redact(name) if isinstance(name, str) and name else "(no name)"

"""What `report` reads of tool calls and conversations: calls per tool name, and, on a calls file
(a rollout's model calls, one response line each), turns per conversation.

A calls file names its lines `<conversation id>#t<N>` for turn N of a conversation and
`<conversation id>#t<N>.ask<K>` for the K-th ask (an expert or a user simulator) made during
that turn; those are the names the rollout writes, fixed so readers need no other file.
Turns per conversation are counted without holding an id per conversation: every turn of a
conversation has its line (a failed call too), so the conversations with at least k turns are
the lines of turn k, and those with exactly k the difference between turn k's and turn k+1's
(memory: one counter per turn number, whatever the file's size).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import orjson

from jsonlbatch.batch_format.call_ids import turn_of
from jsonlbatch.batch_format.records import is_failure
from jsonlbatch.batch_format.samples import load_line
from jsonlbatch.file_io.jsonl import iter_lines


def superseded_failures(path: str) -> set[int]:
    """Line numbers of a calls file's failed lines that a later line of the same id replaces.

    A failed conversation run again (its line removed from the conversations file) sends its
    failed turn again, and the new answer is appended after the old failure: the turn's last
    line is its outcome, as exec's resume takes an id's success over its failures. Only failed
    lines are held while reading (a few, unless a server was down), not an id per line."""
    failed: dict[str, int] = {}  # id -> line number of its latest failure not yet replaced
    replaced: set[int] = set()
    for number, raw in iter_lines(path):
        try:
            obj = load_line(raw)
        except orjson.JSONDecodeError:
            continue  # load_run reports it
        cid = obj.get("custom_id") if isinstance(obj, dict) else None
        if not isinstance(cid, str) or turn_of(cid) is None:
            continue
        earlier = failed.pop(cid, None)
        if earlier is not None:
            replaced.add(earlier)
        if is_failure(obj):
            failed[cid] = number
    return replaced


#: Distinct tool names a report counts one by one. Names read from hermes text are the model's
#: own words: calls of names past these (a model that makes one up per call) count together.
MAX_TOOL_NAMES = 100
OTHER_TOOLS = "(other names)"
_MAX_NAME = 80  # characters of a name shown; a longer one is cut, marked with an ellipsis


def count_tool_names(counts: Counter[str], names: list[str]) -> None:
    """Add `names` to `counts`, keeping at most `MAX_TOOL_NAMES` names apart."""
    for name in names:
        if name in counts or len(counts) < MAX_TOOL_NAMES:
            counts[name] += 1
        else:
            counts[OTHER_TOOLS] += 1


def tool_names(choices: Any) -> list[str]:
    """The function name of every tool call in an answer's choices (chat's `tool_calls`; a
    hosted answer's choices as `samples.hosted_choices` makes them)."""
    names = []
    for choice in choices if isinstance(choices, list) else ():
        message = choice.get("message") if isinstance(choice, dict) else None
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        for call in calls if isinstance(calls, list) else ():
            function = call.get("function") if isinstance(call, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            if not isinstance(name, str) or not name:
                name = "(no name)"
            names.append(name if len(name) <= _MAX_NAME else name[:_MAX_NAME] + "…")
    return names


def turns_per_conversation(turn_lines: Counter[int]) -> dict[int, int]:
    """`turns -> conversations` with that many turns, from the number of lines of each turn
    number (the first turn number in the file is each conversation's first)."""
    if not turn_lines:
        return {}
    first, last = min(turn_lines), max(turn_lines)
    out = {}
    for turn in range(first, last + 1):
        exactly = turn_lines.get(turn, 0) - turn_lines.get(turn + 1, 0)
        if exactly > 0:
            out[turn - first + 1] = exactly
    return out


def turn_figures(turns: dict[int, int]) -> dict[str, float]:
    """Mean, p50, p90 and max of turns per conversation, from `turns -> conversations`
    (percentiles by nearest rank: a number of turns some conversation had)."""
    total = sum(turns.values())
    if not total:
        return {}
    out: dict[str, float] = {"mean": sum(k * n for k, n in turns.items()) / total}
    for name, share in (("p50", 0.5), ("p90", 0.9)):
        rank, seen = max(1, math.ceil(share * total)), 0
        for k in sorted(turns):
            seen += turns[k]
            if seen >= rank:
                out[name] = k
                break
    out["max"] = max(turns)
    return out

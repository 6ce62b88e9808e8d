"""How a rollout names its files and its calls: one definition for the stage that writes them
(rollouts/) and the stages that read them (report/, view/).

A conversations file `conv.jsonl` has its calls file `conv.calls.jsonl` (every model call, as
exec writes response lines) and its tool journal `conv.tools.jsonl` beside it. In the calls
file, the model call of a conversation at turn N is `<conversation>#t<N>`, and the K-th `ask`
made during that turn is `<conversation>#t<N>.ask<K>`.
"""

from __future__ import annotations

import re

_TURN = re.compile(r"#t(\d{1,6})(\.ask\d{1,9})?\Z")


def companions(output: str) -> tuple[str, str]:
    """The calls file and the tool journal beside a conversations file
    (`conv.jsonl` -> `conv.calls.jsonl`, `conv.tools.jsonl`)."""
    stem = output[: -len(".jsonl")] if output.endswith(".jsonl") else output
    return f"{stem}.calls.jsonl", f"{stem}.tools.jsonl"


def call_id(conversation: str, turn: int, ask: int = 0) -> str:
    """The custom_id of a conversation's model call at `turn`, or of its `ask`-th ask then."""
    return f"{conversation}#t{turn}" + (f".ask{ask}" if ask else "")


def turn_of(custom_id: str) -> tuple[int, bool] | None:
    """(turn number, whether the line is an ask) of a calls file's line; None for any other
    custom_id."""
    found = _TURN.search(custom_id)
    if found is None:
        return None
    return int(found[1]), found[2] is not None


def conversation_of(custom_id: str) -> str | None:
    """The conversation id of a calls file's line (`conv#t3.ask1` -> `conv`); None for any
    other custom_id."""
    found = _TURN.search(custom_id)
    return None if found is None else custom_id[: found.start()]

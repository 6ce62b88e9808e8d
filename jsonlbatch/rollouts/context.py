"""What a tool or hook sees of its conversation: `current_conversation()`.

A contextvar holds the conversation whose tool runs now, so a tool takes only its JSON
arguments and still reaches its conversation's state and the run's `ask` (async tools directly;
sync tools run in a thread, which carries the context along).
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from jsonlbatch.batch_format.records import CHAT_URL
from jsonlbatch.errors import JsonlbatchError, UsageError

_CURRENT: contextvars.ContextVar[Conversation] = contextvars.ContextVar("jsonlbatch_conversation")


class AskFailed(JsonlbatchError):
    """An `ask` whose call failed (its line in the calls file says why)."""


class Diverged(JsonlbatchError):
    """A resumed conversation does not retrace its recorded path (its tools changed): it
    fails, rather than take another question's answer or another tool result."""


@dataclass
class AskAnswer:
    """The answer to an `ask`: the server's JSON body, and its first choice's text."""

    custom_id: str
    body: dict[str, Any]

    @property
    def message(self) -> dict[str, Any]:
        choices = self.body.get("choices") or [{}]
        first = choices[0] if isinstance(choices[0], dict) else {}
        return first.get("message") or {}

    @property
    def text(self) -> str:
        content = self.message.get("content")
        return content if isinstance(content, str) else ""


@dataclass
class Conversation:
    """One conversation of a rollout, as its tools see it."""

    id: str
    request: dict[str, Any]  # its request line (the first turn), as read
    state: Any = None  # `new_state(request_line)`'s value, or None
    turn: int = 0  # the model call the tools answer (1-based)
    messages: list[dict[str, Any]] = field(default_factory=list)
    _ask: Callable[[Conversation, dict[str, Any], str], Awaitable[AskAnswer]] | None = field(
        default=None, repr=False
    )

    async def ask(self, body: dict[str, Any], *, url: str = CHAT_URL) -> AskAnswer:
        """Send `body` (a chat body: model, messages, ...) through the same run (scheduler,
        routing by `model`, cache, retries, the calls file) and return its answer. Raises
        `AskFailed` when the call fails (a tool that lets it pass becomes an error message)."""
        if self._ask is None:
            raise UsageError("ask() is only available while the conversation runs")
        return await self._ask(self, body, url)


def current_conversation() -> Conversation:
    """The conversation whose tool (or `user_turn`, `new_state`, `final_state`) runs now."""
    try:
        return _CURRENT.get()
    except LookupError:
        raise UsageError(
            "current_conversation() is only valid inside a tool or hook of a rollout"
        ) from None


def enter(conversation: Conversation) -> None:
    """Make `conversation` current for the task running it (each task has its own context)."""
    _CURRENT.set(conversation)

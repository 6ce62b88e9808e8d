"""What an answer is, per endpoint kind: when a 2xx body is usable, and where its token counts are.

A server can say 200 and send nothing of use: `{}`, `{"detail": "..."}`, a stream that is only
`[DONE]`, a gateway's `{"error": ...}`. Such a body is no result: exec records it as
`invalid_response` and retries it like a 5xx, and `--retry-failed` sends it again. What "usable"
means depends on the endpoint, so each kind has one `AnswerKind` in `KINDS`:

- chat completions: `choices`, each with a `message` that has content, tool calls or reasoning
  (or says why it stopped);
- completions: `choices`, each with a `text`;
- embeddings: `data`, each with an `embedding`;
- responses (OpenAI's Responses API): an `output` list of typed items, and not `status: failed`;
- messages (Anthropic's Messages API): a `content` list of typed blocks;
- moderations: `results`, each with a `flagged`.

Token counts come from the body's `usage`, but only values that are numbers (a server may send
`"prompt_tokens": "12"` or `null`): the body is kept as the server sent it, and the line's
`metrics` hold only what `usage_metrics` found to be non-negative finite numbers.

To add an endpoint kind: one `AnswerKind` in `KINDS` (its URL, a `usable` test, its usage paths).
URLs without an entry get `OTHER`: any object that is not just an error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jsonlbatch.batch_format.records import (
    CHAT_URL,
    COMPLETIONS_URL,
    EMBEDDINGS_URL,
    MESSAGES_URL,
    MODERATIONS_URL,
    RESPONSES_URL,
)

#: A path into a body, e.g. ("usage", "prompt_tokens").
Path = tuple[str, ...]

_MAX_INT = (1 << 63) - 1  # what the line's JSON encoder writes as an integer

#: Keys of a body that only reports a problem (`{"error": ...}`, FastAPI's `{"detail": ...}`).
_ERROR_KEYS = frozenset({"error", "detail", "message", "code", "type", "object", "status"})


@dataclass(frozen=True, slots=True)
class AnswerKind:
    """One endpoint kind's rules.

    `usable(body)` says whether a decoded 2xx body holds an answer; `usage` maps a metrics key
    to the places in the body its number may be, first found wins.
    """

    name: str
    usable: Callable[[Mapping[str, Any]], bool]
    usage: Mapping[str, tuple[Path, ...]] = field(default_factory=dict)
    #: The word used in messages for what a usable body must have.
    needs: str = "an answer"


def number(value: Any) -> int | float | None:
    """`value` if it is a non-negative finite number a JSON line can hold, else None."""
    if value.__class__ is int:
        return value if 0 <= value <= _MAX_INT else None
    if value.__class__ is float:
        return value if value >= 0 and math.isfinite(value) else None
    return None


def _at(body: Mapping[str, Any], path: Path) -> Any:
    value: Any = body
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _items(body: Mapping[str, Any], key: str) -> list[Any] | None:
    value = body.get(key)
    return value if value.__class__ is list and value else None


def _chat_choice(choice: Any) -> bool:
    if not isinstance(choice, dict):
        return False
    message = choice.get("message")
    if not isinstance(message, dict):
        return False
    return (
        isinstance(message.get("content"), (str, list))
        or bool(message.get("tool_calls"))
        or isinstance(message.get("function_call"), dict)
        or isinstance(message.get("reasoning_content"), str)
        or isinstance(message.get("reasoning"), str)
        or isinstance(choice.get("finish_reason"), str)  # finished with nothing to say
    )


def _chat(body: Mapping[str, Any]) -> bool:
    choices = _items(body, "choices")
    return choices is not None and all(_chat_choice(c) for c in choices)


def _completion(body: Mapping[str, Any]) -> bool:
    choices = _items(body, "choices")
    return choices is not None and all(
        isinstance(c, dict) and isinstance(c.get("text"), str) for c in choices
    )


def _embedding(body: Mapping[str, Any]) -> bool:
    data = _items(body, "data")
    return data is not None and all(
        isinstance(d, dict) and isinstance(d.get("embedding"), (list, str)) for d in data
    )


def _typed_list(value: Any) -> bool:
    return value.__class__ is list and all(
        isinstance(item, dict) and isinstance(item.get("type"), str) for item in value
    )


def _response(body: Mapping[str, Any]) -> bool:
    return _typed_list(body.get("output")) and body.get("status") != "failed"


def _message(body: Mapping[str, Any]) -> bool:
    return _typed_list(body.get("content")) and body.get("type", "message") == "message"


def _moderation(body: Mapping[str, Any]) -> bool:
    results = _items(body, "results")
    return results is not None and all(isinstance(r, dict) and "flagged" in r for r in results)


def _not_an_error(body: Mapping[str, Any]) -> bool:
    """For kinds without rules of their own: anything but an empty or error-only object."""
    return bool(body) and not body.keys() <= _ERROR_KEYS


_GENERATION_USAGE: dict[str, tuple[Path, ...]] = {
    "prompt_tokens": (("usage", "prompt_tokens"),),
    "completion_tokens": (("usage", "completion_tokens"),),
    "reasoning_tokens": (
        ("usage", "completion_tokens_details", "reasoning_tokens"),  # OpenAI
        ("usage", "reasoning_tokens"),  # SGLang
    ),
}

#: Usage as the Responses and Messages APIs name it.
_IO_USAGE: dict[str, tuple[Path, ...]] = {
    "prompt_tokens": (("usage", "input_tokens"),),
    "completion_tokens": (("usage", "output_tokens"),),
    "reasoning_tokens": (("usage", "output_tokens_details", "reasoning_tokens"),),
}

#: Rules by request URL.
KINDS: dict[str, AnswerKind] = {
    CHAT_URL: AnswerKind(
        "chat completion", _chat, _GENERATION_USAGE, "choices with a message or tool calls"
    ),
    COMPLETIONS_URL: AnswerKind(
        "completion", _completion, _GENERATION_USAGE, "choices with a text"
    ),
    EMBEDDINGS_URL: AnswerKind(
        "embedding",
        _embedding,
        {"prompt_tokens": (("usage", "prompt_tokens"),)},
        "data with embeddings",
    ),
    RESPONSES_URL: AnswerKind("response", _response, _IO_USAGE, "output items"),
    MESSAGES_URL: AnswerKind("message", _message, _IO_USAGE, "content blocks"),
    MODERATIONS_URL: AnswerKind("moderation", _moderation, {}, "results with flagged"),
}

#: Rules for a URL without an entry in `KINDS`.
OTHER = AnswerKind(
    "answer",
    _not_an_error,
    {
        "prompt_tokens": (("usage", "prompt_tokens"), ("usage", "input_tokens")),
        "completion_tokens": (("usage", "completion_tokens"), ("usage", "output_tokens")),
    },
    "an object that is not just an error",
)


def kind_for(url: str) -> AnswerKind:
    """The rules for requests sent to `url` (a request line's `url`)."""
    return KINDS.get(url, OTHER)


def unusable_reason(url: str, body: Any) -> str | None:
    """Why a decoded 2xx body is no answer for `url`, or None when it is one."""
    kind = kind_for(url)
    if not isinstance(body, dict):
        return f"not a JSON object (a {kind.name} needs {kind.needs})"
    if kind.usable(body):
        return None
    return f"no {kind.needs} in the body"


def usage_metrics(url: str, body: Any) -> dict[str, int | float]:
    """The token counts of a body, by metrics key: only values that are numbers."""
    out: dict[str, int | float] = {}
    if not isinstance(body, dict):
        return out
    for key, paths in kind_for(url).usage.items():
        for path in paths:
            value = number(_at(body, path))
            if value is not None:
                out[key] = value
                break
    return out

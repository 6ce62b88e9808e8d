"""What one saved response line says, choice by choice: the answer text and reasoning, the
finish reason, usage, the failure, and the group/sample split of its custom_id.

This is format knowledge shared by every reader of response files: `post` (votes, patches,
files), `gen` (responses as a data source for a second turn or a judge) and the experiment
runner. It reads the OpenAI Batch output of `jsonlbatch exec`, of `vllm run-batch` (error in the
top-level `error`, body null) and of the OpenAI Batch API (error JSON in `response.body`), and
answer lines `{"custom_id", "answer"}` computed elsewhere.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from jsonlbatch.batch_format.records import (
    MESSAGES_URL,
    MODERATIONS_URL,
    RESPONSES_URL,
    is_failure,
    json_object,
)
from jsonlbatch.redact import redact

#: Separators of `<group><sep><sample>` custom_ids: Agentless `id|3`, `id#3`, `id__pass3`.
DEFAULT_SEPARATORS: tuple[str, ...] = ("|", "#", "__pass")

KeyFunc = Callable[[str], str]


@dataclass(slots=True)
class Sample:
    """One choice of one response (or one failed request)."""

    custom_id: str
    index: int = 0
    text: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    model: str | None = None
    error: str | None = None  # why the request failed; None when it succeeded
    answer: str | None = None  # given by an answer line, not extracted from text
    choices: int = 1  # how many choices its response had
    metrics: dict[str, Any] | None = None  # jsonlbatch's per-request metrics, when present
    #: What an answer without text says (embeddings: `dimensions`; moderations: `flagged`,
    #: `categories`), for tables that show it; None for text answers.
    details: dict[str, Any] | None = None
    path: str = ""
    line: int = 0
    source: int = 0  # position of its file among the inputs

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    @property
    def sample_id(self) -> str:
        """The custom_id, plus the choice index when the response had several."""
        return self.custom_id if self.choices == 1 else f"{self.custom_id}[{self.index}]"


def split_think(text: str) -> tuple[str, str]:
    """Split `<think>...</think>` reasoning out of content: (reasoning, answer).

    Also handles templates that put `<think>` in the prompt (only `</think>` in the output) and
    an unclosed `<think>` (truncated while thinking: all reasoning, no answer).
    """
    end = text.find("</think>")
    if end >= 0:
        reasoning = text[:end].strip()
        if reasoning.startswith("<think>"):
            reasoning = reasoning[len("<think>") :].strip()
        return reasoning, text[end + len("</think>") :].strip()
    stripped = text.lstrip()
    if stripped.startswith("<think>"):
        return stripped[len("<think>") :].strip(), ""
    return "", text


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _failure_reason(obj: dict[str, Any]) -> str:
    error = obj.get("error")
    response = json_object(obj.get("response"))
    status = response.get("status_code")
    message: Any = None
    if isinstance(error, dict):
        message = error.get("message") or error.get("code")
        code = error.get("code")
        # `http_500` beside "HTTP 500" says nothing new; other codes (request_timeout) do.
        if isinstance(code, str) and error.get("message") and code != f"http_{status}":
            message = f"{code}: {error['message']}"
    elif error:
        message = error
    body = response.get("body")
    if message is None and isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else inner
    parts = [f"HTTP {status}"] if isinstance(status, int) else []
    if message:
        parts.append(redact(str(message), limit=200))
    return ": ".join(parts) or "failed"


# -- hosted-API answers, read as chat choices ----------------------------------------------------

_STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                 "tool_use": "tool_calls"}  # fmt: skip


def _choice(text: str, reasoning: str, calls: list[dict[str, Any]], finish: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning:
        message["reasoning"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return {"index": 0, "message": message, "finish_reason": finish}


def _texts(parts: Any, kind: str, key: str = "text") -> list[str]:
    """The `key` strings of the parts of type `kind` in a list of typed parts."""
    if not isinstance(parts, list):
        return []
    return [
        p[key]
        for p in parts
        if isinstance(p, dict) and p.get("type") == kind and isinstance(p.get(key), str)
    ]


def _responses_choice(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses API answer: text in `output[]` messages' `output_text` parts."""
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in body["output"]:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "message":
            texts += _texts(item.get("content"), "output_text")
        elif kind == "reasoning":
            reasoning += _texts(item.get("summary"), "summary_text")
            reasoning += _texts(item.get("content"), "reasoning_text")
        elif kind == "function_call":
            function = {"name": item.get("name"), "arguments": item.get("arguments")}
            calls.append({"id": item.get("call_id"), "type": "function", "function": function})
    details = body.get("incomplete_details")
    if body.get("status") == "incomplete":
        reason = details.get("reason") if isinstance(details, dict) else None
        finish: Any = "length" if reason == "max_output_tokens" else reason or "incomplete"
    else:
        finish = "tool_calls" if calls else "stop"
    return _choice("".join(texts), "".join(reasoning), calls, finish)


def _messages_choice(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages answer: text in `content[]` blocks of type `text`."""
    blocks = body["content"]
    calls = [
        {"id": b.get("id"), "type": "function",
         "function": {"name": b.get("name"), "arguments": orjson.dumps(b.get("input")).decode()}}
        for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"
    ]  # fmt: skip
    reason = body.get("stop_reason")
    finish = _STOP_REASONS.get(reason, reason) if isinstance(reason, str) else None
    thinking = "".join(_texts(blocks, "thinking", "thinking"))
    return _choice("".join(_texts(blocks, "text")), thinking, calls, finish)


def _moderation_choices(results: list[Any]) -> list[dict[str, Any]]:
    """A moderation answer: one choice per input, its text the flagged categories."""
    out = []
    for i, result in enumerate(results):
        result = result if isinstance(result, dict) else {}
        categories = result.get("categories")
        hits = (
            [k for k, v in categories.items() if v is True] if isinstance(categories, dict) else []
        )
        flagged = result.get("flagged") is True
        text = ("flagged: " + ", ".join(hits)) if flagged else "not flagged"
        details = {"flagged": flagged, "categories": hits}
        out.append({**_choice(text, "", [], "stop"), "index": i, "details": details})
    return out


def _embedding_choices(data: Any) -> list[dict[str, Any]] | None:
    """An embeddings answer: one choice per input, no text, its vector's dimensions (None for
    any other body)."""
    if not isinstance(data, list) or not data:
        return None
    out = []
    for pos, item in enumerate(data):
        if not isinstance(item, dict) or "embedding" not in item:
            return None
        vector = item["embedding"]
        dims: int | None = None
        if isinstance(vector, list):
            dims = len(vector)
        elif isinstance(vector, str):  # encoding_format "base64": little-endian float32s
            with contextlib.suppress(binascii.Error, ValueError):
                dims = len(base64.b64decode(vector, validate=True)) // 4
        index = item.get("index")
        out.append({"index": index if isinstance(index, int) else pos, "finish_reason": None,
                    "details": {"dimensions": dims}})  # fmt: skip
    return out


def hosted_choices(body: Any) -> list[dict[str, Any]] | None:
    """Chat-style `choices` for an answer of the Responses, Messages or Moderations API (None
    for any other body), so every reader of chat answers reads these too."""
    if not isinstance(body, dict):
        return None
    if isinstance(body.get("output"), list):
        return [_responses_choice(body)]
    if body.get("type") == "message" and isinstance(body.get("content"), list):
        return [_messages_choice(body)]
    if isinstance(body.get("results"), list) and body["results"]:
        return _moderation_choices(body["results"])
    return None


def hosted_url(body: Any) -> str | None:
    """The endpoint whose answer `body` is, when it is one `hosted_choices` reads (a provider's
    batch answers a chat line in its own API's form: Anthropic's a Messages body); else None."""
    if not isinstance(body, dict) or "choices" in body:
        return None
    if isinstance(body.get("output"), list):
        return RESPONSES_URL
    if body.get("type") == "message" and isinstance(body.get("content"), list):
        return MESSAGES_URL
    if isinstance(body.get("results"), list) and body["results"]:
        return MODERATIONS_URL
    return None


def chat_usage(usage: Any) -> dict[str, Any] | None:
    """`usage` with chat's names: the Responses and Messages APIs say `input_tokens` and
    `output_tokens` where chat says `prompt_tokens` and `completion_tokens`."""
    if not isinstance(usage, dict):
        return None
    if "prompt_tokens" in usage or "input_tokens" not in usage:
        return usage
    return {**usage, "prompt_tokens": usage.get("input_tokens"),
            "completion_tokens": usage.get("output_tokens")}  # fmt: skip


def is_answer_line(obj: dict[str, Any]) -> bool:
    return "answer" in obj and "response" not in obj


def samples_of(
    obj: dict[str, Any], *, path: str = "", line: int = 0, source: int = 0
) -> list[Sample]:
    """The samples of one decoded response line."""
    cid = obj["custom_id"]
    metrics = obj.get("metrics")
    where: dict[str, Any] = {
        "path": path,
        "line": line,
        "source": source,
        "metrics": metrics if isinstance(metrics, dict) else None,
    }
    if is_answer_line(obj):
        value = obj["answer"]
        if value is None:
            return [Sample(cid, error="answer is null", **where)]
        return [Sample(cid, text=as_text(value), answer=as_text(value), **where)]
    error = None
    if is_failure(obj):
        # a failure that kept its answer (one a check refused: `schema_invalid`) is still failed,
        # but its text and model are read, so tables and the viewer can show what broke
        error = _failure_reason(obj)
        if not _kept_answer(obj):
            return [Sample(cid, error=error, **where)]
    body = obj["response"]["body"]
    choices = body.get("choices") if isinstance(body, dict) else None
    if choices is None:
        choices = hosted_choices(body)
    if choices is None and isinstance(body, dict):
        choices = _embedding_choices(body.get("data"))
    if not isinstance(choices, list) or not choices:
        return [Sample(cid, error=error or "response body has no choices", **where)]
    model = body.get("model") if isinstance(body.get("model"), str) else None
    usage = chat_usage(body.get("usage"))
    out = []
    for pos, choice in enumerate(choices):
        choice = choice if isinstance(choice, dict) else {}
        message = json_object(choice.get("message"))
        text = _content_text(message.get("content") if message else choice.get("text"))
        reasoning = message.get("reasoning") or message.get("reasoning_content") or ""
        if not isinstance(reasoning, str) or not reasoning:
            reasoning, text = split_think(text)
        calls = message.get("tool_calls")
        index = choice.get("index")
        out.append(
            Sample(
                cid,
                index=index if isinstance(index, int) else pos,
                text=text,
                reasoning=reasoning,
                finish_reason=choice.get("finish_reason"),
                tool_calls=[c for c in calls if isinstance(c, dict)]
                if isinstance(calls, list)
                else [],
                usage=usage,
                model=model,
                choices=len(choices),
                details=choice.get("details"),
                error=error,
                **where,
            )
        )
    return out


def _kept_answer(obj: dict[str, Any]) -> bool:
    """Whether a failure line holds an answer all the same: a 2xx response with a body."""
    response = json_object(obj.get("response"))
    status = response.get("status_code")
    return (
        isinstance(status, int) and 200 <= status < 300 and isinstance(response.get("body"), dict)
    )


def as_text(value: Any) -> str:
    """A JSON value as a string: strings as they are, anything else as compact JSON."""
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def split_key(separators: Sequence[str] = DEFAULT_SEPARATORS) -> KeyFunc:
    """Group by the custom_id up to its last separator (`django__django-11099|3` -> the id)."""
    seps = tuple(separators)

    def key(custom_id: str) -> str:
        return split_id(custom_id, seps)[0]

    return key


def lookup(obj: Any, dotted: str) -> Any:
    """`obj["a"]["b"][0]` for `a.b.0`; None when any step is missing."""
    for part in dotted.split("."):
        if isinstance(obj, dict):
            obj = obj.get(part)
        elif (
            isinstance(obj, list)
            and re.fullmatch(r"-?\d+", part)
            and -len(obj) <= int(part) < len(obj)
        ):
            obj = obj[int(part)]
        else:
            return None
    return obj


def split_id(
    custom_id: str, separators: Sequence[str] = DEFAULT_SEPARATORS
) -> tuple[str, str | None]:
    """(group, sample suffix) of a custom_id: `django-11099|3` -> (`django-11099`, `3`); an id
    without a separator is its own group with no sample suffix (None). The same cut as
    `split_key`."""
    seps = [s for s in separators if s]
    best, width = -1, 0
    for sep in seps:
        at = custom_id.rfind(sep)
        if at > best:
            best, width = at, len(sep)
    if best <= 0:
        return custom_id, None
    return custom_id[:best], custom_id[best + width :]


# ---------------------------------------------------------------------------------------------
# Reading one line, bounded

#: A line longer than this is measured before it is decoded (shorter ones cost too little).
_MEASURE_FROM = 4 << 20
#: JSON objects and arrays one response line may hold. A real one holds a few hundred (128
#: choices with tool calls); decoding costs ~500 bytes of memory per object, so a line of a
#: million choices (100 MB) would take a gigabyte to read.
MAX_CONTAINERS = 100_000
# A JSON string, escapes included: what is inside one is no structure.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


class LineTooLarge(orjson.JSONDecodeError):
    """A line that would take too much memory to decode; readers report it like bad JSON."""

    def __str__(self) -> str:
        return self.msg


def load_line(raw: bytes) -> Any:
    """One JSONL line decoded, as `orjson.loads`; a line with more than `MAX_CONTAINERS` JSON
    objects and arrays raises `LineTooLarge` (an `orjson.JSONDecodeError`) instead of taking
    gigabytes: report, export and post read every response line through here. Only the
    braces and brackets outside strings count (a 50 MB answer full of code is one string); the
    count stops as soon as it is over, so it costs a fraction of the decoding it saves."""
    if len(raw) > _MEASURE_FROM and raw.count(b"{") + raw.count(b"[") > MAX_CONTAINERS:
        containers, end = 0, 0
        for string in _STRING.finditer(raw):
            containers += raw.count(b"{", end, string.start()) + raw.count(
                b"[", end, string.start()
            )
            end = string.end()
            if containers > MAX_CONTAINERS:
                break
        else:
            containers += raw.count(b"{", end) + raw.count(b"[", end)
        if containers > MAX_CONTAINERS:
            raise LineTooLarge(
                f"a {len(raw) / 1e6:,.0f} MB line with more than {MAX_CONTAINERS:,} JSON objects "
                "and arrays (a response line holds a few hundred); not read",
                "",
                0,
            )
    return orjson.loads(raw)

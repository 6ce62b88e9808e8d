"""The OpenAI Batch line formats: the contract between gen, exec and the post-processors.

Request lines are what `vllm run-batch` and the OpenAI Batch API read::

    {"custom_id": "a|0", "method": "POST", "url": "/v1/chat/completions", "body": {...}}

Response lines are what they write, plus one extra key, `metrics`::

    {"id": "batch_req_...", "custom_id": "a|0",
     "response": {"status_code": 200, "request_id": "...", "body": {...}},
     "error": null, "metrics": {...}}

Checks here return `Problem`s rather than raising, so a validator can report every problem
of a file in one pass.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from jsonlbatch.batch_format.media import part_problem
from jsonlbatch.errors import InputError, Problem
from jsonlbatch.redact import redact_line

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
EMBEDDINGS_URL = "/v1/embeddings"
RESPONSES_URL = "/v1/responses"  # OpenAI's Responses API
MODERATIONS_URL = "/v1/moderations"
MESSAGES_URL = "/v1/messages"  # Anthropic's Messages API (and servers that mimic it, vLLM too)

#: Endpoint paths a request line may name: the OpenAI Batch API's, `vllm run-batch`'s and
#: Anthropic's Messages API.
KNOWN_URLS = frozenset(
    {
        CHAT_URL,
        COMPLETIONS_URL,
        EMBEDDINGS_URL,
        RESPONSES_URL,
        MODERATIONS_URL,
        MESSAGES_URL,
        "/v1/score",
        "/v1/rerank",
        "/v2/rerank",  # vLLM's Cohere-style rerank, which `vllm run-batch` also takes
        "/score",
        "/rerank",
    }
)

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_POSITIVE = ("n", "max_tokens", "max_completion_tokens")
#: Part types `media.part_problem` checks (chat, Responses, Messages).
_MEDIA_PARTS = frozenset({"image_url", "file", "image", "document", "input_image", "input_file"})
_ROLE_STRS = tuple(_ROLES)  # `in` on a tuple compares, so an unhashable role cannot raise
#: The roles of the fast path in `check_messages`: a tool message takes the slow one, which
#: notes it, so a conversation without one pays nothing for the check of its calls.
_PLAIN_ROLE_STRS = tuple(r for r in _ROLE_STRS if r != "tool")


@dataclass(slots=True)
class Request:
    """One parsed request line. `line` is 1-based, for messages."""

    custom_id: str
    url: str
    body: dict[str, Any]
    line: int = 0
    method: str = "POST"
    fingerprint: str | None = None  # of the line as read (see `fingerprint`), for `metrics`
    priority: int | None = None  # the line's own (higher = more important); None: --priority


def check_messages(messages: Any, field_name: str = "body.messages") -> list[tuple[str, str]]:
    """Problems with a chat `messages` list, as (field, message) pairs."""
    if not isinstance(messages, list):
        return [(field_name, f"must be a list of messages, got {_kind(messages)}")]
    if not messages:
        return [(field_name, "must not be empty")]
    out: list[tuple[str, str]] = []
    tool_turns = False
    for i, msg in enumerate(messages):
        if (
            type(msg) is dict
            and type(msg.get("content")) is str
            and msg.get("role") in _PLAIN_ROLE_STRS
        ):
            continue  # the common case, checked first: most files are millions of these
        where = f"{field_name}[{i}]"
        if not isinstance(msg, dict):
            out.append((where, f"must be an object, got {_kind(msg)}"))
            continue
        role = msg.get("role")
        tool_turns = tool_turns or role == "tool"
        if not isinstance(role, str):
            out.append((f"{where}.role", "missing or not a string"))
        elif role not in _ROLES:
            out.append((f"{where}.role", f"unknown role {role!r}"))
        content = msg.get("content")
        if content is None:
            if not (msg.get("tool_calls") or msg.get("function_call")) and "content" not in msg:
                out.append((f"{where}.content", "missing"))
        elif isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    out.append((f"{where}.content[{j}]", "must be an object with a 'type'"))
                elif part["type"] in _MEDIA_PARTS and (found := part_problem(part)):
                    out.append((f"{where}.content[{j}].{found[0]}", found[1]))
        elif not isinstance(content, str):
            out.append((f"{where}.content", f"must be a string or a list, got {_kind(content)}"))
        if role == "assistant" and msg.get("tool_calls") is not None:
            out += _call_problems(msg["tool_calls"], f"{where}.tool_calls")
    if tool_turns:
        out += _unanswered_tool_turns(messages, field_name)
    return out


def _call_problems(calls: Any, where: str) -> list[tuple[str, str]]:
    """An assistant turn's `tool_calls` (carried by `gen --continue` as a server wrote them):
    a list of objects with a string `id` and a `function` with a string `name`, as servers
    take them; the first entry that is not one is named."""
    if not isinstance(calls, list):
        return [(where, f"must be a list of calls, got {_kind(calls)}")]
    for k, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(call, dict)
            or type(call.get("id")) is not str
            or not isinstance(function, dict)
            or type(function.get("name")) is not str
        ):
            return [(f"{where}[{k}]", "a call is an object with a string id and a function "
                                      "with a string name")]  # fmt: skip
    return []


def _unanswered_tool_turns(messages: list[Any], field_name: str) -> list[tuple[str, str]]:
    """A `role: "tool"` message must answer a call: its `tool_call_id` is the id of a call in
    an earlier assistant turn's `tool_calls` (servers refuse the request otherwise)."""
    out: list[tuple[str, str]] = []
    calls: set[str] = set()
    for i, msg in enumerate(messages):
        if type(msg) is not dict:
            continue
        if msg.get("role") == "assistant" and isinstance(msg.get("tool_calls"), list):
            calls.update(
                c["id"]
                for c in msg["tool_calls"]
                if isinstance(c, dict) and type(c.get("id")) is str
            )
        elif msg.get("role") == "tool":
            answered = msg.get("tool_call_id")
            where = f"{field_name}[{i}].tool_call_id"
            if type(answered) is not str:
                out.append((where, "missing: a tool message names the call it answers"))
            elif answered not in calls:
                out.append((where, f"{answered!r} answers no call: no earlier assistant turn's "
                                   "tool_calls has that id"))  # fmt: skip
    return out


#: `--priority` and a request line's `priority` are within this (a 32-bit integer, which every
#: server's field holds).
PRIORITY_RANGE = (-(2**31) + 1, 2**31 - 1)


def is_priority(value: Any) -> bool:
    """An integer priority in `PRIORITY_RANGE` (not a bool, not a float)."""
    low, high = PRIORITY_RANGE
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def request_head_ok(obj: Any) -> bool:
    """Whether the fields of a request line around its body are valid (`check_request` checks
    those and the body): a quick test for a line whose body needs no check."""
    if type(obj) is not dict:
        return False
    cid, priority, url = obj.get("custom_id"), obj.get("priority"), obj.get("url")
    return (
        type(cid) is str
        and cid != ""
        and obj.get("method", "POST") == "POST"
        and (priority is None or is_priority(priority))
        and type(url) is str
        and url in KNOWN_URLS
        and type(obj.get("body")) is dict
    )


def check_request(obj: Any, *, require_model: bool = True) -> list[tuple[str, str]]:
    """Problems with one decoded request line, as (field, message) pairs."""
    if not isinstance(obj, dict):
        return [("line", f"must be a JSON object, got {_kind(obj)}")]
    out: list[tuple[str, str]] = []
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid:
        out.append(("custom_id", "missing or not a non-empty string"))
    method = obj.get("method", "POST")
    if method != "POST":
        out.append(("method", f"must be 'POST', got {method!r}"))
    priority = obj.get("priority")
    if priority is not None and not is_priority(priority):
        out.append(("priority", f"must be an integer (higher = more important), got {priority!r}"))
    url = obj.get("url")
    if not isinstance(url, str):
        out.append(("url", "missing or not a string"))
    elif url not in KNOWN_URLS:
        out.append(("url", f"unknown endpoint {url!r} (known: {', '.join(sorted(KNOWN_URLS))})"))
    body = obj.get("body")
    if not isinstance(body, dict):
        out.append(("body", f"must be an object, got {_kind(body)}"))
        return out
    model = body.get("model")
    if model is None:
        if require_model and url != MODERATIONS_URL:  # moderations has a default model
            out.append((
                "body.model",
                'missing: the request names no model; add "model" to its body (jsonlbatch '
                "gen --model NAME writes it) or run exec with --model NAME",
            ))  # fmt: skip
    elif not isinstance(model, str) or not model:
        out.append(("body.model", "must be a non-empty string"))
    for name in _POSITIVE:  # servers refuse 0 (vLLM: "n must be at least 1")
        value = body.get(name)
        bad = isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1
        if value is not None and bad:
            out.append((f"body.{name}", f"must be a number of at least 1, got {value!r}"))
    if url == CHAT_URL:
        out += check_messages(body.get("messages"))
    elif url == COMPLETIONS_URL and not isinstance(body.get("prompt"), (str, list)):
        out.append(("body.prompt", "missing or not a string/list"))
    elif url == EMBEDDINGS_URL and not isinstance(body.get("input"), (str, list)):
        out.append(("body.input", "missing or not a string/list"))
    elif url in _HOSTED_CHECKS:
        out += _HOSTED_CHECKS[url](body)
    return out


def _cap(body: dict[str, Any], key: str, required: bool = False) -> list[tuple[str, str]]:
    value = body.get(key)
    if value is None:
        return [(f"body.{key}", "missing (the endpoint requires it)")] if required else []
    if type(value) is not int or value < 1:
        return [(f"body.{key}", f"must be an integer of at least 1, got {value!r}")]
    return []


def _check_responses(body: dict[str, Any]) -> list[tuple[str, str]]:
    """The Responses API: `input` is a string or a list of items (messages or typed items)."""
    value = body.get("input")
    out = _cap(body, "max_output_tokens")
    if isinstance(value, str):
        return out
    if not isinstance(value, list) or not value:
        return [("body.input", "missing, or not a string or a non-empty list of items"), *out]
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not (
            isinstance(item.get("role"), str) or isinstance(item.get("type"), str)
        ):
            out.append((f"body.input[{i}]", "must be an object with a 'role' or a 'type'"))
        elif isinstance(content := item.get("content"), list):
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if type(kind) is str and kind in _MEDIA_PARTS and (found := part_problem(part)):
                    out.append((f"body.input[{i}].content[{j}].{found[0]}", found[1]))
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        out.append(("body.instructions", "must be a string"))
    return out


def _check_moderations(body: dict[str, Any]) -> list[tuple[str, str]]:
    value = body.get("input")
    if isinstance(value, str) or (isinstance(value, list) and value):
        return []
    return [("body.input", "missing, or not a string or a non-empty list")]


def _check_messages_api(body: dict[str, Any]) -> list[tuple[str, str]]:
    """Anthropic's Messages API: user/assistant `messages`, a required `max_tokens`, and the
    system prompt as a top-level `system`, not a message."""
    out = check_messages(body.get("messages"))
    for i, msg in enumerate(body.get("messages") or ()):
        if isinstance(msg, dict) and msg.get("role") not in ("user", "assistant", None):
            out.append((f"body.messages[{i}].role", "must be 'user' or 'assistant' (the "
                        "system prompt goes in body.system)"))  # fmt: skip
    out += _cap(body, "max_tokens", required=True)
    system = body.get("system")
    if system is not None and not isinstance(system, (str, list)):
        out.append(("body.system", "must be a string or a list of text blocks"))
    return out


_HOSTED_CHECKS = {
    RESPONSES_URL: _check_responses,
    MODERATIONS_URL: _check_moderations,
    MESSAGES_URL: _check_messages_api,
}


def parse_request(raw: bytes | str, *, path: str, line: int, require_model: bool = True) -> Request:
    """Decode and check one request line; raise `InputError` naming file, line and field."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputError("invalid request", [Problem.bad_json(path, line, exc)]) from None
    problems = check_request(obj, require_model=require_model)
    if problems:
        raise InputError("invalid request", [Problem(path, line, f, m) for f, m in problems])
    return Request(obj["custom_id"], obj["url"], obj["body"], line, obj.get("method", "POST"))


def fingerprint(raw: bytes, url: Any, body: Any, sorted_body: bytes | None = None) -> str:
    """A request's fingerprint, as 16 hex digits in each response line's `metrics`, so a resume
    notices a request edited since its answer: the CRC-32 of what it asks (its URL and its body
    with keys sorted, so a file re-serialised by another tool keeps it), then the CRC-32 of the
    request line as read (`raw`; a resume that finds the line byte for byte the same needs no
    more: most lines of a million-line resume cost one CRC, not a re-encoding).

    Change detection, not security: a cryptographic hash costs several times more per line.
    `sorted_body`: as for `request_crc`.
    """
    return f"{request_crc(url, body, sorted_body):08x}{zlib.crc32(raw):08x}"


def request_crc(url: Any, body: Any, sorted_body: bytes | None = None) -> int:
    """CRC-32 of a request's URL and body (keys sorted): the first half of its fingerprint.
    `sorted_body` is `orjson.dumps(body, option=OPT_SORT_KEYS)`, if the caller has made it."""
    seed = _URL_CRCS.get(url) if type(url) is str else 0
    if seed is None:
        seed = zlib.crc32(url.encode())
        if len(_URL_CRCS) < 64:  # endpoint paths; an odd file cannot grow it without bound
            _URL_CRCS[url] = seed
    return zlib.crc32(sorted_body or orjson.dumps(body, option=orjson.OPT_SORT_KEYS), seed)


#: CRC-32 of each endpoint path met: a file names a few, and each line needs one.
_URL_CRCS: dict[str, int] = {}


def request_line(custom_id: str, body: dict[str, Any], url: str = CHAT_URL) -> bytes:
    """Encode one request line (with its trailing newline)."""
    return (
        orjson.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}) + b"\n"
    )


# ---------------------------------------------------------------------------------------------
# Response lines


@dataclass(slots=True)
class Result:
    """The outcome of one request, as written to the response file.

    `body` is the server's JSON: either decoded, or an `orjson.Fragment` of the raw bytes so a
    successful body is written back byte for byte without re-encoding.
    """

    custom_id: str
    status_code: int | None
    body: Any = None
    request_id: str | None = None
    error: dict[str, Any] | None = None
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None and self.status_code is not None and 200 <= self.status_code < 300

    def to_line(self) -> bytes:
        """The line to save, with secrets masked (`redact_line`: a failure's texts and body are
        searched for credential shapes too; a success's bytes stay as they are unless they
        hold a registered secret)."""
        response = None
        if self.status_code is not None:
            request_id = self.request_id
            if type(request_id) is not str:  # OpenAI's schema says string: none was sent
                request_id = "req_" + _line_id().decode()
            response = {"status_code": self.status_code, "request_id": request_id,
                        "body": self.body}  # fmt: skip
        line_id = "batch_req_" + _line_id().decode()
        if (
            self.error is not None
            and self.status_code is not None
            and 200 <= self.status_code < 300
        ):
            # A 2xx answer that still failed (it broke its schema): `error` goes before
            # `response`, so a resume's fast read of the status never takes it for a success.
            line = orjson.dumps({"id": line_id, "custom_id": self.custom_id, "error": self.error,
                                 "response": response, "metrics": self.metrics})  # fmt: skip
        else:
            line = orjson.dumps({"id": line_id, "custom_id": self.custom_id, "response": response,
                                 "error": self.error, "metrics": self.metrics})  # fmt: skip
        # `+ b"\n"` copies into an exact-size object: orjson's own buffer (OPT_APPEND_NEWLINE)
        # stays over-allocated, and lines held for one write then cost ~4 KB each in RSS.
        return redact_line(line + b"\n", thorough=not self.ok)


#: Random line ids (`batch_req_` + 24 hex digits), made 512 at a time: one `os.urandom` per line
#: cost as much as the rest of a cached answer's line. Emptied in a forked child, which must
#: not repeat its parent's.
_LINE_IDS: list[bytes] = []
os.register_at_fork(after_in_child=_LINE_IDS.clear)


def _line_id() -> bytes:
    if not _LINE_IDS:
        pool = os.urandom(12 * 512).hex().encode()
        _LINE_IDS.extend(pool[i : i + 24] for i in range(0, len(pool), 24))
    return _LINE_IDS.pop()


def json_object(value: Any) -> dict[str, Any]:
    """`value` when it is a JSON object, else an empty one: the one way to read an optional part
    of an answer or a line (`json_object(body.get("usage")).get("total_tokens")`)."""
    return value if isinstance(value, dict) else {}


def is_failure(obj: dict[str, Any]) -> bool:
    """Whether a decoded response line records a failed request.

    The OpenAI service signals HTTP errors only through `response.status_code` (with `error`
    null) while `vllm run-batch` sets `error` (an object, or a bare message string) beside its
    status code, and no status at all where it had none: look at both.
    """
    if obj.get("error"):
        return True
    response = obj.get("response")
    if not isinstance(response, dict):
        return True
    status = response.get("status_code")
    return not (isinstance(status, int) and 200 <= status < 300)


def check_response(obj: Any) -> list[tuple[str, str]]:
    """Problems with one decoded response line, as (field, message) pairs."""
    if not isinstance(obj, dict):
        return [("line", f"must be a JSON object, got {_kind(obj)}")]
    if "body" in obj and "url" in obj and "response" not in obj and "error" not in obj:
        return [("line", "a request line, not a response: is this the request file?")]
    out: list[tuple[str, str]] = []
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid:
        out.append(("custom_id", "missing or not a non-empty string"))
    response = obj.get("response")
    error = obj.get("error")
    if response is None:
        if not (isinstance(error, dict) or (isinstance(error, str) and error)):
            out.append(("error", "a line without a response must carry an error object (or "
                        "vLLM's message string)"))  # fmt: skip
    elif not isinstance(response, dict):
        out.append(("response", f"must be an object or null, got {_kind(response)}"))
    else:
        if not isinstance(response.get("status_code"), int):
            out.append(("response.status_code", "missing or not an integer"))
        body = response.get("body")
        if response.get("status_code") == 200 and not isinstance(body, dict):
            out.append(("response.body", "a 200 response must have an object body"))
    if error is not None and not isinstance(error, (dict, str)):
        out.append(("error", f"must be an object, a string or null, got {_kind(error)}"))
    return out


def _kind(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", type(None): "null", bool: "boolean"}.get(
        type(value), type(value).__name__
    )


def reasoning_tokens(usage: Any) -> int | None:
    """The reasoning token count of a body's `usage`, or None where it gives none.

    OpenAI puts it in `completion_tokens_details.reasoning_tokens`, SGLang in `reasoning_tokens`.
    """
    if not isinstance(usage, dict):
        return None
    details = usage.get("completion_tokens_details")
    if isinstance(details, dict) and details.get("reasoning_tokens") is not None:
        return details["reasoning_tokens"]
    return usage.get("reasoning_tokens")  # SGLang

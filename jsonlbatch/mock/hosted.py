"""The mock's hosted-API endpoints: OpenAI's Responses and Moderations, Anthropic's Messages.

Each request is read as the chat request it means (instructions or `system` first, then the
input or messages), so its reply is the one `content.reply_text` computes for that chat body:
a test can check any answer without knowing which endpoint produced it. Shapes follow the
providers' documentation: a Responses answer's text is in `output[].content[]` of type
`output_text`, a Messages answer's in `content[]` of type `text`, and both count usage as
`input_tokens` / `output_tokens`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any, Protocol

import orjson
from aiohttp import web

from jsonlbatch.answer_contract.contract import SchemaError
from jsonlbatch.answer_contract.schema_forms import declared_schema, with_schema
from jsonlbatch.batch_format.records import CHAT_URL, MESSAGES_URL, RESPONSES_URL, check_messages
from jsonlbatch.mock import containers, content


class _Mock(Protocol):
    """What these answers use of the mock server (`app._Mock` is one): its pace and its
    response maker. A protocol here, so this module does not import the app that imports it."""

    step_delay: float
    files: containers.FileStore

    @property
    def config(self) -> _Config: ...

    def delay(self) -> float: ...

    def respond(
        self, body: bytes, status: int = 200, headers: dict[str, str] | None = None
    ) -> web.Response: ...


class _Config(Protocol):
    @property
    def default_max_tokens(self) -> int: ...

    @property
    def break_json(self) -> float: ...

    @property
    def uncited_file(self) -> bool: ...


#: Words whose presence flags a moderation input (deterministic, so tests can predict it).
FLAGGED_WORDS = frozenset({"attack", "kill", "weapon"})
#: Every category OpenAI's moderation answer carries (the SDK's `Moderation` requires each).
_CATEGORIES = ("harassment", "harassment/threatening", "hate", "hate/threatening", "illicit",
               "illicit/violent", "self-harm", "self-harm/instructions", "self-harm/intent",
               "sexual", "sexual/minors", "violence", "violence/graphic")  # fmt: skip


def as_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat body a Responses or Messages request means (model, messages, token budget)."""
    messages: list[dict[str, Any]] = []
    system = body.get("instructions", body.get("system"))
    if isinstance(system, list):  # Messages API: a list of text blocks
        system = " ".join(b.get("text", "") for b in system if isinstance(b, dict))
    if isinstance(system, str) and system:
        messages.append({"role": "system", "content": system})
    given = body.get("messages", body.get("input"))
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    else:
        for item in given or ():
            if isinstance(item, dict) and isinstance(item.get("role"), str):
                messages.append({"role": item["role"], "content": _text_of(item.get("content"))})
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    for url in (RESPONSES_URL, MESSAGES_URL):  # a declared schema, in the chat form
        with contextlib.suppress(SchemaError):
            found = declared_schema(url, body)
            if found is not None:
                chat = with_schema(CHAT_URL, chat, found.schema)
                break
    if body.get("seed") is not None:
        chat["seed"] = body["seed"]
    budget = body.get("max_output_tokens", body.get("max_tokens"))
    if budget is not None:
        chat["max_tokens"] = budget
    return chat


def _text_of(value: Any) -> str:
    """Text of a message's content: a string, or the text of its typed parts (`input_text`,
    `text`, `output_text`)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return " ".join(p.get("text", "") for p in value if isinstance(p, dict))
    return ""


def check_responses(body: dict[str, Any], reject: type[Exception]) -> None:
    value = body.get("input")
    if not isinstance(value, (str, list)) or (isinstance(value, list) and not value):
        raise reject("input must be a string or a non-empty list of items", 400, "input")
    _positive(body, "max_output_tokens", reject)
    _no_stream(body, reject)


def check_messages_api(body: dict[str, Any], reject: type[Exception]) -> None:
    if "messages" not in body:
        raise reject("messages: Field required", 400, "messages")
    problems = check_messages(body["messages"], "messages")
    if problems:
        raise reject("; ".join(f"{f}: {m}" for f, m in problems), 400, "messages")
    if body.get("max_tokens") is None:
        raise reject("max_tokens: Field required", 400, "max_tokens")
    _positive(body, "max_tokens", reject)
    _no_stream(body, reject)


def check_moderations(body: dict[str, Any], reject: type[Exception]) -> None:
    value = body.get("input")
    if not isinstance(value, (str, list)) or (isinstance(value, list) and not value):
        raise reject("input must be a string or a non-empty list", 400, "input")


def _no_stream(body: dict[str, Any], reject: type[Exception]) -> None:
    if body.get("stream"):
        raise reject("the mock does not stream this endpoint", 400, "stream")


def _positive(body: dict[str, Any], key: str, reject: type[Exception]) -> None:
    value = body.get(key)
    if value is not None and (type(value) is not int or value < 1):
        raise reject(f"{key} must be an integer of at least 1, got {value!r}", 400, key)


async def _wait(mock: _Mock, reply: content.Reply | None) -> None:
    steps = reply.completion_tokens if reply is not None else 0
    wait = mock.delay() + steps * mock.step_delay
    if wait:
        await asyncio.sleep(wait)


def _reply(mock: _Mock, body: dict[str, Any]) -> tuple[content.Reply, int]:
    chat = as_chat(body)
    reply = content.compose(
        chat,
        0,
        default_max_tokens=mock.config.default_max_tokens,
        break_json=mock.config.break_json,
    )
    return reply, content.prompt_tokens(chat)


async def answer_responses(
    mock: _Mock, request: web.Request, body: dict[str, Any], model: str, _prompt: int
) -> web.StreamResponse:
    reply, prompt = _reply(mock, body)
    await _wait(mock, reply)
    rid = os.urandom(16).hex()
    truncated = reply.finish_reason == "length"
    text: dict[str, Any] = {"type": "output_text", "text": "".join(reply.content),
                            "annotations": []}  # fmt: skip
    message = {"type": "message", "id": "msg_" + rid, "status": "completed", "role": "assistant",
               "content": [text]}  # fmt: skip
    before: list[dict[str, Any]] = []
    tool = containers.wants_interpreter(body)
    if tool is not None:  # the hosted code interpreter (mock/containers.py)
        prompt_text = " ".join(str(m["content"]) for m in as_chat(body)["messages"])
        ran = containers.run_interpreter(
            mock.files, tool, prompt_text, text["text"], mock.config.uncited_file
        )
        if isinstance(ran, str):
            error = {"error": {"message": ran, "type": "invalid_request_error", "param": "tools",
                               "code": None}}  # fmt: skip
            return mock.respond(orjson.dumps(error), 400)
        before, text["text"], text["annotations"] = ran
    output = reply.completion_tokens
    payload = {
        "id": "resp_" + rid, "object": "response", "created_at": int(time.time()),
        "status": "incomplete" if truncated else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "model": model, "output": [*before, message],
        # echoed from the request with the API's defaults, as OpenAI answers them: the SDK's
        # `Response` requires these three
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools", []),
        "usage": {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0,
                                                                   "cache_write_tokens": 0},
                  "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": prompt + output},
    }  # fmt: skip
    return mock.respond(orjson.dumps(payload), 200, {"x-request-id": rid})


async def answer_messages(
    mock: _Mock, request: web.Request, body: dict[str, Any], model: str, _prompt: int
) -> web.StreamResponse:
    reply, prompt = _reply(mock, body)
    await _wait(mock, reply)
    rid = os.urandom(12).hex()
    payload = {
        "id": "msg_" + rid, "type": "message", "role": "assistant", "model": model,
        "content": [{"type": "text", "text": "".join(reply.content)}],
        "stop_reason": "max_tokens" if reply.finish_reason == "length" else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": prompt, "output_tokens": reply.completion_tokens},
    }  # fmt: skip
    return mock.respond(orjson.dumps(payload), 200, {"request-id": "req_" + rid})


async def answer_moderations(
    mock: _Mock, request: web.Request, body: dict[str, Any], model: str, _prompt: int
) -> web.StreamResponse:
    await _wait(mock, None)
    results = []
    for item in content.prompt_items(body["input"]):
        text = item if isinstance(item, str) else item.get("text") if isinstance(item, dict) else ""
        words = {w.strip(".,!?").lower() for w in str(text or "").split()}
        flagged = bool(words & FLAGGED_WORDS)
        categories = dict.fromkeys(_CATEGORIES, False)
        categories["violence"] = flagged
        scores = {name: (0.9 if hit else 0.001) for name, hit in categories.items()}
        applied = {name: ["text"] for name in categories}
        results.append({"flagged": flagged, "categories": categories, "category_scores": scores,
                        "category_applied_input_types": applied})  # fmt: skip
    payload = {"id": "modr-" + os.urandom(12).hex(), "model": model, "results": results}
    return mock.respond(orjson.dumps(payload))


#: (path, request check, answer) of each endpoint, for `create_app`.
ROUTES = (
    ("/v1/responses", check_responses, answer_responses),
    ("/v1/messages", check_messages_api, answer_messages),
    ("/v1/moderations", check_moderations, answer_moderations),
)

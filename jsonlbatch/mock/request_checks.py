"""What the mock refuses in a request body, with vLLM's status codes and its nested error
body (`error_body`), so that a client proven against the mock meets the same refusals."""

from __future__ import annotations

from typing import Any

import orjson

from jsonlbatch.batch_format.records import check_messages
from jsonlbatch.mock import content


class Refusal(Exception):
    """A request the server refuses with a 4xx error body (vLLM's nested shape)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


def error_body(status: int, message: str, kind: str, param: str | None = None) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": kind, "param": param, "code": status}}
    )


ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}
CONTEXT_MSG = "This model's maximum context length is {limit} tokens. However, "


def _positive_int(body: dict[str, Any], key: str) -> None:
    value = body.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise Refusal(f"{key} must be an integer of at least 1, got {value!r}", param=key)


def _check_common(body: dict[str, Any]) -> None:
    for key in ("n", "max_tokens", "max_completion_tokens"):
        _positive_int(body, key)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise Refusal(f"stream must be a boolean, got {stream!r}", param="stream")
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise Refusal("Stream options can only be defined when `stream=True`.", param="stream")
        if not isinstance(options, dict):
            raise Refusal("stream_options must be an object", param="stream_options")


def check_chat(body: dict[str, Any]) -> None:
    _check_common(body)
    if "messages" not in body:
        raise Refusal("Field required: messages", param="messages")
    problems = check_messages(body["messages"], "messages")
    if problems:
        raise Refusal("; ".join(f"{f}: {m}" for f, m in problems), param="messages")
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is not None and not isinstance(tools, list):
        raise Refusal("tools must be a list", param="tools")
    if isinstance(choice, dict):
        name = content.function_name(choice)
        if name not in [content.function_name(t) for t in tools or ()]:
            raise Refusal(f"tool_choice names an unknown function {name!r}", param="tool_choice")


def _check_prompt(body: dict[str, Any], key: str) -> None:
    value = body.get(key)
    if not isinstance(value, (str, list)) or (isinstance(value, list) and not value):
        raise Refusal(f"{key} must be a string or a non-empty list", param=key)


def check_completion(body: dict[str, Any]) -> None:
    _check_common(body)
    _check_prompt(body, "prompt")


def check_embedding(body: dict[str, Any]) -> None:
    _check_prompt(body, "input")
    _positive_int(body, "dimensions")
    if body.get("encoding_format", "float") not in ("float", "base64"):
        raise Refusal("encoding_format must be 'float' or 'base64'", param="encoding_format")

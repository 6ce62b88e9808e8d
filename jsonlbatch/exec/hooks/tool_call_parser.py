"""`--parse-tool-calls hermes`: tool calls a model wrote as text, read into `tool_calls`.

A model served without a tool parser (vLLM without `--tool-call-parser`, a plain chat template)
writes its calls as text, in the Hermes / Qwen form::

    Let me look that up.
    <tool_call>
    {"name": "get_order", "arguments": {"order_id": "A17"}}
    </tool_call>

This reads such text as vLLM's hermes parser does, so everything after exec (gen --continue,
post votes, export, report, a rollout's tools) sees ordinary structured calls:

- each `<tool_call>...</tool_call>` (a last one left unclosed too) holds one JSON object with a
  string `name` and an object `arguments` (absent: `{}`); it becomes
  `{"id", "type": "function", "function": {"name", "arguments": <a JSON string>}}`;
- the ids are made, not drawn: `call_` and a hash of the request's custom_id and fingerprint,
  the answer's id, the choice and the call's place, so the same answer gives the same ids on
  every run (a resumed conversation refers to the calls it saw) and different turns never
  share one (even under one custom_id, from a server that gives every answer the same id);
- `content` keeps the text outside the tags (stripped), or null when there is none;
  `finish_reason` becomes `tool_calls`;
- text that is not such JSON (a tag around a broken object, a name that is no string) is left
  as it is, with no calls: the model's answer, not a crash. The line's `metrics.tool_parser`
  says what was done (`{"parser": "hermes", "calls": N}`, or the `error` of a tag left alone).

It is the first on-answer check of a run (`check_hook.py`), so every answer takes it before
the other checks and before its line, whatever its source: sent, streamed (the rebuilt body) or
stored (the answer cache's, through `vet`). It changes the answer and accepts it. A choice that
already has `tool_calls` (a server with a parser) is left alone. Chat answers to requests that
offer `tools` (with a `tool_choice` other than "none") only, as vLLM's parser: the answer to
any other request is its text, tags and all (a judge quoting a transcript).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import orjson

from jsonlbatch.batch_format.records import CHAT_URL
from jsonlbatch.exec.hooks.check_hook import ACCEPT, AnswerToCheck, Check, CheckVerdict

#: The formats `--parse-tool-calls` reads.
PARSERS = ("hermes",)
_START, _END = "<tool_call>", "</tool_call>"
_TAG = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)\Z", re.DOTALL)


class Malformed(ValueError):
    """Text inside a tag that is no call."""


#: Twenty digits in a row: maybe an integer past 64 bits, which orjson reads as a float.
_LONG_INT = re.compile(r"\d{20}")


def _loads(text: str) -> Any:
    """JSON as the model wrote it: orjson, unless the text may hold an integer past 64 bits
    (an id of 30 digits would become a float, another order's id): then Python's json, as
    vLLM's parser reads it, exact (NaN and Infinity refused; too deep a RecursionError)."""
    if _LONG_INT.search(text) is None:
        return orjson.loads(text)
    return json.loads(text, parse_constant=_no_constant)


def _dumps(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # an integer past 64 bits, read exactly by `_loads`
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_hermes(text: str, id_seed: str) -> tuple[str | None, list[dict[str, Any]]] | None:
    """(content left, calls) read from `text`; None when it holds no tag. Raises `Malformed`
    when a tag holds something that is not a call (the caller then leaves the text alone)."""
    if _START not in text:
        return None
    calls: list[dict[str, Any]] = []
    outside: list[str] = []
    at = 0
    for k, found in enumerate(_TAG.finditer(text)):
        outside.append(text[at : found.start()])
        at = found.end()
        inner = found[1] if found[1] is not None else found[2]
        try:
            obj = _loads(inner.strip())
        except (ValueError, RecursionError) as exc:
            raise Malformed(f"call {k + 1} is not JSON: {exc}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            raise Malformed(f"call {k + 1} has no string 'name'")
        arguments = obj.get("arguments", {})
        try:
            if isinstance(arguments, str):  # some templates write the arguments as a JSON string
                arguments = _loads(arguments)
            text = _dumps(arguments)
        except (ValueError, RecursionError):
            raise Malformed(f"call {k + 1}'s arguments are not JSON") from None
        if not isinstance(arguments, dict):
            raise Malformed(f"call {k + 1}'s arguments are not an object")
        digest = hashlib.blake2b(f"{id_seed}\0{k}".encode(), digest_size=12).hexdigest()
        function = {"name": obj["name"], "arguments": text}
        calls.append({"id": f"call_{digest}", "type": "function", "function": function})
    outside.append(text[at:])
    left = "".join(outside).strip()
    return (left or None), calls


class ToolCallParser(Check):
    """The on-answer check that rewrites hermes text into `tool_calls` (see the module doc)."""

    def __init__(self, parser: str = "hermes") -> None:
        if parser not in PARSERS:
            raise ValueError(f"unknown tool-call parser {parser!r}")
        self.parser = parser

    def __call__(self, answer: AnswerToCheck, /) -> CheckVerdict:
        if answer.request.url != CHAT_URL or not _offers_tools(answer.request.body):
            return ACCEPT
        body = answer.body()
        choices = body.get("choices") if isinstance(body, dict) else None
        if not isinstance(choices, list):
            return ACCEPT
        new_choices, calls, errors = [], 0, []
        for i, choice in enumerate(choices):
            message = choice.get("message") if isinstance(choice, dict) else None
            if not isinstance(message, dict):
                new_choices.append(choice)
                continue
            text = message.get("content")
            if not isinstance(text, str) or message.get("tool_calls"):
                new_choices.append(choice)
                continue
            request = answer.request  # its fingerprint: two turns of one id are two requests
            seed = f"{request.custom_id}\0{request.fingerprint}\0{body.get('id')}\0{i}"
            try:
                parsed = parse_hermes(text, seed)
            except Malformed as exc:
                errors.append(f"choice {i}: {exc}")
                parsed = None
            if parsed is None or not parsed[1]:
                new_choices.append(choice)
                continue
            content, found = parsed
            calls += len(found)
            message = {**message, "content": content, "tool_calls": found}
            new_choices.append({**choice, "message": message, "finish_reason": "tool_calls"})
        if not calls and not errors:
            return ACCEPT
        record: dict[str, Any] = {"parser": self.parser, "calls": calls}
        if errors:
            record["error"] = "; ".join(errors)[:500]
        answer.result.metrics["tool_parser"] = record
        if calls:
            new_body = {**body, "choices": new_choices}
            answer.decoded, answer.raw = new_body, None
            answer.result.body = new_body
        return ACCEPT


def _offers_tools(body: Any) -> bool:
    """Whether the request let the model call tools (`tools`, and `tool_choice` not "none"):
    vLLM's parser reads calls only then; an answer to any other request that quotes the form
    (a judge citing a transcript, a last turn asked with `tool_choice: none`) is text."""
    if not isinstance(body, dict):
        return False
    tools = body.get("tools")
    return isinstance(tools, list) and bool(tools) and body.get("tool_choice") != "none"

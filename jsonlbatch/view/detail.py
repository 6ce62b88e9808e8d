"""One request as the detail pane shows it: the prompt as chat turns, every choice's answer (with
its reasoning apart and JSON answers pretty-printed), the failure, the metrics and the raw line.

Everything here is text for the page to show as text: the browser escapes it (the page never
inserts a server string as HTML), and every string passes through `redact` first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from jsonlbatch.batch_format.samples import Sample, samples_of
from jsonlbatch.redact import redact, redact_json
from jsonlbatch.view.media import describe_source, part_source

#: Where the page gets the bytes of image part (message, part) of the request shown.
MediaLink = Callable[[int, int], str]

#: Longest raw line sent to the page whole; longer ones are cut (the file keeps them whole).
RAW_LIMIT = 2_000_000


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts
        parts = []
        for part in value:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif part_source(part) is not None:
                continue  # shown as media beside the text, never as base64
            elif isinstance(part, dict):
                parts.append(f"[{part.get('type', 'part')}]")
        return "\n".join(parts)
    return "" if value is None else orjson.dumps(value).decode()


def _media(content: Any, message: int, link: MediaLink | None) -> list[dict[str, Any]]:
    """The images and files of a message's content: kind, type, size, and where the page
    gets an image's bytes (`src`), or a remote URL as text."""
    out = []
    for number, part in enumerate(content if isinstance(content, list) else ()):
        source = part_source(part)
        if source is None:
            continue
        item = describe_source(source)
        if source.data is not None and source.kind == "image" and link is not None:
            item["src"] = link(message, number)
        out.append(redact_json(item))
    return out


def prompt_turns(body: Any, link: MediaLink | None = None) -> list[dict[str, Any]]:
    """The request's prompt as a thread of turns, each {role, text}: chat messages, a Responses
    `input`, a Messages `system`, a completion's `prompt`, an embedding's `input`. A turn that
    calls tools has `calls` (`calls_of`); a tool's result has the `tool_call_id` it answers and,
    where an earlier turn made that call, the tool's `name`. Images and files are listed under
    `media` (`link` says where the page reads an image)."""
    if not isinstance(body, dict):
        return []
    turns: list[dict[str, Any]] = []
    if isinstance(body.get("system"), (str, list)):
        turns.append({"role": "system", "text": _text(body["system"])})
    if isinstance(body.get("instructions"), str):
        turns.append({"role": "system", "text": body["instructions"]})
    messages = body.get("messages")
    if not isinstance(messages, list):
        messages = body.get("input") if isinstance(body.get("input"), list) else None
    names: dict[str, str] = {}  # call id -> tool name, for the results that answer them
    for number, message in enumerate(messages or ()):
        if isinstance(message, dict):
            turn = _turn(message, names)
            media = _media(message.get("content"), number, link)
            if media:
                turn["media"] = media
            turns.append(turn)
        elif isinstance(message, str):
            turns.append({"role": "user", "text": message})
    for key in ("prompt", "input"):
        if isinstance(body.get(key), str):
            turns.append({"role": "user", "text": body[key]})
    return [redact_json(turn) for turn in turns]


def _turn(message: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """One message as a turn; `names` learns the calls it makes."""
    kind = message.get("type")
    if kind == "function_call":  # a Responses input item: a call the model made
        message = {"role": "assistant", "tool_calls": [{"id": message.get("call_id"), "function": {
            "name": message.get("name"), "arguments": message.get("arguments")}}]}  # fmt: skip
    elif kind == "function_call_output":  # ... and its result
        message = {"role": "tool", "tool_call_id": message.get("call_id"),
                   "content": message.get("output")}  # fmt: skip
    turn: dict[str, Any] = {"role": str(message.get("role", "user")),
                            "text": _text(message.get("content"))}  # fmt: skip
    calls = calls_of(message.get("tool_calls"))
    if calls:
        turn["calls"] = calls
        names.update((c["id"], c["name"]) for c in calls if c["id"] and c["name"])
    answered = message.get("tool_call_id")
    if isinstance(answered, str):
        turn["tool_call_id"] = answered
        name = message.get("name") if isinstance(message.get("name"), str) else None
        turn["name"] = name or names.get(answered)
    return turn


def calls_of(tool_calls: Any) -> list[dict[str, Any]]:
    """Tool calls as the page shows them: {id, name, arguments}, the arguments indented when
    they are JSON (else as the model wrote them)."""
    out = []
    for call in tool_calls if isinstance(tool_calls, list) else ():
        if not isinstance(call, dict):
            continue
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            arguments = pretty_json(arguments) or arguments
        elif arguments is not None:
            arguments = orjson.dumps(arguments, option=orjson.OPT_INDENT_2).decode()
        call_id, name = call.get("id"), function.get("name")
        out.append({"id": call_id if isinstance(call_id, str) else None,
                    "name": name if isinstance(name, str) else None,
                    "arguments": arguments or ""})  # fmt: skip
    return out


def pretty_json(text: str) -> str | None:
    """`text` indented, when the whole of it (or of a fenced block) is a JSON object or list."""
    stripped = text.strip()
    if stripped.startswith("```"):
        stripped = stripped.split("\n", 1)[-1].rsplit("```", 1)[0].strip()
    if stripped[:1] not in ("{", "["):
        return None
    try:
        value = orjson.loads(stripped)
    except orjson.JSONDecodeError:
        return None
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def _choice(sample: Sample) -> dict[str, Any]:
    text = redact(sample.text)
    return {
        "index": sample.index,
        "text": text,
        "reasoning": redact(sample.reasoning),
        "finish_reason": sample.finish_reason,
        "tool_calls": [redact_json(c) for c in sample.tool_calls],
        "calls": redact_json(calls_of(sample.tool_calls)),
        "json": pretty_json(text),
    }


def collected_files(metrics: Any) -> list[dict[str, Any]]:
    """The files `exec --files-dir` collected for the line (`metrics.files`): each one's path
    under that folder and its size, for the pane's list."""
    records = metrics.get("files") if isinstance(metrics, dict) else None
    found = []
    for record in records if isinstance(records, list) else ():
        if isinstance(record, dict):
            size = record.get("bytes")
            found.append({"path": redact(str(record.get("path") or record.get("name"))),
                          "bytes": size if type(size) is int else None})  # fmt: skip
    return found


def describe(
    raw: bytes, request_raw: bytes | None = None, *, line: int = 0, link: MediaLink | None = None
) -> dict[str, Any]:
    """The detail pane's data for one saved response line (and its request line, if known;
    `link` makes the URL of one of its images)."""
    raw_text = raw.decode("utf-8", "replace")
    out: dict[str, Any] = {
        "line": line,
        "raw": redact(raw_text[:RAW_LIMIT]),
        "raw_cut": len(raw_text) > RAW_LIMIT,
    }
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        out["problem"] = f"not JSON: {exc}"
        return out
    if not isinstance(obj, dict) or not isinstance(obj.get("custom_id"), str):
        out["problem"] = "not a response line (no custom_id)"
        return out
    out["custom_id"] = redact(obj["custom_id"])
    metrics = obj.get("metrics")
    out["metrics"] = redact_json(metrics) if isinstance(metrics, dict) else None
    out["files"] = collected_files(metrics)
    request_body = None
    if request_raw is not None:
        try:
            request = orjson.loads(request_raw)
            request_body = request.get("body") if isinstance(request, dict) else None
        except orjson.JSONDecodeError:
            request_body = None
    out["prompt"] = prompt_turns(request_body, link)
    out["request_known"] = request_raw is not None
    try:
        samples = samples_of(obj)
    except (KeyError, TypeError, AttributeError):
        out["problem"] = "not a response line (no response, error or answer)"
        samples = []
    failed = [s for s in samples if s.failed]
    out["error"] = failed[0].error if failed else None
    # a failure that kept its answer (the one that broke the schema) shows it under the error
    out["choices"] = [_choice(s) for s in samples if not s.failed or s.text]
    first = samples[0] if samples else None
    out["model"] = first.model if first else None
    out["usage"] = redact_json(first.usage) if first and first.usage else None
    return out

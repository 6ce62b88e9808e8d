"""One request as the detail pane shows it: the prompt as chat turns, every choice's answer (with
its reasoning apart and JSON answers pretty-printed), the failure, the metrics and the raw line.

Everything here is text for the page to show as text: the browser escapes it (the page never
inserts a server string as HTML), and every string passes through `redact` first.
"""

from __future__ import annotations

from typing import Any

import orjson

from jsonlbatch.redact import redact, redact_json
from jsonlbatch.samples import Sample, samples_of

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
            elif isinstance(part, dict):
                parts.append(f"[{part.get('type', 'part')}]")
        return "\n".join(parts)
    return "" if value is None else orjson.dumps(value).decode()


def prompt_turns(body: Any) -> list[dict[str, str]]:
    """The request's prompt as a list of {role, text}: chat messages, a Responses `input`, a
    Messages `system`, a completion's `prompt`, an embedding's `input`."""
    if not isinstance(body, dict):
        return []
    turns: list[dict[str, str]] = []
    if isinstance(body.get("system"), (str, list)):
        turns.append({"role": "system", "text": _text(body["system"])})
    if isinstance(body.get("instructions"), str):
        turns.append({"role": "system", "text": body["instructions"]})
    messages = body.get("messages")
    if not isinstance(messages, list):
        messages = body.get("input") if isinstance(body.get("input"), list) else None
    for message in messages or ():
        if isinstance(message, dict):
            text = _text(message.get("content"))
            if message.get("tool_calls"):
                text += (
                    "\n" + orjson.dumps(message["tool_calls"], option=orjson.OPT_INDENT_2).decode()
                )
            turns.append({"role": str(message.get("role", "user")), "text": text})
        elif isinstance(message, str):
            turns.append({"role": "user", "text": message})
    for key in ("prompt", "input"):
        if isinstance(body.get(key), str):
            turns.append({"role": "user", "text": body[key]})
    return [{k: redact(v) for k, v in turn.items()} for turn in turns]


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


def describe(raw: bytes, request_raw: bytes | None = None, *, line: int = 0) -> dict[str, Any]:
    """The detail pane's data for one saved response line (and its request line, if known)."""
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
    out["prompt"] = prompt_turns(request_body)
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

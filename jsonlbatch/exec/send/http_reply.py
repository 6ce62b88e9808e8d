"""What an HTTP answer means for a request: the line to write and whether to try again.

Kept apart from the executor's loop (`job.py`): the rules that decide a result (a usable 2xx is
kept byte for byte, a 2xx without an answer is `invalid_response`, an error keeps the server's
body and a redacted message) read alone, and the loop only calls `http_result`.
"""

from __future__ import annotations

from typing import Any

import orjson

from jsonlbatch.batch_format.answers import unusable_reason, usage_metrics
from jsonlbatch.batch_format.records import Request, Result
from jsonlbatch.exec.send.retry import Verdict, classify
from jsonlbatch.file_io.jsonl import BOM
from jsonlbatch.redact import redact


def http_result(
    req: Request, status: int, raw: bytes, request_id: str | None, metrics: dict[str, Any]
) -> tuple[Result, Verdict]:
    """Turn a response into a Result and decide what it means for the request.

    A 2xx line always has `error` null (resume relies on it): a 2xx whose body is no usable
    answer for its endpoint (`batch_format/answers.py` says what is), such as `{}` or a gateway's
    `{"error": ...}` sent with 200, is retried, and if it is the last word it is recorded as
    `invalid_response` with no response. A usable body is kept as the server's exact bytes.
    """
    verdict = classify(status, raw)
    body = _decode(raw)
    if verdict is Verdict.OK:
        reason = unusable_reason(req.url, body)
        if reason is not None:
            return _invalid(req, status, reason, body, request_id, metrics), Verdict.RETRY
        if request_id is None:
            request_id = body.get("id")
        metrics.update(usage_metrics(req.url, body))
        return Result(req.custom_id, status, _exact(raw), request_id, None, metrics), verdict
    message = redact(_error_message(body) or f"HTTP {status}", limit=500)
    error = {"code": f"http_{status}", "message": message}
    return Result(req.custom_id, status, _error_body(body), request_id, error, metrics), verdict


def _error_body(body: Any) -> dict[str, Any]:
    """An error answer's body as OpenAI's line schema has it: an object. JSON objects stay as
    sent; a text (a proxy's HTML page, "Unauthorized"), an empty body or JSON that is no object
    is kept as the message of an OpenAI-shaped error, so `response.body` is always an object
    and `response.body.error.message` always says what came back."""
    if isinstance(body, dict):
        return body
    if body is None or body == "":
        return {"error": {"message": "", "type": "empty_body", "param": None, "code": None}}
    text = body if isinstance(body, str) else orjson.dumps(body).decode()
    return {"error": {"message": text, "type": "non_object_body", "param": None, "code": None}}


def _decode(raw: bytes) -> Any:
    """A body as JSON where it is JSON (a leading BOM allowed), else as text; None if empty."""
    if raw.startswith(BOM):
        raw = raw[len(BOM) :]
    try:
        return orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace")


def _exact(raw: bytes) -> orjson.Fragment:
    """The server's JSON as it sent it, to be written byte for byte (no float for an integer
    beyond 64 bits, no re-encoding). Only line breaks go: in valid JSON they are whitespace
    (a string cannot hold a raw one), and a response line must be one line."""
    if raw.startswith(BOM):
        raw = raw[len(BOM) :]
    if b"\n" in raw or b"\r" in raw:
        raw = raw.translate(None, b"\r\n")
    return orjson.Fragment(raw.strip())


def _invalid(
    req: Request,
    status: int,
    reason: str,
    body: Any,
    request_id: str | None,
    metrics: dict[str, Any],
) -> Result:
    """A 2xx that is no answer: a failure without a response (so resume retries it)."""
    shown = body if isinstance(body, str) else orjson.dumps(body).decode()
    shown = shown[:4400]  # bounded, with room for a key across the cut made after masking
    message = redact(f"HTTP {status} without a usable answer ({reason}): {shown}", limit=400)
    error = {"code": "invalid_response", "message": message}
    return Result(req.custom_id, None, None, request_id, error, metrics)


def _error_message(body: Any) -> str:
    """The human message of an error body, whichever of the common shapes it has."""
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("detail")
            return str(msg) if msg else ""
        return str(err)
    return str(body) if body else ""

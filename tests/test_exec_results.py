"""What an HTTP answer means for a request (exec/send/http_reply.py) and which failures are retried
(exec/send/retry.py), without a server: `http_result` on the bytes a server could send."""

from __future__ import annotations

import orjson
import pytest
from sendutil import chat_answer, request

from jsonlbatch.exec.send.http_reply import http_result
from jsonlbatch.exec.send.retry import Verdict, is_context_length_error, parse_retry_after
from jsonlbatch.file_io.jsonl import BOM
from jsonlbatch.redact import register_secret


def line(result) -> dict:
    return orjson.loads(result.to_line())


def test_a_usable_answer_is_kept_as_the_servers_bytes() -> None:
    raw = b'{"id":"chatcmpl-9","choices":[{"message":{"content":"hi"}}],"n":123456789012345678901}'
    metrics: dict = {"attempts": 1}
    result, verdict = http_result(request(), 200, raw, None, metrics)
    assert verdict is Verdict.OK and result.ok and result.error is None
    assert result.request_id == "chatcmpl-9"  # no x-request-id header: the body's id
    assert b'"n":123456789012345678901' in result.to_line()  # not through a float
    assert result.metrics is metrics


def test_a_header_request_id_wins_and_usage_becomes_metrics() -> None:
    raw = orjson.dumps(chat_answer(prompt_tokens=11, completion_tokens=5))
    result, _ = http_result(request(), 201, raw, "from-header", {})
    assert result.request_id == "from-header" and result.status_code == 201
    assert result.metrics == {"prompt_tokens": 11, "completion_tokens": 5}


def test_a_bom_and_line_breaks_do_not_reach_the_line() -> None:
    pretty = orjson.dumps(chat_answer("a\\nb"), option=orjson.OPT_INDENT_2).replace(b"\n", b"\r\n")
    result, verdict = http_result(request(), 200, BOM + pretty, None, {})
    assert verdict is Verdict.OK
    written = result.to_line()
    assert written.count(b"\n") == 1 and written.endswith(b"\n") and b"\r" not in written
    assert BOM not in written
    assert line(result)["response"]["body"] == chat_answer("a\\nb")


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{}", "no choices"),
        (b'{"error": {"message": "upstream timed out"}}', "upstream timed out"),
        (b"[1, 2]", "not a JSON object"),
        (b"<html>proxy page</html>", "not a JSON object"),
    ],
)
def test_a_2xx_without_an_answer_is_retried_and_written_without_a_response(raw, reason) -> None:
    result, verdict = http_result(request(), 200, raw, "rid", {"attempts": 2})
    assert verdict is Verdict.RETRY and not result.ok
    out = line(result)
    assert out["response"] is None and out["error"]["code"] == "invalid_response"
    assert out["error"]["message"].startswith("HTTP 200 without a usable answer (")
    assert reason in out["error"]["message"]
    assert out["metrics"]["attempts"] == 2


def test_an_unusable_2xx_is_shown_bounded_and_masked() -> None:
    secret = "sk-test-" + "q" * 40
    register_secret(secret)
    raw = orjson.dumps({"error": {"message": f"key {secret} " + "x" * 20_000}})
    result, _ = http_result(request(), 200, raw, None, {})
    message = result.error["message"]
    assert secret not in message and len(message) <= 400


@pytest.mark.parametrize(
    ("status", "raw", "verdict", "message"),
    [
        (400, b'{"error": {"message": "bad temperature"}}', Verdict.FINAL, "bad temperature"),
        (404, b'{"detail": "no such route"}', Verdict.FINAL, "no such route"),
        (422, b'{"error": {"detail": "unprocessable"}}', Verdict.FINAL, "unprocessable"),
        (500, b"", Verdict.RETRY, "HTTP 500"),
        (502, b"Bad Gateway", Verdict.RETRY, "Bad Gateway"),
        (429, b'{"error": "slow down"}', Verdict.RETRY, "slow down"),
        (401, b'{"error": {"message": "bad key"}}', Verdict.ABORT, "bad key"),
        (500, b'{"error": {"message": "maximum context length is 10"}}', Verdict.FINAL, "max"),
    ],
)
def test_an_error_keeps_the_servers_body_and_its_message(status, raw, verdict, message) -> None:
    result, got = http_result(request(), status, raw, "rid", {})
    assert got is verdict and not result.ok
    assert result.status_code == status and result.request_id == "rid"
    assert result.error["code"] == f"http_{status}" and message in result.error["message"]
    out = line(result)
    assert out["response"]["status_code"] == status
    # a body that is not a JSON object is kept as OpenAI's error object (its text as sent)
    wrapped = {"message": raw.decode(), "type": "non_object_body" if raw else "empty_body",
               "param": None, "code": None}  # fmt: skip
    kept = orjson.loads(raw) if raw.startswith(b"{") else {"error": wrapped}
    assert out["response"]["body"] == kept


def test_an_error_message_is_masked_and_bounded() -> None:
    secret = "sk-test-" + "z" * 40
    register_secret(secret)
    raw = orjson.dumps({"error": {"message": f"bad key {secret} " + "y" * 5000}})
    result, _ = http_result(request(), 400, raw, None, {})
    assert secret not in result.error["message"] and len(result.error["message"]) <= 500
    assert secret not in result.to_line().decode()


def test_a_context_length_error_is_found_in_the_first_4kib_only() -> None:
    assert is_context_length_error(b'{"error": "Prompt is too long"}')
    assert is_context_length_error(b"x" * 4000 + b" context_length_exceeded")
    assert not is_context_length_error(b"x" * 4096 + b" context_length_exceeded")


def test_retry_after_is_never_negative_and_a_bad_date_is_ignored() -> None:
    assert parse_retry_after(" 3 ") == 3.0
    assert parse_retry_after("-5") == 0.0
    now = 1_700_000_000.0
    assert parse_retry_after("Tue, 14 Nov 2023 22:13:00 GMT", now=now) == 0.0  # in the past
    assert parse_retry_after("Tue, 99 Nov 2023 25:00:00 GMT", now=now) is None
    assert parse_retry_after("") is None

"""Answers that are not answers: a 2xx without a usable body is a failure that is retried and
re-sent; usage numbers that are not numbers stay out of the metrics; a usable body is written
byte for byte."""

from __future__ import annotations

import asyncio
import json
import time

import orjson
import pytest
from aiohttp import web
from batchutil import cli, exec_cli, odd_server, read_results

from jsonlbatch.batch_format.answers import kind_for, number, unusable_reason, usage_metrics
from jsonlbatch.batch_format.records import CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL, request_line

CHAT_OK = {"id": "c1", "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}]}


@pytest.mark.parametrize(
    ("url", "body", "usable"),
    [
        (CHAT_URL, CHAT_OK, True),
        (CHAT_URL, {}, False),
        (CHAT_URL, {"detail": "Not Found"}, False),
        (CHAT_URL, {"choices": []}, False),
        (CHAT_URL, {"choices": [{"index": 0}]}, False),
        (CHAT_URL, {"choices": [{"message": {"role": "assistant"}}]}, False),
        (CHAT_URL, {"choices": "no"}, False),
        (CHAT_URL, [CHAT_OK], False),
        (
            CHAT_URL,
            {"choices": [{"message": {"content": None, "tool_calls": [{"id": "t"}]}}]},
            True,
        ),
        (CHAT_URL, {"choices": [{"message": {"content": None}, "finish_reason": "length"}]}, True),
        (COMPLETIONS_URL, {"choices": [{"text": ""}]}, True),
        (COMPLETIONS_URL, {"choices": [{"index": 0}]}, False),
        (COMPLETIONS_URL, CHAT_OK, False),
        (EMBEDDINGS_URL, {"data": [{"embedding": [0.1]}]}, True),
        (EMBEDDINGS_URL, {"data": [{"embedding": "AAAA"}]}, True),
        (EMBEDDINGS_URL, {"data": []}, False),
        (EMBEDDINGS_URL, {"object": "list"}, False),
        ("/v1/rerank", {"results": [{"index": 0}]}, True),
        ("/v1/rerank", {"error": {"message": "x"}}, False),
        ("/v1/rerank", {}, False),
    ],
)
def test_usable_answers_by_endpoint_kind(url, body, usable):
    assert (unusable_reason(url, body) is None) is usable


def test_usage_metrics_take_only_numbers():
    body = {
        "usage": {
            "prompt_tokens": "12",
            "completion_tokens": 7,
            "completion_tokens_details": {"reasoning_tokens": None},
            "reasoning_tokens": 3,
        }
    }
    assert usage_metrics(CHAT_URL, body) == {"completion_tokens": 7, "reasoning_tokens": 3}
    for bad in (True, -1, float("nan"), float("inf"), 1 << 64, [1], {"n": 1}, None):
        assert number(bad) is None, bad
        assert usage_metrics(CHAT_URL, {"usage": {"prompt_tokens": bad}}) == {}
    assert usage_metrics(EMBEDDINGS_URL, {"usage": {"prompt_tokens": 4, "total_tokens": 4}}) == {
        "prompt_tokens": 4
    }
    assert usage_metrics(CHAT_URL, {"usage": "lots"}) == {}
    assert kind_for("/v1/unknown").name == "answer"


def _requests(path, kinds):
    lines = []
    for kind in kinds:
        if kind.startswith("embed"):
            lines.append(request_line(kind, {"model": "mock", "input": kind}, EMBEDDINGS_URL))
        elif kind.startswith("text"):
            lines.append(request_line(kind, {"model": "mock", "prompt": kind}, COMPLETIONS_URL))
        else:
            msgs = [{"role": "user", "content": kind}]
            lines.append(request_line(kind, {"model": "mock", "messages": msgs}))
    path.write_bytes(b"".join(lines))


def _asked(body: dict) -> str:
    if "messages" in body:
        return body["messages"][0]["content"]
    return body.get("prompt") or body["input"]


def test_a_200_without_an_answer_is_retried_and_resent_by_retry_failed(tmp_path):
    broken = {
        "empty": {},
        "detail": {"detail": "Not Found"},
        "nochoices": {"id": "x", "object": "chat.completion", "choices": []},
        "text-noprompt": {"choices": [{"index": 0, "finish_reason": "stop"}]},
        "embed-nodata": {"object": "list", "data": []},
    }
    fixed = {
        "text-noprompt": {"choices": [{"index": 0, "text": "fine"}]},
        "embed-nodata": {"data": [{"index": 0, "embedding": [0.5]}]},
    }
    state = {"broken": True}
    seen: dict[str, int] = {}

    async def handler(request):
        kind = _asked(await request.json())
        seen[kind] = seen.get(kind, 0) + 1
        if state["broken"]:
            return web.json_response(broken[kind])
        return web.json_response(fixed.get(kind, CHAT_OK))

    url, stop = odd_server(handler, CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL)
    req, out = tmp_path / "req.jsonl", tmp_path / "out.jsonl"
    _requests(req, broken)
    try:
        first = exec_cli(req, out, "--url", url, "--max-retries", "1", "--backoff", "0.01")
        assert first.returncode == 3, first.stderr
        for cid, line in read_results(out).items():
            assert line["response"] is None, cid
            assert line["error"]["code"] == "invalid_response", cid
            assert line["metrics"]["attempts"] == 2 and seen[cid] == 2, cid
        assert "invalid_response x5" in first.stderr
        assert cli("validate", str(out)).returncode == 0
        state["broken"] = False
        again = exec_cli(req, out, "--url", url, "--retry-failed")
        assert again.returncode == 0, again.stderr
    finally:
        stop()
    results = read_results(out)
    assert len(results) == 5 and all(line["error"] is None for line in results.values())
    assert results["embed-nodata"]["response"]["body"]["data"][0]["embedding"] == [0.5]


def test_a_stream_that_is_only_done_is_no_answer(tmp_path):
    async def handler(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    url, stop = odd_server(handler)
    req, out = tmp_path / "req.jsonl", tmp_path / "out.jsonl"
    _requests(req, ["only-done"])
    try:
        proc = exec_cli(req, out, "--url", url, "--stream", "--max-retries", "0")
    finally:
        stop()
    assert proc.returncode == 3, proc.stderr
    line = read_results(out)["only-done"]
    assert line["response"] is None and line["error"]["code"] == "invalid_response"


BIG = 123456789012345678901234567890


def test_usage_that_is_not_numbers_and_bodies_kept_byte_for_byte(tmp_path):
    """Strings, nulls, lists and 2**70 as token counts: the summary counts every line, the
    metrics hold no such value, report reads the file; a body with an integer beyond 64 bits or
    pretty-printed over lines is the server's bytes (less the line breaks)."""

    async def handler(request):
        kind = _asked(await request.json())
        usage = {
            "prompt_tokens": "12",
            "completion_tokens": None if kind.endswith("1") else [3],
            "total_tokens": 1 << 70,
            "completion_tokens_details": {"reasoning_tokens": {"n": 1}},
        }
        text = json.dumps(
            {**CHAT_OK, "seed": BIG, "usage": usage}, indent=2 if "7" in kind else None
        )
        return web.Response(body=text.encode(), content_type="application/json")

    url, stop = odd_server(handler)
    req, out = tmp_path / "req.jsonl", tmp_path / "out.jsonl"
    _requests(req, [f"q{i}" for i in range(50)])
    try:
        proc = exec_cli(req, out, "--url", url)
    finally:
        stop()
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "50 ok, 0 failed" in proc.stderr and "not sent" not in proc.stderr
    results = read_results(out)
    assert len(results) == 50
    for cid, line in results.items():
        assert not {"prompt_tokens", "completion_tokens", "reasoning_tokens"} & set(line["metrics"])
        assert line["response"]["body"]["usage"]["prompt_tokens"] == "12", cid
    for raw in out.read_bytes().splitlines():
        exact = json.loads(raw)  # the standard library keeps big integers exact
        assert exact["response"]["body"]["seed"] == BIG
        assert exact["response"]["body"]["usage"]["total_tokens"] == 1 << 70
    pretty = next(r for r in out.read_bytes().splitlines() if b'"custom_id":"q7"' in r)
    assert b'"seed": 123456789012345678901234567890' in pretty  # the server's spacing kept
    report = cli("report", str(out), "--format", "json")
    assert report.returncode == 0, report.stderr
    assert orjson.loads(report.stdout)


def _chunk(**choice) -> bytes:
    head = {"id": "s1", "object": "chat.completion.chunk", "created": 1, "model": "mock"}
    return b"data: " + orjson.dumps({**head, "choices": [{"index": 0, **choice}]}) + b"\n\n"


def test_done_ends_a_stream_and_the_content_decides_what_an_answer_is(tmp_path):
    """`[DONE]` on a connection the server keeps open ends the answer (not the timeout); a
    plain JSON answer labelled text/event-stream is read as JSON; SSE labelled JSON as SSE."""

    async def handler(request):
        kind = _asked(await request.json())
        if kind == "json-as-sse":
            return web.Response(body=orjson.dumps(CHAT_OK), content_type="text/event-stream")
        resp = web.StreamResponse(
            headers={
                "Content-Type": "application/json" if kind == "sse-as-json" else "text/event-stream"
            }
        )
        await resp.prepare(request)
        await resp.write(_chunk(delta={"role": "assistant", "content": "he"}))
        await resp.write(_chunk(delta={"content": "llo"}, finish_reason="stop"))
        await resp.write(b"data: [DONE]\n\n")
        for _ in range(300 if kind == "kept-open" else 0):  # open after [DONE], up to 30 s
            if request.transport is None or request.transport.is_closing():
                return resp  # the client has hung up
            await asyncio.sleep(0.1)
        await resp.write_eof()
        return resp

    url, stop = odd_server(handler)
    req, out = tmp_path / "req.jsonl", tmp_path / "out.jsonl"
    _requests(req, ["kept-open", "json-as-sse", "sse-as-json"])
    started = time.monotonic()
    try:
        proc = exec_cli(req, out, "--url", url, "--stream", "--timeout", "8", "--max-retries", "0")
    finally:
        stop()
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - started < 8
    results = read_results(out)
    for cid in ("kept-open", "sse-as-json"):
        assert results[cid]["response"]["body"]["choices"][0]["message"]["content"] == "hello"
        assert results[cid]["metrics"]["chunks"] == 2
    assert results["json-as-sse"]["response"]["body"] == CHAT_OK

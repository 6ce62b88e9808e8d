"""`jsonlbatch exec --stream` end to end, over real HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from batchutil import cli, read_results

import jsonlbatch
from jsonlbatch.batch_format.records import request_line

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def mixed_requests(path: Path) -> None:
    """Chat with n=1 and n=3, forced tool calls, completions with n=2, and embeddings."""
    lines = []
    for i in range(12):
        messages = [{"role": "user", "content": f"question {i}"}]
        body: dict[str, Any] = {"model": "mock", "messages": messages, "max_tokens": 6 + i}
        if i % 3 == 1:
            body["n"] = 3
        if i % 4 == 3:
            body.update(tools=TOOLS, tool_choice="required")
        lines.append(request_line(f"chat-{i}", body))
    for i in range(3):
        body = {"model": "mock", "prompt": f"once {i}", "max_tokens": 5, "n": 2}
        lines.append(request_line(f"text-{i}", body, "/v1/completions"))
    lines.append(request_line("embed", {"model": "mock", "input": "x"}, "/v1/embeddings"))
    path.write_bytes(b"".join(lines))


def test_streamed_bodies_equal_unstreamed_ones(tmp_path, mock_server):
    url = mock_server(reasoning=True)
    mixed_requests(tmp_path / "req.jsonl")
    outs = {}
    for mode in ("plain", "stream"):
        out = tmp_path / f"{mode}.jsonl"
        flags = ["--stream"] if mode == "stream" else []
        proc = cli("exec", str(tmp_path / "req.jsonl"), "-o", str(out), "--url", url, *flags)
        assert proc.returncode == 0, proc.stderr
        outs[mode] = read_results(out)
        if mode == "stream":
            assert "ttft_p50=" in proc.stderr  # the progress bar's running TTFT median
    plain, stream = outs["plain"], outs["stream"]
    assert set(plain) == set(stream) and len(stream) == 16
    for cid, line in stream.items():
        body, whole = line["response"]["body"], plain[cid]["response"]["body"]
        assert body["object"] == whole["object"], cid
        assert body["usage"] == whole["usage"], cid
        if cid == "embed":
            assert body["data"] == whole["data"]
            continue
        assert len(body["choices"]) == len(whole["choices"]), cid
        for got, want in zip(body["choices"], whole["choices"], strict=True):
            assert got["index"] == want["index"] and got["finish_reason"] == want["finish_reason"]
            if "text" in want:
                assert got["text"] == want["text"], cid
                continue
            message, expected = got["message"], want["message"]
            assert message["content"] == expected["content"], cid
            # the mock streams reasoning as `reasoning_content` only, and says it under both
            # names unstreamed
            assert message["reasoning_content"] == expected["reasoning_content"], cid
            assert message.get("tool_calls") == expected.get("tool_calls"), cid
    assert any(
        c["message"].get("tool_calls") for c in stream["chat-3"]["response"]["body"]["choices"]
    )
    assert len(stream["chat-1"]["response"]["body"]["choices"]) == 3


def test_stream_metrics_follow_the_contract(tmp_path, mock_server):
    url = mock_server(reasoning=True)
    mixed_requests(tmp_path / "req.jsonl")
    out = tmp_path / "out.jsonl"
    proc = cli("exec", str(tmp_path / "req.jsonl"), "-o", str(out), "--url", url, "--stream", "-q")
    assert proc.returncode == 0, proc.stderr
    results = read_results(out)
    for cid, line in results.items():
        m = line["metrics"]
        assert {"attempts", "endpoint", "start_time", "latency_s"} <= set(m), cid
        usage = line["response"]["body"]["usage"]
        # only what `usage` reports: an embedding has no completion tokens
        assert (m["prompt_tokens"], m.get("completion_tokens")) == (
            usage["prompt_tokens"],
            usage.get("completion_tokens"),
        )
        if cid == "embed":  # not streamable: sent and written as without --stream
            assert "ttft_s" not in m and "chunks" not in m
            continue
        assert 0 <= m["ttft_s"] <= m["latency_s"], cid
        assert m["chunks"] >= 2, cid
        tpot = (m["latency_s"] - m["ttft_s"]) / (m["completion_tokens"] - 1)
        assert m["tpot_s"] == pytest.approx(tpot, abs=1e-5), cid
        assert 0 <= m["itl_p50_s"] <= m["itl_p90_s"] <= m["itl_p99_s"] <= m["itl_max_s"], cid
        assert m["itl_mean_s"] <= m["itl_max_s"], cid


def test_paced_stream_times_what_the_server_did(tmp_path, mock_server):
    """The mock waits 0.3 s before the first chunk, then 25 ms per token: the measured TTFT and
    gaps cannot be shorter than that (lower bounds only: a slow machine only adds time)."""
    url = mock_server(latency=0.3, tokens_per_second=40)
    messages = [{"role": "user", "content": "paced"}]
    lines = [
        request_line(f"r{i}", {"model": "mock", "messages": messages, "max_tokens": 6})
        for i in range(4)
    ]
    (tmp_path / "req.jsonl").write_bytes(b"".join(lines))
    out = tmp_path / "out.jsonl"
    proc = cli("exec", str(tmp_path / "req.jsonl"), "-o", str(out), "--url", url, "--stream")
    assert proc.returncode == 0, proc.stderr
    for line in read_results(out).values():
        m = line["metrics"]
        assert m["ttft_s"] >= 0.28
        assert m["itl_p50_s"] >= 0.02 and m["tpot_s"] >= 0.02
        assert m["latency_s"] >= m["ttft_s"] + 4 * 0.02
        assert m["chunks"] == 6 and m["completion_tokens"] == 6


def test_error_events_mid_stream_are_retried(tmp_path, mock_server):
    url = mock_server(stream_error_rate=0.5, seed=3)
    lines = [
        request_line(f"r{i}", {"model": "mock", "messages": [{"role": "user", "content": str(i)}]})
        for i in range(40)
    ]
    (tmp_path / "req.jsonl").write_bytes(b"".join(lines))
    out = tmp_path / "out.jsonl"
    args = ["--url", url, "--stream", "--backoff", "0.01", "--max-retries", "20"]
    proc = cli("exec", str(tmp_path / "req.jsonl"), "-o", str(out), *args)
    assert proc.returncode == 0, proc.stderr
    results = read_results(out)
    assert all(line["error"] is None for line in results.values())
    attempts = Counter(line["metrics"]["attempts"] for line in results.values())
    with urllib.request.urlopen(url.removesuffix("/v1") + "/mock/stats") as resp:
        stats = json.load(resp)
    assert stats["stream_errors"] == sum((k - 1) * v for k, v in attempts.items()) > 0


def test_error_events_that_never_stop_become_failed_lines(tmp_path, mock_server):
    url = mock_server(stream_error_rate=1.0)
    body = {"model": "mock", "messages": [{"role": "user", "content": "x"}]}
    (tmp_path / "req.jsonl").write_bytes(request_line("only", body))
    out = tmp_path / "out.jsonl"
    args = ["--url", url, "--stream", "--backoff", "0.01", "--max-retries", "1"]
    proc = cli("exec", str(tmp_path / "req.jsonl"), "-o", str(out), *args)
    assert proc.returncode == 3, proc.stderr
    line = read_results(out)["only"]
    assert line["response"] is None
    assert line["error"]["code"] == "stream_error"
    assert "Stream interrupted" in line["error"]["message"]
    assert line["metrics"]["attempts"] == 2 and line["metrics"]["latency_s"] >= 0
    assert "stream_error x1" in proc.stderr


# -- a hand-made server: cut streams, huge lines, a server that ignores `stream` -------------------

BIG = "y" * (1 << 20)  # one SSE line over 1 MiB: aiohttp's readline would raise LineTooLong


async def raw_server() -> tuple[web.AppRunner, str, Counter[str]]:
    seen: Counter[str] = Counter()

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        kind = body["messages"][0]["content"]
        seen[kind] += 1
        head = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "m"}
        if kind == "plain":  # answers JSON whatever the request asked
            message = {"role": "assistant", "content": "whole"}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return web.json_response({**head, "object": "chat.completion", "choices": [choice]})
        text = BIG if kind == "big" else "fine"
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
        await resp.write(b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n")
        if kind == "cut" and seen[kind] == 1:
            await resp.write_eof()  # a clean end, but no finish and no [DONE]
            return resp
        if kind == "crash" and seen[kind] == 1:
            assert request.transport is not None
            request.transport.abort()  # the server dies mid-stream: a torn chunked body
            return resp
        done = {"index": 0, "delta": {}, "finish_reason": "stop"}
        usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
        await resp.write(b"data: " + orjson.dumps({**head, "choices": [done]}) + b"\n\n")
        await resp.write(
            b"data: " + orjson.dumps({**head, "choices": [], "usage": usage}) + b"\n\n"
        )
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/v1", seen


async def test_cut_streams_are_retried_long_lines_and_json_answers_are_read(tmp_path):
    runner, url, seen = await raw_server()
    try:
        lines = [
            request_line(kind, {"model": "m", "messages": [{"role": "user", "content": kind}]})
            for kind in ("cut", "crash", "big", "plain")
        ]
        (tmp_path / "req.jsonl").write_bytes(b"".join(lines))
        summary = await jsonlbatch.aexecute(
            tmp_path / "req.jsonl",
            tmp_path / "out.jsonl",
            urls=[url],
            stream=True,
            quiet=True,
            backoff_base=0.01,
        )
    finally:
        await runner.cleanup()
    assert (summary.succeeded, summary.failed, summary.retries) == (4, 0, 2)
    results = read_results(tmp_path / "out.jsonl")
    for kind in ("cut", "crash"):
        assert seen[kind] == 2 and results[kind]["metrics"]["attempts"] == 2
        body = results[kind]["response"]["body"]
        assert body["choices"][0]["message"]["content"] == "fine"
    big = results["big"]["response"]["body"]
    assert big["object"] == "chat.completion"
    assert big["choices"][0]["message"]["content"] == BIG
    assert big["usage"]["completion_tokens"] == results["big"]["metrics"]["completion_tokens"] == 2
    plain = results["plain"]
    assert plain["response"]["body"]["choices"][0]["message"]["content"] == "whole"
    assert "ttft_s" not in plain["metrics"]

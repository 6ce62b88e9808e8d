"""The mock server over real HTTP: shapes, determinism, errors, faults."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import struct
from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson
import pytest

from jsonlbatch.errors import UsageError
from jsonlbatch.mock import MockConfig, prompt_tokens, reasoning_text, reply_text
from jsonlbatch.mock.content import compose

CHAT = "/chat/completions"
HELLO = {"model": "mock", "messages": [{"role": "user", "content": "Say hello to the tests"}]}
WEATHER_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "required": ["city"],
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                       "unit": {"enum": ["celsius", "fahrenheit"]}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}}}},
]  # fmt: skip


async def call(
    url: str, body: Any = None, *, path: str = CHAT, headers: dict[str, str] | None = None
) -> tuple[int, Mapping[str, str], bytes]:
    """POST `body` (or GET when None) and return status, headers and raw body."""
    async with aiohttp.ClientSession() as session:
        if body is None:
            request = session.get(url + path, headers=headers)
        else:
            data = body if isinstance(body, bytes) else orjson.dumps(body)
            request = session.post(url + path, data=data, headers=headers)
        async with request as resp:
            return resp.status, resp.headers.copy(), await resp.read()


async def post_json(url: str, body: Any, path: str = CHAT, **kw: Any) -> tuple[int, Any]:
    status, _, raw = await call(url, body, path=path, **kw)
    return status, orjson.loads(raw)


def events(raw: bytes) -> tuple[list[str], list[Any]]:
    """Split an SSE body into its comment lines and its decoded data events."""
    comments, data = [], []
    for block in raw.decode().split("\n\n"):
        for line in block.splitlines():
            if line.startswith(":"):
                comments.append(line)
            elif line.startswith("data: "):
                payload = line[len("data: ") :]
                data.append(payload if payload == "[DONE]" else json.loads(payload))
    return comments, data


def gather_stream(chunks: list[Any]) -> dict[int, dict[str, Any]]:
    """Rebuild each choice of a chat stream from its deltas."""
    out: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk.get("choices", []):
            got = out.setdefault(
                choice["index"],
                {"content": "", "reasoning": "", "roles": 0, "finish": [], "args": "", "calls": []},
            )
            delta = choice["delta"]
            got["roles"] += "role" in delta
            got["content"] += delta.get("content") or ""
            got["reasoning"] += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls", []):
                if "id" in call:
                    got["calls"].append((call["id"], call["function"]["name"]))
                got["args"] += call["function"].get("arguments", "")
            if choice["finish_reason"]:
                got["finish"].append(choice["finish_reason"])
    return out


# -- chat completions ---------------------------------------------------------------------------


async def test_chat_completion_shape_and_content(mock_server):
    url = mock_server()
    status, headers, raw = await call(url, HELLO)
    body = orjson.loads(raw)
    assert status == 200
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-") and int(body["id"][len("chatcmpl-") :], 16) >= 0
    assert body["model"] == "mock" and isinstance(body["created"], int)
    assert headers["x-request-id"] and headers["Content-Type"].startswith("application/json")
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["logprobs"] is None
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["role"] == "assistant"
    text = choice["message"]["content"]
    assert text == reply_text(HELLO)
    assert text.startswith("mock-") and len(text.split()) == 16
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 16, "total_tokens": 21}


async def test_client_request_id_is_echoed(mock_server):
    url = mock_server()
    _, headers, _ = await call(url, HELLO, headers={"X-Request-Id": "trace-42"})
    assert headers["x-request-id"] == "trace-42"


async def test_n_choices_each_deterministic_and_counted(mock_server):
    url = mock_server()
    body = {**HELLO, "n": 3, "max_tokens": 4}
    status, out = await post_json(url, body)
    assert status == 200
    texts = [c["message"]["content"] for c in out["choices"]]
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    assert texts == [reply_text(body, i) for i in range(3)]
    assert len(set(texts)) == 3
    assert all(c["finish_reason"] == "length" for c in out["choices"])
    assert out["usage"]["completion_tokens"] == sum(len(t.split()) for t in texts) == 12


@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens"])
async def test_token_budget_cuts_with_length(mock_server, key):
    url = mock_server(default_max_tokens=8)
    _, short = await post_json(url, {**HELLO, key: 3})
    _, roomy = await post_json(url, {**HELLO, key: 100})
    assert short["choices"][0]["finish_reason"] == "length"
    assert len(short["choices"][0]["message"]["content"].split()) == 3
    assert roomy["choices"][0]["finish_reason"] == "stop"
    assert len(roomy["choices"][0]["message"]["content"].split()) == 8
    # the cut reply is a prefix of the full one: the same request, a smaller budget
    assert roomy["choices"][0]["message"]["content"].startswith(
        short["choices"][0]["message"]["content"]
    )


def test_reply_depends_on_meaning_only():
    reordered = {
        "messages": [{"content": "Say hello to the tests", "role": "user"}],
        "model": "mock",
    }
    assert reply_text(reordered) == reply_text(HELLO)
    transport = {**HELLO, "stream": True, "stream_options": {"include_usage": True}, "n": 5}
    assert reply_text(transport) == reply_text(HELLO)
    assert reply_text({**HELLO, "model": "other"}) != reply_text(HELLO)
    other_message = {**HELLO, "messages": [{"role": "user", "content": "Say bye"}]}
    assert reply_text(other_message) != reply_text(HELLO)
    assert reply_text(HELLO, 1) != reply_text(HELLO, 0)
    parts = [{"role": "user", "content": [{"type": "text", "text": "two words"}]}]
    assert prompt_tokens({"messages": parts}) == 2


async def test_stream_matches_whole_answer(mock_server):
    url = mock_server()
    body = {**HELLO, "n": 2, "max_tokens": 5}
    _, whole = await post_json(url, body)
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    status, headers, raw = await call(url, stream)
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    comments, data = events(raw)
    assert comments == [": ping"] and raw.startswith(b": ping\n\n")
    assert data[-1] == "[DONE]"
    chunks, usage_chunk = data[:-2], data[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"] == whole["usage"]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in data[:-1]}) == 1
    # role first for every choice, then one word per chunk, choices interleaved
    assert [c["choices"][0]["delta"].get("role") for c in chunks[:2]] == ["assistant"] * 2
    assert [c["choices"][0]["index"] for c in chunks[2:6]] == [0, 1, 0, 1]
    assert all(len(c["choices"]) == 1 for c in chunks)
    rebuilt = gather_stream(chunks)
    for i, choice in enumerate(whole["choices"]):
        assert rebuilt[i]["content"] == choice["message"]["content"] == reply_text(body, i)
        assert rebuilt[i]["roles"] == 1 and rebuilt[i]["finish"] == ["length"]
    words = [c for c in chunks if c["choices"][0]["delta"].get("content")]
    assert len(words) == whole["usage"]["completion_tokens"]


async def test_stream_without_usage_and_stream_options_need_stream(mock_server):
    url = mock_server()
    _, _, raw = await call(url, {**HELLO, "stream": True})
    _, data = events(raw)
    assert data[-1] == "[DONE]" and all("usage" not in c for c in data[:-1])
    status, err = await post_json(url, {**HELLO, "stream_options": {"include_usage": True}})
    assert status == 400 and err["error"]["code"] == 400 and "stream" in err["error"]["message"]


async def test_paced_stream_and_latency_keep_content(mock_server):
    url = mock_server(latency=0.02, latency_jitter=0.01, tokens_per_second=2000)
    body = {**HELLO, "max_tokens": 6}
    _, whole = await post_json(url, body)
    _, _, raw = await call(url, {**body, "stream": True})
    _, data = events(raw)
    assert gather_stream(data[:-1])[0]["content"] == whole["choices"][0]["message"]["content"]


async def test_reasoning_in_message_and_stream(mock_server):
    url = mock_server(reasoning=True)
    _, out = await post_json(url, HELLO)
    message = out["choices"][0]["message"]
    assert message["reasoning_content"] == message["reasoning"] == reasoning_text(HELLO)
    assert message["reasoning"].startswith("reason-")
    assert message["content"] == reply_text(HELLO, reasoning=True)
    assert out["usage"]["completion_tokens"] == 16  # reasoning shares the budget
    _, _, raw = await call(url, {**HELLO, "stream": True})
    rebuilt = gather_stream(events(raw)[1][:-1])[0]
    assert rebuilt["reasoning"] == message["reasoning"]
    assert rebuilt["content"] == message["content"]
    # a budget smaller than the thinking: reasoning cut, no content, "length"
    _, cut = await post_json(url, {**HELLO, "max_tokens": 3})
    choice = cut["choices"][0]
    assert choice["message"]["content"] is None and choice["finish_reason"] == "length"
    assert len(choice["message"]["reasoning"].split()) == 3


async def test_forced_tool_call(mock_server):
    url = mock_server()
    body = {**HELLO, "tools": WEATHER_TOOLS, "tool_choice": "required"}
    _, out = await post_json(url, body)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call_,) = choice["message"]["tool_calls"]
    assert call_["type"] == "function" and call_["function"]["name"] == "get_weather"
    args = json.loads(call_["function"]["arguments"])
    assert set(args) == {"city", "days", "unit"}
    assert isinstance(args["city"], str) and isinstance(args["days"], int)
    assert args["unit"] in ("celsius", "fahrenheit")
    assert out["usage"]["completion_tokens"] == len(call_["function"]["arguments"].split())
    _, again = await post_json(url, body)
    assert again["choices"][0]["message"]["tool_calls"] == [call_]
    _, _, raw = await call(url, {**body, "stream": True})
    rebuilt = gather_stream(events(raw)[1][:-1])[0]
    assert rebuilt["calls"] == [(call_["id"], "get_weather")]
    assert rebuilt["args"] == call_["function"]["arguments"]
    assert rebuilt["finish"] == ["tool_calls"]


async def test_named_and_auto_tool_choice(mock_server):
    url = mock_server()
    named = {"type": "function", "function": {"name": "get_time"}}
    _, out = await post_json(url, {**HELLO, "tools": WEATHER_TOOLS, "tool_choice": named})
    assert out["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_time"
    _, auto = await post_json(url, {**HELLO, "tools": WEATHER_TOOLS, "tool_choice": "auto"})
    assert auto["choices"][0]["message"]["content"] == reply_text(HELLO)
    missing = {"type": "function", "function": {"name": "nope"}}
    status, err = await post_json(url, {**HELLO, "tools": WEATHER_TOOLS, "tool_choice": missing})
    assert status == 400 and err["error"]["param"] == "tool_choice"


# -- completions, embeddings, models, health ----------------------------------------------------


async def test_text_completions(mock_server):
    url = mock_server()
    body = {"model": "mock", "prompt": "Once upon a time", "max_tokens": 4}
    status, out = await post_json(url, body, "/completions")
    assert status == 200 and out["object"] == "text_completion" and out["id"].startswith("cmpl-")
    (choice,) = out["choices"]
    assert choice["text"] == reply_text(body) and choice["finish_reason"] == "length"
    assert out["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}
    _, _, raw = await call(url, {**body, "stream": True}, path="/completions")
    _, data = events(raw)
    assert "".join(c["choices"][0]["text"] for c in data[:-1]) == choice["text"]
    assert data[-2]["choices"][0]["finish_reason"] == "length"
    _, many = await post_json(url, {**body, "prompt": ["a b", "c"], "n": 2}, "/completions")
    assert [c["index"] for c in many["choices"]] == [0, 1, 2, 3]
    assert many["usage"]["prompt_tokens"] == 3


async def test_embeddings(mock_server):
    url = mock_server()
    body = {"model": "mock", "input": ["first text", "second", "first text"]}
    status, out = await post_json(url, body, "/embeddings")
    assert status == 200 and out["object"] == "list" and out["usage"]["prompt_tokens"] == 5
    vectors = [d["embedding"] for d in out["data"]]
    assert [d["index"] for d in out["data"]] == [0, 1, 2]
    assert all(math.isclose(sum(v * v for v in vec), 1.0) for vec in vectors)
    assert vectors[0] == vectors[2] != vectors[1]
    _, wide = await post_json(url, {**body, "dimensions": 16}, "/embeddings")
    assert len(wide["data"][0]["embedding"]) == 16
    _, packed = await post_json(url, {**body, "encoding_format": "base64"}, "/embeddings")
    raw = base64.b64decode(packed["data"][0]["embedding"])
    floats = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert len(floats) == len(vectors[0])
    assert all(math.isclose(a, b, abs_tol=1e-7) for a, b in zip(floats, vectors[0], strict=True))


async def test_models_health_version(mock_server):
    url = mock_server(served_models=("org/A", "B"), max_model_len=4096)
    status, models = await post_json(url, None, "/models")
    assert status == 200 and models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["org/A", "B"]
    card = models["data"][0]
    assert card["object"] == "model" and card["owned_by"] == "jsonlbatch-mock"
    assert card["root"] == "org/A" and card["max_model_len"] == 4096
    root = url.removesuffix("/v1")
    status, _, raw = await call(root, None, path="/health")
    assert status == 200 and raw == b""
    status, version = await post_json(root, None, "/version")
    assert status == 200 and isinstance(version["version"], str)
    # no model: the first served one answers
    _, out = await post_json(url, {"messages": HELLO["messages"]})
    assert out["model"] == "org/A"


# -- errors ------------------------------------------------------------------------------------


async def test_unknown_model_is_404_like_vllm(mock_server):
    url = mock_server()
    status, err = await post_json(url, {**HELLO, "model": "gpt-3.5-turbo"})
    assert status == 404
    assert err == {"error": {"message": "The model `gpt-3.5-turbo` does not exist.",
                             "type": "NotFoundError", "param": "model", "code": 404}}  # fmt: skip


async def test_accept_any_model_echoes_it(mock_server):
    url = mock_server(accept_any_model=True)
    status, out = await post_json(url, {**HELLO, "model": "whatever/7b"})
    assert status == 200 and out["model"] == "whatever/7b"
    _, models = await post_json(url, None, "/models")
    assert [m["id"] for m in models["data"]] == ["mock"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "mock", "messages": [', None),
        (b"[1, 2]", None),
        ({"model": "mock"}, "messages"),
        ({"model": "mock", "messages": []}, "messages"),
        ({"model": "mock", "messages": [{"role": "wizard", "content": "x"}]}, "messages"),
        ({**HELLO, "max_tokens": 0}, "max_tokens"),
        ({**HELLO, "n": "2"}, "n"),
        ({"model": "mock"}, "prompt"),
    ],
)
async def test_bad_requests_are_400_with_nested_error(mock_server, body, param):
    url = mock_server()
    path = "/completions" if param == "prompt" else CHAT
    status, err = await post_json(url, body, path)
    assert status == 400
    assert err["error"]["code"] == 400 and err["error"]["type"] == "BadRequestError"
    assert err["error"]["param"] == param and err["error"]["message"]


async def test_context_length(mock_server):
    url = mock_server(max_model_len=10)
    status, err = await post_json(url, {**HELLO, "max_tokens": 6})  # 5 + 6 > 10
    assert status == 400 and "maximum context length" in err["error"]["message"]
    status, _ = await post_json(url, {**HELLO, "max_tokens": 5})
    assert status == 200
    long_prompt = {**HELLO, "messages": [{"role": "user", "content": "w " * 10}]}
    status, err = await post_json(url, long_prompt)
    assert status == 400 and "maximum context length" in err["error"]["message"]


async def test_api_key(mock_server):
    url = mock_server(api_key="sk-test-secret")
    for headers in (None, {"Authorization": "Bearer wrong"}, {"api-key": "nope"}):
        status, err = await post_json(url, HELLO, headers=headers)
        assert status == 401 and err == {"error": "Unauthorized"}
    status, _ = await post_json(url, None, "/models")
    assert status == 401
    status, _ = await post_json(url, HELLO, headers={"Authorization": "Bearer sk-test-secret"})
    assert status == 200
    status, _ = await post_json(url, HELLO, headers={"api-key": "sk-test-secret"})
    assert status == 200
    status, _, _ = await call(url.removesuffix("/v1"), None, path="/health")
    assert status == 200


async def test_warmup_answers_503(mock_server):
    url = mock_server(warmup=600)
    root = url.removesuffix("/v1")
    assert (await call(root, None, path="/health"))[0] == 503
    status, err = await post_json(url, HELLO)
    assert status == 503 and err["error"]["code"] == 503
    assert (await call(url, None, path="/models"))[0] == 200  # like SGLang: listed before ready


async def test_warmup_then_ready(mock_server):
    root = mock_server(warmup=1.0).removesuffix("/v1")
    seen = []
    for _ in range(200):  # bounded: 200 x 50 ms
        seen.append((await call(root, None, path="/health"))[0])
        if seen[-1] == 200:
            break
        await asyncio.sleep(0.05)
    assert seen[0] == 503 and seen[-1] == 200 and set(seen) == {503, 200}


# -- fault injection ---------------------------------------------------------------------------


async def statuses(url: str, count: int) -> list[int]:
    """Statuses of `count` sequential requests (one connection: a stable arrival order)."""
    out = []
    async with aiohttp.ClientSession() as session:
        for i in range(count):
            body = {**HELLO, "messages": [{"role": "user", "content": f"q{i}"}]}
            async with session.post(url + CHAT, json=body) as resp:
                await resp.read()
                if resp.status == 429:
                    assert resp.headers["Retry-After"] == "2.5"
                out.append(resp.status)
    return out


async def test_fault_rates_replay_under_a_seed(mock_server):
    config = {"fail_rate": 0.2, "rate_limit_rate": 0.1, "retry_after": 2.5}
    first = await statuses(mock_server(seed=7, **config), 400)
    again = await statuses(mock_server(seed=7, **config), 400)
    other = await statuses(mock_server(seed=8, **config), 400)
    assert first == again and first != other
    assert set(first) == {200, 429, 500}
    assert 0.14 <= first.count(500) / 400 <= 0.26
    assert 0.05 <= first.count(429) / 400 <= 0.15
    _, err = await post_json(mock_server(fail_rate=1.0), HELLO)
    assert err["error"]["type"] == "InternalServerError" and "injected" in err["error"]["message"]


async def test_drop_closes_the_connection(mock_server):
    url = mock_server(drop_rate=1.0)
    with pytest.raises(aiohttp.ClientConnectionError):
        await call(url, HELLO)
    _, stats = await post_json(url.removesuffix("/v1"), None, "/mock/stats")
    assert stats["dropped"] == 1 and stats["requests"] == {"/v1/chat/completions": 1}


async def test_hang_answers_nothing_and_429_without_retry_after(mock_server):
    url = mock_server(hang_rate=1.0)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.3)) as session:
        with pytest.raises(asyncio.TimeoutError):
            await session.post(url + CHAT, json=HELLO)
    _, stats = await post_json(url.removesuffix("/v1"), None, "/mock/stats")
    assert stats["hung"] == 1 and stats["responses"] == {}
    status, headers, _ = await call(mock_server(rate_limit_rate=1.0, retry_after=None), HELLO)
    assert status == 429 and "Retry-After" not in headers


async def test_record_bodies_keeps_the_last_ones(mock_server):
    url = mock_server(record_bodies=2)
    for i in range(3):
        await post_json(url, {**HELLO, "priority": i})
    _, bodies = await post_json(url.removesuffix("/v1"), None, "/mock/bodies")
    assert [b["priority"] for b in bodies] == [1, 2]


async def test_stream_error_midway(mock_server):
    url = mock_server(stream_error_rate=1.0)
    body = {**HELLO, "stream": True, "stream_options": {"include_usage": True}}
    status, _, raw = await call(url, body)
    assert status == 200
    _, data = events(raw)
    assert data[-1] == "[DONE]"
    error = data[-2]["error"]
    assert error["code"] == 500 and "injected" in error["message"]
    content = gather_stream(data[:-2])[0]["content"]
    assert content and reply_text(HELLO).startswith(content) and content != reply_text(HELLO)
    assert not any("usage" in c for c in data[:-2])
    # non-streamed requests are not affected
    assert (await post_json(url, HELLO))[0] == 200


def test_config_is_checked():
    for bad in ({"fail_rate": 1.5}, {"latency": -1}, {"fail_rate": 0.6, "drop_rate": 0.6},
                {"served_models": ()}, {"default_max_tokens": 0}, {"tokens_per_second": 0}):  # fmt: skip
        with pytest.raises(UsageError):
            MockConfig(**bad)


def test_compose_counts_tokens_consistently():
    reply = compose({**HELLO, "max_tokens": 10}, 0, default_max_tokens=12, reasoning=True)
    assert len(reply.reasoning) == 6 and len(reply.content) == 4
    assert reply.completion_tokens == 10 and reply.finish_reason == "length"

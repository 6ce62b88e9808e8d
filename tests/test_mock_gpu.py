"""The mock's optional GPU model: prefix cache in KV blocks, prefill cost, continuous batching,
and vLLM-named `/metrics`."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson
import pytest

from jsonlbatch.errors import UsageError
from jsonlbatch.exec.route.server_metrics import counters, parse_prometheus
from jsonlbatch.mock.__main__ import build_parser, config_from_args
from jsonlbatch.mock.gpu import GpuModel, prompt_words

FAST = GpuModel(prefill_tokens_per_s=1e6, decode_step_s=0.001)


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


async def chat(session: aiohttp.ClientSession, url: str, text: str, **extra) -> dict:
    body = {"messages": [{"role": "user", "content": text}], **extra}
    async with session.post(url + "/chat/completions", data=orjson.dumps(body)) as resp:
        assert resp.status == 200
        if extra.get("stream"):
            await resp.read()
            return {}
        return await resp.json()


async def metrics(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url.removesuffix("/v1") + "/metrics") as resp:
        assert resp.status == 200
        return parse_prometheus(await resp.text())


async def test_a_repeated_prompt_hits_the_cache_in_whole_blocks(mock_server):
    url = mock_server(gpu=FAST)
    async with aiohttp.ClientSession() as s:
        await chat(s, url, words("a", 100))  # 6 full blocks of 16, plus 4 tokens
        await chat(s, url, words("a", 100), stream=True)  # streamed answers count the same
        await chat(s, url, words("a", 50) + " " + words("b", 50))  # 3 blocks shared
        m = await metrics(s, url)
    assert m["vllm:prefix_cache_queries_total"] == 300
    assert m["vllm:prefix_cache_hits_total"] == 96 + 48
    assert m["vllm:prompt_tokens_total"] == 300
    assert m["vllm:request_success_total"] == 3
    assert m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
    got = counters(m)
    assert got is not None and got.kind == "vllm" and got.requests == 3


async def test_the_cache_is_lru_in_blocks(mock_server):
    url = mock_server(gpu=GpuModel(cache_blocks=10, prefill_tokens_per_s=1e6, decode_step_s=1e-3))
    async with aiohttp.ClientSession() as s:
        await chat(s, url, words("a", 97))  # 6 blocks
        await chat(s, url, words("b", 97))  # 6 more: 2 of a's evicted, its first ones
        await chat(s, url, words("a", 97))  # a's first block is gone: nothing usable
        m = await metrics(s, url)
    assert m["vllm:prefix_cache_hits_total"] == 0


async def test_uncached_prompts_pay_for_prefill(mock_server):
    url = mock_server(gpu=GpuModel(prefill_tokens_per_s=4000, decode_step_s=0.001))
    async with aiohttp.ClientSession() as s:
        started = time.monotonic()
        await chat(s, url, words("a", 1200), max_tokens=2)
        assert time.monotonic() - started >= 0.3  # 1,200 tokens at 4,000/s
        await chat(s, url, words("a", 1200), max_tokens=2)
        m = await metrics(s, url)
    assert m["vllm:prefix_cache_hits_total"] == 1184


async def test_at_most_max_batch_requests_run_and_the_rest_wait(mock_server):
    url = mock_server(gpu=GpuModel(max_batch=1, decode_step_s=0.02), default_max_tokens=10)
    async with aiohttp.ClientSession() as s:
        tasks = [asyncio.ensure_future(chat(s, url, words(t, 40))) for t in "abc"]
        seen = set()
        for _ in range(40):  # bounded: about 0.6 s of work
            m = await metrics(s, url)
            seen.add((m["vllm:num_requests_running"], m["vllm:num_requests_waiting"]))
            if all(t.done() for t in tasks):
                break
            await asyncio.sleep(0.01)
        await asyncio.gather(*tasks)
        m = await metrics(s, url)
    assert (1, 2) in seen and all(running <= 1 for running, _ in seen)
    assert m["vllm:generation_tokens_total"] == 30


async def test_the_default_mock_has_no_metrics(mock_server):
    url = mock_server()
    async with aiohttp.ClientSession() as s, s.get(url.removesuffix("/v1") + "/metrics") as r:
        assert r.status == 404


def test_prompt_words_of_each_request_shape():
    parts = {"role": "user", "content": [{"type": "text", "text": "c d"}, {"type": "image_url"}]}
    assert prompt_words({"messages": [{"role": "system", "content": "a b"}, parts]}) == list("abcd")
    assert prompt_words({"prompt": [1, 2, 3]}) == [1, 2, 3]
    assert prompt_words({"prompt": ["a b", "c"]}) == ["a", "b", "c"]
    assert prompt_words({"input": "x y"}) == ["x", "y"]


def test_command_line_flags():
    parse = build_parser().parse_args
    assert config_from_args(parse([])).gpu is None
    gpu = config_from_args(parse(["--gpu-model", "--gpu-max-batch", "8"])).gpu
    assert gpu == GpuModel(max_batch=8)
    with pytest.raises(UsageError):
        config_from_args(parse(["--gpu-model", "--gpu-time-scale", "0"]))

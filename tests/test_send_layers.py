"""The send path's three layers alone (exec/send/sender.py, exec/send/transport.py), and issue 39's rule: a
`Retry-After` delays its own request; only evidence of a run-wide limit holds every request.

In-process: the transport over real HTTP to the mock on 127.0.0.1, `assess` on values, and the
retry policy and endpoint layers of a real `Sender` over a real pool, once with a scripted
transport (to play refused and closed connections exactly) and once over real HTTP.
"""

from __future__ import annotations

import asyncio
import random
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from batchutil import chat_body, failures, read_results, write_requests
from conftest import free_port
from multidict import CIMultiDict

from jsonlbatch.batch_format.records import CHAT_URL, Request, Result
from jsonlbatch.exec.exec_options import ExecOptions
from jsonlbatch.exec.front_door import execute
from jsonlbatch.exec.output.events import EventBus, Retried, Sent
from jsonlbatch.exec.output.run_summary import RunSummary
from jsonlbatch.exec.route.endpoints import parse_endpoint
from jsonlbatch.exec.route.model_pools import PoolSpec, build_pools, parse_endpoints
from jsonlbatch.exec.send import rate_limits as limits
from jsonlbatch.exec.send.body_caps import TOO_LARGE
from jsonlbatch.exec.send.budget import Meter
from jsonlbatch.exec.send.pacing import Pacing
from jsonlbatch.exec.send.retry import Backoff, batch_cap, retry_after_of
from jsonlbatch.exec.send.sender import Sender
from jsonlbatch.exec.send.transport import Broken, Health, Next, Reply, Transport, assess

_OK = orjson.dumps(
    {"id": "x1", "object": "chat.completion", "model": "mock", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    ], "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
)  # fmt: skip


def _request(i: int = 0) -> Request:
    return Request(f"r{i}", CHAT_URL, chat_body(i))


def _reply(status: int, raw: bytes = b"{}", retry_after: float | None = None) -> Reply:
    return Reply(status=status, raw=raw, streamed=None, request_id=None, headers={},
                 retry_after=retry_after)  # fmt: skip


# -- the transport ---------------------------------------------------------------------------


async def _post(url: str, limit: int = 1 << 20, timeout: float = 30.0) -> Reply | Broken:
    async with aiohttp.ClientSession() as session:
        transport = Transport(session, timeout=timeout, limit=limit, stall=600.0)
        data = orjson.dumps(chat_body(0))
        headers = {"Content-Type": "application/json"}
        return await transport.post(parse_endpoint(url), CHAT_URL, data, headers, False)


def test_the_transport_reads_an_answer_whole(mock_server):
    got = asyncio.run(_post(mock_server()))
    assert isinstance(got, Reply) and got.status == 200 and got.retry_after is None
    assert orjson.loads(got.raw)["choices"][0]["message"]["content"]


def test_the_transport_reads_a_429s_retry_after(mock_server):
    got = asyncio.run(_post(mock_server(rate_limit_rate=1.0, retry_after=0.25)))
    assert isinstance(got, Reply) and got.status == 429 and got.retry_after == 0.25


def test_the_transport_turns_failures_into_values(mock_server):
    refused = asyncio.run(_post(f"http://127.0.0.1:{free_port()}/v1"))
    assert isinstance(refused, Broken) and refused.absent and refused.status is None
    large = asyncio.run(_post(mock_server(), limit=10))
    assert isinstance(large, Broken) and large.code == TOO_LARGE and large.status == 200
    late = asyncio.run(_post(mock_server(latency=5.0), timeout=0.2))
    assert isinstance(late, Broken) and late.code == "request_timeout" and not late.absent


def test_retry_after_ms_wins_over_retry_after():
    assert retry_after_of(CIMultiDict({"retry-after-ms": "250", "Retry-After": "3"})) == 0.25
    assert retry_after_of(CIMultiDict({"retry-after-ms": "soon", "retry-after": "3"})) == 3.0
    assert retry_after_of(CIMultiDict({"retry-after-ms": "nan"})) is None
    assert retry_after_of(CIMultiDict()) is None


# -- what an answer means --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("got", "nxt", "health"),
    [
        (_reply(200, _OK), Next.ANSWER, Health.GOOD),
        (_reply(200, b"{}"), Next.RETRY, Health.FAULT),  # a 2xx without an answer
        (_reply(500), Next.RETRY, Health.FAULT),
        (_reply(503), Next.RETRY, Health.BUSY),
        (_reply(429, retry_after=1.0), Next.RETRY, Health.SAME),
        (_reply(400, b'{"error": {"message": "bad"}}'), Next.FINAL, Health.SAME),
        (_reply(401), Next.ABORT, Health.SAME),
        (Broken("request_timeout", "no response within 3s"), Next.RETRY, Health.FAULT),
        (Broken(TOO_LARGE, "too large", 200), Next.KEEP, Health.FAULT),
    ],
)
def test_judge_says_what_comes_next_and_what_it_tells_of_the_endpoint(got, nxt, health):
    assessed = assess(_request(), got, {"attempts": 1}, 0.0, 0.1)
    assert (assessed.next, assessed.health) == (nxt, health)
    assert assessed.result.metrics["attempts"] == 1  # the metrics go in the line
    assert (assessed.answer is not None) is (nxt is Next.ANSWER)
    if isinstance(got, Reply) and got.status == 429:
        assert assessed.retry_after == 1.0
    if isinstance(got, Broken):
        assert assessed.result.status_code is None and assessed.result.error["code"] == got.code


# -- backoff ---------------------------------------------------------------------------------


def test_a_retry_after_replaces_the_backoff_and_the_backoff_is_capped_for_a_batch():
    backoff = Backoff(1.0, batch_cap(1.0), random.Random(1))
    assert backoff.delay(1, retry_after=1.0) == 1.0
    assert 1.0 <= backoff.delay(6, retry_after=1.0) <= 5.0  # not 8-16 s of doubling
    waits = [backoff.delay(3, retry_after=0.01) for _ in range(100)]  # refused again: spread
    assert min(waits) >= 0.01 and max(waits) - min(waits) > 1.0
    assert backoff.delay(6, retry_after=0.0) >= 4.0  # "0" says nothing: the backoff applies
    assert max(backoff.delay(n) for n in range(1, 40)) <= 8.0
    assert Backoff(3.0, batch_cap(3.0)).delay(30) <= 24.0  # --backoff still sets it


# -- the policy and endpoint layers of a real Sender -----------------------------------------


class Scripted:
    """A transport that answers from a script (and counts what it was asked)."""

    def __init__(self, script: list[Reply | Broken]) -> None:
        self.script = script
        self.posts = 0

    async def post(self, *args: Any) -> Reply | Broken:
        self.posts += 1
        return self.script.pop(0)


async def _with_sender(
    url: str, scenario: Callable[[Sender, list[Any]], Awaitable[Any]], **options: Any
) -> Any:
    opts = ExecOptions(urls=[url], **options)
    async with aiohttp.ClientSession() as session:
        specs = [PoolSpec()]
        pools = build_pools(session, specs=specs, urls=[url],
                            by_url=parse_endpoints(specs, [url], {}), keys={}, opts=opts,
                            controller=None, watchdog=None)  # fmt: skip
        bus, events = EventBus(), []
        bus.subscribe(events.append, Sent, Retried)
        meter = Meter(Pacing.of(opts))
        sender = Sender(opts=opts, session=session, pools=pools, meter=meter,
                        stopping=asyncio.Event(), summary=RunSummary("out"), bus=bus)  # fmt: skip
        try:
            return await scenario(sender, events)
        finally:
            await pools.close()


def test_a_refused_connection_and_one_closed_keepalive_cost_no_attempt(mock_server):
    async def scenario(sender: Sender, events: list[Any]) -> tuple[Result, int]:
        closed = Broken("connection_error", "closed", disconnected=True)
        refused = Broken("connection_error", "refused", absent=True)
        sender.transport = Scripted([refused, closed, closed, _reply(200, _OK)])  # type: ignore[assignment]
        result = await sender.send(_request())
        return result, [e.attempt for e in events if isinstance(e, Sent)]

    result, sent = asyncio.run(_with_sender(mock_server(), scenario, backoff_base=0.01))
    assert result.ok and result.metrics["attempts"] == 2  # the second close is an attempt
    assert sent == [1, 1, 1, 2]


def test_a_429s_retry_after_is_the_wait_of_its_request_not_the_backoff(mock_server):
    """Over real HTTP: 429s saying `Retry-After: 0.05` with a 30 s `--backoff`."""

    async def scenario(sender: Sender, events: list[Any]) -> tuple[Result, list[float]]:
        result = await sender.send(_request())
        return result, [e.delay_s for e in events if isinstance(e, Retried)]

    url = mock_server(rate_limit_rate=1.0, retry_after=0.05)
    result, delays = asyncio.run(_with_sender(url, scenario, backoff_base=30.0, max_retries=1))
    assert result.status_code == 429 and result.metrics["attempts"] == 2
    assert delays == [0.05]


def test_an_answer_too_large_is_kept_at_once_and_a_401_stops_the_run(mock_server):
    async def scenario(sender: Sender, events: list[Any]) -> Result:
        script = Scripted([Broken(TOO_LARGE, "too large", 200)])
        sender.transport = script  # type: ignore[assignment]
        result = await sender.send(_request())
        assert script.posts == 1
        sender.transport = Scripted([_reply(401)])  # type: ignore[assignment]
        with pytest.raises(Exception, match="rejected the credentials"):
            await sender.send(_request(1))
        return result

    result = asyncio.run(_with_sender(mock_server(), scenario, max_retries=5))
    assert result.error is not None and result.error["code"] == TOO_LARGE


# -- issue 39, whole runs --------------------------------------------------------------------


def _starts(results: dict[str, dict]) -> list[tuple[float, int]]:
    return sorted((r["metrics"]["start_time"], r["metrics"]["attempts"]) for r in results.values())


def test_a_stray_retry_after_delays_its_own_request_not_the_run(tmp_path: Path, mock_server):
    """5% of answers are 429s with `Retry-After: 2` and no rate-limit headers. Each such
    request waits its 2 s; the others keep going meanwhile (the old rule sent nothing before
    it: no line started inside any of those waits), and every request ends once."""
    url = mock_server(rate_limit_rate=0.05, retry_after=2.0, latency=0.05, seed=11)
    write_requests(tmp_path / "req.jsonl", 200, max_tokens=2)
    out = tmp_path / "out.jsonl"
    summary = execute(tmp_path / "req.jsonl", out, urls=[url], concurrency=4, quiet=True,
                      backoff_base=0.01, max_retries=8)  # fmt: skip
    results = read_results(out)
    assert len(results) == 200 and len(out.read_bytes().splitlines()) == 200
    assert not failures(results) and summary.rate_limited > 0
    starts = _starts(results)
    during = [  # lines first sent while a retried request waited out its Retry-After
        sum(1 for s, n in starts if n == 1 and retried - 1.7 < s < retried - 0.3)
        for retried, attempts in starts
        if attempts == 2
    ]
    assert during and max(during) >= 5, during


def test_a_server_answering_429_with_retry_after_to_everything_is_bounded(
    tmp_path: Path, mock_server, monkeypatch
):
    """The share of 429s is evidence of a run-wide limit: their `Retry-After` holds the run
    (and the throttle slows it), yet every request uses up its retries and gets its line."""
    monkeypatch.setattr(limits, "MIN_RATE", 50.0)  # the real floor (2/s) takes minutes here
    url = mock_server(rate_limit_rate=1.0, retry_after=0.05)
    write_requests(tmp_path / "req.jsonl", 12, max_tokens=2)
    out = tmp_path / "out.jsonl"
    summary = execute(tmp_path / "req.jsonl", out, urls=[url], concurrency=16, quiet=True,
                      backoff_base=0.01, max_retries=4)  # fmt: skip
    results = read_results(out)
    assert len(results) == 12 and len(failures(results)) == 12
    assert summary.rate_limited == 12 * 5  # the first attempt and 4 retries each, no more
    stats = urllib.request.urlopen(url.removesuffix("/v1") + "/mock/stats", timeout=10)
    assert orjson.loads(stats.read())["requests"]["/v1/chat/completions"] == 60

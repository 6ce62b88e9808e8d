"""Pacing per endpoint group (exec/send/pacing.py): one model's 429s hold none of the others'."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from batchutil import cli, read_results

pytestmark = pytest.mark.timeout(120, method="thread")


def _mixed(path: Path, counts: dict[str, int]) -> dict[str, str]:
    lines, asked = [], {}
    for model, n in counts.items():
        for i in range(n):
            cid = f"{model}{i}"
            asked[cid] = model
            body = {"model": model, "messages": [{"role": "user", "content": f"q {i}"}],
                    "max_tokens": 4}  # fmt: skip
            lines.append({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                          "body": body})  # fmt: skip
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return asked


@pytest.mark.slow
def test_a_model_that_only_refuses_holds_no_other_model(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    """Model A's gateway answers 429 with Retry-After 30 to everything; B is healthy. Once A's
    share of 429s is evidence of a limit, A's group is throttled and held; B's requests go on
    at speed (before, the one run-wide hold kept B waiting 30 s), and A's requests end with
    failure lines after their retries (a request waits a hold no longer than its own
    Retry-After: 40 x --backoff here)."""
    refusing = mock_server(served_models=("a",), rate_limit_rate=1.0, retry_after=30)
    healthy = mock_server(served_models=("b",), latency=0.005)
    requests, output = tmp_path / "req.jsonl", tmp_path / "out.jsonl"
    asked = _mixed(requests, {"a": 40, "b": 100})
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(
        orjson.dumps({"a": {"urls": [refusing]}, "b": {"urls": [healthy]}}).decode()
    )
    done = cli("exec", str(requests), "-o", str(output), "--endpoints", str(endpoints), "-q",
               "-c", "32", "--max-retries", "1", "--backoff", "0.05")  # fmt: skip
    assert done.returncode == 3, done.stderr  # some requests failed
    assert "Traceback" not in done.stderr
    results = read_results(output)
    assert set(results) == set(asked)
    by_model: dict[str, list[dict]] = {"a": [], "b": []}
    for cid, line in results.items():
        by_model[asked[cid]].append(line)
    assert all(line["response"]["status_code"] == 429 for line in by_model["a"])
    assert all(line["metrics"]["attempts"] == 2 for line in by_model["a"])
    assert all(line["response"]["status_code"] == 200 for line in by_model["b"])
    starts = sorted(line["metrics"]["start_time"] for line in by_model["b"])
    # B never waited out A's 30 s Retry-After hold (its answers take well under a second each)
    assert starts[-1] - starts[0] < 15, starts[-1] - starts[0]


def test_groups_keep_their_own_429_state_and_share_the_users_limits() -> None:
    from jsonlbatch.exec.send.pacing import Pacing

    async def scenario() -> tuple[Pacing, float]:
        pacing = Pacing(rpm=6000, hold_cap=0.3)
        a, b = pacing.group("a"), pacing.group("b")
        assert pacing.group("a") is a and a.buckets["requests"] is b.buckets["requests"]
        for _ in range(25):  # a's every answer a 429: a share high enough to hold it
            ticket = await a.acquire(a_cost := _cost())
            a.answered(429, {}, ticket, retry_after=30.0, cost=a_cost)
        assert a.throttle is not None and a.hold_until > 0
        assert b.throttle is None and b.hold_until == 0.0
        loop = asyncio.get_running_loop()
        start = loop.time()
        await b.acquire(_cost())  # not held by a's Retry-After
        await a.acquire(_cost())  # held, at most hold_cap
        return pacing, loop.time() - start

    pacing, waited = asyncio.run(scenario())
    assert waited < 5.0  # not a's 30 s
    assert pacing.rate_limited == 25
    assert pacing.describe() == "6,000 rpm (--rpm)"


def _cost():
    from jsonlbatch.exec.send.token_bucket import Cost

    return Cost()

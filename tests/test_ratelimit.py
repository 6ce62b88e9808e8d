"""Rate limits: the mock's provider headers, limits learned from them, --rpm/--tpm, and how a
429 slows the whole run. Real HTTP against the mock on 127.0.0.1; small, quick runs."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
import urllib.request

import orjson
import pytest
from batchutil import exec_cli, failures, read_results, write_requests

from jsonlbatch.exec.front_door import execute
from jsonlbatch.exec.send import rate_limits as limits
from jsonlbatch.exec.send.rate_limits import Cost, RateLimiter, parse_reset
from jsonlbatch.mock.limits import go_duration


def test_reset_values_of_both_families_parse():
    assert parse_reset("1s") == 1.0
    assert parse_reset("6m0s") == 360.0
    assert parse_reset("250ms") == 0.25
    assert parse_reset("1h2m3.5s") == pytest.approx(3723.5)
    assert parse_reset("20") == 20.0
    assert parse_reset("2026-11-24T06:00:30Z", now=1795500000.0) == pytest.approx(30.0)
    assert parse_reset("soon") is None and parse_reset(None) is None
    for seconds in (0.25, 1.0, 1.5, 360.0, 3723.5):
        assert parse_reset(go_duration(seconds)) == pytest.approx(seconds)


def _post(url: str, body: bytes = b'{"model":"mock","messages":[{"role":"user","content":"hi"}]}'):
    request = urllib.request.Request(
        url + "/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


def test_mock_enforces_rpm_with_the_openai_header_set(mock_server):
    url = mock_server(rpm=120, tpm=100_000)  # a bucket of 2 requests (1 s of 120 rpm)
    answers = [_post(url) for _ in range(3)]
    assert [status for status, _ in answers] == [200, 200, 429]
    headers = answers[0][1]
    assert headers["x-ratelimit-limit-requests"] == "120"
    assert headers["x-ratelimit-remaining-requests"] == "1"
    assert headers["x-ratelimit-limit-tokens"] == "100000"
    assert parse_reset(headers["x-ratelimit-reset-requests"]) == pytest.approx(0.5, abs=0.1)
    assert parse_reset(headers["x-ratelimit-reset-tokens"]) is not None
    limited = answers[2][1]
    assert limited["x-ratelimit-remaining-requests"] == "0"
    assert 0 < float(limited["Retry-After"]) <= 0.5


def test_mock_sends_the_anthropic_header_set(mock_server):
    url = mock_server(rpm=60, tpm=6000, rate_limit_headers="anthropic")
    status, headers = _post(url)
    assert status == 200
    assert headers["anthropic-ratelimit-requests-limit"] == "60"
    assert headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert headers["anthropic-ratelimit-tokens-limit"] == "6000"
    assert 0 < parse_reset(headers["anthropic-ratelimit-requests-reset"]) <= 2
    assert not any(k.startswith("x-ratelimit") for k in headers)


def test_mock_refuses_a_bad_limit_config(mock_server):
    with pytest.raises(Exception, match="header style"):
        mock_server(rpm=60, rate_limit_headers="azure")


@pytest.mark.parametrize("style", ["openai", "anthropic"])
def test_exec_learns_the_limit_from_headers_and_stays_under_it(tmp_path, mock_server, style):
    url = mock_server(rpm=1200, rate_limit_headers=style)  # 20 a second, a bucket of 20
    write_requests(tmp_path / "req.jsonl", 50, max_tokens=4)
    started = time.monotonic()
    summary = execute(
        tmp_path / "req.jsonl", tmp_path / "out.jsonl", urls=[url], concurrency=32, quiet=True,
        backoff_base=0.05,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert summary.succeeded == 50
    assert summary.rate_limited == 0, summary.format()
    assert "1,200 rpm (headers)" in summary.limits
    assert elapsed >= (50 - 20) / 20 * 0.9  # paced: the first second's bucket, then 20/s


def test_without_learning_the_same_run_runs_into_429s(tmp_path, mock_server):
    url = mock_server(rpm=1200)
    write_requests(tmp_path / "req.jsonl", 50, max_tokens=4)
    summary = execute(
        tmp_path / "req.jsonl", tmp_path / "out.jsonl", urls=[url], concurrency=32, quiet=True,
        backoff_base=0.05, max_retries=50, rate_limits=False,
    )  # fmt: skip
    assert summary.succeeded == 50
    assert summary.rate_limited > 0
    assert summary.limits == ""


def test_learned_token_limit_paces_by_tokens(tmp_path, mock_server):
    # The mock charges prompt words + max_tokens: 2 + 48 = 50 tokens a request; 6,000 tpm is
    # 2 requests a second (a bucket of 100 tokens).
    url = mock_server(tpm=6000)
    write_requests(tmp_path / "req.jsonl", 8, max_tokens=48)
    started = time.monotonic()
    summary = execute(
        tmp_path / "req.jsonl", tmp_path / "out.jsonl", urls=[url], concurrency=8, quiet=True,
        backoff_base=0.05,
    )  # fmt: skip
    assert summary.succeeded == 8
    assert summary.rate_limited <= 1, summary.format()
    assert "6,000 tpm (headers)" in summary.limits
    assert time.monotonic() - started >= 2.0


def test_rpm_option_paces_a_server_that_sends_no_headers(tmp_path, mock_server):
    url = mock_server()
    write_requests(tmp_path / "req.jsonl", 40)
    started = time.monotonic()
    summary = execute(
        tmp_path / "req.jsonl", tmp_path / "out.jsonl", urls=[url], concurrency=16, quiet=True,
        rpm=1200,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert summary.succeeded == 40
    assert summary.limits == "1,200 rpm (--rpm)"
    assert elapsed >= (40 - 20) / 20 * 0.9


_HEADERS = {"x-ratelimit-limit-requests": "12000", "x-ratelimit-remaining-requests": "0"}


def _answer(limiter: RateLimiter, status: int, headers=None, retry_after=None, cost=None) -> None:
    """One answer to a request sent just now (as a worker's send would count it)."""
    limiter.answered(status, headers or {}, limiter.count_unpaced(), retry_after, cost)


def test_a_429_with_retry_after_and_a_spent_budget_holds_every_worker_until_then():
    async def scenario() -> float:
        limiter = RateLimiter()
        _answer(limiter, 429, _HEADERS, retry_after=0.3)  # remaining-requests: 0
        assert limiter.active and limiter.hold_until > time.monotonic()
        started = time.monotonic()
        await limiter.acquire(Cost())  # another worker's request: held by the first's 429
        return time.monotonic() - started

    assert asyncio.run(scenario()) >= 0.28


def test_a_stray_retry_after_holds_no_other_request():
    """Issue 39: a 429 with `Retry-After` but no sign of a run-wide limit (no rate-limit
    headers, or headers with budget left) delays its own request only (its sender waits)."""
    left = {"x-ratelimit-limit-requests": "12000", "x-ratelimit-remaining-requests": "500"}

    async def scenario() -> RateLimiter:
        limiter = RateLimiter()
        _answer(limiter, 200)
        draw = random.Random(4)
        for _ in range(400):
            stray = draw.random() < 0.05
            _answer(limiter, 429 if stray else 200, retry_after=30.0 if stray else None)
        assert not limiter.active and limiter.throttle is None  # workers skip the limiter
        _answer(limiter, 429, left, retry_after=30.0)
        return limiter

    limiter = asyncio.run(scenario())
    assert limiter.rate_limited > 10
    assert limiter.hold_until == 0.0


def _tokens(remaining: int) -> dict[str, str]:
    return {"x-ratelimit-limit-tokens": "90000", "x-ratelimit-remaining-tokens": str(remaining)}


def _anthropic(remaining: int) -> dict[str, str]:
    return {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": str(remaining),
    }


@pytest.mark.parametrize(
    ("headers", "cost", "held"),
    [
        (_tokens(40), 100, True),
        (_tokens(400), 100, False),
        (_anthropic(0), 0, True),
        (_anthropic(7), 0, False),
    ],
)
def test_the_budget_is_spent_when_less_remains_than_the_request_costs(headers, cost, held):
    limiter = RateLimiter()
    _answer(limiter, 429, headers, retry_after=5.0, cost=Cost.of(cost / 2, cost / 2))
    assert (limiter.hold_until > 0) is held


def test_failures_answered_faster_than_answers_are_no_high_share():
    """Issue 39: a 429 or a 500 comes back at once, an answer after its generation, so the
    first answers of any moment are mostly failures. 5% stray 429s (and 5% 500s, and a timeout
    that never answers) must not read as a high share: the share is taken over the answers to
    a group of requests in the order they were sent, not over the first answers back."""

    async def scenario() -> RateLimiter:
        limiter = RateLimiter()
        draw = random.Random(7)
        for _ in range(10):  # rounds of 256 in flight; errors and 429s are answered first
            sent = [(limiter.count_unpaced(), draw.random()) for _ in range(256)]
            fast = [(t, r) for t, r in sent if r < 0.1]
            for ticket, r in fast + [(t, r) for t, r in sent if r >= 0.1]:
                if r < 0.05:
                    limiter.answered(429, {}, ticket, 1.0)
                elif r < 0.09:
                    limiter.answered(500, {}, ticket, None)
                elif r < 0.1:
                    limiter.unanswered(ticket)  # a timeout: no HTTP answer at all
                else:
                    limiter.answered(200, {}, ticket, None)
        return limiter

    limiter = asyncio.run(scenario())
    assert limiter.rate_limited > 100
    assert limiter.throttle is None and limiter.hold_until == 0.0 and not limiter.active


def test_a_high_share_of_429s_lets_their_retry_after_hold_the_run():
    async def scenario() -> RateLimiter:
        limiter = RateLimiter()
        for _ in range(limits.DECIDE_EVERY):  # a group of answers, all 429: a run-wide limit
            _answer(limiter, 429, retry_after=0.5)
        assert limiter.throttle is not None
        _answer(limiter, 429, retry_after=0.5)
        return limiter

    limiter = asyncio.run(scenario())
    assert limiter.hold_until > time.monotonic()


@pytest.mark.parametrize("share", [0.05, 0.2])
def test_stray_429s_without_headers_never_slow_the_run(share):
    async def scenario() -> RateLimiter:
        limiter = RateLimiter()
        draw = random.Random(3)
        for _ in range(2000):
            _answer(limiter, 429 if draw.random() < share else 200)
        return limiter

    limiter = asyncio.run(scenario())
    assert limiter.rate_limited > 0
    assert limiter.throttle is None and not limiter.active and limiter.status() == ""


def test_a_high_share_of_429s_halves_the_rate_down_to_a_floor_and_recovers_in_answers():
    async def scenario() -> tuple[list[float], RateLimiter]:
        limiter = RateLimiter()
        limiter._send_rate = lambda now: 400.0  # type: ignore[method-assign]
        rates = []
        for _ in range(12 * limits.DECIDE_EVERY):  # a server that answers 429 to everything
            _answer(limiter, 429)
            rates.append(limiter.throttle.rate if limiter.throttle else 0.0)
        assert limiter.active and limiter.throttle is not None
        # recovery: answers without 429s double the rate back, group by group, until lifted
        for _ in range(20 * limits.DECIDE_EVERY):
            _answer(limiter, 200)
        return rates, limiter

    rates, limiter = asyncio.run(scenario())
    steps = sorted({r for r in rates if r}, reverse=True)
    assert steps[0] == pytest.approx(200.0)  # half the rate that ran into the limit
    assert all(a == pytest.approx(2 * b) for a, b in itertools.pairwise(steps[:-1]))
    assert steps[-1] == limits.MIN_RATE  # bounded: never a standstill
    assert rates[limits.DECIDE_EVERY - 2] == 0.0  # no decision before a group of answers
    assert limiter.throttle is None


def test_a_429_with_rate_limit_headers_slows_down_at_once():
    limiter = RateLimiter()
    limiter._send_rate = lambda now: 100.0  # type: ignore[method-assign]
    _answer(limiter, 200)
    _answer(limiter, 429, _HEADERS)
    assert limiter.throttle is not None and limiter.throttle.rate == pytest.approx(50.0)
    _answer(limiter, 429, _HEADERS)  # one decision per group of answers, not per 429
    assert limiter.throttle.rate == pytest.approx(50.0)


def test_rate_limits_off_turns_off_every_pacing_not_asked_for():
    limiter = RateLimiter(rpm=600, learn=False)
    for _ in range(3 * limits.DECIDE_EVERY):
        _answer(limiter, 429, _HEADERS, retry_after=30.0)
    assert limiter.rate_limited == 3 * limits.DECIDE_EVERY
    assert limiter.throttle is None and limiter.hold_until == 0.0
    assert list(limiter.buckets) == ["requests"] and limiter.describe() == "600 rpm (--rpm)"


def _all_answered(tmp_path, url: str, count: int, *args: str) -> str:
    """`exec` of `count` small requests to `url`; every one answered once; its stderr."""
    write_requests(tmp_path / "req.jsonl", count, max_tokens=2)
    out = tmp_path / "out.jsonl"
    proc = exec_cli(tmp_path / "req.jsonl", out, "--url", url, *args)
    assert proc.returncode == 0, proc.stderr
    results = read_results(out)
    assert len(results) == count and not failures(results)
    return proc.stderr


def test_stray_429s_finish_the_run_unpaced(tmp_path, mock_server):
    url = mock_server(rate_limit_rate=0.2, retry_after=None, seed=5)
    stderr = _all_answered(tmp_path, url, 300, "-c", "32", "--backoff", "0.01",
                           "--max-retries", "20")  # fmt: skip
    assert "after 429s" not in stderr


def test_a_server_answering_429_to_everything_ends_with_failure_lines(
    tmp_path, mock_server, monkeypatch
):
    monkeypatch.setattr(limits, "MIN_RATE", 50.0)  # the real floor (2/s) takes minutes here
    url = mock_server(rate_limit_rate=1.0, retry_after=None)
    write_requests(tmp_path / "req.jsonl", 12, max_tokens=2)
    out = tmp_path / "out.jsonl"
    summary = execute(
        tmp_path / "req.jsonl", out, urls=[url], concurrency=16, quiet=True, backoff_base=0.01,
        max_retries=4,
    )  # fmt: skip
    results = read_results(out)
    assert len(results) == 12 and len(failures(results)) == 12
    assert {r["response"]["status_code"] for r in results.values()} == {429}
    assert summary.rate_limited == 12 * 5  # bounded: the first attempt and 4 retries each
    stats = urllib.request.urlopen(url.removesuffix("/v1") + "/mock/stats", timeout=10)
    assert orjson.loads(stats.read())["requests"]["/v1/chat/completions"] == 60


def test_a_429_storm_is_slowed_for_all_workers_and_paced_is_shown(tmp_path, mock_server):
    url = mock_server(rpm=600)
    stderr = _all_answered(tmp_path, url, 40, "-c", "16", "--backoff", "0.05",
                           "--max-retries", "40")  # fmt: skip
    assert "paced: 600 rpm" in stderr
    assert "rate limits: 600 rpm (headers)" in stderr


def test_a_reset_far_beyond_a_minute_reveals_a_daily_window():
    async def learn(headers: dict[str, str]) -> RateLimiter:
        limiter = RateLimiter()
        limiter.observe(headers, (0, 0.0))
        return limiter

    daily = asyncio.run(learn({"x-ratelimit-limit-requests": "10000",
                               "x-ratelimit-remaining-requests": "9000",
                               "x-ratelimit-reset-requests": "2h24m0s"}))  # fmt: skip
    assert daily.buckets["requests"].per_minute == pytest.approx(1000 / 144)  # 1,000 in 144 min
    minute = asyncio.run(learn({"anthropic-ratelimit-requests-limit": "50",
                                "anthropic-ratelimit-requests-remaining": "49",
                                "anthropic-ratelimit-requests-reset": "2020-01-01T00:00:00Z"}))  # fmt: skip
    assert minute.buckets["requests"].per_minute == 50


HOSTILE = {
    "a limit of 1e-300": {"x-ratelimit-limit-requests": "1e-300",
                          "x-ratelimit-remaining-requests": "0",
                          "x-ratelimit-reset-requests": "1s"},
    "remaining 0, reset in 99,999 h": {"x-ratelimit-limit-requests": "100",
                                       "x-ratelimit-remaining-requests": "0",
                                       "x-ratelimit-reset-requests": "99999h"},
    "tokens 1e-300": {"x-ratelimit-limit-tokens": "1e-300",
                      "x-ratelimit-remaining-tokens": "0",
                      "x-ratelimit-reset-tokens": "9999h"},
}  # fmt: skip


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_limit_headers_cannot_stall_a_run(tmp_path, monkeypatch, case):
    """A limit learned from headers holds one request at most `_MAX_LEARNED_WAIT_S` (here
    0.1 s so the test is quick): the run finishes instead of sending one an hour."""
    from aiohttp import web
    from batchutil import odd_server

    from jsonlbatch.exec.front_door import aexecute

    monkeypatch.setattr(limits, "_MAX_LEARNED_WAIT_S", 0.1)
    body = {"id": "x", "object": "chat.completion", "model": "mock",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}  # fmt: skip

    async def handler(request):
        await request.read()
        return web.json_response(body, headers=HOSTILE[case])

    url, stop = odd_server(handler)
    write_requests(tmp_path / "req.jsonl", 6)
    try:
        summary = asyncio.run(
            asyncio.wait_for(  # a bound for a stall, not a speed check
                aexecute(tmp_path / "req.jsonl", tmp_path / "out.jsonl", urls=[url], quiet=True),
                60,
            )
        )
    finally:
        stop()
    assert summary.succeeded == 6


def test_an_absolute_reset_is_read_against_the_servers_date():
    """Anthropic's reset is a time: a server clock an hour ahead (its `Date` too) is no
    one-hour window."""
    import email.utils

    ahead = time.time() + 3600
    headers = {
        "date": email.utils.formatdate(ahead, usegmt=True),
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-requests-reset": time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime(ahead + 2)
        ),
    }

    async def learn() -> RateLimiter:
        limiter = RateLimiter()
        limiter.observe(headers, (0, 0.0))
        return limiter

    assert asyncio.run(learn()).buckets["requests"].per_minute == 50

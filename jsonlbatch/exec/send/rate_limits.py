"""Pacing against a provider's limits: token buckets, limits learned from headers, 429 slowdown.

One `RateLimiter` serves every worker of one endpoint group (a model's replicas: what a provider
limits together; `pacing.Pacing` keeps one per group), so one model's 429s never hold another's
requests. It keeps up to four continuously refilled buckets, one per kind of limit
(requests, tokens, input tokens, output tokens), each holding at most one second of its rate so
that a run never bursts past what the provider can take at once. A request takes its cost from
every bucket before it is sent (allowed to go into debt, so one request larger than a bucket
still goes) and the token buckets are corrected with the real usage when the answer arrives.

Limits come from `--rpm`/`--tpm` and, unless learning is off, from response headers: OpenAI's
and Azure's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` and Anthropic's
`anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`. The
limit sets a bucket's rate; what remains pulls the bucket down when the provider counts less
left than we do (never up: our own count already holds requests the server has not seen yet).

A 429 slows the whole run only on evidence of a limit, never for being a 429: a stray 429 (a
gateway's queue limit, a busy replica, a proxy) is retried like a 500 and nothing else changes,
and its `Retry-After` delays that request alone (its sender waits it out). The evidence:
rate-limit headers on the 429, or a high share of 429s (`HIGH_SHARE`) among the answers to the
first `DECIDE_EVERY` requests sent since the last change (all of them, however fast each came
back: `_weigh`). Then sending is throttled to half the
rate, and a 429's `Retry-After` holds every request of the group (nothing is sent before it,
each request held at most `hold_cap` in all, the bound of its own `Retry-After`) when the
headers say the budget is spent (less left than the request costs) or while a high share of
429s holds the throttle down. The throttle halves at most once per
`DECIDE_EVERY` such answers (so the next decision sees requests sent at the new rate), down to
`MIN_RATE`; each later group of answers with a low share (`LOW_SHARE`) doubles it back, and it
is lifted once it is twice the rate that ran into the limit. Recovery is counted in answers: a
run that sends slowly recovers slowly, but always recovers. With learning off (`--rate-limits
off`) none of this happens: only `--rpm`/`--tpm` pace the run.

The hot path stays cheap when nothing limits the run: `active` is False, workers skip the
limiter, and `observe` is two header lookups that find nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Mapping

from jsonlbatch.exec.send.rate_limit_headers import (
    ANTHROPIC_HEADERS,
    OPENAI_HEADERS,
    header_number,
    parse_reset,
    server_now,
)
from jsonlbatch.exec.send.token_bucket import Bucket, Cost

_SHORT = {
    "requests": "rpm",
    "tokens": "tpm",
    "input_tokens": "input tpm",
    "output_tokens": "output tpm",
}

#: Limits learned from headers are paced at this share of what they allow: sending exactly at
#: the limit leaves the provider's bucket empty, and then any jitter on the way (a request
#: that arrives a millisecond early) is a 429.
LEARNED_SHARE = 0.95
#: The 429 slowdown decides once per this many answers to requests sent since its last change.
DECIDE_EVERY = 20
HIGH_SHARE = 0.5  # this share of 429s among those answers is a limit: halve the rate
LOW_SHARE = 0.3  # below this share the throttle doubles back (stray 429s do not hold it down)
#: Requests/s the 429 throttle never goes below: a server that answers 429 to everything is
#: not hammered (each request also backs off), yet its requests use up their retries and end
#: with failure lines in minutes.
MIN_RATE = 2.0
_MAX_HOLD_S = 300.0  # a Retry-After longer than this holds the run only this long
_MAX_LEARNED_WAIT_S = 20.0  # a limit learned from headers holds one request at most this long
#: While limits are being learned, the first request goes alone, and the others wait for its
#: answer (and the limits its headers tell) at most this long: a cold local server must not
#: hold a run up, and a hosted API must not see a burst of hundreds before its limits are known.
FIRST_ANSWER_WAIT_S = 2.0

#: A limit whose reset is this much longer than a per-minute refill would take is a longer
#: window (requests per day): the rate then follows from what is used and when it is back.
_LONG_WINDOW = 2.0
#: The longest window a provider counts in (requests per day): a reset further away than this
#: is a broken header (99,999 h), not a window.
_MAX_WINDOW_S = 86400.0


class RateLimiter:
    """The run's shared pacing state. Workers call `acquire` before sending, `observe` with
    each answer's headers, `on_429` when limited, and `settle` with the real usage."""

    def __init__(
        self,
        rpm: float | None = None,
        tpm: float | None = None,
        learn: bool = True,
        *,
        shared: Mapping[str, Bucket] | None = None,
        hold_cap: float = _MAX_HOLD_S,
    ) -> None:
        self.learn = learn
        #: `shared`: the run's `--rpm`/`--tpm` buckets, which every group takes from (a lower
        #: limit learned by one group replaces them in that group only).
        self.buckets: dict[str, Bucket] = dict(shared or {})
        #: A request waits for a `Retry-After` hold at most this long (then only the throttle
        #: paces it): a group whose every answer is a 429 ends with failure lines.
        self.hold_cap = min(hold_cap, _MAX_HOLD_S)
        if rpm:
            self.buckets["requests"] = Bucket(rpm, "--rpm")
        if tpm:
            self.buckets["tokens"] = Bucket(tpm, "--tpm")
        self.fixed = frozenset(self.buckets)  # user limits: headers may lower them, not raise
        self.hold_until = 0.0  # no request leaves before this (monotonic): Retry-After
        self.throttle: Bucket | None = None  # the 429 slowdown, on top of any limit
        self._throttle_base = 0.0  # requests/s that ran into the limit (this episode)
        self._mark = 0  # requests sent before the slowdown's last change: their answers are old
        self._answers = 0  # answers to requests sent since then ...
        self._limited = 0  # ... and how many of them were 429s
        self._evidence = False  # a 429 among them carried rate-limit headers
        self._by_share = False  # the throttle is down because of a high share of 429s
        self.sent = 0  # requests sent so far, for the send rate and the header reconciliation
        self._tokens_sent = 0.0
        self._rate_mark = (time.monotonic(), 0)
        self._recent_rate = 0.0
        self.paced_at = -math.inf  # monotonic time a request last had to wait
        self.rate_limited = 0  # 429s seen
        #: Output tokens assumed for a request without a cap: a running mean of real answers.
        self.typical_output = 256.0
        #: Real prompt tokens per estimated one (from usage): corrects the character estimate.
        self.prompt_scale = 1.0
        self._lock = asyncio.Lock()
        self._gate: asyncio.Event | None = asyncio.Event() if learn else None
        self._probe_sent = False
        self.active = bool(self.buckets) or learn

    # -- sending -------------------------------------------------------------------------------

    def needs_tokens(self) -> bool:
        """Whether requests must carry a token estimate (some token bucket is in use)."""
        return len(self.buckets) > ("requests" in self.buckets)

    async def acquire(self, cost: Cost) -> tuple[int, float]:
        """Wait until `cost` fits every bucket (and any 429 hold is over), then take it.

        Waiters queue on one lock, so they leave in order and a large request is not starved.
        Returns a ticket for `observe`: the requests sent before this one and the tokens sent
        up to and including it.
        """
        held_until = time.monotonic() + self.hold_cap  # counted from the queue's end
        async with self._lock:
            # A limit learned from headers holds one request at most `_MAX_LEARNED_WAIT_S`: a
            # limit of 1e-300, a `remaining: 0` with a reset 99,999 h away, or a reset read
            # against a clock an hour off would otherwise stall the run.
            believed_until = time.monotonic() + _MAX_LEARNED_WAIT_S
            while True:
                now = time.monotonic()
                wait = min(self.hold_until, held_until) - now
                for kind, bucket in self.buckets.items():
                    if bucket.source != "headers" or now < believed_until:
                        wait = max(wait, bucket.wait_for(getattr(cost, kind), now))
                if self.throttle is not None:
                    wait = max(wait, self.throttle.wait_for(1.0, now))
                if wait <= 0:
                    break
                self.paced_at = now
                nap = min(wait, 1.0)  # re-check: limits change while we wait
                if now < believed_until:
                    nap = min(nap, believed_until - now + 1e-3)
                await asyncio.sleep(nap)
            for kind, bucket in self.buckets.items():
                bucket.level -= getattr(cost, kind)
            if self.throttle is not None:
                self.throttle.level -= 1.0
        return self._count(cost)

    def count_unpaced(self, cost: Cost | None = None) -> tuple[int, float]:
        """Note a request sent without waiting (the limiter is not active)."""
        return self._count(cost)

    def _count(self, cost: Cost | None) -> tuple[int, float]:
        if cost is not None:
            self._tokens_sent += cost.tokens
        ticket = (self.sent, self._tokens_sent)
        self.sent += 1
        return ticket

    def settle(self, estimate: Cost, prompt: float, completion: float, ok: bool = True) -> None:
        """Correct the token buckets with a finished request's real usage (a failed request
        keeps its estimate: what the provider counted for it is unknown). Buckets learned from
        headers are left alone: what the provider says remains is the truer count (OpenAI
        charges the output cap, not the answer's length)."""
        if not ok:
            return
        self.typical_output += (completion - self.typical_output) * 0.05
        for kind, real in (
            ("tokens", prompt + completion),
            ("input_tokens", prompt),
            ("output_tokens", completion),
        ):
            bucket = self.buckets.get(kind)
            if bucket is not None and bucket.source != "headers":
                bucket.level = min(bucket.capacity, bucket.level + getattr(estimate, kind) - real)

    def calibrate(self, estimated: float, real: float) -> None:
        """Move the prompt estimate's correction towards what the usage said (a running mean,
        bounded so one odd answer cannot swing it)."""
        ratio = min(4.0, max(0.25, real / estimated))
        self.prompt_scale += (ratio - self.prompt_scale) * 0.05

    # -- learning ------------------------------------------------------------------------------

    @property
    def gated(self) -> bool:
        return self._gate is not None

    async def first_answer(self) -> None:
        """Let the first request go; hold the others until its answer (or FIRST_ANSWER_WAIT_S)."""
        if self._gate is None:
            return
        if not self._probe_sent:
            self._probe_sent = True
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._gate.wait(), FIRST_ANSWER_WAIT_S)
        self._open_gate()

    def _open_gate(self) -> None:
        if self._gate is not None:
            self._gate.set()
            self._gate = None
            self._refresh_active()

    def observe(self, headers: Mapping[str, str], ticket: tuple[int, float]) -> bool:
        """Learn limits and what is left from an answer's headers (any status); True when
        they carried rate-limit headers."""
        if not self.learn:
            return False
        found = self._learn_from(headers, ticket)
        if self._gate is not None:
            self._open_gate()
        return found

    def _learn_from(self, headers: Mapping[str, str], ticket: tuple[int, float]) -> bool:
        family = _family(headers)
        if family is None:
            return False
        now = None
        for kind, (limit_name, remaining_name, reset_name) in family.items():
            limit = header_number(headers.get(limit_name))
            if limit is None or limit < 1:  # no count of requests or tokens: not a limit
                continue
            remaining = header_number(headers.get(remaining_name))
            if remaining is not None and remaining < limit:
                if now is None:
                    now = server_now(headers) or time.time()
                reset = parse_reset(headers.get(reset_name), now)
                if reset and reset > _LONG_WINDOW * 60.0 * (limit - remaining) / limit:
                    # Back to full only after `reset`: refilled at (limit - remaining) / reset.
                    limit = 60.0 * (limit - remaining) / min(reset, _MAX_WINDOW_S)
            self._learn(kind, limit, remaining, ticket)
        self.active = True
        return True

    def _learn(
        self, kind: str, limit: float, remaining: float | None, ticket: tuple[int, float]
    ) -> None:
        bucket = self.buckets.get(kind)
        if bucket is None:
            bucket = self.buckets[kind] = Bucket(limit, "headers", LEARNED_SHARE)
            # Start empty: requests sent before this answer may not have reached the provider
            # yet, and a full bucket on top of them is a burst it may refuse.
            bucket.level = 0.0
        elif bucket.source == "headers" and bucket.per_minute != limit:
            bucket.set_limit(limit)
        elif kind in self.fixed and limit < bucket.per_minute:
            # The provider allows this group less than --rpm/--tpm said: a bucket of its own
            # (the shared one paces the other groups still).
            learned = Bucket(limit, "headers", LEARNED_SHARE)
            learned.level = min(bucket.level, learned.capacity)
            bucket = self.buckets[kind] = learned
        if remaining is None:
            return
        # The server counted up to this request; those sent after it are in our count but may
        # not be in its `remaining` yet.
        later = self.sent - ticket[0] - 1 if kind == "requests" else self._tokens_sent - ticket[1]
        bucket.refill(time.monotonic())
        bucket.level = min(bucket.level, remaining - max(0.0, later))

    # -- 429 -----------------------------------------------------------------------------------

    def answered(
        self,
        status: int,
        headers: Mapping[str, str],
        ticket: tuple[int, float],
        retry_after: float | None,
        cost: Cost | None = None,
    ) -> None:
        """An HTTP answer to the request of `ticket` (any status; `cost`: what the request
        takes): learn from its headers and weigh the evidence of a limit (module docstring)."""
        if status == 429:
            self.rate_limited += 1
        if not self.learn:  # --rate-limits off: no pacing the user did not ask for
            return
        headed = self.observe(headers, ticket)
        now = time.monotonic()
        self._weigh(ticket[0], status == 429, headed, now)
        if status == 429 and retry_after and (self._by_share or (headed and spent(headers, cost))):
            self.hold_until = max(self.hold_until, now + min(retry_after, _MAX_HOLD_S))
            self.active = True

    def unanswered(self, ticket: tuple[int, float]) -> None:
        """An attempt that got no HTTP answer (a timeout, a dropped or refused connection): it
        counts in its group as an answer that is no 429, or the group would never be whole."""
        if self.learn:
            self._weigh(ticket[0], False, False, time.monotonic())

    def _weigh(self, index: int, limited: bool, headed: bool, now: float) -> None:
        """Count the answer to the request sent `index`-th. The share is taken over the group of
        the first `DECIDE_EVERY` requests sent since the last change, once all of them are
        answered, not over the first answers to come back: errors come back faster than
        answers (no generation), so the first answers of a moment are mostly the failures."""
        if index < self._mark:  # sent before the last change: says nothing about the new rate
            return
        if limited and headed:
            self._evidence = True
        if index < self._mark + DECIDE_EVERY:
            self._answers += 1
            self._limited += limited
        if self._evidence and self.throttle is None:
            self._decide(now)  # a provider that says it limits us: slow down at once
        elif self._answers >= DECIDE_EVERY:
            self._decide(now)

    def _decide(self, now: float) -> None:
        share = self._limited / max(1, self._answers)
        if self._evidence or share >= HIGH_SHARE:
            # a share counts over a whole group (a 429 with headers decides on fewer answers)
            self._by_share = share >= HIGH_SHARE and self._answers >= DECIDE_EVERY
            self._slow_down(now)
        elif self.throttle is not None and share < LOW_SHARE:
            self._by_share = False
            self._speed_up()
        self._answers = self._limited = 0
        self._evidence = False
        self._mark = self.sent

    def _slow_down(self, now: float) -> None:
        """Halve the sending rate (from what is really sent, when that is less)."""
        current = self._send_rate(now)
        if self.throttle is None:
            limit = self.buckets.get("requests")
            if limit is not None:
                current = min(current, limit.rate) if current else limit.rate
            self._throttle_base = max(current, MIN_RATE)
            self.throttle = Bucket(self._throttle_base * 60.0, "429")
            current = self._throttle_base
        else:
            current = min(current, self.throttle.rate) if current else self.throttle.rate
        self.throttle.set_limit(max(MIN_RATE, current / 2) * 60.0)
        self.throttle.level = min(self.throttle.level, 0.0)
        self.active = True

    def _speed_up(self) -> None:
        """Double the throttle back; lift it once it is twice the rate that ran into the limit."""
        assert self.throttle is not None
        rate = self.throttle.rate * 2
        if rate >= 2 * self._throttle_base:
            self.throttle = None
            self._refresh_active()
        else:
            self.throttle.set_limit(rate * 60.0)

    def _refresh_active(self) -> None:
        """Whether workers must go through `acquire` (anything paces or holds the run)."""
        self.active = (
            bool(self.buckets)
            or self.throttle is not None
            or self._gate is not None
            or self.hold_until > time.monotonic()
        )

    def _send_rate(self, now: float) -> float:
        """Requests per second over the last few seconds."""
        mark_time, mark_sent = self._rate_mark
        if now - mark_time >= 0.5:
            self._recent_rate = (self.sent - mark_sent) / (now - mark_time)
            if now - mark_time >= 5.0:
                self._rate_mark = (now, self.sent)
        return self._recent_rate or (self.sent / max(now - mark_time, 1e-3))

    # -- display -------------------------------------------------------------------------------

    def status(self, window: float = 2.0) -> str:
        """`paced: 3,000 rpm` while a limit made requests wait lately, else ''."""
        now = time.monotonic()
        if now - self.paced_at > window:
            return ""
        if self.hold_until > now:
            return f"paced: holding {self.hold_until - now:.0f}s (Retry-After)"
        parts = [f"{b.per_minute:,.0f} {_SHORT[k]}" for k, b in self.buckets.items()]
        if self.throttle is not None:
            parts.append(f"{self.throttle.per_minute:,.0f} rpm after 429s")
        return "paced: " + ", ".join(parts) if parts else ""

    def describe(self) -> str:
        """The limits in force, for the end-of-run summary."""
        parts = [f"{b.per_minute:,.0f} {_SHORT[k]} ({b.source})" for k, b in self.buckets.items()]
        return ", ".join(parts)


def _family(headers: Mapping[str, str]) -> dict[str, tuple[str, ...]] | None:
    """Which provider's rate-limit headers an answer carries, if any."""
    if "x-ratelimit-limit-requests" in headers or "x-ratelimit-limit-tokens" in headers:
        return OPENAI_HEADERS
    if "anthropic-ratelimit-requests-limit" in headers:
        return ANTHROPIC_HEADERS
    return None


def spent(headers: Mapping[str, str], cost: Cost | None) -> bool:
    """Whether a 429's rate-limit headers say the budget is spent: for some kind of limit, less
    remains than the request costs (at least one request, or one token). Only then is the 429's
    `Retry-After` a limit of the whole run rather than of the request that got it."""
    family = _family(headers)
    if family is None:
        return False
    for kind, (_, remaining_name, _) in family.items():
        remaining = header_number(headers.get(remaining_name))
        need = getattr(cost, kind) if cost is not None else 0.0
        if remaining is not None and remaining < max(1.0, need):
            return True
    return False

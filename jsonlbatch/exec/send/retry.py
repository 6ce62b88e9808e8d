"""Which failures are worth another attempt, and how long to wait before it."""

from __future__ import annotations

import email.utils
import enum
import math
import random
import time
from collections.abc import Mapping


class Verdict(enum.Enum):
    OK = "ok"
    RETRY = "retry"  # transient: try again after a backoff
    FINAL = "final"  # this request will never succeed as sent: record it
    ABORT = "abort"  # nothing will succeed (bad credentials): stop the run


_CONTEXT_MARKERS = (
    "maximum context length",
    "context length",
    "context_length_exceeded",
    "prompt is too long",
    "too many tokens",
)


def classify(status: int, body: bytes) -> Verdict:
    """Sort an HTTP status into a verdict, as the OpenAI SDK and vLLM clients do.

    408, 409, 429 and 5xx are transient; 401/403 mean no request can succeed; every other 4xx is
    the request's own fault. A 400 saying the context is too long is final at once, whatever
    status a proxy dressed it in.
    """
    if 200 <= status < 300:
        return Verdict.OK
    if status in (401, 403):
        return Verdict.ABORT
    if status in (408, 409, 429) or (status >= 500 and not is_context_length_error(body)):
        return Verdict.RETRY
    return Verdict.FINAL


def is_context_length_error(body: bytes) -> bool:
    text = body[:4096].decode("utf-8", "replace").lower()
    return any(marker in text for marker in _CONTEXT_MARKERS)


#: The backoff doubles at most this many times: from `--backoff` (1 s) to 8 times it (8 s), as the
#: OpenAI SDK caps its own at 8 s. A batch's tail is the few requests that failed five or six
#: times in a row; doubling on to 60 s made that tail one request's 31 s of waiting.
DOUBLINGS = 3


def batch_cap(base: float) -> float:
    """The longest backoff for a run whose first retry waits `base`."""
    return base * 2**DOUBLINGS


class Backoff:
    """Exponential backoff with equal jitter: `base * 2**(attempt-1)`, capped, half of it random.

    Jitter keeps thousands of requests that failed together from retrying in lockstep.
    """

    def __init__(self, base: float = 1.0, cap: float = 60.0, rng: random.Random | None = None):
        self.base = base
        self.cap = cap
        self._rng = rng or random.Random()

    @property
    def longest_wait(self) -> float:
        """The longest `Retry-After` one request waits (five times the backoff cap); a group's
        `Retry-After` hold keeps a request no longer either (`rate_limits.RateLimiter`)."""
        return self.cap * 5

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based).

        A server's `Retry-After` says when this request may go again (it knows its own load):
        the wait is that, instead of the backoff, as the OpenAI SDK does; capped at five times
        the backoff cap so a misconfigured header cannot stall a run for hours. From the
        request's second attempt on, up to half the backoff's step is added at random: a
        request refused again although it waited contends with others that were told the same
        moment, and they must not all come back together again (a rate-limited server without
        learned limits was otherwise hammered, one request losing 100 times in a row). A
        `Retry-After` of 0 says nothing useful: the backoff applies.
        """
        step = min(self.cap, self.base * 2 ** min(max(0, attempt - 1), 60))
        if retry_after:
            wait = min(retry_after, self.longest_wait)
            return wait + self._rng.uniform(0, step / 2) if attempt > 1 else wait
        return step / 2 + self._rng.uniform(0, step / 2)


def retry_after_of(headers: Mapping[str, str]) -> float | None:
    """When the server says to try again, in seconds: `retry-after-ms` (OpenAI's and Azure's,
    finer) when it is a number, else `Retry-After` (seconds or an HTTP date)."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            value = float(millis)
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value / 1000.0
    return parse_retry_after(headers.get("Retry-After"))


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """`Retry-After` as seconds: either delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))

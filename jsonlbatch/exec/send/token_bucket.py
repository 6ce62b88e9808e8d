"""The token bucket every pace of exec is made of, and what one request takes from each kind.

A bucket is refilled continuously at its rate and holds `BURST_S` seconds of it, so a run never
sends a minute's worth at once (OpenAI enforces per-minute limits over shorter windows too).
`rate_limits.RateLimiter` keeps one per kind of limit; `--rpm`/`--tpm` buckets are shared by
every endpoint group of a run (`pacing.Pacing`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

BURST_S = 1.0  # a bucket holds this many seconds of its rate


@dataclass(slots=True)
class Cost:
    """What one request takes from each kind of bucket (tokens are estimates until settled)."""

    requests: float = 1.0
    tokens: float = 0.0
    input_tokens: float = 0.0
    output_tokens: float = 0.0

    @classmethod
    def of(cls, prompt: float, max_output: float) -> Cost:
        return cls(1.0, prompt + max_output, prompt, max_output)


class Bucket:
    """A continuously refilled token bucket of `rate` per second holding `BURST_S` of it.

    The level may go below zero (debt): a request costing more than the bucket holds is sent
    once the bucket is full, and the debt is repaid by waiting.
    """

    __slots__ = ("capacity", "level", "limit", "rate", "share", "source", "stamp")

    def __init__(self, per_minute: float, source: str, share: float = 1.0) -> None:
        self.source = source  # "--rpm", "headers", ...
        self.share = share  # of the limit that is used
        self.limit = self.rate = self.capacity = self.level = 0.0
        self.stamp = time.monotonic()
        self.set_limit(per_minute, fill=True)

    def set_limit(self, per_minute: float, fill: bool = False) -> None:
        self.refill(time.monotonic())
        self.limit = per_minute
        self.rate = per_minute * self.share / 60.0
        self.capacity = max(1.0, self.rate * BURST_S)
        self.level = self.capacity if fill else min(self.level, self.capacity)

    def refill(self, now: float) -> None:
        if now > self.stamp:
            self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
            self.stamp = now

    def wait_for(self, amount: float, now: float) -> float:
        """Seconds until `amount` may be taken (0 when it may be taken now)."""
        self.refill(now)
        need = min(amount, self.capacity)
        if self.level >= need or self.rate <= 0:
            return 0.0
        return (need - self.level) / self.rate

    @property
    def per_minute(self) -> float:
        """The limit (not the share of it that is used)."""
        return self.limit

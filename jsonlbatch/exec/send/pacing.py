"""Pacing per endpoint group: one model's 429s never hold another model's requests.

A provider limits what it serves together: a model's replicas behind one gateway, a host and
its key. Each endpoint pool of a run (`route/model_pools.py`: one per model in a fleet, one for
a plain run) is such a group and gets a `RateLimiter` of its own, so its 429 evidence, its
throttle, its `Retry-After` hold and the limits learned from its headers are its own: a model
whose gateway refuses everything is slowed and held while the others run at speed, and its
requests end with failure lines after their retries. `--rpm`/`--tpm` are the user's limits of
the whole run: their buckets are shared by every group.
"""

from __future__ import annotations

from collections.abc import Hashable

from jsonlbatch.exec.exec_options import ExecOptions
from jsonlbatch.exec.send.rate_limits import RateLimiter
from jsonlbatch.exec.send.retry import Backoff, batch_cap


class Pacing:
    """The run's rate limiters, one per endpoint group, created on a group's first request."""

    def __init__(
        self,
        rpm: float | None = None,
        tpm: float | None = None,
        learn: bool = True,
        *,
        hold_cap: float = float("inf"),
    ) -> None:
        self.learn = learn
        self.hold_cap = hold_cap
        self._user = RateLimiter(rpm, tpm, learn=False).buckets  # shared by every group
        self.groups: dict[Hashable, RateLimiter] = {}

    @classmethod
    def of(cls, opts: ExecOptions) -> Pacing:
        """A run's pacing: its `--rpm`/`--tpm`, `--rate-limits`, and a hold no longer than
        the longest `Retry-After` one request waits (`--backoff`)."""
        cap = batch_cap(opts.backoff_base) if opts.backoff_cap is None else opts.backoff_cap
        longest = Backoff(opts.backoff_base, cap).longest_wait
        return cls(opts.rpm, opts.tpm, learn=opts.rate_limits, hold_cap=longest)

    def group(self, key: Hashable) -> RateLimiter:
        """The limiter of endpoint group `key` (an endpoint pool)."""
        limiter = self.groups.get(key)
        if limiter is None:
            limiter = self.groups[key] = RateLimiter(
                learn=self.learn, shared=self._user, hold_cap=self.hold_cap
            )
        return limiter

    @property
    def rate_limited(self) -> int:
        """429s seen over every group."""
        return sum(limiter.rate_limited for limiter in self.groups.values())

    def describe(self) -> str:
        """The limits in force, for the end-of-run summary (a shared limit named once)."""
        limiters = list(self.groups.values()) or [RateLimiter(learn=False, shared=self._user)]
        parts = (part for limiter in limiters for part in limiter.describe().split(", "))
        return ", ".join(dict.fromkeys(part for part in parts if part))

    def status(self) -> str:
        """What paces the run now, for the progress bar (each group's, once)."""
        parts = dict.fromkeys(limiter.status() for limiter in self.groups.values())
        return "; ".join(part for part in parts if part)

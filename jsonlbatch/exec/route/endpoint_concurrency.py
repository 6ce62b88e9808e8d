"""How many requests one endpoint may have in flight: the concurrency controller of each endpoint.

The run has `--concurrency` workers; an endpoint takes a request only while its in-flight count
is under its controller's `limit`, so a controller can hold an endpoint below the workers'
number (an adaptive controller that backs off on 429s and latency growth, issue 24) without the
run loop knowing how it decides. `observe` sees every attempt's outcome on that endpoint.

The default, `FixedConcurrency`, never limits below the workers' number: today's behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class EndpointAttempt:
    """One attempt on an endpoint: `status` None for a transport error or a cut stream."""

    status: int | None
    latency_s: float
    rate_limited: bool = False


#: The name `EndpointAttempt` had before (a controller written to it still imports it).
Outcome = EndpointAttempt


class ConcurrencyController(Protocol):
    """Decides an endpoint's in-flight limit; read before each request is given to it."""

    @property
    def limit(self) -> int: ...

    def observe(self, attempt: EndpointAttempt, /) -> None: ...


class FixedConcurrency:
    """A constant limit (the run's `--concurrency`: never the one that binds)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("a concurrency limit must be at least 1")
        self.limit = limit

    def observe(self, attempt: EndpointAttempt, /) -> None:
        """A fixed limit learns nothing."""

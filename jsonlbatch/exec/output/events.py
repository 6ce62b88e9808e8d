"""The run's event stream: typed events that the progress bar, a viewer or a metrics exporter read.

The run loop says what happened (`Sent`, `Answered`, `Failed`, `Retried`, `RateLimited`, and a
`Snapshot` of the counters twice a second) and never who listens: the progress bar is one
subscriber among others, so a live viewer or a Prometheus exporter plugs in without a branch in
the loop. An event type nobody subscribed to is not even built (`EventBus.wants`), so the stream
costs nothing per request when only the progress bar listens to snapshots.

Subscribers are called synchronously on the event loop: keep them short (append to a queue,
bump a counter) and never block. An exception in a subscriber stops the run like a bug would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from jsonlbatch.exec.output.run_summary import RunSummary


@dataclass(frozen=True, slots=True)
class Sent:
    """An attempt went out: `attempt` is 1 for the first try."""

    custom_id: str
    endpoint: str
    attempt: int


@dataclass(frozen=True, slots=True)
class Answered:
    """A request's usable answer was written to the output (`metrics` as in its line)."""

    custom_id: str
    status: int
    metrics: dict[str, Any] = field(repr=False)


@dataclass(frozen=True, slots=True)
class Failed:
    """A request's failure was written to the output: it failed for good in this run."""

    custom_id: str
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Retried:
    """An attempt failed and the request is tried again after `delay_s` (0: at once)."""

    custom_id: str
    attempt: int
    reason: str
    delay_s: float


@dataclass(frozen=True, slots=True)
class RateLimited:
    """An endpoint answered 429; `retry_after` is its Retry-After in seconds, if it gave one."""

    custom_id: str
    endpoint: str
    retry_after: float | None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The run's counters now (every 0.5 s and once at the end): `summary` is the live summary,
    `status` what the run waits for (empty when sending), `extra` the pacing/spend line."""

    summary: RunSummary
    retrying: int
    status: str = ""
    extra: str = ""
    final: bool = False


Event = Sent | Answered | Failed | Retried | RateLimited | Snapshot
E = TypeVar("E", Sent, Answered, Failed, Retried, RateLimited, Snapshot)
Subscriber = Callable[[Any], None]


class EventBus:
    """Delivers each event to the subscribers of its type, in subscription order."""

    def __init__(self) -> None:
        self._subscribers: dict[type, list[Subscriber]] = {}

    def subscribe(self, callback: Callable[[E], None], *types: type[E]) -> None:
        """Call `callback(event)` for each event of `types` (all types when none is given)."""
        for kind in types or (Sent, Answered, Failed, Retried, RateLimited, Snapshot):
            self._subscribers.setdefault(kind, []).append(callback)

    def wants(self, kind: type) -> bool:
        """Whether anyone listens to `kind`: check before building an event on the hot path."""
        return kind in self._subscribers

    def emit(self, event: Event) -> None:
        for callback in self._subscribers.get(type(event), ()):
            callback(event)

"""`-c auto`: each endpoint's concurrency tuned to what its server can take.

A fixed `-c` is either too low (the server's batch is not full: throughput lost) or too high
(requests queue on the server: every request waits longer, and a slow replica gets as many as a
fast one). `AdaptiveConcurrency` is one endpoint's controller behind the concurrency seam
(`endpoint_concurrency.py`): the endpoint takes a request only while its in-flight count is under
`limit`. Every `TICK_S` it decides, from the best evidence it has:

- **the server's own gauges** (vLLM `vllm:num_requests_waiting` and `num_requests_running`,
  SGLang `sglang:num_queue_reqs` and `num_running_reqs`, read from `/metrics`): a queue longer
  than a small headroom (a 32nd of the limit, at least 2) in each of the last `WINDOW`
  scrapes means the batch is full, so the limit drops to the most that ran plus that headroom;
  a short queue while the limit binds lets it grow (at most every other scrape once the server
  was first found full). (One scrape is
  not enough: an engine admits waiting requests only at its next step.) The KV-cache gauge is read but
  does not steer: a full cache already shows as a queue (vLLM admits no request it cannot
  hold), and a prefix cache counts as used;
- **else latency and throughput**: growing while the mean latency stays within 1.5x of the
  best seen; shrinking when it passes 2x; a growth step that raised latency without raising
  throughput is taken back;
- **always**: a 429 or 503 on the endpoint cuts the limit to 70% (at most once per tick).

Growth doubles until the first sign of a full server (slow start: its first queue cuts at
once, as it is the overshoot itself), then adds a sixteenth. Each
endpoint has its own controller, so a slow replica ends with fewer requests than a fast one.
The controller knows nothing of the run, so a per-model pool can hold one per endpoint too.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import aiohttp

from jsonlbatch.exec.route.endpoint_concurrency import (
    ConcurrencyController,
    EndpointAttempt,
    FixedConcurrency,
)
from jsonlbatch.exec.route.server_metrics import ServerCounters, ServerLoad, fetch, load

if TYPE_CHECKING:
    from jsonlbatch.exec.route.endpoints import Endpoint

TICK_S = 0.5  # seconds between decisions (and /metrics scrapes)
WINDOW = 3  # scrapes a queue must last to count (engines admit requests at step boundaries)
START = 16  # the first limit: a cold server is not flooded before its signals are read
SHRINK_ON_OVERLOAD = 0.7
_OVERLOAD = frozenset({429, 503})


class AdaptiveConcurrency:
    """One endpoint's in-flight limit, tuned by its server's signals (module docstring)."""

    def __init__(self, maximum: int, start: int = START) -> None:
        self.maximum = max(1, maximum)
        self._limit = float(min(start, self.maximum))
        self._slow_start = True
        self._done = 0  # successful answers since the last latency decision ...
        self._latency = 0.0  # ... and their summed latency
        self._since = time.monotonic()
        self._overloaded = False
        self._baseline = math.inf  # the best mean latency seen (drifts up slowly)
        self._grew: tuple[float, float, float] | None = None  # (old limit, rate, mean) before
        #: (waiting, running) of the server's last scrapes since the limit last changed
        self._recent: deque[tuple[float, float]] = deque(maxlen=WINDOW)

    @property
    def limit(self) -> int:
        return max(1, int(self._limit))

    def observe(self, attempt: EndpointAttempt, /) -> None:
        if attempt.status in _OVERLOAD or attempt.rate_limited:
            self._overloaded = True
        elif attempt.status is not None and attempt.status < 300:
            self._done += 1
            self._latency += attempt.latency_s

    def _set(self, limit: float) -> None:
        self._limit = min(float(self.maximum), max(1.0, limit))

    def _grow(self) -> None:
        self._set(self._limit * 2 if self._slow_start else self._limit + max(1.0, self._limit / 16))

    def _full(self, limit: float) -> None:
        self._slow_start = False
        self._grew = None
        self._set(limit)

    def decide(self, server: ServerLoad | None, in_flight: int) -> None:
        """One decision, from the server's gauges (None: from latency) and what is in flight."""
        if self._overloaded:
            self._overloaded = False
            self._full(self._limit * SHRINK_ON_OVERLOAD)
            return
        binding = in_flight >= self.limit - max(1, self.limit // 8)
        if server is not None:
            self._done, self._latency = 0, 0.0
            self._recent.append((server.waiting, server.running or 0.0))
            # A queue that lasts the whole window, not one caught between two engine steps.
            queued = min(w for w, _ in self._recent)
            peak = max(r for _, r in self._recent)
            headroom = max(2.0, self._limit / 32)
            # While doubling, a queue is the overshoot itself: cut at once.
            lasting = len(self._recent) >= (1 if self._slow_start else WINDOW)
            if queued > headroom and lasting:
                self._full(min(self._limit, peak + headroom) if peak else self._limit * 0.8)
                self._recent.clear()
            elif binding and queued <= headroom / 2 and len(self._recent) >= 2 - self._slow_start:
                self._grow()
                self._recent.clear()
            return
        self._by_latency(binding)

    def _by_latency(self, binding: bool) -> None:
        now = time.monotonic()
        if self._done < max(8, self.limit // 2):
            return  # too few answers yet to tell
        mean, rate = self._latency / self._done, self._done / max(now - self._since, 1e-3)
        self._done, self._latency, self._since = 0, 0.0, now
        self._baseline = min(self._baseline * 1.02, mean)
        grew, self._grew = self._grew, None
        if grew is not None and rate < grew[1] * 1.03 and mean > grew[2] * 1.1:
            self._full(grew[0])  # more in flight only made each request slower
        elif mean > 2 * self._baseline:
            self._full(self._limit * 0.8)
        elif binding and mean <= 1.5 * self._baseline:
            self._grew = (self._limit, rate, mean)
            self._grow()

    async def watch(
        self,
        session: aiohttp.ClientSession,
        endpoint: Endpoint,
        headers: Mapping[str, str],
        metrics: bool,
    ) -> None:
        """Decide every `TICK_S`, reading the server's `/metrics` first when it has them."""
        url = endpoint.root_url("/metrics")
        while True:
            await asyncio.sleep(TICK_S)
            server = None
            if metrics:
                samples = await fetch(session, url, headers, endpoint.proxy)
                server = load(samples) if samples is not None else None
            self.decide(server, endpoint.in_flight)


def wants_auto(concurrency: int | str | None, endpoint: Endpoint, kind: str | None) -> bool:
    """`-c auto`; or no `-c` and a server this run launched or one with vLLM/SGLang metrics."""
    if concurrency == "auto":
        return True
    return concurrency is None and (endpoint.launched or kind is not None)


def start(
    concurrency: int | str | None,
    maximum: int,
    endpoints: Sequence[Endpoint],
    scraped: Sequence[ServerCounters | None],
    session: aiohttp.ClientSession,
    headers: Mapping[Endpoint, Mapping[str, str]],
) -> list[asyncio.Task[None]]:
    """Give the endpoints that want it an adaptive controller and start its decisions; the
    tasks are the caller's to cancel."""
    tasks = []
    for ep, found in zip(endpoints, scraped, strict=True):
        if wants_auto(concurrency, ep, found.kind if found is not None else None):
            controller = AdaptiveConcurrency(maximum)
            ep.controller = controller
            watch = controller.watch(session, ep, headers[ep], metrics=found is not None)
            tasks.append(asyncio.ensure_future(watch))
    return tasks


def shown(endpoints: Sequence[Endpoint]) -> str:
    """`c=24/31` (each adaptive endpoint's limit, in `--url` order) for the progress bar."""
    limits = [ep.controller.limit for ep in endpoints if is_adaptive(ep.controller)]
    return f"c={'/'.join(map(str, limits))}" if limits else ""


def is_adaptive(controller: ConcurrencyController) -> bool:
    return not isinstance(controller, FixedConcurrency)

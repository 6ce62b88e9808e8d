"""Sending one request: admitted by the meter and its pool, then attempted until it has a result.

`Sender.send` is one request's whole life on the wire: its pool (by `body.model`) and the
pool's in-flight cap, the meter (`--max-cost`), then attempts in three layers, as httpx splits
auth, redirects and the transport:

- the retry policy (`Sender._attempts`): counts attempts, and after each decides (from what
  `transport.assess` says it means) to keep the result, show the answer to the on-answer check
  (which may accept, reject or re-ask), fit the request to the context, or retry after a
  backoff or the server's `Retry-After`;
- the endpoint (`Sender._try`): paced by the meter's rate limits, an endpoint chosen by the
  pool's router, one exchange on it, and its health, its concurrency controller and the meter
  told what came back. A refused connection is the server's absence, not the request's fault,
  and a kept-alive connection closed under a request (once) is a race: both are sent again
  here and cost no attempt;
- the transport (`transport.Transport.post`): one POST and its answer read whole.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from jsonlbatch.batch_format.records import Request, Result
from jsonlbatch.errors import AuthenticationError
from jsonlbatch.exec.exec_options import ExecOptions
from jsonlbatch.exec.hooks.check_hook import (
    Accept,
    AskAgain,
    Check,
    CheckVerdict,
    begin,
    end,
    refused,
)
from jsonlbatch.exec.hooks.contract_check import fit_to_context
from jsonlbatch.exec.output.events import EventBus, RateLimited, Retried, Sent
from jsonlbatch.exec.output.run_summary import RunSummary
from jsonlbatch.exec.route.endpoint_concurrency import EndpointAttempt
from jsonlbatch.exec.route.endpoint_pool import EndpointPool
from jsonlbatch.exec.route.endpoints import Endpoint
from jsonlbatch.exec.route.model_pools import ModelPools
from jsonlbatch.exec.send.budget import BudgetReached, Meter, Ticket
from jsonlbatch.exec.send.hosted_files import HostedFiles
from jsonlbatch.exec.send.priority import Payloads
from jsonlbatch.exec.send.retry import Backoff, batch_cap
from jsonlbatch.exec.send.streaming import STREAM_URLS, stream_body
from jsonlbatch.exec.send.transport import Assessed, Broken, Health, Next, Transport, assess


class Stop(Exception):
    """Raised inside a worker to drop its request unwritten (the run is stopping)."""


@dataclass(slots=True)
class Asking:
    """A request as it is being sent: its body (which a re-ask or `--fit-context` replaces) and
    what follows from it."""

    req: Request
    payloads: Payloads  # the body's bytes, per server's priority terms
    route_key: Any  # the router's key (a prompt prefix)
    streaming: bool
    raced: bool = False  # a kept-alive connection already closed under it once


@dataclass(slots=True)
class Tried:
    """One attempt, assessed, on the endpoint that made it."""

    endpoint: Endpoint
    assessed: Assessed


class Sender:
    """Sends requests for one run; `stopping` is the run's "send nothing more" flag."""

    def __init__(
        self,
        *,
        opts: ExecOptions,
        session: aiohttp.ClientSession,
        pools: ModelPools,
        meter: Meter,
        stopping: asyncio.Event,
        summary: RunSummary,
        bus: EventBus,
        check: Check | None = None,
        files: HostedFiles | None = None,
    ) -> None:
        self.opts = opts
        self.pools = pools
        self.meter = meter
        self.stopping = stopping
        self.summary = summary
        self.bus = bus
        self.check = check
        self.files = files  # file:// uploads, --files-dir (hosted_files.py)
        cap = batch_cap(opts.backoff_base) if opts.backoff_cap is None else opts.backoff_cap
        self.backoff = Backoff(opts.backoff_base, cap)
        self.transport = Transport(session, timeout=opts.timeout, limit=opts.max_response_bytes,
                                   stall=opts.stream_stall_timeout)  # fmt: skip
        self.retrying = 0  # requests waiting out a backoff now
        self._fitted: dict[str, dict[str, int]] = {}  # --fit-context: custom_id -> what it did

    async def send(self, req: Request) -> Result:
        """One request, admitted (its pool's cap, the meter) and attempted. Raises `Stop` when
        the run stops first, or `BudgetReached` when `--max-cost` allows no more."""
        pool = self.pools.route(req.body)
        cap = self.pools.cap(pool)
        if cap is not None:
            await cap.acquire()
        try:
            ticket = await self.meter.start(req, pool)  # BudgetReached: the caller stops the run
            try:
                result = await self._attempts(begin(self.check, req), pool, ticket)
            except BaseException:
                self.meter.abandon(ticket)
                raise
            finally:
                end(self.check, req)
                if self.files is not None:
                    self.files.end(req)
                fitted = self._fitted.pop(req.custom_id, None)
            if fitted is not None:
                result.metrics["fit_context"] = fitted
            self.meter.finish(ticket, result)
            return result
        finally:
            if cap is not None:
                cap.release()

    # -- the retry policy ----------------------------------------------------------------------

    async def _attempts(self, req: Request, pool: EndpointPool, ticket: Ticket) -> Result:
        """Send one request until it succeeds, fails for good, or runs out of retries."""
        if self.files is not None:  # its file:// references uploaded, their ids in place
            prepared = await self.files.prepare(req, pool)
            if isinstance(prepared, Result):
                return prepared
            req = prepared
        asking = self._asking(req, pool)
        attempt = 0
        failed_on: set[Endpoint] = set()  # its retries go elsewhere while there is an elsewhere
        while True:
            attempt += 1
            tried = await self._try(asking, pool, ticket, attempt, failed_on)
            assessed = tried.assessed
            result = assessed.result
            nxt = assessed.next
            if nxt is Next.ANSWER:
                assert assessed.answer is not None
                verdict: CheckVerdict | None = None
                if self.files is not None:  # its files collected before the container expires
                    verdict = await self.files.on_answer(assessed.answer, tried.endpoint, pool)
                if verdict is None and self.check is not None:
                    verdict = self.check(assessed.answer)
                if verdict is None or isinstance(verdict, Accept):
                    return result
                result = refused(result, verdict, attempt)
                if not isinstance(verdict, AskAgain) or attempt > self.opts.max_retries:
                    return result
                req = asking.req
                req = Request(
                    req.custom_id, req.url, verdict.body, req.line,
                    fingerprint=req.fingerprint, priority=req.priority,
                )  # fmt: skip
                asking = self._asking(req, pool, asking.raced)
                await self._retry(req, attempt, verdict.reason, 0.0)
            elif nxt is Next.RETRY:
                failed_on.add(tried.endpoint)
                extra = attempt - self.opts.max_retries
                if extra > 0 and not pool.untried(failed_on, extra):
                    return result  # out of retries, and no replica it has not failed on is up
                # a set-aside endpoint is waited for in acquire() instead
                up = tried.endpoint.up
                delay = self.backoff.delay(attempt, assessed.retry_after) if up else 0.0
                reason = (result.error or {}).get("code", "error")
                await self._retry(asking.req, attempt, reason, delay)
            elif nxt is Next.FINAL:
                fit = self._fit(asking.req, result)
                if fit is None:
                    return result
                asking = self._asking(fit, pool, asking.raced)
                await self._retry(fit, attempt, "context_length", 0.0)
            elif nxt is Next.KEEP:  # the same request would get the same answer
                return result
            else:
                raise AuthenticationError(
                    f"{tried.endpoint.name} rejected the credentials (HTTP "
                    f"{result.status_code}); check --api-key or OPENAI_API_KEY. Nothing more "
                    "was sent; re-run to resume"
                )

    def _asking(self, req: Request, pool: EndpointPool, raced: bool = False) -> Asking:
        """A new body's payloads (per server's priority terms), route key and streaming flag
        (`--stream` applied to it)."""
        if self.opts.stream and req.url in STREAM_URLS:
            stream_body(req.body)
        priority = req.priority if req.priority is not None else self.opts.priority
        return Asking(
            req=req,
            payloads=Payloads(req.body, priority),
            route_key=pool.router.key(req.body),
            streaming=req.body.get("stream") is True,
            raced=raced,
        )

    def _fit(self, req: Request, result: Result) -> Request | None:
        """With --fit-context, once per request: the request with `max_tokens` cut to what the
        context has room for, when `result` is a refusal saying how much (contract_check.py)."""
        if not self.opts.fit_context or req.custom_id in self._fitted:
            return None
        found = fit_to_context(req.url, req.body, result.body)
        if found is None:
            return None
        body, self._fitted[req.custom_id] = found
        return Request(
            req.custom_id, req.url, body, req.line, fingerprint=req.fingerprint,
            priority=req.priority,
        )  # fmt: skip

    async def _retry(self, req: Request, attempts: int, reason: str, delay: float) -> None:
        self.summary.retries += 1
        if self.bus.wants(Retried):
            self.bus.emit(Retried(req.custom_id, attempts, reason, delay))
        if delay > 0:
            await self._pause(delay)

    async def _pause(self, seconds: float) -> None:
        """Back off before a retry; give up at once if the run is stopping."""
        self.retrying += 1
        try:
            await asyncio.wait_for(self.stopping.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            return
        finally:
            self.retrying -= 1
        raise Stop

    # -- the endpoint --------------------------------------------------------------------------

    async def _try(
        self,
        asking: Asking,
        pool: EndpointPool,
        ticket: Ticket,
        attempt: int,
        failed_on: set[Endpoint],
    ) -> Tried:
        """Attempt number `attempt`: paced, sent on the endpoint the pool chooses, and accounted
        to that endpoint and the meter. Sent again without counting an attempt while the server
        is absent (the endpoint is set aside and waited for in `acquire`), and once after a
        kept-alive connection closed under the request."""
        req = asking.req
        while True:
            await self.meter.before_send(ticket)
            endpoint = await pool.acquire(asking.route_key, failed_on)
            if self.stopping.is_set():
                pool.release(endpoint)
                raise Stop
            if self.bus.wants(Sent):
                self.bus.emit(Sent(req.custom_id, endpoint.name, attempt))
            start_wall, start = time.time(), time.perf_counter()
            try:
                got = await self.transport.post(
                    endpoint, req.url, asking.payloads.for_sign(endpoint.priority_sign),
                    pool.headers[endpoint], asking.streaming,
                )  # fmt: skip
            finally:
                pool.release(endpoint)
            retry_after = None
            if isinstance(got, Broken):
                self.meter.no_answer(ticket)
                if got.absent:  # refused, unresolvable or silent: not this request's fault
                    pool.set_aside(endpoint, got.message)
                    continue
                if got.disconnected and not asking.raced:
                    asking.raced = True
                    continue
            else:
                retry_after = got.retry_after
                self.meter.after_answer(ticket, got.status, got.headers, retry_after)
            end = time.perf_counter()
            status = got.status
            endpoint.controller.observe(EndpointAttempt(status, end - start, status == 429))
            if status == 429 and self.bus.wants(RateLimited):
                self.bus.emit(RateLimited(req.custom_id, endpoint.name, retry_after))
            metrics: dict[str, Any] = {
                "attempts": attempt,
                "endpoint": endpoint.name,
                "start_time": round(start_wall, 6),
                "latency_s": round(end - start, 6),
            }
            assessed = assess(req, got, metrics, start, end)
            health = assessed.health
            if health is Health.GOOD:
                pool.record_success(endpoint)
            elif health is Health.FAULT:
                pool.record_failure(endpoint, assessed.fault)
            elif health is Health.BUSY:  # starting or overloaded: probe /health until ready
                pool.set_aside(endpoint, "HTTP 503 (starting or overloaded)")
            return Tried(endpoint, assessed)


__all__ = ["BudgetReached", "Sender", "Stop"]

"""Sending one request: admitted by the meter and its pool, then attempted until it has a result.

`Sender.send` is one request's whole life on the wire: its pool (by `body.model`) and the
pool's in-flight cap, the meter (rate limits and `--max-cost`), then attempts on the endpoints
the pool's router picks. An attempt ends in a usable answer (shown to the on-answer check, which
may accept, reject or re-ask), a final failure, or a retry after a backoff; a refused connection
is the server's absence, not the request's fault, and costs no attempt.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from jsonlbatch.answers import unusable_reason
from jsonlbatch.errors import AuthenticationError
from jsonlbatch.exec.answer_check import fit_to_context
from jsonlbatch.exec.bodies import TOO_LARGE, read_answer, read_body
from jsonlbatch.exec.budget import BudgetReached, Meter, Ticket
from jsonlbatch.exec.checks import Accept, Answer, AnswerCheck, AskAgain, begin, end, refused
from jsonlbatch.exec.concurrency import Outcome
from jsonlbatch.exec.endpoint_pool import EndpointPool
from jsonlbatch.exec.endpoints import describe_exception
from jsonlbatch.exec.events import EventBus, RateLimited, Retried, Sent
from jsonlbatch.exec.options import ExecOptions
from jsonlbatch.exec.pools import ModelPools
from jsonlbatch.exec.priority import Payloads
from jsonlbatch.exec.results import http_result
from jsonlbatch.exec.retry import Backoff, Verdict, batch_cap, retry_after_of
from jsonlbatch.exec.streaming import STREAM_URLS, StreamError, StreamReader, stream_body
from jsonlbatch.exec.summary import RunSummary
from jsonlbatch.records import COMPLETIONS_URL, Request, Result
from jsonlbatch.redact import redact


class Stop(Exception):
    """Raised inside a worker to drop its request unwritten (the run is stopping)."""


class Sender:
    """Sends requests for one run; `stopping` is the run's "send nothing more" flag."""

    def __init__(
        self,
        opts: ExecOptions,
        session: aiohttp.ClientSession,
        pools: ModelPools,
        meter: Meter,
        stopping: asyncio.Event,
        summary: RunSummary,
        bus: EventBus,
        check: AnswerCheck | None = None,
    ) -> None:
        self.opts = opts
        self.session = session
        self.pools = pools
        self.meter = meter
        self.stopping = stopping
        self.summary = summary
        self.bus = bus
        self.check = check
        cap = batch_cap(opts.backoff_base) if opts.backoff_cap is None else opts.backoff_cap
        self.backoff = Backoff(opts.backoff_base, cap)
        self.timeout = aiohttp.ClientTimeout(total=opts.timeout, sock_connect=30)
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
            ticket = await self.meter.start(req)  # BudgetReached: the caller stops the run
            try:
                result = await self._attempts(begin(self.check, req), pool, ticket)
            except BaseException:
                self.meter.abandon(ticket)
                raise
            finally:
                end(self.check, req)
                fitted = self._fitted.pop(req.custom_id, None)
            if fitted is not None:
                result.metrics["fit_context"] = fitted
            self.meter.finish(ticket, result)
            return result
        finally:
            if cap is not None:
                cap.release()

    async def _attempts(self, req: Request, pool: EndpointPool, ticket: Ticket) -> Result:
        """Send one request until it succeeds, fails for good, or runs out of retries."""
        payloads, route_key, streaming = self._prepared(req, pool)
        attempts = 0
        raced = False
        while True:
            await self.meter.before_send(ticket)
            endpoint = await pool.acquire(route_key)
            if self.stopping.is_set():
                pool.release(endpoint)
                raise Stop
            attempts += 1
            if self.bus.wants(Sent):
                self.bus.emit(Sent(req.custom_id, endpoint.name, attempts))
            start_wall, start = time.time(), time.perf_counter()
            retry_after = None
            failure: tuple[str, str] | None
            streamed: StreamReader | None = None
            status: int | None = None
            try:
                async with self.session.post(
                    endpoint.target(req.url),
                    data=payloads.for_sign(endpoint.priority_sign),
                    headers=pool.headers[endpoint],
                    proxy=endpoint.proxy,
                    timeout=self.timeout,
                    allow_redirects=False,  # a redirect could carry our credentials elsewhere
                ) as resp:
                    status = resp.status
                    limit = self.opts.max_response_bytes
                    if status == 200 and (streaming or resp.content_type == "text/event-stream"):
                        raw, streamed = await read_answer(
                            resp.content.iter_any(),
                            chat=req.url != COMPLETIONS_URL,
                            limit=limit,
                            stall=self.opts.stream_stall_timeout,
                        )
                    else:
                        raw = await read_body(resp.content.iter_any(), limit, resp.content_length)
                    request_id = resp.headers.get("x-request-id")
                    if status == 429 or status >= 500:
                        retry_after = retry_after_of(resp.headers)
                    self.meter.after_answer(ticket, status, resp.headers, retry_after)
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
                # Refused, unresolvable or silent: the server is down or cold, not this
                # request's fault. Wait for it without using an attempt.
                pool.set_aside(endpoint, describe_exception(exc))
                attempts -= 1
                continue
            except aiohttp.ServerDisconnectedError as exc:
                if not raced:  # a keep-alive connection closed under us: not an attempt
                    raced = True
                    attempts -= 1
                    continue
                failure = ("connection_error", describe_exception(exc))
            except asyncio.TimeoutError:
                failure = ("request_timeout", f"no response within {self.opts.timeout:g}s")
            except StreamError as exc:  # an error event or a cut stream after a 200
                failure = (exc.code, str(exc))
            except (aiohttp.ClientError, OSError) as exc:
                failure = ("connection_error", describe_exception(exc))
            else:
                failure = None
            finally:
                pool.release(endpoint)
            end = time.perf_counter()
            endpoint.controller.observe(Outcome(status, end - start, status == 429))
            if status == 429 and self.bus.wants(RateLimited):
                self.bus.emit(RateLimited(req.custom_id, endpoint.name, retry_after))
            metrics: dict[str, Any] = {
                "attempts": attempts,
                "endpoint": endpoint.name,
                "start_time": round(start_wall, 6),
                "latency_s": round(end - start, 6),
            }
            answer: Answer | None = None
            if failure is None and streamed is not None:
                body = streamed.body()
                reason = unusable_reason(req.url, body)
                if reason is None:
                    metrics.update(streamed.metrics(start, end))
                    pool.record_success(endpoint)
                    result = Result(
                        req.custom_id, status, body, request_id or body["id"], None, metrics
                    )
                    answer = Answer(req, result, decoded=body)
                else:
                    failure = (
                        "invalid_response",
                        f"HTTP {status} stream without an answer ({reason})",
                    )
            if answer is None and failure is None:
                assert status is not None
                result, verdict = http_result(req, status, raw, request_id, metrics)
                if verdict is Verdict.OK:
                    pool.record_success(endpoint)
                    answer = Answer(req, result, raw=raw)
                elif verdict is Verdict.ABORT:
                    raise AuthenticationError(
                        f"{endpoint.name} rejected the credentials (HTTP {status}); check "
                        "--api-key or OPENAI_API_KEY. Nothing more was sent; re-run to resume"
                    )
                elif verdict is Verdict.FINAL:
                    fit = self._fit(req, result)
                    if fit is None:
                        return result
                    req = fit
                    payloads, route_key, streaming = self._prepared(req, pool)
                    await self._retry(req, attempts, "context_length", 0.0)
                    continue
                elif status == 503:  # starting or overloaded: probe /health until it is ready
                    pool.set_aside(endpoint, "HTTP 503 (starting or overloaded)")
                elif status >= 500 or result.status_code is None:  # 5xx, or a 2xx no answer
                    pool.record_failure(endpoint, f"HTTP {status}")
            elif failure is not None:
                code, message = failure
                pool.record_failure(endpoint, message)
                result = Result(
                    req.custom_id, None, error={"code": code, "message": redact(message)}
                )
                result.metrics = metrics
                if code == TOO_LARGE:  # the same request would get the same answer
                    return result
            if answer is not None:
                if self.check is None:
                    return result
                verdict_of_check = self.check(answer)
                if isinstance(verdict_of_check, Accept):
                    return result
                result = refused(result, verdict_of_check, attempts)
                if not isinstance(verdict_of_check, AskAgain) or attempts > self.opts.max_retries:
                    return result
                req = Request(
                    req.custom_id, req.url, verdict_of_check.body, req.line,
                    fingerprint=req.fingerprint, priority=req.priority,
                )  # fmt: skip
                payloads, route_key, streaming = self._prepared(req, pool)
                await self._retry(req, attempts, verdict_of_check.reason, 0.0)
                continue
            if attempts > self.opts.max_retries:
                return result
            # a set-aside endpoint is waited for in acquire() instead
            delay = self.backoff.delay(attempts, retry_after) if endpoint.up else 0.0
            reason = (result.error or {}).get("code", "error")
            await self._retry(req, attempts, reason, delay)

    def _prepared(self, req: Request, pool: EndpointPool) -> tuple[Payloads, Any, bool]:
        """A new body's payloads (per server's priority terms), route key and streaming flag
        (`--stream` applied to it)."""
        if self.opts.stream and req.url in STREAM_URLS:
            stream_body(req.body)
        priority = req.priority if req.priority is not None else self.opts.priority
        payloads = Payloads(req.body, priority)
        return payloads, pool.router.key(req.body), req.body.get("stream") is True

    def _fit(self, req: Request, result: Result) -> Request | None:
        """With --fit-context, once per request: the request with `max_tokens` cut to what the
        context has room for, when `result` is a refusal saying how much (answer_check.py)."""
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


__all__ = ["BudgetReached", "Sender", "Stop"]

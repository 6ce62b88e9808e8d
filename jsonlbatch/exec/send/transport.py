"""One attempt on the wire, and what its answer means for the request.

The bottom layer of sending (`sender.py` holds the two above it: the retry policy, and the
endpoint choice with its accounting), as httpx keeps its transport apart from auth and
redirects. `Transport.post` sends one POST and reads its answer whole; every way it can fail is
a `Broken` value, not an exception, so the layers above never sort aiohttp's exception classes.
`assess` turns what came back into the request's `Result` and says what happens next (`Next`)
and what it tells about the endpoint's health (`Health`), without touching either: the layers
above act on it. Both are small enough to test alone (tests/test_send_layers.py).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from jsonlbatch.batch_format.answers import unusable_reason
from jsonlbatch.batch_format.records import COMPLETIONS_URL, Request, Result
from jsonlbatch.exec.hooks.check_hook import AnswerToCheck
from jsonlbatch.exec.route.endpoints import Endpoint, describe_exception
from jsonlbatch.exec.send.body_caps import TOO_LARGE, read_answer, read_body
from jsonlbatch.exec.send.http_reply import http_result
from jsonlbatch.exec.send.retry import Verdict, retry_after_of
from jsonlbatch.exec.send.streaming import StreamError, StreamReader
from jsonlbatch.redact import redact


@dataclass(slots=True)
class Reply:
    """An HTTP answer, read whole: its body (`raw`), or for an event stream its reader."""

    status: int
    raw: bytes
    streamed: StreamReader | None
    request_id: str | None
    headers: Mapping[str, str]
    retry_after: float | None  # seconds, on a 429 or 5xx that said when to come back


@dataclass(slots=True)
class Broken:
    """An attempt without a whole answer: `status` is the one seen before the body broke off."""

    code: str  # connection_error, request_timeout, a stream's error code, response_too_large
    message: str
    status: int | None = None
    absent: bool = False  # refused, unresolvable or silent: the server is not there (yet)
    disconnected: bool = False  # the server closed the connection (maybe a kept-alive one)


class Transport:
    """Sends one POST on a run's session and reads its answer (`opts` of the run, as numbers)."""

    def __init__(
        self, session: aiohttp.ClientSession, *, timeout: float, limit: int, stall: float
    ) -> None:
        self.session = session
        self.seconds = timeout
        self.timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=30)
        self.limit = limit  # bytes of one answer, decoded
        self.stall = stall  # seconds a stream may go without output

    async def post(
        self,
        endpoint: Endpoint,
        url: str,
        data: bytes,
        headers: Mapping[str, str],
        streaming: bool,
    ) -> Reply | Broken:
        """POST `data` to `endpoint`'s address for `url`; the answer, or why there is none."""
        status: int | None = None
        try:
            async with self.session.post(
                endpoint.target(url),
                data=data,
                headers=headers,
                proxy=endpoint.proxy,
                timeout=self.timeout,
                allow_redirects=False,  # a redirect could carry our credentials elsewhere
            ) as resp:
                status = resp.status
                streamed: StreamReader | None = None
                if status == 200 and (streaming or resp.content_type == "text/event-stream"):
                    raw, streamed = await read_answer(
                        resp.content.iter_any(),
                        chat=url != COMPLETIONS_URL,
                        limit=self.limit,
                        stall=self.stall,
                    )
                elif _plain_within(resp, self.limit):
                    raw = await resp.read()  # its length is known and not encoded: one read
                else:
                    raw = await read_body(resp.content.iter_any(), self.limit, resp.content_length)
                said = resp.headers
                return Reply(
                    status=status,
                    raw=raw,
                    streamed=streamed,
                    request_id=said.get("x-request-id"),
                    headers=said,
                    retry_after=retry_after_of(said) if status == 429 or status >= 500 else None,
                )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            return Broken("connection_error", describe_exception(exc), absent=True)
        except aiohttp.ServerDisconnectedError as exc:
            return Broken("connection_error", describe_exception(exc), status, disconnected=True)
        except asyncio.TimeoutError:
            return Broken("request_timeout", f"no response within {self.seconds:g}s", status)
        except StreamError as exc:  # an error event, a cut stream or an answer too large
            return Broken(exc.code, str(exc), status)
        except (aiohttp.ClientError, OSError) as exc:
            return Broken("connection_error", describe_exception(exc), status)


def _plain_within(resp: aiohttp.ClientResponse, limit: int) -> bool:
    """The body is `Content-Length` bytes as they are, at most `limit`: aiohttp reads no more
    than that, so the whole body can be read at once. A compressed body can inflate past its
    Content-Length, and one without it can be any size: those are read chunk by chunk."""
    length = resp.content_length
    return length is not None and length <= limit and "Content-Encoding" not in resp.headers


class Next(enum.Enum):
    """What the retry policy does after an attempt."""

    ANSWER = "answer"  # a usable answer: shown to the on-answer check, then kept
    RETRY = "retry"  # a passing failure: again after a backoff, while attempts are left
    FINAL = "final"  # the request's own fault (4xx): kept as it is, unless it can be fitted
    KEEP = "keep"  # a failure the same request would meet again (an answer too large)
    ABORT = "abort"  # the credentials were refused: nothing will succeed


class Health(enum.Enum):
    """What an attempt says about its endpoint."""

    GOOD = "good"  # answered: its run of failures is over
    SAME = "same"  # the request's own fault or a rate limit: nothing about the server
    FAULT = "fault"  # a server-side failure, counted towards setting it aside
    BUSY = "busy"  # a 503 (starting or overloaded): set aside and probed until ready


@dataclass(slots=True)
class Assessed:
    """An attempt's `result` (the line it would make), and what it means."""

    result: Result
    next: Next
    health: Health
    answer: AnswerToCheck | None = None
    retry_after: float | None = None
    fault: str = ""  # why the endpoint failed, when `health` is FAULT


def assess(
    req: Request, got: Reply | Broken, metrics: dict[str, Any], start: float, end: float
) -> Assessed:
    """What an attempt's answer (or its failure) means for `req`; `metrics` go in its result,
    `start` and `end` are the attempt's `time.perf_counter()` times (for a stream's timings)."""
    if isinstance(got, Broken):
        result = _failure(req, got.code, got.message, metrics)
        nxt = Next.KEEP if got.code == TOO_LARGE else Next.RETRY
        return Assessed(result, nxt, Health.FAULT, fault=got.message)
    status, streamed = got.status, got.streamed
    if streamed is not None:
        body = streamed.body()
        reason = unusable_reason(req.url, body)
        if reason is None:
            metrics.update(streamed.metrics(start, end))
            result = Result(req.custom_id, status, body, got.request_id or body["id"], None,
                            metrics)  # fmt: skip
            return Assessed(
                result, Next.ANSWER, Health.GOOD, AnswerToCheck(req, result, decoded=body)
            )
        message = f"HTTP {status} stream without an answer ({reason})"
        result = _failure(req, "invalid_response", message, metrics)
        return Assessed(result, Next.RETRY, Health.FAULT, fault=message)
    result, verdict = http_result(req, status, got.raw, got.request_id, metrics)
    if verdict is Verdict.OK:
        return Assessed(result, Next.ANSWER, Health.GOOD, AnswerToCheck(req, result, raw=got.raw))
    if verdict is Verdict.ABORT:
        return Assessed(result, Next.ABORT, Health.SAME)
    if verdict is Verdict.FINAL:
        return Assessed(result, Next.FINAL, Health.SAME)
    if status == 503:
        health = Health.BUSY
    elif status >= 500 or result.status_code is None:  # 5xx, or a 2xx without an answer
        health = Health.FAULT
    else:  # 408, 409, 429
        health = Health.SAME
    return Assessed(result, Next.RETRY, health, retry_after=got.retry_after, fault=f"HTTP {status}")


def _failure(req: Request, code: str, message: str, metrics: dict[str, Any]) -> Result:
    """A line without an answer (so a resume sends the request again)."""
    error = {"code": code, "message": redact(message)}
    return Result(req.custom_id, None, error=error, metrics=metrics)

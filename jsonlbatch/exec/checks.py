"""The on-answer check: a caller's rule that sees each usable answer and may refuse it or ask again.

The executor decides what a *usable* answer is (`answers.py`: the endpoint's shape); a check
decides whether it is a *good* one for this caller (an answer contract, a JSON schema). It is
called once per usable answer, with the request as sent, and returns a verdict:

- `Accept()`: write the answer (the default when no check is installed);
- `Reject(reason)`: write a failure line (`error.code` = `code`, "check_failed" by default)
  without the answer (with `keep=True`, with it: its status and body stay beside the error),
  so `--retry-failed` sends the request again later;
- `AskAgain(body, reason)`: send the request again now with `body` (for instance the
  conversation plus "your answer did not match the schema: ..."); a re-ask uses an attempt, so
  `--max-retries` bounds them, and the last refusal is written as its `otherwise` (a `Reject`)
  says, else as a plain `Reject` would be.

A check that keeps state across one request's asks may also define `begin(request) -> Request`
(called before the first attempt; returns the request to send, e.g. a re-ask resumed from a
journal) and `end(request)` (called once the request's result is made, whatever it is);
`chain` runs several checks as one.

The output line keeps the fingerprint of the request as the file asks it, so a resume treats a
re-asked request as the same request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from jsonlbatch.records import Request, Result
from jsonlbatch.redact import redact


@dataclass(frozen=True, slots=True)
class Accept:
    """Keep the answer."""


@dataclass(frozen=True, slots=True)
class Reject:
    """Write a failure instead of the answer."""

    reason: str
    code: str = "check_failed"
    keep: bool = False  # keep the answer (status, body) in the failure line


@dataclass(frozen=True, slots=True)
class AskAgain:
    """Send the request again with `body` (the whole body, model included); `otherwise` is
    what to write when no attempt is left."""

    body: dict[str, Any]
    reason: str
    otherwise: Reject | None = None


CheckVerdict = Accept | Reject | AskAgain
ACCEPT = Accept()


@dataclass(slots=True)
class Answer:
    """A usable answer as it arrived: `result` is the line it would make; `raw` the body's
    bytes (None for a streamed answer, whose body is rebuilt as `decoded`)."""

    request: Request
    result: Result
    raw: bytes | None = None
    decoded: Any = None

    def body(self) -> Any:
        """The answer's JSON body, decoded once (checks of the same answer share it)."""
        if self.decoded is None and self.raw is not None:
            self.decoded = orjson.loads(self.raw)
        return self.decoded


class AnswerCheck(Protocol):
    """Called with each usable answer; returns what to do with it. Runs on the event loop: a
    check that takes long (a judge model) should hand work to a thread itself."""

    def __call__(self, answer: Answer, /) -> CheckVerdict: ...


def refused(result: Result, verdict: Reject | AskAgain, attempts: int) -> Result:
    """The failure line for an answer the check refused (the answer itself is kept only when
    the `Reject` says so)."""
    if isinstance(verdict, AskAgain) and verdict.otherwise is not None:
        verdict = verdict.otherwise
    code = verdict.code if isinstance(verdict, Reject) else "check_failed"
    error = {"code": code, "message": redact(verdict.reason, limit=500)}
    # the check's own count wins: a resumed re-ask adds the attempts of earlier runs
    metrics = {"attempts": attempts, **result.metrics}
    if isinstance(verdict, Reject) and verdict.keep:
        return Result(
            result.custom_id, result.status_code, result.body, result.request_id, error, metrics
        )
    return Result(result.custom_id, None, None, result.request_id, error, metrics)


def begin(check: Any, request: Request) -> Request:
    """The request to send first, as the check's `begin` (if it has one) says."""
    hook = getattr(check, "begin", None)
    return request if hook is None else hook(request)


def end(check: Any, request: Request) -> None:
    """Tell the check (if it wants to know) that the request's result is made."""
    hook = getattr(check, "end", None)
    if hook is not None:
        hook(request)


class _Chain:
    """Checks run in turn on each answer: the first that does not accept decides."""

    def __init__(self, checks: list[AnswerCheck]) -> None:
        self.checks = checks

    def __call__(self, answer: Answer, /) -> CheckVerdict:
        for check in self.checks:
            verdict = check(answer)
            if not isinstance(verdict, Accept):
                return verdict
        return ACCEPT

    def begin(self, request: Request) -> Request:
        for check in self.checks:
            request = begin(check, request)
        return request

    def end(self, request: Request) -> None:
        for check in self.checks:
            end(check, request)


def chain(*checks: AnswerCheck | None) -> AnswerCheck | None:
    """One check that runs `checks` (None ones left out) in turn; None when there are none."""
    given = [c for c in checks if c is not None]
    if len(given) < 2:
        return given[0] if given else None
    return _Chain(given)

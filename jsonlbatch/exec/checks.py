"""The on-answer check: a caller's rule that sees each usable answer and may refuse it or ask again.

The executor decides what a *usable* answer is (`answers.py`: the endpoint's shape); a check
decides whether it is a *good* one for this caller (an answer contract, a JSON schema). It is
called once per usable answer, with the request as sent, and returns a verdict:

- `Accept()`: write the answer (the default when no check is installed);
- `Reject(reason)`: write a failure line (`error.code` = `code`, "check_failed" by default)
  without the answer, so `--retry-failed` sends the request again later;
- `AskAgain(body, reason)`: send the request again now with `body` (for instance the
  conversation plus "your answer did not match the schema: ..."); a re-ask uses an attempt, so
  `--max-retries` bounds them, and the last refusal is written as a `Reject` would be.

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


@dataclass(frozen=True, slots=True)
class AskAgain:
    """Send the request again with `body` (the whole body, model included)."""

    body: dict[str, Any]
    reason: str


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
    """The failure line for an answer the check refused (the answer itself is not kept)."""
    code = verdict.code if isinstance(verdict, Reject) else "check_failed"
    error = {"code": code, "message": redact(verdict.reason, limit=500)}
    metrics = dict(result.metrics, attempts=attempts)
    return Result(result.custom_id, None, None, result.request_id, error, metrics)

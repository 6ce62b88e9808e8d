"""The on-answer check: a caller's rule that sees each usable answer and may refuse it or ask again.

The executor decides what a *usable* answer is (`batch_format/answers.py`: the endpoint's shape); a check
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

A check's whole interface is `AnswerCheck`: the call, `begin(request) -> Request` (before the
first attempt; returns the request to send, e.g. a re-ask resumed from a journal) and
`end(request)` (once the request's result is made, whatever it is). A check that keeps state
across one request's asks subclasses `Check` (defaults for both) or writes all three itself; a
plain callable (`CheckFunction`) is completed once, where it enters the run (`as_check`), so the
run calls every check the same way and never asks what it has. `chain` runs several as one.

A stored answer (the answer cache, a provider's batch results) passes the same check before it
is written (`vet`): one the check accepts is written with what the check added to its metrics
(the contract's verdict); one it refuses is not served, and its request is sent instead.

The output line keeps the fingerprint of the request as the file asks it, so a resume treats a
re-asked request as the same request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import orjson

from jsonlbatch.batch_format.answers import unusable_reason
from jsonlbatch.batch_format.records import Request, Result
from jsonlbatch.errors import UsageError
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
class AnswerToCheck:
    """A usable answer as it arrived: `result` is the line it would make; `raw` the body's
    bytes (None for a streamed answer, whose body is rebuilt as `decoded`)."""

    request: Request
    result: Result
    raw: bytes | None = None
    decoded: Any = None
    #: A stored answer (the cache's), not one sent now: a refusal means "send it", so a check
    #: plans no re-ask on it.
    stored: bool = False

    def body(self) -> Any:
        """The answer's JSON body, decoded once (checks of the same answer share it)."""
        if self.decoded is None and self.raw is not None:
            self.decoded = orjson.loads(self.raw)
        return self.decoded


#: The name `AnswerToCheck` had before (a check written to it still imports it); a caller's
#: typed response line is `exec/output/run_outcome.py`'s `Answer`.
Answer = AnswerToCheck


class CheckFunction(Protocol):
    """The least a check is: a callable from an answer to a verdict (`as_check` completes it)."""

    def __call__(self, answer: AnswerToCheck, /) -> CheckVerdict: ...


@runtime_checkable
class AnswerCheck(Protocol):
    """Every member the run calls on a check, with its real signature. Runs on the event loop:
    a check that takes long (a judge model) should hand work to a thread itself.

    Subclass `Check` for the defaults of `begin` and `end`; a class with all three needs no
    base class; a plain callable (`CheckFunction`) is completed; a callable with `begin` but
    no `end` (or the other way) is refused where it enters the run (`as_check`)."""

    def __call__(self, answer: AnswerToCheck, /) -> CheckVerdict:
        """What to do with this usable answer: `Accept()`, `Reject(...)`, `AskAgain(...)`."""
        ...

    def begin(self, request: Request, /) -> Request:
        """Before a request's first attempt: the request to send (a re-ask resumed, ...)."""
        ...

    def end(self, request: Request, /) -> None:
        """The request's result is made, whatever it is (forget what was kept for it)."""
        ...


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


class Check:
    """`AnswerCheck` with the defaults: override what you need. `begin` and `end` bracket one
    request's asks; the defaults keep no state."""

    def __call__(self, answer: AnswerToCheck, /) -> CheckVerdict:
        return ACCEPT

    def begin(self, request: Request, /) -> Request:
        return request

    def end(self, request: Request, /) -> None:
        pass


class _Plain(Check):
    """A plain callable as a `Check`."""

    def __init__(self, check: CheckFunction) -> None:
        self.check = check

    def __call__(self, answer: AnswerToCheck, /) -> CheckVerdict:
        return self.check(answer)


class _Whole(Check):
    """An `AnswerCheck` that is no `Check` subclass, as one (the run's checks are `Check`s)."""

    def __init__(self, check: AnswerCheck) -> None:
        self.check = check

    def __call__(self, answer: AnswerToCheck, /) -> CheckVerdict:
        return self.check(answer)

    def begin(self, request: Request, /) -> Request:
        return self.check.begin(request)

    def end(self, request: Request, /) -> None:
        self.check.end(request)


def begin(check: Check | None, request: Request) -> Request:
    """The request to send first, as the run's check (if any) says."""
    return request if check is None else check.begin(request)


def end(check: Check | None, request: Request) -> None:
    """Tell the run's check (if any) that the request's result is made."""
    if check is not None:
        check.end(request)


def as_check(check: AnswerCheck | CheckFunction) -> Check:
    """`check` with the whole interface: a `Check` as it is, another `AnswerCheck` (all three
    members) or a plain callable wrapped. A callable with only one of `begin` and `end` is a
    TypeError: wrapping it would drop the one it has (the one place a check's members are
    looked at)."""
    if isinstance(check, Check):
        return check
    if isinstance(check, AnswerCheck):
        return _Whole(check)
    name = type(check).__name__
    if not callable(check):  # refused here, not at the first answer, after requests were paid for
        raise UsageError(f"a check is called with each answer: got {name} (see AnswerCheck)")
    has = [m for m in ("begin", "end") if hasattr(check, m)]
    if has:
        raise TypeError(
            f"Seams.check: {name} has {has[0]} but not {'end' if has[0] == 'begin' else 'begin'}"
            ": a check with either needs both (or subclass jsonlbatch.exec.hooks.check_hook."
            "Check for the defaults), or the one it has would be ignored"
        )
    return _Plain(check)


def vet(check: Check | None, request: Request, result: Result, raw: bytes | None) -> Reject | None:
    """None when a stored answer (`result`, its body's bytes `raw`) may be written for
    `request`; else why not, as the `Reject` its failure line would say.

    It takes the steps a fresh answer takes after it is read: the endpoint's shape (a usable
    answer, `batch_format/answers.py`: a cache folder or a provider's results file is hostile input too),
    then the check, as a first answer. An accepted answer keeps what the check wrote into its
    metrics (the contract's verdict); a refused one is sent instead where it can be (the check
    plans no re-ask on it), else written as the failure."""
    if raw is None:
        body = result.body
    else:
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return Reject("the stored answer is not JSON", "invalid_response")
    reason = unusable_reason(request.url, body)
    if reason is not None:
        return Reject(f"the stored answer is {reason}", "invalid_response")
    if check is None:
        return None
    sent = check.begin(request)
    try:
        verdict = check(AnswerToCheck(sent, result, raw, body, stored=True))
    finally:
        check.end(request)
    if isinstance(verdict, Accept):
        return None
    if isinstance(verdict, AskAgain):
        return verdict.otherwise or Reject(verdict.reason)
    return verdict


class _Chain(Check):
    """Checks run in turn on each answer: the first that does not accept decides."""

    def __init__(self, checks: list[Check]) -> None:
        self.checks = checks

    def __call__(self, answer: AnswerToCheck, /) -> CheckVerdict:
        for check in self.checks:
            verdict = check(answer)
            if not isinstance(verdict, Accept):
                return verdict
        return ACCEPT

    def begin(self, request: Request) -> Request:
        for check in self.checks:
            request = check.begin(request)
        return request

    def end(self, request: Request) -> None:
        for check in self.checks:
            check.end(request)


def chain(*checks: AnswerCheck | CheckFunction | None) -> Check | None:
    """One check that runs `checks` (None ones left out) in turn; None when there are none."""
    given = [as_check(c) for c in checks if c is not None]
    if len(given) < 2:
        return given[0] if given else None
    return _Chain(given)

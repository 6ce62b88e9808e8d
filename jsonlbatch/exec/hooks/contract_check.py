"""exec's side of the answer contract: each usable answer checked against its request's schema,
asked again when it breaks it; and `max_tokens` fitted to the context when a server refuses it.

`AnswerChecker` is an on-answer check (`check_hook.py`) that the run installs before any check of
the caller's:

- an answer whose every choice holds the schema is accepted, and the line's `metrics` gain the
  contract record (`answer_contract/contract.py`): the verdict, message and value read per choice, the asks, the
  schema;
- one that breaks it is asked again (`AskAgain`) while `reask` asks are left: a fresh sample (a
  new seed, derived from the id and the ask) or, with `feedback`, a follow-up turn quoting the
  validator's message;
- then it is a failure that keeps the last answer (`Reject(keep=True)`, code `schema_invalid`),
  which `--retry-failed` sends again.

Re-asks survive a crash: before a re-ask is sent, what it is built from (the asks so far, the
answer and its error) is appended to a journal beside the output (`.<output>.reasks`); `begin`
resumes a request there, so a run killed mid-re-ask goes on at the next ask instead of
repeating finished ones. Entries of requests whose line is written are dropped at the next start.

`fit_to_context` is the rule of `--fit-context` (the sender calls it on a final refusal).
"""

from __future__ import annotations

import contextlib
import os
import re
import zlib
from dataclasses import dataclass
from typing import Any

import orjson

from jsonlbatch.answer_contract.schema_forms import declared_schema
from jsonlbatch.batch_format.idset import IdSet
from jsonlbatch.batch_format.records import (
    CHAT_URL,
    COMPLETIONS_URL,
    MESSAGES_URL,
    RESPONSES_URL,
    Request,
)
from jsonlbatch.exec.hooks.check_hook import (
    ACCEPT,
    AnswerToCheck,
    AskAgain,
    Check,
    CheckVerdict,
    Reject,
)
from jsonlbatch.exec.hooks.tool_contract import broken_turn, check_answer_choices, tool_feedback
from jsonlbatch.file_io.jsonl import AppendWriter, iter_lines, rewrite_atomically
from jsonlbatch.redact import redact_line

#: What a follow-up turn says (`--reask-feedback`); {error} is the validator's message.
FEEDBACK = (
    "Your answer does not match the required JSON schema: {error}. Reply again with only the "
    "JSON value, matching the schema exactly."
)
#: Context-overflow refusals (reference: providers.md section 4), each giving the context
#: length `n` and the prompt's tokens `p`.
_OVERFLOW = (
    # OpenAI (older wording) and the mock: "...maximum context length is N tokens. However, you
    # requested T tokens (P in the messages, K in the completion)"
    re.compile(r"maximum context length is (?P<n>\d+) tokens.*?\((?P<p>\d+) in the messages"),
    # OpenAI (newer): "...maximum context length is N tokens. However, your messages resulted
    # in P tokens" (P = the messages alone: what is left is room for the answer)
    re.compile(r"maximum context length is (?P<n>\d+) tokens.*?messages resulted in (?P<p>\d+)"),
    # SGLang: "...maximum context length of N tokens. You requested a total of T tokens: P tokens
    # from the input messages and K tokens for the completion"
    re.compile(r"maximum context length of (?P<n>\d+) tokens.*?(?P<p>\d+) tokens from the input"),
    # Anthropic: "input length and `max_tokens` exceed context limit: P + K > N"
    re.compile(r"exceed context limit: (?P<p>\d+) \+ \d+ > (?P<n>\d+)"),
)
_SEEDED = frozenset({CHAT_URL, COMPLETIONS_URL})  # endpoints that take a `seed`
_PROMPTS = ("messages", "input", "prompt")  # where a feedback turn goes


@dataclass(slots=True)
class _State:
    """One request between its first ask and its line."""

    original: dict[str, Any]  # the body as the file asks it
    fingerprint: str | None
    asks: int = 1  # the ask now in flight (1: the first)
    # resumed from the journal: asks answered and attempts made by earlier runs, added to this
    # run's so that the line's `attempts` is never below its `asks`
    asks_before: int = 0
    attempts_before: int = 0
    prompt_tokens: int | float = 0  # over the answers received so far (every ask is paid for)
    completion_tokens: int | float = 0


class AnswerChecker(Check):
    """The answer contract of one run over one output file (see the module doc)."""

    def __init__(
        self,
        output: str,
        *,
        reask: int = 0,
        feedback: bool = False,
        done: tuple[IdSet, ...] = (),
        enabled: bool = True,
    ) -> None:
        self.reask, self.feedback = reask, feedback
        self.enabled = enabled  # False: schemas are sent on, answers are not checked
        self.path = journal_path(output)
        self._states: dict[str, _State] = {}
        self._resumed = _load_journal(self.path, done) if enabled else {}
        self._journal: AppendWriter | None = None

    # -- a request's way in and out ------------------------------------------------------------

    def begin(self, req: Request) -> Request:
        """The request to send first: as it is, or, where the journal says an earlier run got
        to, its next re-ask."""
        state = _State(req.body, req.fingerprint)
        self._states[req.custom_id] = state
        if not self._resumed:
            return req
        entry = self._resumed.pop(req.custom_id, None)
        if entry is None or entry.get("fingerprint") != req.fingerprint:
            return req
        state.asks = state.asks_before = int(entry["asks"])
        earlier = entry.get("attempts")  # older journals have none: each ask one attempt
        earlier = min(earlier, 1 << 31) if type(earlier) is int else 0  # a sane count, never huge
        state.attempts_before = max(earlier, state.asks)
        body = self._next_body(req.custom_id, req.url, state, req.body, entry.get("answer"),
                               str(entry.get("error")))  # fmt: skip
        state.asks += 1  # the ask this body makes
        return Request(req.custom_id, req.url, body, req.line, fingerprint=req.fingerprint)

    def end(self, req: Request) -> None:
        """The request's result is made: forget it."""
        self._states.pop(req.custom_id, None)

    # -- the check -----------------------------------------------------------------------------

    def __call__(self, answer: AnswerToCheck, /) -> CheckVerdict:
        req = answer.request
        state = self._states.get(req.custom_id)
        if state is None:  # a Sender used without begin(): the request as sent is the original
            state = self._states[req.custom_id] = _State(req.body, req.fingerprint)
        declared = declared_schema(req.url, state.original) if self.enabled else None
        if declared is None:
            return ACCEPT
        verdicts = check_answer_choices(req.url, state.original, declared, answer.body())
        bad = next((v for v in verdicts if not v.valid), None)
        metrics = answer.result.metrics
        record: dict[str, Any] = {
            "valid": bad is None,
            "asks": state.asks,
            "choices": [v.as_json() for v in verdicts],
            "schema": declared.schema,
        }
        state.prompt_tokens += metrics.get("prompt_tokens", 0)
        state.completion_tokens += metrics.get("completion_tokens", 0)
        if state.asks > 1:  # what every ask cost, for --max-cost (budget.py reads it)
            record["usage"] = {"prompt_tokens": state.prompt_tokens,
                               "completion_tokens": state.completion_tokens}  # fmt: skip
        if state.attempts_before:
            metrics["attempts"] = metrics.get("attempts", 1) + state.attempts_before
            record["asks_before"] = state.asks_before
        metrics["contract"] = record
        if bad is None:
            return ACCEPT
        asks = "the answer" if state.asks == 1 else f"all {state.asks} answers"
        failed = Reject(f"{asks} broke the schema; the last: {bad.error}", "schema_invalid",
                        keep=True)  # fmt: skip
        if state.asks > self.reask or answer.stored:  # a stored answer is not re-asked: sent
            return failed
        said = broken_turn(answer.body(), declared.tool, verdicts)
        self._journal_write(req.custom_id, state, said, bad.error, metrics.get("attempts", 1))
        body = self._next_body(req.custom_id, req.url, state, req.body, said, bad.error or "")
        state.asks += 1
        return AskAgain(body, f"schema_invalid: {bad.error}", otherwise=failed)

    # -- re-asks ---------------------------------------------------------------------------------

    def _next_body(
        self, cid: str, url: str, state: _State, sent: dict[str, Any], answer: Any, error: str
    ) -> dict[str, Any]:
        """The body of the ask after `state.asks`: the one sent (so what the sender changed,
        a fitted max_tokens, stays), with a new seed; with feedback, the original conversation
        plus the broken answer and the validator's message."""
        body = dict(sent)
        if url in _SEEDED:  # a fresh sample: a new seed, the same for the same ask
            base = state.original.get("seed")
            mix = zlib.crc32(f"{cid}\0{state.asks}".encode())
            body["seed"] = ((base if isinstance(base, int) else 0) + mix) % (1 << 31)
        if self.feedback:
            for key in _PROMPTS:
                if key in state.original:
                    body[key] = state.original[key]
            body = _with_feedback(url, body, answer, error)
        return body

    def _journal_write(
        self, cid: str, state: _State, answer: Any, error: str | None, attempts: int
    ) -> None:
        if self._journal is None:
            self._journal = AppendWriter(self.path)
        entry = {"custom_id": cid, "fingerprint": state.fingerprint, "asks": state.asks,
                 "attempts": attempts, "answer": answer, "error": error}  # fmt: skip
        # the journal is a file exec writes: the output's redaction (a server may echo our key
        # in the very answer kept here, and the file stays after a kill -9)
        self._journal.write(redact_line(orjson.dumps(entry) + b"\n", thorough=True))

    def close(self, complete: bool) -> None:
        """End of the run: the journal goes once every request has its line."""
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        if complete:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def fit_to_context(
    url: str, body: dict[str, Any], refusal: Any
) -> tuple[dict[str, Any], dict[str, int]] | None:
    """`body` with its output cap cut to what the context has room for, and what was done,
    when `refusal` (an error body) is a context-overflow message that says how much; else None
    (a prompt that alone does not fit, an unknown wording, a cap already small enough)."""
    text = _message(refusal)
    for pattern in _OVERFLOW:
        found = pattern.search(text)
        if found is None:
            continue
        room = int(found["n"]) - int(found["p"])
        key = _cap_key(url, body)
        asked = body.get(key)
        if room < 1 or not isinstance(asked, int) or room >= asked:
            return None
        return {**body, key: room}, {"max_tokens": room, "asked": asked}
    return None


def journal_path(output: str) -> str:
    """Where the re-ask journal of `output` lives: hidden, beside its real path."""
    real = os.path.realpath(output)
    return os.path.join(os.path.dirname(real), f".{os.path.basename(real)}.reasks")


def _load_journal(path: str, done: tuple[IdSet, ...]) -> dict[str, dict[str, Any]]:
    """The latest entry per request that has no line yet; the journal is rewritten without the
    others (and without a torn last line a crash may have left)."""
    if not os.path.exists(path):
        return {}
    entries: dict[str, dict[str, Any]] = {}
    dropped = 0
    for _, raw in iter_lines(path):
        try:
            entry = orjson.loads(raw)
            cid = entry["custom_id"]
            int(entry["asks"])
        except (orjson.JSONDecodeError, TypeError, KeyError, ValueError):
            dropped += 1  # a torn last line
            continue
        if any(cid in ids for ids in done):
            dropped += 1
            continue
        dropped += cid in entries
        entries[cid] = entry
    if dropped:
        lines = (redact_line(orjson.dumps(e) + b"\n", thorough=True) for e in entries.values())
        rewrite_atomically(path, lines)
    return entries


def _with_feedback(url: str, body: dict[str, Any], answer: Any, error: str) -> dict[str, Any]:
    """`body` as a follow-up turn: the broken answer, then the validator's message."""
    if url == CHAT_URL and isinstance(answer, dict) and isinstance(body.get("messages"), list):
        return {**body, "messages": [*body["messages"], *tool_feedback(answer, error)]}
    said = answer if isinstance(answer, str) else orjson.dumps(answer).decode()
    note = FEEDBACK.format(error=error)
    turns = [{"role": "assistant", "content": said}, {"role": "user", "content": note}]
    if url in (CHAT_URL, MESSAGES_URL) and isinstance(body.get("messages"), list):
        return {**body, "messages": [*body["messages"], *turns]}
    if url == RESPONSES_URL:
        given = body.get("input")
        items = (
            [{"role": "user", "content": given}] if isinstance(given, str) else list(given or [])
        )
        return {**body, "input": [*items, *turns]}
    if url == COMPLETIONS_URL and isinstance(body.get("prompt"), str):
        return {**body, "prompt": f"{body['prompt']}{said}\n\n{note}\n\n"}
    return body


def _cap_key(url: str, body: dict[str, Any]) -> str:
    if url == RESPONSES_URL:
        return "max_output_tokens"
    return "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"


def _message(body: Any) -> str:
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or "")
        return str(err)
    return str(body or "")

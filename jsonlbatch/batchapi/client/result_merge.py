"""Turning a finished batch's result files into OUT's lines, and what they cost.

Whichever provider answered, its results arrive here as OpenAI Batch output lines (the adapters
translate them), carrying the ids the requests were sent under; each becomes one line of OUT
under the request file's own custom_id, with exec's fingerprint last in `metrics`, and is priced
as billed (its model's price, cached input as cached, at the batch share). Requests a batch
left without a line get a failure line saying how the batch ended.

A results file is the provider's data: every line of it passes `ResultsGuard` on its way in
(all three providers' downloads stream through it), so a line that is not JSON, not an object, too
long, or whose id is not a string becomes an `unreadable` marker that `merged_lines` counts and
reports; the requests it should have answered get no line and end as failures that
`--retry-failed` sends again, instead of a traceback that every rerun repeats.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from jsonlbatch.batch_format.records import is_failure, json_object
from jsonlbatch.batchapi.formats.batch_objects import MISSING_CODES
from jsonlbatch.file_io.jsonl import iter_lines
from jsonlbatch.pricing.cost import (
    UNCAPPED_OUTPUT_TOKENS,
    estimate_prompt_tokens,
    max_output_tokens,
)
from jsonlbatch.pricing.prices import PriceBook, Tokens, bill, tokens_of
from jsonlbatch.redact import redact, redact_line

#: The longest results line read (a longer one is unreadable: memory stays bounded whatever a
#: provider sends). An answer is far smaller; raise it here if a model's answers ever are not.
MAX_RESULT_LINE = 64 << 20
#: The most of one of a batch's error messages kept in its requests' failure lines.
_ERROR_TEXT = 500
#: What translating a hostile but well-formed JSON value can raise: the line is unreadable.
_SHAPE_ERRORS = (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError)


class ResultsGuard:
    """The one guard on a provider's results, fed its results file's bytes as they arrive (so
    nothing of it is kept on disk as sent): each line comes out as an OpenAI Batch output line
    (through `translate`, a provider adapter's, when given), masked as the output is, or, when
    it cannot be one, as `{"custom_id": null, "unreadable": "line N: why"}`. A line longer than
    `MAX_RESULT_LINE` is not held: memory stays bounded whatever a provider sends."""

    def __init__(
        self,
        translate: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        id_field: str = "custom_id",
    ) -> None:
        self.translate = translate
        self.id_field = id_field
        self._parts: list[bytes] = []  # the line being received, no newline seen yet
        self._held = 0
        self._number = 0  # lines seen
        self._skipping = False  # inside a line too long to hold

    def feed(self, chunk: bytes) -> bytes:
        """The output lines for the lines `chunk` completes."""
        out = []
        pos = 0
        while (end := chunk.find(b"\n", pos)) >= 0:
            piece, pos = chunk[pos:end], end + 1
            if self._skipping:  # the end of a line already reported as too long
                self._skipping = False
                continue
            line = b"".join((*self._parts, piece)) if self._parts else piece
            self._parts, self._held = [], 0
            out.append(self._line(line))
        if pos < len(chunk) and not self._skipping:
            self._parts.append(chunk[pos:])
            self._held += len(chunk) - pos
            if self._held > MAX_RESULT_LINE:
                self._parts, self._held, self._skipping = [], 0, True
                self._number += 1
                out.append(_unreadable(self._number, f"longer than {MAX_RESULT_LINE} bytes"))
        return b"".join(out)

    def end(self) -> bytes:
        """The output for a last line without a newline."""
        line, self._parts = b"".join(self._parts), []
        return b"" if self._skipping or not line else self._line(line)

    def _line(self, line: bytes) -> bytes:
        self._number += 1
        line = line.strip()
        if not line:
            return b""
        if len(line) > MAX_RESULT_LINE:  # whole in one chunk, yet no shorter for that
            return _unreadable(self._number, f"longer than {MAX_RESULT_LINE} bytes")
        why, out = _checked_line(line, self.translate, self.id_field)
        return out if out is not None else _unreadable(self._number, why)


def _unreadable(number: int, why: str) -> bytes:
    return orjson.dumps({"custom_id": None, "unreadable": f"line {number}: {why}"}) + b"\n"


def _checked_line(
    line: bytes, translate: Callable[[dict[str, Any]], dict[str, Any]] | None, id_field: str
) -> tuple[str, bytes | None]:
    """(why it is unreadable, None) or ("", the line as an OpenAI Batch output line)."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return "not JSON", None
    if not isinstance(obj, dict):
        return f"a JSON {_kind(obj)}, not an object", None
    sent = obj.get(id_field)
    if not isinstance(sent, str):
        return f"`{id_field}` is {'missing' if sent is None else 'a ' + _kind(sent)}", None
    try:
        out = line + b"\n" if translate is None else orjson.dumps(translate(obj)) + b"\n"
    except _SHAPE_ERRORS as exc:
        return f"cannot be read as a result ({type(exc).__name__})", None
    # kept on disk until merged, then in OUT: the output's redaction (an error may echo our key)
    return "", redact_line(out, thorough=True)


def _kind(value: Any) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", float: "number"}
    return names.get(type(value), "number" if isinstance(value, int) else "value")


@dataclass(slots=True)
class Unreadable:
    """The results lines of a batch that answered nothing: how many, and the first reasons
    (kept few: a results file of garbage must not grow a list as long as itself)."""

    count: int = 0
    first: list[str] = field(default_factory=list)

    def add(self, why: str) -> None:
        self.count += 1
        if len(self.first) < 3:
            self.first.append(why)

    def note(self, batch_id: str) -> str:
        """What a run says (even with --quiet: its outcome depends on it) about them."""
        shown = "; ".join(self.first) + ("; ..." if self.count > len(self.first) else "")
        return (
            f"{batch_id}: {self.count} results lines could not be read ({shown}); the requests "
            "they were for end as failures, which --retry-failed sends again"
        )


@dataclass(slots=True)
class Merged:
    line: bytes
    failed: bool
    cost: float | None  # as billed; None when its model has no price


def missing_reason(batch: dict[str, Any]) -> tuple[str, str]:
    """The failure code and message for requests a batch ended without answering."""
    status = batch.get("status") or "failed"
    code, message = MISSING_CODES.get(status, MISSING_CODES["failed"])
    said = []
    for e in batch_errors(batch)[:5]:  # the provider's words: masked and cut as any
        line, text = e.get("line"), redact(str(e.get("message")), limit=_ERROR_TEXT)
        said.append(f"line {line}: {text}" if isinstance(line, int) else text)
    if said:
        message += ": " + "; ".join(said)
    return code, message


def batch_errors(batch: dict[str, Any]) -> list[dict[str, Any]]:
    """The objects of a batch's `errors.data` (the provider's data: whatever else is there
    is left out)."""
    data = json_object(batch.get("errors")).get("data")
    if not isinstance(data, list):
        return []
    return [e if isinstance(e, dict) else {"message": e} for e in data]


def batch_count(batch: dict[str, Any], key: str) -> int:
    """A number of `request_counts` (0 where the provider wrote something else)."""
    value = json_object(batch.get("request_counts")).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def merged_lines(
    downloads: list[Path],
    left: dict[str, tuple[str, str]],
    batch_id: str,
    present: Callable[[str], bool],
    book: PriceBook,
    unreadable: Unreadable,
) -> Iterator[Merged]:
    """The downloaded lines (as `ResultsGuard` wrote them) in jsonlbatch's response format,
    each id once (the custom_id of the request file, whatever id the provider was sent), with
    the request's fingerprint last in `metrics` as exec writes it; taken ids leave `left` (what
    stays there got no line); why each unreadable line was is added to `unreadable`."""
    for path in downloads:
        for _, raw in iter_lines(path):
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                obj = {"unreadable": "not JSON"}
            sent = obj.get("custom_id") if isinstance(obj, dict) else None
            if not isinstance(sent, str):
                why = obj.get("unreadable") if isinstance(obj, dict) else None
                unreadable.add(why if isinstance(why, str) else "no custom_id")
                continue
            if sent not in left:
                continue  # not ours, or seen already
            cid, mark = left.pop(sent)
            if present(cid):
                continue
            metrics = dict(json_object(obj.get("metrics")))
            metrics.pop("fingerprint", None)
            line = {
                "id": obj.get("id"),
                "custom_id": cid,
                "response": obj.get("response"),
                "error": obj.get("error"),
                "metrics": {**metrics, "batch_id": batch_id, "fingerprint": mark},
            }
            bad = is_failure(line)
            yield Merged(orjson.dumps(line) + b"\n", bad, None if bad else billed(line, book))


def billed(line: dict[str, Any], book: PriceBook) -> float | None:
    """What an answered line cost, at its model's price and the batch share."""
    body = json_object(json_object(line.get("response")).get("body"))
    model = body.get("model")
    price = book.for_model(model if isinstance(model, str) else None)
    if price is None:
        return None
    return bill(tokens_of(body.get("usage")), price, batch=True)


def spent_in(output: str, book: PriceBook) -> float:
    """What OUT's batch answers cost as billed (the run's own `--max-cost` counts these)."""
    if not os.path.exists(output):
        return 0.0
    return sum(c for c in (billed_line(raw, book) for _, raw in iter_lines(output)) if c)


def billed_line(raw: bytes, book: PriceBook) -> float | None:
    """`billed` of a saved line of OUT (None for a failure or an unreadable line)."""
    try:
        line = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(line, dict) or is_failure(line):
        return None
    return (
        billed(line, book)
        if isinstance(json_object(line.get("metrics")).get("batch_id"), str)
        else None
    )


def worst_cost(part_file: Path, book: PriceBook) -> float:
    """The most a part's requests can cost as a batch: estimated prompt tokens and every
    output cap (`UNCAPPED_OUTPUT_TOKENS` where a request sets none), at batch prices. A
    request whose model has no price counts nothing (the summary says so)."""
    total = 0.0
    for _, raw in iter_lines(part_file):
        body = json_object(orjson.loads(raw).get("body"))
        price = book.for_model(body.get("model") if isinstance(body.get("model"), str) else None)
        if price is None:
            continue
        cap = max_output_tokens(body) or UNCAPPED_OUTPUT_TOKENS
        total += bill(Tokens(uncached=estimate_prompt_tokens(body), output=cap), price, batch=True)
    return total


def refused_for_quota(batch: dict[str, Any]) -> bool:
    """A batch that failed at once because the provider's queue was full (OpenAI's
    `token_limit_exceeded`), with no request run."""
    if batch.get("status") != "failed":
        return False
    quota = any(e.get("code") == "token_limit_exceeded" for e in batch_errors(batch))
    return quota and not batch_count(batch, "completed")


def chunks(items: Iterator[Any], size: int = 1000) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk

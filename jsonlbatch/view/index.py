"""An index of a response file's lines: where each starts, plus the few numbers a table needs.

The viewer never holds a file's lines in memory. It keeps, per line, its byte offset and a
fixed-size summary (status, finish reason, tokens, latency, cost, verdict) in typed arrays, so
a million lines cost about 60 MB and any page of the table is a handful of `pread`s. Small
vocabularies (error codes, finish reasons, models, endpoints) are stored once and referred to
by number.

A file that is still being written (a live `exec`) is followed: `refresh()` indexes the complete
lines appended since the last call and leaves a torn last line for later; a file that shrank,
was replaced (a rewrite by `--retry-failed`), or changed other than by appending (`cp` over it:
same inode, other bytes where the indexed ones were) is indexed again from the start.

Memory is bounded whatever the file holds: a line longer than `MAX_LINE` (more than any body
exec saves) is one oversized row whose bytes are skipped, never held, and only its head is read
back to show it; only regular files are read (a FIFO would block, a device never ends).
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import orjson

from jsonlbatch.batch_format.records import is_failure
from jsonlbatch.batch_format.samples import chat_usage, hosted_choices
from jsonlbatch.exec.send.body_caps import MAX_RESPONSE_BYTES
from jsonlbatch.pricing.cost import Price

#: Lines indexed per step before yielding, so a web request never waits behind a long scan.
STEP_LINES = 5000
#: Lines appended after the id index was sorted that are searched one by one before it is
#: sorted again.
_TAIL = 50_000
_READ = 1 << 20
#: Bytes read per step at most (between two whole lines), as STEP_LINES bounds the lines.
_STEP_BYTES = 64 << 20
#: The longest line indexed as a line: a saved line is at most a body under exec's cap
#: (`--max-response-bytes`, 64 MiB by default) and its wrapping. A longer one is one oversized
#: row: its bytes are skipped, not held. Raise `MAX_RESPONSE_BYTES` to raise both.
MAX_LINE = MAX_RESPONSE_BYTES + (1 << 20)
#: How much of an oversized row is read back to show it.
SHOWN = 1 << 20
#: Bytes compared at the head and at the end of what was indexed, at every look: a file
#: rewritten in place differs there from what the index was built on.
_CHECK = 4096
NAN = math.nan
#: `flags` bits: ok, truncated, cached, unreadable, oversized (also unreadable).
OK, TRUNCATED, CACHED, UNREADABLE, OVERSIZED = 1, 2, 4, 8, 16

#: Verdict codes: no verdict recorded, valid/passed, invalid/failed.
VERDICT_NONE, VERDICT_OK, VERDICT_BAD = 0, 1, 2


class Vocabulary:
    """Strings seen in a column, stored once; rows hold their number (0 = none)."""

    def __init__(self) -> None:
        self.names: list[str] = [""]
        self._ids: dict[str, int] = {"": 0}

    def id(self, name: str | None) -> int:
        if not name:
            return 0
        found = self._ids.get(name)
        if found is None:
            found = self._ids[name] = len(self.names)
            self.names.append(name)
        return found


@dataclass(slots=True)
class Summary:
    """What the table shows of one line (read from the line, not kept)."""

    ok: bool
    status: int  # HTTP status; 0 when no answer came back
    error: str | None
    finish: str | None
    truncated: bool
    model: str | None
    endpoint: str | None
    prompt_tokens: float
    completion_tokens: float
    latency: float
    ttft: float
    cost: float
    verdict: int
    cached: bool


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return NAN
    return float(value)


def _verdict(obj: dict[str, Any], metrics: dict[str, Any]) -> int:
    """A schema or judge verdict where the line carries one (`metrics.contract.valid`,
    `metrics.valid`, or a judge line's `passed`)."""
    for holder, key in ((metrics.get("contract"), "valid"), (metrics, "valid"), (obj, "passed")):
        if isinstance(holder, dict) and isinstance(holder.get(key), bool):
            return VERDICT_OK if holder[key] else VERDICT_BAD
    return VERDICT_NONE


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def summarize(obj: Any, price: Price | None = None) -> Summary | None:
    """The table's view of one decoded response line; None for a line that is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("custom_id"), str):
        return None
    metrics = _mapping(obj.get("metrics"))
    response = _mapping(obj.get("response"))
    body = _mapping(response.get("body"))
    status = response.get("status_code")
    ok = "response" in obj and not is_failure(obj)
    error = obj.get("error")
    code = None
    if not ok:
        if isinstance(error, dict):
            code = str(error.get("code") or error.get("type") or "error")
        elif isinstance(status, int):
            code = f"http_{status}"
        else:
            code = "error"
    choices = body.get("choices")
    if choices is None:
        choices = hosted_choices(body) if body else None
    reasons = (
        [
            str(c.get("finish_reason"))
            for c in choices or ()
            if isinstance(c, dict) and c.get("finish_reason")
        ]
        if isinstance(choices, list)
        else []
    )
    usage = chat_usage(body.get("usage")) or {}
    prompt = _number(metrics.get("prompt_tokens", usage.get("prompt_tokens")))
    completion = _number(metrics.get("completion_tokens", usage.get("completion_tokens")))
    cost = _number(metrics.get("cost"))
    if math.isnan(cost) and price is not None and ok:
        cost = price.of(0.0 if math.isnan(prompt) else prompt,
                        0.0 if math.isnan(completion) else completion)  # fmt: skip
    model = body.get("model") if isinstance(body.get("model"), str) else metrics.get("model")
    endpoint = metrics.get("endpoint")
    return Summary(
        ok=ok,
        status=status if isinstance(status, int) and not isinstance(status, bool) else 0,
        error=code,
        finish=reasons[0] if reasons else None,
        truncated="length" in reasons,
        model=model if isinstance(model, str) else None,
        endpoint=endpoint if isinstance(endpoint, str) else None,
        prompt_tokens=prompt,
        completion_tokens=completion,
        latency=_number(metrics.get("latency_s")),
        ttft=_number(metrics.get("ttft_s")),
        cost=cost,
        verdict=_verdict(obj, metrics),
        cached=metrics.get("cache") == "hit",
    )


def id_key(custom_id: str) -> int:
    """A 63-bit key of a custom_id for the sorted id index (confirmed against the line)."""
    digest = hashlib.blake2b(custom_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def open_regular(path: str) -> BinaryIO | None:
    """`path` opened for reading when it is a regular file; None when it is missing or is
    something else (opened without blocking: a FIFO's open waits for a writer)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return os.fdopen(fd, "rb", buffering=0)


class LineIndex:
    """Offsets and summaries of one response file's lines, built and extended in steps."""

    def __init__(self, path: str, *, price: Price | None = None, max_line: int = MAX_LINE) -> None:
        self.path = path
        self.price = price
        self.max_line = max_line
        self.errors, self.finishes = Vocabulary(), Vocabulary()
        self.models, self.endpoints = Vocabulary(), Vocabulary()
        self.version = 0
        self._reset()

    def _reset(self) -> None:
        self.offsets = array("q")
        self.lengths = array("l")
        self.status = array("h")
        self.flags = array("B")  # OK, TRUNCATED, CACHED, UNREADABLE, OVERSIZED
        self.error = array("H")
        self.finish = array("H")
        self.model = array("H")
        self.endpoint = array("H")
        self.verdict = array("B")
        self.prompt = array("f")
        self.completion = array("f")
        self.latency = array("f")
        self.ttft = array("f")
        self.cost = array("f")
        self._keys: array[int] = array("q")  # id keys, unsorted, one per line
        self._sorted: tuple[array[int], array[int]] | None = None
        self.size = 0  # bytes indexed (up to the end of the last complete line)
        self.file_size = 0
        self._inode: tuple[int, int] | None = None
        self.version += 1  # changes whenever rows are added or the index restarts
        self._caught_up = False
        self._long: int | None = None  # an oversized row whose end is not read yet
        self._head = self._tail = b""  # the first and the last bytes indexed
        self._torn_at = -1  # the file's size when its torn last line was last read
        self._looked = (-1, -1)  # the file's (size, mtime) at the last look

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def done(self) -> bool:
        """Every complete line the file had at the last look is indexed (a torn last line,
        still being written, is not a line yet)."""
        return self._caught_up

    def refresh(self, max_lines: int = STEP_LINES) -> int:
        """Index up to `max_lines` more complete lines; the number indexed."""
        fh = open_regular(self.path)
        if fh is None:
            return 0
        with fh:
            st = os.fstat(fh.fileno())
            inode = (st.st_dev, st.st_ino)
            looked = (st.st_size, st.st_mtime_ns)
            if self._inode is not None and (
                inode != self._inode
                or st.st_size < self.size
                or (looked[0] == self._looked[0] and looked[1] != self._looked[1])
                or self._rewritten(fh.fileno())
            ):
                self._reset()  # replaced, cut, or written without growing: start again
            self._inode, self._looked = inode, looked
            self.file_size = st.st_size
            if self.size >= st.st_size or st.st_size == self._torn_at:
                self._caught_up = True  # nothing new (a torn last line is not read again
                return 0  # until the file grows: it may never end)
            self._caught_up = False
            added = self._read(fh, max_lines)
            self._torn_at = st.st_size if self._caught_up and self.size < st.st_size else -1
            self._head = os.pread(fh.fileno(), min(_CHECK, self.size), 0)
            tail = min(_CHECK, self.size)
            self._tail = os.pread(fh.fileno(), tail, self.size - tail)
        if added:
            self.version += 1
        return added

    def _rewritten(self, fd: int) -> bool:
        """Whether the bytes the index was built on are no longer there (a file written over
        in place keeps its inode, and may grow; one written over at the same size is told by
        its modification time above: appending always grows a file)."""
        return (
            os.pread(fd, len(self._head), 0) != self._head
            or os.pread(fd, len(self._tail), self.size - len(self._tail)) != self._tail
        )

    def _read(self, fh: BinaryIO, max_lines: int) -> int:
        """Index lines from `self.size` on: up to `max_lines`, and up to `_STEP_BYTES` read
        (past that only to finish a line); a line longer than `max_line` becomes an oversized
        row, skipped to its end in this and later calls."""
        fh.seek(self.size)
        start = self.size  # where the line being read starts
        parts: list[bytes] = []  # that line's bytes so far (no newline seen yet)
        held = read = added = 0
        while added < max_lines and (parts or read < _STEP_BYTES):
            chunk = fh.read(_READ)
            if not chunk:
                self._caught_up = True
                break
            read += len(chunk)
            pos = 0
            if self._long is not None:  # inside an oversized line: skip to its end
                end = chunk.find(b"\n")
                skipped = len(chunk) if end < 0 else end + 1
                self.lengths[self._long] += skipped - (end >= 0)
                start += skipped
                if end < 0:
                    continue
                self._long, pos = None, skipped
            while added < max_lines and (end := chunk.find(b"\n", pos)) >= 0:
                line = b"".join((*parts, chunk[pos:end])) if parts else chunk[pos:end]
                parts, held = [], 0
                self._add(start, line)
                added += 1
                start += len(line) + 1
                pos = end + 1
            if added >= max_lines:
                break
            if pos < len(chunk):
                parts.append(chunk[pos:])
                held += len(chunk) - pos
            if held > self.max_line:  # more than any response: one row, its bytes not held
                self._add_unreadable(start, held, UNREADABLE | OVERSIZED)
                self._long = len(self.offsets) - 1
                start += held
                parts, held = [], 0
                added += 1
        self.size = start
        return added

    def _add(self, offset: int, raw: bytes) -> None:
        if not raw.strip():
            return
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            obj = None
        row = summarize(obj, self.price)
        if row is None:
            self._add_unreadable(offset, len(raw), UNREADABLE)
            return
        self.offsets.append(offset)
        self.lengths.append(len(raw))
        self._keys.append(id_key(obj["custom_id"]))
        self.status.append(min(row.status, 32767))
        self.flags.append(
            (OK if row.ok else 0) | (TRUNCATED if row.truncated else 0)
            | (CACHED if row.cached else 0)
        )  # fmt: skip
        self.error.append(self.errors.id(row.error))
        self.finish.append(self.finishes.id(row.finish))
        self.model.append(self.models.id(row.model))
        self.endpoint.append(self.endpoints.id(row.endpoint))
        self.verdict.append(row.verdict)
        self.prompt.append(row.prompt_tokens)
        self.completion.append(row.completion_tokens)
        self.latency.append(row.latency)
        self.ttft.append(row.ttft)
        self.cost.append(row.cost)

    def _add_unreadable(self, offset: int, length: int, flags: int) -> None:
        """A row for a line that is no response line (not JSON, no custom_id, oversized)."""
        self.offsets.append(offset)
        self.lengths.append(length)
        self._keys.append(-1)
        self.status.append(0)
        self.flags.append(flags)
        for column in (self.error, self.finish, self.model, self.endpoint):
            column.append(0)
        self.verdict.append(0)
        for numbers in (self.prompt, self.completion, self.latency, self.ttft, self.cost):
            numbers.append(NAN)

    def read(self, row: int) -> bytes:
        """The raw bytes of indexed line `row` (0-based); an oversized row's first `SHOWN`."""
        return next(self.read_many([row]))[1]

    def read_many(self, rows: list[int]) -> Iterator[tuple[int, bytes]]:
        fh = open_regular(self.path)
        if fh is None:  # gone or replaced by something else since: nothing to show
            yield from ((row, b"") for row in rows)
            return
        with fh:
            fd = fh.fileno()
            for row in rows:
                size = self.lengths[row]
                if self.flags[row] & OVERSIZED:
                    size = min(size, SHOWN)
                yield row, os.pread(fd, size, self.offsets[row])

    def prepare_lookup(self) -> None:
        """Sort the id index now (about a second per million lines), so that the first
        comparison does not wait for it; lines added later are searched linearly until the
        unsorted tail is long enough to sort again."""
        count = len(self._keys)
        if self._sorted is None or count - len(self._sorted[0]) > _TAIL:
            order = sorted(range(count), key=self._keys.__getitem__)
            self._sorted = (array("q", map(self._keys.__getitem__, order)), array("q", order))

    def find(self, custom_id: str) -> list[int]:
        """The rows whose custom_id is `custom_id` (normally one)."""
        self.prepare_lookup()
        assert self._sorted is not None
        keys, rows = self._sorted
        key = id_key(custom_id)
        candidates = []
        at = bisect_left(keys, key)
        while at < len(keys) and keys[at] == key:
            candidates.append(rows[at])
            at += 1
        tail = self._keys[len(keys) :]
        candidates += [len(keys) + i for i, k in enumerate(tail) if k == key]
        found = []
        for row in candidates:
            try:
                obj = orjson.loads(self.read(row))
            except orjson.JSONDecodeError:
                obj = None
            if isinstance(obj, dict) and obj.get("custom_id") == custom_id:
                found.append(row)
        return sorted(found)

"""Filters, sorting and paging over a `LineIndex`: what the table asks for, answered from the
index's arrays (and, for a text search, one pass over the lines that pass the other filters).

A query is the table's state as it appears in the page's URL (`status=failed&sort=latency`), so
a view can be bookmarked; `Query.from_params` is the one place that reads it.
"""

from __future__ import annotations

import math
import re
from array import array
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import compress
from typing import Any

import orjson

from jsonlbatch.errors import UsageError
from jsonlbatch.view.index import VERDICT_BAD, VERDICT_OK, LineIndex, open_regular

STATUSES = ("all", "ok", "failed", "truncated", "cached", "valid", "invalid")
SORTS = ("line", "latency", "ttft", "tokens", "prompt", "cost", "status")
MAX_PAGE = 500


@dataclass(frozen=True, slots=True)
class Query:
    status: str = "all"
    error: str = ""
    finish: str = ""
    model: str = ""
    q: str = ""
    sort: str = "line"
    desc: bool = False
    page: int = 0
    size: int = 50

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> Query:
        """The query a URL's parameters ask for; a bad value is a `UsageError` naming it."""

        def number(name: str, default: int, top: int) -> int:
            text = params.get(name, "")
            if not text:
                return default
            if not text.isdigit() or int(text) > top:
                raise UsageError(f"{name}: a whole number from 0 to {top}, not {text[:20]!r}")
            return int(text)

        query = cls(
            status=params.get("status") or "all",
            error=params.get("error", ""),
            finish=params.get("finish", ""),
            model=params.get("model", ""),
            q=params.get("q", "")[:200],
            sort=params.get("sort") or "line",
            desc=params.get("desc", "") in ("1", "true"),
            page=number("page", 0, 10**9),
            size=max(1, number("size", 50, MAX_PAGE)),
        )
        if query.status not in STATUSES:
            raise UsageError(f"status: one of {', '.join(STATUSES)}")
        if query.sort not in SORTS:
            raise UsageError(f"sort: one of {', '.join(SORTS)}")
        return query

    def filters(self) -> Query:
        """The same query without its order and page (what decides which rows match)."""
        return replace(self, sort="line", desc=False, page=0, size=50)


#: Flag and verdict bytes that each status keeps (see `LineIndex.flags`).
_FLAG_TESTS: dict[str, Callable[[int], bool]] = {
    "ok": lambda f: f & 9 == 1,
    "failed": lambda f: f & 1 == 0,
    "truncated": lambda f: f & 2 == 2,
    "cached": lambda f: f & 4 == 4,
}
_VERDICT_TESTS = {"valid": VERDICT_OK, "invalid": VERDICT_BAD}


def _byte_mask(column: array[int], keep: Callable[[int], bool]) -> bytes:
    """One byte per row, 1 where `keep(value)`: a translation of the column's bytes, done in C."""
    table = bytes(1 if keep(value) else 0 for value in range(256))
    return column.tobytes().translate(table)


def _needles(text: str) -> tuple[bytes, ...]:
    """The query as it may appear in a saved line: as typed, and JSON-escaped."""
    lowered = text.lower()
    plain = lowered.encode()
    escaped = orjson.dumps(lowered)[1:-1]
    return (plain,) if escaped == plain else (plain, escaped)


class Searcher:
    """Answers queries over one index. Everything is done by C loops over the index's arrays
    (byte masks, `itertools.compress`, sort keys read with `array.__getitem__`), and the last
    few matches and orders are kept, so paging through a million rows costs a slice."""

    def __init__(self, index: LineIndex, requests: Sequence[LineIndex] = ()) -> None:
        self.index = index
        #: Request files (`--requests`): the search looks in prompts too.
        self.requests = list(requests)
        self._cache: dict[tuple[Query, str, bool], tuple[int, Sequence[int]]] = {}
        self._keys: dict[tuple[str, bool], tuple[int, list[float]]] = {}
        self._facets: tuple[int, dict[str, dict[str, int]]] | None = None

    def _remember(self, key: tuple[Query, str, bool], rows: Sequence[int]) -> Sequence[int]:
        if len(self._cache) > 16:
            self._cache.clear()
        self._cache[key] = (self.index.version, rows)
        return rows

    def _cached(self, key: tuple[Query, str, bool]) -> Sequence[int] | None:
        found = self._cache.get(key)
        return found[1] if found is not None and found[0] == self.index.version else None

    def matches(self, query: Query) -> Sequence[int]:
        """The rows that pass the query's filters, in line order."""
        key = (query.filters(), "line", False)
        cached = self._cached(key)
        if cached is not None:
            return cached
        index = self.index
        count = len(index)
        rows: Sequence[int] = range(count)
        if query.status in _FLAG_TESTS:
            rows = self._keep(rows, _byte_mask(index.flags, _FLAG_TESTS[query.status]))
        elif query.status in _VERDICT_TESTS:
            wanted = _VERDICT_TESTS[query.status]
            rows = self._keep(rows, _byte_mask(index.verdict, lambda v: v == wanted))
        for column, names, wanted_name in (
            (index.error, index.errors.names, query.error),
            (index.finish, index.finishes.names, query.finish),
            (index.model, index.models.names, query.model),
        ):
            if wanted_name:
                code = names.index(wanted_name) if wanted_name in names else -1
                if isinstance(rows, range):
                    rows = array("l", compress(rows, map(code.__eq__, column)))
                else:
                    rows = array("l", (i for i in rows if column[i] == code))
        if query.q:
            found = self._search(_needles(query.q))
            rows = array("l", (i for i in rows if i in found))
        return self._remember(key, rows)

    @staticmethod
    def _keep(rows: Sequence[int], mask: bytes) -> Sequence[int]:
        if isinstance(rows, range):
            return array("l", compress(rows, mask))
        return array("l", (i for i in rows if mask[i]))

    def _search(self, needles: tuple[bytes, ...]) -> set[int]:
        """Rows whose saved line, or whose request line, holds one of `needles`."""
        index = self.index
        found = set(_scan(index, needles))
        for requests in self.requests:
            for row in _scan(requests, needles):
                try:
                    cid = orjson.loads(requests.read(row)).get("custom_id")
                except (orjson.JSONDecodeError, AttributeError):
                    continue
                if isinstance(cid, str):
                    found.update(index.find(cid))
        return found

    def page(self, query: Query) -> tuple[int, list[int]]:
        """(how many rows match, the rows of the asked page in the asked order)."""
        rows = self.matches(query)
        if query.sort != "line" or query.desc:
            key = (query.filters(), query.sort, query.desc)
            ordered = self._cached(key)
            if ordered is None:
                if query.sort == "line":
                    ordered = rows[::-1]
                else:
                    by = self._sort_key(query.sort, query.desc)
                    ordered = self._remember(key, sorted(rows, key=by, reverse=query.desc))
            rows = ordered
        start = query.page * query.size
        return len(rows), list(rows[start : start + query.size])

    def _sort_key(self, name: str, desc: bool) -> Callable[[int], Any]:
        """A C-speed key (a list's `__getitem__`) where unknown values come last either way."""
        index = self.index
        columns: dict[str, array[Any]] = {
            "latency": index.latency,
            "ttft": index.ttft,
            "tokens": index.completion,
            "prompt": index.prompt,
            "cost": index.cost,
            "status": index.status,
        }
        column = columns[name]
        cached = self._keys.get((name, desc))
        if cached is None or cached[0] != index.version:
            missing = -math.inf if desc else math.inf
            values = [v if v == v else missing for v in column]
            cached = self._keys[(name, desc)] = (index.version, values)
        return cached[1].__getitem__

    def facets(self) -> dict[str, dict[str, int]]:
        """Counts per error code, finish reason and model, for the filter menus."""
        index = self.index
        if self._facets is not None and self._facets[0] == index.version:
            return self._facets[1]
        out: dict[str, dict[str, int]] = {}
        for name, column, vocab in (
            ("error", index.error, index.errors.names),
            ("finish", index.finish, index.finishes.names),
            ("model", index.model, index.models.names),
        ):
            counts = Counter(column)
            out[name] = {vocab[k]: v for k, v in counts.most_common() if k}
        flags = Counter(index.flags)
        out["status"] = {
            name: sum(v for k, v in flags.items() if test(k)) for name, test in _FLAG_TESTS.items()
        }
        verdicts = Counter(index.verdict)
        if verdicts.get(VERDICT_OK) or verdicts.get(VERDICT_BAD):
            out["status"]["valid"] = verdicts.get(VERDICT_OK, 0)
            out["status"]["invalid"] = verdicts.get(VERDICT_BAD, 0)
        self._facets = (index.version, out)
        return out


_CHUNK = 4 << 20
#: A base64 payload in a saved line (lowercased, as the scan reads it): a `data:` URL's after
#: `;base64,`, or a base64 source's `"data":"` value (Anthropic's blocks, Gemini's inlineData).
#: JSON may escape its '/' as '\\/'.
_MARKERS = (b";base64,", b'"data":')
_BASE64 = b"abcdefghijklmnopqrstuvwxyz0123456789+/=\\"
_BASE64_RUN = re.compile(rb"[a-z0-9+/=\\]*")
#: A `"data":` value shorter than this is text, not a payload.
_SHORTEST = 16
#: Bytes read past a chunk's end: a payload's marker and first characters cut by the border
#: are seen whole, so the next chunk knows where in it that payload goes on.
_OVERLAP = 64


def _run_end(chunk: bytes, start: int) -> int:
    """Where the base64 starting at `start` ends: at the closing quote of its JSON string
    (a C search), checked to hold base64 only (a C translate); else where its run stops."""
    end = chunk.find(b'"', start)
    end = len(chunk) if end < 0 else end
    if not chunk[start:end].translate(None, _BASE64):
        return end
    run = _BASE64_RUN.match(chunk, start)
    return run.end() if run else start


@dataclass(slots=True)
class _Payloads:
    """The base64 payloads of one lowercased chunk: `starts` (of their markers, for bisect),
    `bodies` (where the base64 begins) and `ends`, in order."""

    starts: list[int]
    bodies: list[int]
    ends: list[int]

    @classmethod
    def find(cls, chunk: bytes, carry: int | None) -> _Payloads:
        """`carry`: where in this chunk a payload begun in the previous one goes on. Found by
        C searches for the markers and the closing quotes: a chunk of base64 costs little."""
        found = cls([], [], [])
        if carry is not None:
            found.add(0, carry, _run_end(chunk, carry))
        marks = []
        for marker in _MARKERS:
            at = chunk.find(marker)
            while at >= 0:
                marks.append((at, marker))
                at = chunk.find(marker, at + len(marker))
        for at, marker in sorted(marks):
            if found.ends and at < found.ends[-1]:
                continue
            body = at + len(marker)
            if marker != _MARKERS[0]:  # "data": then an optional space and the opening quote
                body += chunk.startswith(b" ", body)
                if not chunk.startswith(b'"', body):
                    continue
                body += 1
            end = _run_end(chunk, body)
            if marker == _MARKERS[0] or end - body >= _SHORTEST:
                found.add(at, body, end)
        return found

    def add(self, start: int, body: int, end: int) -> None:
        self.starts.append(start)
        self.bodies.append(body)
        self.ends.append(end)

    def holds(self, at: int) -> bool:
        """Whether offset `at` is inside a payload's base64."""
        k = bisect_right(self.starts, at) - 1
        return k >= 0 and self.bodies[k] <= at < self.ends[k]

    def carry(self, border: int) -> int | None:
        """Where the next chunk (starting at `border`) is inside a payload begun before it."""
        k = bisect_right(self.starts, border - 1) - 1
        if k < 0 or self.ends[k] <= border:
            return None
        return max(self.bodies[k] - border, 0)


def _scan(index: LineIndex, needles: tuple[bytes, ...]) -> set[int]:
    """Rows of `index` whose line holds a needle (case-insensitive), by reading the file in
    large chunks and mapping each hit's offset to its row: no per-line work. A hit inside a
    base64 payload (an image in a `data:` URL) is no match: "dog" is in most pictures."""
    found: set[int] = set()
    offsets = index.offsets
    end = index.size  # only what is indexed
    longest = max(len(n) for n in needles)
    fh = open_regular(index.path)  # not a FIFO put in its place since: that open would block
    if fh is None:
        return found
    carry: int | None = None
    with fh:
        pos = 0
        while pos < end:
            fh.seek(pos)
            chunk = fh.read(min(_CHUNK + longest + _OVERLAP, end - pos)).lower()
            payloads = _Payloads.find(chunk, carry)
            for needle in needles:
                at = chunk.find(needle)
                while 0 <= at < _CHUNK:
                    if not payloads.holds(at):
                        found.add(bisect_right(offsets, pos + at) - 1)
                    at = chunk.find(needle, at + 1)
            carry = payloads.carry(_CHUNK)
            pos += _CHUNK
    return found

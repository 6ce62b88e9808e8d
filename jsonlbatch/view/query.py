"""Filters, sorting and paging over a `LineIndex`: what the table asks for, answered from the
index's arrays (and, for a text search, one pass over the lines that pass the other filters).

A query is the table's state as it appears in the page's URL (`status=failed&sort=latency`), so
a view can be bookmarked; `Query.from_params` is the one place that reads it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from jsonlbatch.errors import UsageError
from jsonlbatch.view.index import VERDICT_BAD, VERDICT_OK, LineIndex

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


def _status_test(index: LineIndex, status: str) -> Callable[[int], bool] | None:
    flags, verdict = index.flags, index.verdict
    tests: dict[str, Callable[[int], bool]] = {
        "ok": lambda i: flags[i] & 1 == 1,
        "failed": lambda i: flags[i] & 1 == 0,
        "truncated": lambda i: flags[i] & 2 == 2,
        "cached": lambda i: flags[i] & 4 == 4,
        "valid": lambda i: verdict[i] == VERDICT_OK,
        "invalid": lambda i: verdict[i] == VERDICT_BAD,
    }
    return tests.get(status)


def _column_test(column: Any, names: list[str], wanted: str) -> Callable[[int], bool] | None:
    if not wanted:
        return None
    code = names.index(wanted) if wanted in names else -1
    return lambda i: column[i] == code


def _needles(text: str) -> tuple[bytes, ...]:
    """The query as it may appear in a saved line: as typed, and JSON-escaped."""
    lowered = text.lower()
    plain = lowered.encode()
    escaped = orjson.dumps(lowered)[1:-1]
    return (plain,) if escaped == plain else (plain, escaped)


class Searcher:
    """Answers queries over one index, keeping the last few matches (paging is then cheap)."""

    def __init__(
        self, index: LineIndex, requests_of: Callable[[str], list[bytes]] | None = None
    ) -> None:
        self.index = index
        #: The request lines of a custom_id (from `--requests`), searched beside the answer.
        self.requests_of = requests_of
        self._cache: dict[Query, tuple[int, list[int]]] = {}

    def matches(self, query: Query) -> list[int]:
        key = query.filters()
        cached = self._cache.get(key)
        if cached is not None and cached[0] == self.index.version:
            return cached[1]
        index = self.index
        tests = [
            t
            for t in (
                _status_test(index, query.status),
                _column_test(index.error, index.errors.names, query.error),
                _column_test(index.finish, index.finishes.names, query.finish),
                _column_test(index.model, index.models.names, query.model),
            )
            if t is not None
        ]
        rows = [i for i in range(len(index)) if all(t(i) for t in tests)]
        if query.q:
            rows = self._search(rows, _needles(query.q))
        if len(self._cache) > 16:
            self._cache.clear()
        self._cache[key] = (index.version, rows)
        return rows

    def _search(self, rows: list[int], needles: tuple[bytes, ...]) -> list[int]:
        found = []
        for row, raw in self.index.read_many(rows):
            text = raw.lower()
            if any(n in text for n in needles) or self._in_request(raw, needles):
                found.append(row)
        return found

    def _in_request(self, raw: bytes, needles: tuple[bytes, ...]) -> bool:
        if self.requests_of is None:
            return False
        try:
            cid = orjson.loads(raw).get("custom_id")
        except (orjson.JSONDecodeError, AttributeError):
            return False
        if not isinstance(cid, str):
            return False
        return any(any(n in line.lower() for n in needles) for line in self.requests_of(cid))

    def page(self, query: Query) -> tuple[int, list[int]]:
        """(how many rows match, the rows of the asked page in the asked order)."""
        rows = self.matches(query)
        if query.sort != "line" or query.desc:
            rows = sorted(rows, key=self._sort_key(query.sort), reverse=query.desc)
        start = query.page * query.size
        return len(rows), rows[start : start + query.size]

    def _sort_key(self, name: str) -> Callable[[int], Any]:
        index = self.index
        if name == "line":
            return lambda i: i
        if name == "status":
            return lambda i: (index.status[i], i)
        column = {
            "latency": index.latency,
            "ttft": index.ttft,
            "tokens": index.completion,
            "prompt": index.prompt,
            "cost": index.cost,
        }[name]

        def key(i: int) -> tuple[bool, float, int]:
            value = column[i]
            missing = math.isnan(value)  # unknown values always sort last
            return (missing, 0.0 if missing else value, i)

        return key

    def facets(self) -> dict[str, dict[str, int]]:
        """Counts per error code, finish reason and model, for the filter menus."""
        index = self.index
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
            "ok": sum(v for k, v in flags.items() if k & 1),
            "failed": sum(v for k, v in flags.items() if not k & 1),
            "truncated": sum(v for k, v in flags.items() if k & 2),
            "cached": sum(v for k, v in flags.items() if k & 4),
        }
        verdicts = Counter(index.verdict)
        if verdicts.get(VERDICT_OK) or verdicts.get(VERDICT_BAD):
            out["status"]["valid"] = verdicts.get(VERDICT_OK, 0)
            out["status"]["invalid"] = verdicts.get(VERDICT_BAD, 0)
        return out

"""`jsonlbatch validate`: every problem of a request or response file, located, in one pass."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import orjson

from jsonlbatch.errors import MAX_PROBLEMS, InputError, Problem, UsageError
from jsonlbatch.exec.scan import find_duplicates, scan_input
from jsonlbatch.idset import IdSet
from jsonlbatch.jsonl import iter_lines
from jsonlbatch.records import check_response


@dataclass
class ValidationReport:
    path: str
    kind: str  # "requests" or "responses"
    lines: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def validate_file(path: str | os.PathLike[str], kind: str = "auto") -> ValidationReport:
    """Check a request file (as exec would before sending) or a response file."""
    path = os.fspath(path)
    if kind == "auto":
        kind = detect_kind(path)
    if kind == "requests":
        report = ValidationReport(path, kind)
        try:
            scan = scan_input(path)
        except InputError as exc:
            report.problems = exc.problems
        else:
            report.lines = scan.total
        return report
    if kind == "responses":
        return _validate_responses(path)
    raise UsageError(f"unknown file kind {kind!r}: use requests, responses or auto")


def detect_kind(path: str) -> str:
    """A response line has `response`/`error`; anything else is read as a request file."""
    for _, raw in iter_lines(path):
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict) and ("response" in obj or "error" in obj) and "body" not in obj:
            return "responses"
        return "requests"
    return "requests"


def _validate_responses(path: str) -> ValidationReport:
    report = ValidationReport(path, "responses")
    seen = IdSet()
    for number, raw in iter_lines(path):
        report.lines += 1
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            report.problems.append(Problem(path, number, None, f"bad JSON: {exc}"))
        else:
            found = check_response(obj)
            report.problems += [Problem(path, number, f, m) for f, m in found]
            if isinstance(obj, dict) and isinstance(obj.get("custom_id"), str):
                seen.add(obj["custom_id"])
        if len(report.problems) >= MAX_PROBLEMS:
            return report
    report.problems += find_duplicates(path, seen.colliding_hashes())
    return report

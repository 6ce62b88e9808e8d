"""`jsonlbatch validate`: every problem of a request or response file, located, in one pass."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import orjson

from jsonlbatch.batch_format.idset import IdSet
from jsonlbatch.batch_format.records import check_response
from jsonlbatch.errors import MAX_PROBLEMS, InputError, Problem, UsageError
from jsonlbatch.exec.prepare.file_refs import FileRefs
from jsonlbatch.exec.prepare.input_scan import find_duplicates, scan_input
from jsonlbatch.file_io.jsonl import is_regular, iter_lines, spool


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
    """Check a request file (as exec would before sending) or a response file.

    A file that cannot be read twice (a pipe) is read once into a temporary copy, as exec does.
    A file that cannot be read at all raises `InputError`: that is no "ok".
    """
    name = os.fspath(path)
    if kind not in ("auto", "requests", "responses"):
        raise UsageError(f"unknown file kind {kind!r}: use requests, responses or auto")
    source = name if is_regular(name) else spool(name)
    try:
        if kind == "auto":
            kind = detect_kind(source)
        if kind == "responses":
            return _validate_responses(source, name)
        report = ValidationReport(name, kind)
        try:
            scan = scan_input(source, name=name, refs=FileRefs())  # file:// files too
        except InputError as exc:
            if not exc.problems:  # unreadable, not a file of lines: no report to give
                raise
            report.problems = exc.problems
            last = report.problems[-1]
            if last.message.startswith("bad JSON") and last.line == _unterminated_tail(source):
                message = "torn last line (no newline at its end: a write cut short); exec "
                report.problems[-1] = Problem(
                    last.path, last.line, None, message + "refuses the file until it is whole"
                )
        else:
            report.lines = scan.total
        return report
    finally:
        if source != name:
            os.unlink(source)


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


def _validate_responses(path: str, name: str) -> ValidationReport:
    report = ValidationReport(name, "responses")
    seen = IdSet()
    torn = _unterminated_tail(path)
    for number, raw in iter_lines(path):
        report.lines += 1
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            if number == torn:
                message = "torn last line (no newline at its end: a write cut short); exec cuts it"
                report.problems.append(Problem(name, number, None, message))
            else:
                report.problems.append(Problem.bad_json(name, number, exc))
        else:
            found = check_response(obj)
            report.problems += [Problem(name, number, f, m) for f, m in found]
            if isinstance(obj, dict) and isinstance(obj.get("custom_id"), str):
                seen.add(obj["custom_id"])
        if len(report.problems) >= MAX_PROBLEMS:
            return report
    report.problems += find_duplicates(path, seen.colliding_hashes(), name=name)
    return report


def _unterminated_tail(path: str) -> int | None:
    """The line number of a last line without its newline (what exec treats as torn), or None."""
    with open(path, "rb") as f:
        if f.seek(0, os.SEEK_END) == 0:
            return None
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return None
        f.seek(0)
        return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b"")) + 1

"""The one reader of saved response files, and the grouping of samples.

Reads the OpenAI Batch output of `jsonlbatch exec`, of `vllm run-batch` (error in the top-level
`error`, body null) and of the OpenAI Batch API (error JSON in `response.body` with a 4xx/5xx
status, or lines of its separate error file, passed as one more input). Each choice of each
response becomes a `Sample`; failed requests become a sample with `error` set so that they are
counted, never silently lost. Lines `{"custom_id", "answer"}` (answers computed elsewhere, e.g.
by running a model's code) are read too, so they can be pooled into a vote.

What a line says (its `Sample`s, the id split) is format knowledge in `jsonlbatch.batch_format.samples`,
shared with `gen`; this module adds reading whole files and grouping.

Grouping (samples of one question or one SWE-bench instance) streams: a first pass counts the
lines of each group, a second pass yields a group as soon as its last line has been read. Memory
is bounded by the largest group in files written in request order (jsonlbatch, vLLM), and stays
correct for files in any order (the OpenAI Batch API).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from jsonlbatch.batch_format.records import check_response
from jsonlbatch.batch_format.samples import (
    DEFAULT_SEPARATORS,
    KeyFunc,
    Sample,
    as_text,
    is_answer_line,
    load_line,
    lookup,
    samples_of,
    split_key,
    split_think,
)
from jsonlbatch.errors import InputError, Problem, UsageError, problems_text
from jsonlbatch.file_io.jsonl import iter_lines, iter_lines_at, read_lines_at
from jsonlbatch.post.summary import TORN, Unused

__all__ = [  # the response-line pieces live in the core (`jsonlbatch.batch_format.samples`); post re-exports
    "DEFAULT_SEPARATORS",
    "Group",
    "KeyFunc",
    "Sample",
    "as_text",
    "check_responses",
    "iter_groups",
    "json_lines",
    "lookup",
    "make_key",
    "read_responses",
    "request_field_key",
    "samples_of",
    "split_key",
    "split_think",
]


@dataclass(slots=True)
class Group:
    """The samples of one group, ordered by custom_id (numbers compared as numbers), then choice."""

    key: str
    samples: list[Sample]


def json_lines(path: str, problems: list[Problem]) -> Iterator[tuple[int, Any]]:
    """(line number, decoded value) of each non-blank line; undecodable lines go to `problems`."""
    for lineno, raw in iter_lines(path):
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            problems.append(Problem.bad_json(path, lineno, exc))
            continue
        yield lineno, obj


def _lines(paths: Sequence[str]) -> Iterator[tuple[int, str, int, dict[str, Any] | Problem]]:
    """(source, path, line number, decoded line or its problem) for every non-blank line.

    A last line without its newline that does not decode is a torn write: reported as
    `Problem` with field "torn" so callers can skip it instead of failing.
    """
    for source, path in enumerate(paths):
        for lineno, start, raw in iter_lines_at(path):  # shared BOM handling and read errors
            try:
                obj = load_line(raw)
            except orjson.JSONDecodeError as exc:
                torn = _torn(path, start, raw)
                yield (
                    source,
                    path,
                    lineno,
                    Problem.bad_json(path, lineno, exc, "torn" if torn else None),
                )
                continue
            if isinstance(obj, dict) and is_answer_line(obj):
                ok = isinstance(obj.get("custom_id"), str) and obj["custom_id"]
                problems = [] if ok else [("custom_id", "missing or not a non-empty string")]
            else:
                problems = check_response(obj)
            if problems:
                for fld, msg in problems:
                    yield source, path, lineno, Problem(path, lineno, fld, msg)
                continue
            yield source, path, lineno, obj


def _torn(path: str, start: int, raw: bytes) -> bool:
    """Whether the line read as `raw` at byte `start` was a torn write: it had no newline yet
    (it is the last line), or it has grown since (a writer was finishing it)."""
    lines = read_lines_at(path, [start], strip=False)
    try:
        physical = next(lines, b"")
    except OSError:  # gone since: cannot tell, so it is reported as bad
        return False
    finally:
        lines.close()
    return not physical.endswith(b"\n") or physical.strip() != raw


def read_responses(paths: str | Sequence[str], unused: Unused | None = None) -> Iterator[Sample]:
    """Stream the samples of response files in file order.

    Raises `InputError` at the first malformed line; a torn last line is skipped (and
    counted in `unused`).
    """
    paths = [paths] if isinstance(paths, str) else list(paths)
    for source, path, lineno, item in _lines(paths):
        if isinstance(item, Problem):
            if item.field == "torn":
                if unused is not None:
                    unused.add(TORN, f"{path}:{lineno}")
                continue
            raise InputError("malformed response file", [item])
        yield from samples_of(item, path=path, line=lineno, source=source)


def request_field_key(requests_path: str, field_path: str) -> KeyFunc:
    """Group by a field of the request line (dotted, e.g. `body.metadata.instance_id`).

    Keeps one value per custom_id in memory: the request file may be in any order.
    """
    values: dict[str, str] = {}
    problems: list[Problem] = []
    for lineno, obj in json_lines(requests_path, problems):
        cid = obj.get("custom_id") if isinstance(obj, dict) else None
        value = lookup(obj, field_path)
        if not isinstance(cid, str):
            problems.append(Problem(requests_path, lineno, "custom_id", "missing"))
        elif value is None:
            problems.append(Problem(requests_path, lineno, field_path, "missing"))
        else:
            values[cid] = as_text(value)
    if problems:
        raise InputError(f"cannot group by {field_path}", problems)

    def key(custom_id: str) -> str:
        try:
            return values[custom_id]
        except KeyError:
            raise InputError(f"custom_id {custom_id!r} is not in {requests_path}") from None

    return key


def make_key(
    separators: Sequence[str] | None = None,
    requests: str | None = None,
    group_field: str | None = None,
) -> KeyFunc:
    """The grouping the CLI options ask for."""
    if group_field:
        if not requests:
            raise UsageError("--group-field needs --requests (the request file)")
        return request_field_key(requests, group_field)
    return split_key(DEFAULT_SEPARATORS if separators is None else separators)


#: Runs of ASCII digits only: `str.isdigit` and `\d` also take superscripts and other
#: scripts' digits, some of which `int` refuses (`q|1²`).
_ASCII_DIGITS = re.compile(r"([0-9]+)")


def _order(sample: Sample) -> tuple[Any, ...]:
    natural = tuple(
        (0, int(part), "") if _ASCII_DIGITS.fullmatch(part) else (1, 0, part)
        for part in _ASCII_DIGITS.split(sample.custom_id)
        if part
    )
    return (sample.source, natural, sample.index)


@dataclass
class _Scan:
    """What a first pass over the inputs learned."""

    sizes: dict[str, int] = field(default_factory=dict)  # lines per group key
    last_line: dict[int, int] = field(default_factory=dict)  # per input
    torn: set[tuple[int, int]] = field(default_factory=set)  # (input, line)


def _scan(paths: Sequence[str], key: KeyFunc | None, unused: Unused | None) -> _Scan:
    scan = _Scan()
    problems: list[Problem] = []
    for source, path, lineno, item in _lines(paths):
        first = source not in scan.last_line
        scan.last_line[source] = lineno
        if isinstance(item, Problem):
            if first and item.message.startswith("a request line"):  # say it once, not per line
                raise InputError(
                    f"{path} holds requests, not responses: post reads what `jsonlbatch exec` "
                    "wrote",
                    [item],
                )
            if item.field == "torn":
                scan.torn.add((source, lineno))
                if unused is not None:
                    unused.add(TORN, f"{path}:{lineno}")
            else:
                problems.append(item)
        elif key is not None:
            k = key(item["custom_id"])
            scan.sizes[k] = scan.sizes.get(k, 0) + 1
    if problems:
        raise InputError(f"malformed response file ({problems_text(problems)})", problems)
    return scan


def check_responses(paths: str | Sequence[str]) -> None:
    """Raise `InputError` listing every malformed line of the inputs (a torn last line is fine).

    For readers that stream with `read_responses` but must not start writing on bad input.
    """
    _scan([paths] if isinstance(paths, str) else list(paths), None, None)


def iter_groups(
    paths: str | Sequence[str], key: KeyFunc | None = None, unused: Unused | None = None
) -> Iterator[Group]:
    """Stream the groups of response files (see the module docstring for memory bounds).

    Raises `InputError` listing every malformed line before yielding anything. When a custom_id
    occurs twice in one file (a retried request), a success replaces a failure, else the later
    line wins.
    """
    paths = [paths] if isinstance(paths, str) else list(paths)
    key = key or split_key()
    scan = _scan(paths, key, unused)
    remaining, last_line, torn = scan.sizes, scan.last_line, scan.torn
    pending: dict[str, dict[tuple[int, str], list[Sample]]] = {}
    for source, path, lineno, item in _lines(paths):
        # Lines appended since the first pass (a file still being written) wait for the next run.
        if (
            isinstance(item, Problem)
            or lineno > last_line.get(source, 0)
            or (source, lineno) in torn
        ):
            continue
        k = key(item["custom_id"])
        by_id = pending.setdefault(k, {})
        samples = samples_of(item, path=path, line=lineno, source=source)
        previous = by_id.get((source, item["custom_id"]))
        if previous is None or previous[0].failed or not samples[0].failed:
            by_id[(source, item["custom_id"])] = samples
        remaining[k] -= 1
        if remaining[k] == 0:
            del pending[k], remaining[k]
            yield Group(k, sorted((s for ss in by_id.values() for s in ss), key=_order))

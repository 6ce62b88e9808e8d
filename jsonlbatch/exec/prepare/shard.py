"""Scale-out past one machine: split a request file over N jobs, merge their outputs back.

`--shard K/N` keeps the requests whose group (the custom_id before its sample suffix, so a
task's samples stay together) hashes to K (0-based, as SLURM array task ids are), so N jobs
(array tasks, nodes) can each run `exec` on the same file without talking to each other; the split depends on the id only, never on line order or on the machine. `merge`
joins the N outputs into one file in request order and refuses to pretend: every request id must
have exactly one result.
"""

from __future__ import annotations

import hashlib
import os
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import orjson

from jsonlbatch.batch_format.records import check_response, is_failure
from jsonlbatch.batch_format.samples import split_id
from jsonlbatch.errors import InputError, Problem, UsageError
from jsonlbatch.file_io.jsonl import iter_lines, rewrite_atomically
from jsonlbatch.file_io.output_guard import OutputLock, check_output, same_file

_SHOWN_PER_KIND = 5


def parse_shard(text: str) -> tuple[int, int]:
    """ "K/N" -> (K, N) with 0 <= K < N."""
    k_text, sep, n_text = text.strip().partition("/")
    try:
        k, n = int(k_text), int(n_text)
    except ValueError:
        k = n = -1
    if not sep or n < 1 or not 0 <= k < n:
        raise UsageError(f"--shard wants K/N with 0 <= K < N (e.g. 0/4 ... 3/4), got {text!r}")
    return k, n


def shard_of(custom_id: str, n: int) -> int:
    """Which of `n` shards a request belongs to: a keyed-nothing hash of its group (the id up
    to its last `|`, `#` or `__pass`, as post groups samples), the same everywhere (Python's
    `hash()` is salted per process and would split differently on every node). By group, so
    a task's samples stay on one shard: votes, pass@k and prefix caching need them together."""
    group, _ = split_id(custom_id)
    digest = hashlib.blake2b(group.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % n


def in_shard(custom_id: str, k: int, n: int) -> bool:
    """Whether the request `custom_id` belongs to shard `k` of `n`."""
    return n == 1 or shard_of(custom_id, n) == k


@dataclass
class MergeSummary:
    """What a merge wrote."""

    output: str
    parts: int
    requests: int
    ok: int = 0
    failed: int = 0
    superseded: int = 0  # lines dropped for a better result of the same id (a retry's success)

    def format(self) -> str:
        text = (
            f"merged {self.parts} part(s): {self.requests} results for {self.requests} requests "
            f"({self.ok} ok, {self.failed} failed) -> {self.output}"
        )
        if self.superseded:
            text += f"; {self.superseded} superseded line(s) dropped"
        return text


class MergeError(InputError):
    """The parts do not hold exactly one result per request; nothing was written."""

    def __init__(
        self,
        message: str,
        problems: Sequence[Problem],
        *,
        missing: Sequence[str] = (),
        duplicated: Sequence[str] = (),
        unknown: Sequence[str] = (),
    ) -> None:
        super().__init__(message, problems)
        self.missing = list(missing)
        self.duplicated = list(duplicated)
        self.unknown = list(unknown)


@dataclass(slots=True)
class _Slot:
    """Where the chosen result line of one request lies."""

    part: int
    offset: int
    length: int
    line: int
    ok: bool


@dataclass
class _Findings:
    bad: list[Problem] = field(default_factory=list)
    duplicated: list[tuple[str, Problem]] = field(default_factory=list)
    unknown: list[tuple[str, Problem]] = field(default_factory=list)
    superseded: int = 0


def merge(
    parts: Sequence[str | os.PathLike[str]],
    requests: str | os.PathLike[str],
    output: str | os.PathLike[str],
) -> MergeSummary:
    """Join shard outputs into `output` (in request order), written atomically.

    A successful line wins over failed ones for the same id, and of several failed lines the
    last is kept (the latest attempt). Raises MergeError, writing nothing, when an id has no
    result, has two successful ones (overlapping shards), or is not in `requests`.
    """
    paths = [os.fspath(p) for p in parts]
    requests, output = os.fspath(requests), os.fspath(output)
    _check_paths(paths, requests, output)
    index, request_lines = _request_index(requests)
    slots: list[_Slot | None] = [None] * len(request_lines)
    found = _Findings()
    for part_no, path in enumerate(paths):
        _scan_part(part_no, path, paths, index, slots, found)
    missing = [
        (cid, Problem(requests, request_lines[i], "custom_id", f"no result for {cid!r}"))
        for cid, i in index.items()
        if slots[i] is None
    ]
    if found.bad or found.duplicated or found.unknown or missing:
        raise _merge_error(found, missing)
    summary = MergeSummary(output, len(paths), len(slots), superseded=found.superseded)
    for slot in slots:
        assert slot is not None
        if slot.ok:
            summary.ok += 1
        else:
            summary.failed += 1
    lock = OutputLock(output)  # not while an exec (or another merge) writes it
    lock.acquire()
    try:
        rewrite_atomically(output, _chosen_lines(paths, slots))
    finally:
        lock.release()
    return summary


def _check_paths(parts: list[str], requests: str, output: str) -> None:
    if not parts:
        raise UsageError("merge needs at least one part file")
    for i, part in enumerate(parts):
        if any(same_file(part, other) for other in parts[:i]):
            raise UsageError("a part file is given twice")
    check_output(output, (*parts, requests), exec_lock=False)  # merge takes the lock itself


def _request_index(path: str) -> tuple[dict[str, int], array[int]]:
    """custom_id -> position, and each position's line number (for messages)."""
    index: dict[str, int] = {}
    lines = array("q")
    problems = []
    for number, raw in iter_lines(path):
        try:
            cid = orjson.loads(raw).get("custom_id")
        except (orjson.JSONDecodeError, AttributeError):
            problems.append(Problem(path, number, None, "not a JSON object"))
            continue
        if not isinstance(cid, str) or not cid:
            problems.append(Problem(path, number, "custom_id", "missing or not a non-empty string"))
        elif cid in index:
            first = lines[index[cid]]
            problems.append(Problem(path, number, "custom_id", f"{cid!r} repeats line {first}"))
        else:
            index[cid] = len(lines)
            lines.append(number)
    if problems:
        raise InputError(f"cannot merge: {path} has invalid request lines", problems)
    return index, lines


def _scan_part(
    part_no: int,
    path: str,
    paths: list[str],
    index: dict[str, int],
    slots: list[_Slot | None],
    found: _Findings,
) -> None:
    offset = 0
    for number, line in _raw_lines(path):
        start, offset = offset, offset + len(line)
        raw = line.strip()
        if not raw:
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            hint = " (a torn last line: run that shard's exec again to finish it)"
            torn = not line.endswith(b"\n")
            found.bad.append(Problem(path, number, None, f"bad JSON: {exc}{hint if torn else ''}"))
            continue
        problems = check_response(obj)
        if problems:
            found.bad += [Problem(path, number, f, m) for f, m in problems]
            continue
        cid = obj["custom_id"]
        i = index.get(cid)
        if i is None:
            found.unknown.append(
                (cid, Problem(path, number, "custom_id", f"{cid!r} is not in the requests"))
            )
            continue
        slot = _Slot(part_no, start, len(line), number, not is_failure(obj))
        old = slots[i]
        if old is not None and old.ok and slot.ok:
            where = f"{paths[old.part]}:{old.line}"
            found.duplicated.append(
                (cid, Problem(path, number, "custom_id", f"second success for {cid!r} ({where})"))
            )
            continue
        if old is not None:
            found.superseded += 1
            if old.ok:
                continue
        slots[i] = slot


def _merge_error(found: _Findings, missing: list[tuple[str, Problem]]) -> MergeError:
    kinds = [
        ("missing", missing),
        ("duplicated", found.duplicated),
        ("unknown", found.unknown),
    ]
    counts = [f"{len(found.bad)} invalid line(s)"] if found.bad else []
    counts += [f"{len(items)} {name} id(s)" for name, items in kinds if items]
    # The first few of every kind first: a thousand missing ids must not hide one duplicate.
    groups = [found.bad, *([p for _, p in items] for _, items in kinds)]
    problems = [p for g in groups for p in g[:_SHOWN_PER_KIND]]
    problems += [p for g in groups for p in g[_SHOWN_PER_KIND:]]
    return MergeError(
        "cannot merge, nothing written: " + ", ".join(counts),
        problems,
        missing=[cid for cid, _ in missing],
        duplicated=[cid for cid, _ in found.duplicated],
        unknown=[cid for cid, _ in found.unknown],
    )


def _chosen_lines(paths: list[str], slots: list[_Slot | None]) -> Iterator[bytes]:
    fds = [os.open(p, os.O_RDONLY) for p in paths]
    try:
        for slot in slots:
            assert slot is not None
            yield os.pread(fds[slot.part], slot.length, slot.offset).strip() + b"\n"
    finally:
        for fd in fds:
            os.close(fd)


def _raw_lines(path: str) -> Iterator[tuple[int, bytes]]:
    """(1-based number, line with its newline): byte offsets stay exact."""
    try:
        f = open(path, "rb", buffering=1 << 20)  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    with f:
        yield from enumerate(f, 1)

"""The passes made before anything is sent: what is asked (input) and what is done (output).

Both stream their file and keep only compact state (an `IdSet`, an array of the byte offsets
of pending lines), so a million-line job costs a few megabytes here. Nothing is modified: the output's
torn tail is only measured, and cut later, once the input is known to be good.
"""

from __future__ import annotations

import os
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from jsonlbatch.errors import InputError, OutputError, Problem
from jsonlbatch.idset import IdSet, id_key
from jsonlbatch.jsonl import iter_lines, iter_lines_at
from jsonlbatch.records import check_request, is_failure

#: Stop collecting after this many problems: the user fixes the pattern, not each line.
MAX_PROBLEMS = 1000


@dataclass
class OutputScan:
    """What an existing response file already holds."""

    path: str
    exists: bool = False
    lines: int = 0
    done: IdSet = field(default_factory=IdSet)
    failed: set[str] = field(default_factory=set)
    keep_bytes: int = 0
    cut_bytes: int = 0
    duplicates: int = 0

    @property
    def torn(self) -> bool:
        return self.cut_bytes > 0


def scan_output(path: str | os.PathLike[str], *, separate_failed: bool) -> OutputScan:
    """Read a response file: ids done, ids failed (kept apart when `separate_failed`), and where
    the last complete, readable line ends. A bad line followed by good ones is not a crash
    artefact, so it is an error rather than something to cut."""
    scan = OutputScan(os.fspath(path))
    if not os.path.exists(path):
        return scan
    scan.exists = True
    offset = 0
    bad_since: tuple[int, int] | None = None  # (line number, byte offset) of a trailing bad run
    seen_failed: set[str] = scan.failed
    with open(path, "rb", buffering=1 << 20) as f:
        for number, raw in enumerate(f, 1):
            start, offset = offset, offset + len(raw)
            stripped = raw.strip()
            if not stripped:
                continue
            found = _response_id(stripped, separate_failed) if raw.endswith(b"\n") else None
            if found is None:
                if bad_since is None:
                    bad_since = (number, start)
                continue
            if bad_since is not None:
                raise OutputError(
                    f"{scan.path}:{bad_since[0]}: unreadable line inside the response file (not a "
                    "torn last line, so it is not cut automatically); check it with "
                    f"`jsonlbatch validate {scan.path}`"
                )
            scan.lines += 1
            cid, failed = found
            if separate_failed and failed:
                seen_failed.add(cid)
            else:
                if cid in seen_failed:  # an earlier failure, now superseded
                    seen_failed.discard(cid)
                scan.done.add(cid)
    scan.keep_bytes = bad_since[1] if bad_since else offset
    scan.cut_bytes = offset - scan.keep_bytes
    scan.duplicates = len(scan.done.colliding_hashes())
    return scan


# How `Result.to_line` starts a line: `{"id":"batch_req_<24 hex>","custom_id":"<id>",...`.
_OWN_ID = b'{"id":"batch_req_'
_OWN_CID = b'","custom_id":"'
_CID_AT = len(_OWN_ID) + 24 + len(_OWN_CID)


def _response_id(line: bytes, check_failure: bool) -> tuple[str, bool] | None:
    """(custom_id, whether the line records a failure), or None for an unreadable line.

    When the failure status is not needed, the id of a line jsonlbatch wrote is read from its
    fixed place without decoding the server's body: a million-line resume starts seconds
    sooner. Other lines (and ids with escapes) are decoded in full.
    """
    if not check_failure and line.startswith(_OWN_ID) and line.endswith(b"}"):
        end = line.find(b'"', _CID_AT)
        if line[_CID_AT - len(_OWN_CID) : _CID_AT] == _OWN_CID and end > _CID_AT:
            raw_id = line[_CID_AT:end]
            if b"\\" not in raw_id:
                return raw_id.decode("utf-8", "replace"), False
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid:
        return None
    return cid, check_failure and is_failure(obj)


@dataclass
class InputScan:
    """A validated request file: how many requests, which still need sending, which models."""

    path: str
    total: int = 0
    pending: array = field(default_factory=lambda: array("Q"))  # byte offsets of lines to send
    models: Counter[str] = field(default_factory=Counter)
    already_done: int = 0
    retry_ids: set[str] = field(default_factory=set)
    outside_shard: int = 0


def scan_input(
    path: str | os.PathLike[str],
    *,
    require_model: bool = True,
    done: IdSet | None = None,
    failed: set[str] | frozenset[str] = frozenset(),
    select: Callable[[str], bool] | None = None,
) -> InputScan:
    """Validate the request file and work out what still has to be sent.

    Raises `InputError` listing every problem (up to `MAX_PROBLEMS`) with file, line and field:
    bad JSON, missing custom_ids, duplicates, and for every line still to be sent, malformed
    fields. A line whose id is `done` is skipped, and only its JSON and id are checked: it will
    not be sent, and a million of them must not slow a resume down. `failed` ids are re-sent
    (and reported in `retry_ids` so their old lines can be dropped); `select` picks a shard.
    """
    scan = InputScan(os.fspath(path))
    problems: list[Problem] = []
    seen = IdSet()
    for number, offset, raw in iter_lines_at(path):
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            problems.append(Problem(scan.path, number, None, f"bad JSON: {exc}"))
            if len(problems) >= MAX_PROBLEMS:
                break
            continue
        cid = obj.get("custom_id") if type(obj) is dict else None
        if done is not None and type(cid) is str and cid in done and cid not in failed:
            seen.add(cid)
            if select is None or select(cid):
                scan.total += 1
                scan.already_done += 1
            else:
                scan.outside_shard += 1
            continue
        found = check_request(obj, require_model=require_model)
        if found:
            problems += [Problem(scan.path, number, f, m) for f, m in found]
            if len(problems) >= MAX_PROBLEMS:
                break
            continue
        seen.add(cid)
        if select is not None and not select(cid):
            scan.outside_shard += 1
            continue
        scan.total += 1
        model = obj["body"].get("model")
        if model is not None:
            scan.models[model] += 1
        if cid in failed:
            scan.retry_ids.add(cid)
        scan.pending.append(offset)
    if len(problems) < MAX_PROBLEMS:
        problems += find_duplicates(scan.path, seen)
        problems.sort(key=lambda p: p.line or 0)
    if problems:
        raise InputError(f"{scan.path}: {_count(problems)}; nothing was sent", problems)
    return scan


def find_duplicates(path: str, seen: IdSet) -> list[Problem]:
    """Confirm `seen`'s hash collisions against the real custom_ids of `path` (a request or a
    response file), and name every line that repeats an earlier one."""
    suspects = seen.colliding_hashes()
    if not suspects:
        return []
    first_line: dict[str, int] = {}
    problems = []
    for number, raw in iter_lines(path):
        try:
            cid = orjson.loads(raw)["custom_id"]
        except (orjson.JSONDecodeError, TypeError, KeyError):
            continue
        if not isinstance(cid, str) or id_key(cid) not in suspects:
            continue
        if cid in first_line:
            problems.append(
                Problem(path, number, "custom_id", f"{cid!r} repeats line {first_line[cid]}")
            )
        else:
            first_line[cid] = number
    return problems


def _count(problems: list[Problem]) -> str:
    n = len(problems)
    more = "+" if n >= MAX_PROBLEMS else ""
    return f"{n}{more} problem{'s' if n != 1 else ''}"

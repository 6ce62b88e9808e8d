"""The passes made before anything is sent: what is asked (input) and what is done (output).

Both stream their file and keep only compact state (an `IdSet`, an array of the byte offsets
of pending lines), so a million-line job costs a few megabytes here. Nothing is modified: the output's
torn tail is only measured, and cut later, once the input is known to be good.
"""

from __future__ import annotations

import os
import re
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from jsonlbatch.errors import MAX_PROBLEMS, InputError, OutputError, Problem, count_problems
from jsonlbatch.idset import IdSet, id_key
from jsonlbatch.jsonl import iter_lines, iter_lines_at
from jsonlbatch.records import check_request, is_failure


@dataclass
class OutputScan:
    """What an existing response file already holds."""

    path: str
    lines: int = 0
    ok: IdSet = field(default_factory=IdSet)  # ids with a successful line
    failed: set[str] = field(default_factory=set)  # ids whose only lines record failures
    keep_bytes: int = 0
    cut_bytes: int = 0

    @property
    def torn(self) -> bool:
        return self.cut_bytes > 0


def scan_output(path: str | os.PathLike[str]) -> OutputScan:
    """Read a response file: which ids succeeded, which only failed, and where the last
    complete, readable line ends.

    A bad line followed by good ones is not a crash artefact, and two successful lines for one
    id mean two runs wrote the file at once: both are errors, not something to repair.
    """
    scan = OutputScan(os.fspath(path))
    if not os.path.exists(path):
        return scan
    offset = lines = 0
    bad_since: tuple[int, int] | None = None  # (line number, byte offset) of a trailing bad run
    failed: set[str] = set()
    done: list[bytes] = []  # ids of successful own lines, hashed into `scan.ok` in batches
    with open(path, "rb", buffering=1 << 20) as f:
        for number, raw in enumerate(f, 1):
            offset += len(raw)
            own = _OWN_LINE.match(raw)
            if own is not None and bad_since is None and raw.endswith(b"}\n"):
                lines += 1
                cid, status = own.groups()
                if status == b"2":
                    done.append(cid)
                    if len(done) == _BATCH:
                        scan.ok.update(_decode_all(done))
                        done.clear()
                else:
                    failed.add(cid.decode("utf-8", "replace"))
                continue
            stripped = raw.strip()
            if not stripped:
                continue
            found = _response_id(stripped) if raw.endswith(b"\n") else None
            if found is None:
                if bad_since is None:
                    bad_since = (number, offset - len(raw))
                continue
            if bad_since is not None:
                raise OutputError(
                    f"{scan.path}:{bad_since[0]}: unreadable line inside the response file (not a "
                    "torn last line, so it is not cut automatically); check it with "
                    f"`jsonlbatch validate {scan.path}`"
                )
            cid_str, is_failed = found
            if cid_str is None:
                raise OutputError(
                    f"{scan.path}:{number}: not a response line (it has no `response` or "
                    "`error`); is -o pointing at a request file?"
                )
            lines += 1
            if is_failed:
                failed.add(cid_str)
            else:
                scan.ok.add(cid_str)
    scan.ok.update(_decode_all(done))
    scan.lines = lines
    scan.keep_bytes = bad_since[1] if bad_since else offset
    scan.cut_bytes = offset - scan.keep_bytes
    repeated = find_duplicates(scan.path, scan.ok.colliding_hashes())
    if repeated:
        shown = "".join(f"\n  {problem}" for problem in repeated[:20])
        raise OutputError(
            f"{scan.path}: some requests have more than one successful line, as when two runs "
            f"write one file at once; keep one line per custom_id and run again:{shown}"
        )
    scan.failed = {cid for cid in failed if cid not in scan.ok}  # a success wins
    return scan


# How `Result.to_line` starts a line: `{"id":"batch_req_<24 hex>","custom_id":"<id>",...`. The
# id and status of such a line are read from their fixed places without decoding the server's
# body (jsonlbatch writes a 2xx status only with `error` null): a million-line resume starts
# seconds sooner. Other lines (other tools' files, ids with escapes, `response: null`) are
# decoded in full.
_OWN_LINE = re.compile(
    rb'\{"id":"batch_req_[0-9a-f]{24}","custom_id":"([^"\\\n]+)","response":\{"status_code":(\d)'
)
_BATCH = 1 << 16


def line_custom_id(line: bytes) -> str | None:
    """The custom_id of one response line: read in place where jsonlbatch wrote the line."""
    own = _OWN_LINE.match(line)
    if own is not None:
        return own[1].decode("utf-8", "replace")
    return orjson.loads(line).get("custom_id")


def _decode_all(ids: list[bytes]) -> list[str]:
    """Decode a batch of raw ids with three C calls instead of one Python call each."""
    return b"\n".join(ids).decode("utf-8", "replace").split("\n") if ids else []


def _response_id(line: bytes) -> tuple[str | None, bool] | None:
    """(custom_id, whether the line records a failure) of a response line; None for an
    unreadable line; (None, False) for a readable line that is no response."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid:
        return None
    if "response" not in obj and "error" not in obj:
        return None, False
    return cid, is_failure(obj)


@dataclass
class InputScan:
    """A validated request file: how many requests, which still need sending, which models."""

    path: str
    total: int = 0
    pending: array = field(default_factory=lambda: array("Q"))  # byte offsets of lines to send
    models: Counter[str] = field(default_factory=Counter)
    already_done: int = 0  # have a line in the output (a success, or a failure not retried)
    failed_before: int = 0  # of those, failures
    retry_ids: set[str] = field(default_factory=set)
    foreign: int = 0  # ids in the output with no request in the input (without a shard)
    size: int = 0  # the file's size and mtime when scanned: the sender checks them again
    mtime_ns: int = 0


def scan_input(
    path: str | os.PathLike[str],
    *,
    require_model: bool = True,
    existing: OutputScan | None = None,
    retry_failed: bool = False,
    select: Callable[[str], bool] | None = None,
) -> InputScan:
    """Validate the request file and work out what still has to be sent.

    Raises `InputError` listing every problem (up to `MAX_PROBLEMS`) with file, line and field:
    bad JSON, missing custom_ids, duplicates, and for every line still to be sent, malformed
    fields. A line that already has a result in `existing` is skipped, and only its JSON and id
    are checked: it will not be sent, and a million of them must not slow a resume down (one
    probe of `existing.ok` both skips it and notices an id the input repeats). With
    `retry_failed`, ids whose result is a failure are sent again (and listed in `retry_ids` so
    their old lines can be dropped). `select` picks a shard.
    """
    scan = InputScan(os.fspath(path))
    stat = stat_input(path)
    scan.size, scan.mtime_ns = stat.st_size, stat.st_mtime_ns
    ok = existing.ok if existing is not None else IdSet()
    failed = existing.failed if existing is not None else set()
    problems: list[Problem] = []
    done_slot, done_met, any_done = ok.slot, bytearray(ok.capacity), len(ok) > 0
    repeated: set[int] = set()  # keys of done ids the input names more than once
    seen = IdSet()  # every other id
    ids: list[str] = []  # hashed into `seen` in batches
    for number, offset, raw in iter_lines_at(path):
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            problems.append(Problem(scan.path, number, None, f"bad JSON: {exc}"))
            if len(problems) >= MAX_PROBLEMS:
                break
            continue
        cid = obj.get("custom_id") if type(obj) is dict else None
        at = done_slot(cid) if any_done and type(cid) is str else -1
        if at >= 0 or (type(cid) is str and cid in failed and not retry_failed):
            if at < 0:
                seen.add(cid)  # a failure kept as it is: rare
            elif done_met[at]:
                repeated.add(id_key(cid))
            else:
                done_met[at] = 1
            if select is None or select(cid):
                scan.total += 1
                scan.already_done += 1
                scan.failed_before += at < 0
            continue
        found = check_request(obj, require_model=require_model)
        if found:
            problems += [Problem(scan.path, number, f, m) for f, m in found]
            if len(problems) >= MAX_PROBLEMS:
                break
            continue
        ids.append(cid)
        if len(ids) == _BATCH:
            seen.update(ids)
            ids.clear()
        if select is not None and not select(cid):
            continue
        scan.total += 1
        model = obj["body"].get("model")
        if model is not None:
            scan.models[model] += 1
        if cid in failed:
            scan.retry_ids.add(cid)
        scan.pending.append(offset)
    seen.update(ids)
    if len(problems) < MAX_PROBLEMS:
        problems += find_duplicates(scan.path, seen.colliding_hashes() | repeated)
        problems.sort(key=lambda p: p.line or 0)
    if problems:
        raise InputError(f"{scan.path}: {_count(problems)}; nothing was sent", problems)
    if existing is not None and select is None:
        scan.foreign = len(ok) + len(failed) - scan.already_done - len(scan.retry_ids)
    return scan


def stat_input(path: str | os.PathLike[str]) -> os.stat_result:
    """`os.stat` of a request file, failing as an `InputError` a user can act on."""
    try:
        return os.stat(path)
    except OSError as exc:
        raise InputError(f"cannot read {os.fspath(path)}: {exc.strerror}") from None


def find_duplicates(path: str, suspects: set[int]) -> list[Problem]:
    """Confirm hash collisions (`suspects`, keys as `id_key` makes them) against the real
    custom_ids of `path` (a request or a response file), and name every line that repeats an
    earlier one."""
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
    return f"{count_problems(n)} problem{'s' if n != 1 else ''}"

"""The pass made before anything is sent: what is asked (the input), against what is done.

`scan_input` validates the whole request file and works out what still has to be sent, given
what the output holds (`resume_scan.scan_output`, re-exported here). It streams the file and keeps
only compact state (an `IdSet`, an array of the byte offsets of pending lines), so a million-line
job costs a few megabytes here. Nothing is modified.
"""

from __future__ import annotations

import os
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from zlib import crc32

import orjson

from jsonlbatch.answer_contract.schema_forms import SCHEMA_KEYS, check_declared
from jsonlbatch.batch_format.idset import IdSet, id_key
from jsonlbatch.batch_format.records import check_request, request_crc, request_head_ok
from jsonlbatch.errors import MAX_PROBLEMS, InputError, Problem, problems_text
from jsonlbatch.exec.hooks.tool_contract import check_tool_schemas

# the output pass, re-exported: callers ask `scan` for both passes
from jsonlbatch.exec.prepare.file_refs import FileRefs, has_refs
from jsonlbatch.exec.prepare.resume_scan import (  # the output pass: callers ask `scan` for both passes
    BATCH_LINES,
    LOW32,
    NO_FINGERPRINT,
    OutputScan,
    check_output_file,
    find_duplicates,
    line_custom_id,
    scan_output,
)
from jsonlbatch.exec.prepare.wrong_file_hints import hint
from jsonlbatch.file_io.jsonl import iter_lines_at

__all__ = [
    "CHANGED_POLICIES",
    "NO_GROUP",
    "InputScan",
    "OutputScan",
    "check_output_file",
    "edited",
    "find_duplicates",
    "groups_of",
    "line_custom_id",
    "scan_input",
    "scan_output",
    "stat_input",
]


CHANGED_POLICIES = ("refuse", "resend", "keep")


@dataclass
class InputScan:
    """A validated request file: how many requests, which still need sending, which models."""

    path: str
    total: int = 0
    pending: array = field(default_factory=lambda: array("Q"))  # byte offsets of lines to send
    models: Counter[str] = field(default_factory=Counter)
    urls: Counter[str] = field(default_factory=Counter)  # endpoint paths of the pending lines
    already_done: int = 0  # have a line in the output (a success, or a failure not retried)
    failed_before: int = 0  # of those, failures
    #: What `already_done` counts, in the resume note's words, when a request source counts
    #: something else (a rollout: "conversations already finished in conv.jsonl").
    done_words: str = ""
    replace: IdSet = field(default_factory=IdSet)  # ids whose old lines go before sending
    retried: int = 0  # failures sent again (--retry-failed)
    schemas: int = 0  # lines that may declare an answer schema (the contract check runs)
    answered: int = 0  # answered while scanned (`answer`: the answer cache), not pending
    changed: int = 0  # requests edited since their result was written
    changed_ids: list[str] = field(default_factory=list)  # the first few of them
    unfingerprinted: int = 0  # done requests whose result predates fingerprints
    foreign: int = 0  # ids in the output with no request in the input (without a shard)
    #: Each pending line's look-ahead group (`router.prefix_group`, `NO_GROUP` for none), beside
    #: `grouped`, the offsets they were taken for: the window need not read and parse the lines
    #: again (8 bytes a pending line). Empty when the scan was not asked for groups.
    groups: array = field(default_factory=lambda: array("q"))
    grouped: array | None = field(default=None, repr=False)
    #: Lines that name a `file://` file (`file_refs.has_refs`): none, and a line to send need
    #: not be searched again.
    ref_lines: int = 0
    size: int = 0  # the file's size and mtime when scanned: the sender checks them again
    mtime_ns: int = 0


#: A pending line with no look-ahead group: -1 is no `hash()` value (CPython never returns it).
NO_GROUP = -1


def groups_of(scan: InputScan, offsets: Sequence[int]) -> Sequence[int] | None:
    """The look-ahead groups the scan noted for `offsets` (its pending lines, or some of them:
    a pool's, those a store left), in their order; None when it noted none for one of them
    (the window then reads the lines for their groups)."""
    grouped, groups = scan.grouped, scan.groups
    if grouped is None:
        return None
    if offsets is grouped:
        return groups
    found = array("q")
    for offset in offsets:
        at = bisect_left(grouped, offset)  # the scan's offsets ascend: file order
        if at == len(grouped) or grouped[at] != offset:
            return None
        found.append(groups[at])
    return found


def scan_input(
    path: str | os.PathLike[str],
    *,
    require_model: bool = True,
    existing: OutputScan | None = None,
    retry_failed: bool = False,
    changed: str = "refuse",
    select: Callable[[str], bool] | None = None,
    name: str | None = None,
    answer: Callable[[dict[str, Any], bytes, bool], bool] | None = None,
    refs: FileRefs | None = None,
    group: Callable[[dict[str, Any]], int | None] | None = None,
) -> InputScan:
    """Validate the request file and work out what still has to be sent.

    Raises `InputError` listing every problem (up to `MAX_PROBLEMS`) with file, line and field:
    bad JSON, missing custom_ids, duplicates, and for every line still to be sent, malformed
    fields. A line that already has a result in `existing` is skipped, and only its JSON, id
    and fingerprint are checked: it will not be sent, and a million of them must not slow a
    resume down (one probe of `existing.ok` both skips it and notices an id the input repeats).
    With `retry_failed`, ids whose result is a failure are sent again. A request whose
    fingerprint differs from its result's was edited since: `changed` says whether to refuse
    the run (the default), send it again, or keep the old result. Ids sent again are listed in
    `replace`, so their old lines can be dropped. `select` picks a shard. `name` is the file's
    name in messages, when `path` is a copy (of a pipe). `answer(obj, raw, pending)` sees
    every line that parses, in file order, and may answer a checked pending one (True: it is
    counted in `answered`, not `pending`): the answer cache's look-up, made in this one pass.
    `refs` reads each `file://PATH` a line names as its file's hash (`file_refs.py`) before
    anything else sees the line; a path that cannot be sent is a problem of its line.
    `group(body)` is each pending line's look-ahead group, noted in `groups` (`groups_of`).
    """
    if changed not in CHANGED_POLICIES:
        raise ValueError(f"changed must be one of {CHANGED_POLICIES}")
    scan = InputScan(name or os.fspath(path))
    st = stat_input(path)
    scan.size, scan.mtime_ns = st.st_size, st.st_mtime_ns
    ok = existing.ok if existing is not None else IdSet()
    failed = existing.failed if existing is not None else IdSet()
    check_fps = existing is not None and existing.fingerprinted > 0
    problems: list[Problem] = []
    done_slot, done_met, any_done = ok.slot, bytearray(ok.capacity), len(ok) > 0
    failed_slot, any_failed = failed.slot, len(failed) > 0
    done_values = ok.values() if check_fps else array("q")
    repeated: set[int] = set()  # keys of done ids the input names more than once
    seen = IdSet()  # every other id
    ids: list[str] = []  # hashed into `seen` in batches
    number = 0
    for number, offset, raw in iter_lines_at(path):
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            problems.append(Problem.bad_json(scan.path, number, exc))
            if len(problems) >= MAX_PROBLEMS:
                break
            continue
        cid: Any = obj.get("custom_id") if type(obj) is dict else None  # a str when checked
        named = bool(refs and cid and has_refs(raw))
        scan.ref_lines += named
        unusable = refs.resolve(obj.get("body")) if refs and named else []
        at = done_slot(cid) if any_done and type(cid) is str else -1
        kept_failure = at < 0 and any_failed and type(cid) is str and failed_slot(cid) >= 0
        if at >= 0 or (kept_failure and not retry_failed):
            resend = False
            if at >= 0 and (select is None or select(cid)):
                stored = done_values[at] if check_fps else NO_FINGERPRINT
                if stored == NO_FINGERPRINT:
                    scan.unfingerprinted += 1
                elif edited(stored, raw, obj):
                    scan.changed += 1
                    if len(scan.changed_ids) < 5:
                        scan.changed_ids.append(cid)
                    resend = changed == "resend"
            if not resend:
                if answer is not None:
                    answer(obj, raw, False)
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
            if at >= 0:
                done_met[at] = 1
        # A line the store answers now is not sent, and its body was checked when the answer
        # was asked for (the key is over the body): only the fields around it are checked.
        answered = (
            answer is not None
            and request_head_ok(obj)
            and (select is None or select(cid))
            and answer(obj, raw, True)
        )
        if not answered:
            found = check_request(obj, require_model=require_model) + unusable
            if not found and not SCHEMA_KEYS.isdisjoint(obj["body"]):  # it may declare one
                found = check_declared(obj["url"], obj["body"])
                found = found or check_tool_schemas(obj["url"], obj["body"])
                scan.schemas += 1
            if found:
                problems += [Problem(scan.path, number, f, m) for f, m in found]
                if len(problems) >= MAX_PROBLEMS:
                    break
                continue
        if at < 0:
            ids.append(cid)
            if len(ids) == BATCH_LINES:
                seen.update(ids)
                ids.clear()
        if select is not None and not select(cid):
            if answer is not None:
                answer(obj, raw, False)
            continue
        scan.total += 1
        if at >= 0 or kept_failure:
            scan.replace.add(cid)
            scan.retried += kept_failure and at < 0 and retry_failed
        if answered:
            scan.answered += 1
            continue
        model = obj["body"].get("model")
        if model is not None:
            scan.models[model] += 1
        scan.urls[obj["url"]] += 1
        scan.pending.append(offset)
        if group is not None:  # of the body as the line has it, before its files were resolved
            key = group(orjson.loads(raw)["body"] if named else obj["body"])
            scan.groups.append(NO_GROUP if key is None else key)
    if group is not None:
        scan.grouped = scan.pending
    seen.update(ids)
    if number == 0:  # "all 0 requests have a result" would read as success
        raise InputError(f"{scan.path} is empty: it has no request lines; nothing was sent")
    if len(problems) < MAX_PROBLEMS:
        problems += find_duplicates(path, seen.colliding_hashes() | repeated, name=scan.path)
        problems.sort(key=lambda p: p.line or 0)
    if problems:
        raise InputError(
            f"{scan.path}: {problems_text(problems)}; nothing was sent",
            problems,
            hint(os.fspath(path), scan.path),
        )
    if scan.changed and changed == "refuse":
        shown = ", ".join(scan.changed_ids) + (", ..." if scan.changed > 5 else "")
        raise InputError(
            f"{scan.path}: {scan.changed} request{'s' if scan.changed != 1 else ''} changed "
            f"since {existing.path if existing else 'the output'} answered them ({shown}); "
            "nothing was sent. Pass --changed resend to send them again (their old results are "
            "replaced) or --changed keep to keep the old results"
        )
    if existing is not None and select is None:
        scan.foreign = len(ok) + len(failed) - scan.already_done - len(scan.replace)
    return scan


def edited(stored: int, raw: bytes, obj: dict[str, Any]) -> bool:
    """Whether a request line differs from the one its result's fingerprint (`stored`, as
    `OutputScan.ok` holds it) was taken from: neither the same line nor the same request
    re-serialised."""
    return stored & LOW32 != crc32(raw) and (stored >> 32) & LOW32 != request_crc(
        obj.get("url"), obj.get("body")
    )


def stat_input(path: str | os.PathLike[str]) -> os.stat_result:
    """`os.stat` of a request file, failing as an `InputError` a user can act on."""
    try:
        return os.stat(path)
    except OSError as exc:
        raise InputError(f"cannot read {os.fspath(path)}: {exc.strerror}") from None

"""The passes made before anything is sent: what is asked (input) and what is done (output).

Both stream their file and keep only compact state (an `IdSet`, an array of the byte offsets
of pending lines), so a million-line job costs a few megabytes here. Nothing is modified: the output's
torn tail is only measured, and cut later, once the input is known to be good.
"""

from __future__ import annotations

import os
import re
import stat
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat
from zlib import crc32

import orjson

from jsonlbatch.errors import MAX_PROBLEMS, InputError, OutputError, Problem, count_problems
from jsonlbatch.idset import IdSet, id_key
from jsonlbatch.jsonl import BOM, iter_lines, iter_lines_at
from jsonlbatch.records import check_request, check_response, is_failure, request_crc


@dataclass
class OutputScan:
    """What an existing response file already holds."""

    path: str
    lines: int = 0
    #: ids with a successful line, each with its request fingerprint (NO_FINGERPRINT if none)
    ok: IdSet = field(default_factory=lambda: IdSet(values=True))
    failed: IdSet = field(default_factory=IdSet)  # ids whose only lines record failures
    fingerprinted: int = 0  # successful lines that carry a request fingerprint
    keep_bytes: int = 0
    cut_bytes: int = 0

    @property
    def torn(self) -> bool:
        return self.cut_bytes > 0


#: Stands for "no fingerprint" (lines written before jsonlbatch recorded them).
NO_FINGERPRINT = -1
_LOW32 = 0xFFFFFFFF

# How `Result.to_line` ends a line that has a fingerprint: metrics hold it last.
_FP_TAIL = b',"fingerprint":"'
_FP_START, _FP_END = -(len(_FP_TAIL) + 20), -20


_NO_FP_HEX = b"f" * 16  # NO_FINGERPRINT's digits


def _fingerprint_value(text: bytes | str | None) -> int:
    """A fingerprint's 16 hex digits as the signed 64-bit number an `IdSet` holds."""
    if not text or len(text) != 16:
        return NO_FINGERPRINT
    try:
        value = int(text, 16)
    except ValueError:
        return NO_FINGERPRINT
    return (value ^ (1 << 63)) - (1 << 63)


def _fingerprint_values(texts: list[bytes]) -> array:
    """`_fingerprint_value` of a batch, in C: hex to unsigned, reinterpreted as signed."""
    try:
        unsigned = array("Q", map(int, texts, repeat(16)))
    except (ValueError, OverflowError):  # a hand-edited line: one at a time
        return array("q", map(_fingerprint_value, texts))
    signed = array("q")
    signed.frombytes(unsigned.tobytes())
    return signed


def scan_output(path: str | os.PathLike[str]) -> OutputScan:
    """Read a response file: which ids succeeded, which only failed, the request fingerprint
    of every line, and where the last complete line ends.

    Failed lines keep no fingerprint: a failure is no answer to go stale, and `--retry-failed`
    sends the request as it is now.

    Only a final fragment without its newline is torn (a crash can leave nothing else): it is
    measured here and cut before anything is appended. Any complete line that is not a
    response line (bad JSON, `NaN`, wrong fields) is an error naming its line, as `validate`
    reports it; so are two successful lines for one id (two runs wrote the file at once).
    Nothing is modified here.
    """
    scan = OutputScan(os.fspath(path))
    if not check_output_file(path):
        return scan
    offset = lines = 0
    torn_at: int | None = None  # byte offset of a final fragment without its newline
    problems: list[Problem] = []
    done: list[bytes] = []  # ids of successful own lines, hashed into `scan.ok` in batches
    done_fps: list[bytes] = []  # and the hex digits of their fingerprints
    own_failed: list[bytes] = []  # ids of failed own lines, hashed in batches
    failed_keys = array("q")
    with open(path, "rb", buffering=1 << 20) as f:
        for number, raw in enumerate(f, 1):
            offset += len(raw)
            own = _OWN_LINE.match(raw)
            if own is not None and raw.endswith(b"}\n"):
                lines += 1
                cid, status = own.groups()
                if status == b"2":
                    done.append(cid)
                    done_fps.append(
                        raw[_FP_END:-4] if raw[_FP_START:_FP_END] == _FP_TAIL else _NO_FP_HEX
                    )
                    if len(done) == _BATCH:
                        _add_done(scan, done, done_fps)
                else:
                    own_failed.append(cid)
                    if len(own_failed) == _BATCH:
                        failed_keys.extend(map(hash, _decode_all(own_failed)))
                        own_failed.clear()
                continue
            if number == 1 and raw.startswith(BOM):
                raw = raw[len(BOM) :]
            if not raw.endswith(b"\n"):  # only the last line can lack it
                if raw.strip():
                    torn_at = offset - len(raw)
                continue
            stripped = raw.strip()
            if not stripped:
                continue
            found = _response_line(stripped, scan.path, number, problems)
            if found is None:
                if len(problems) >= MAX_PROBLEMS:
                    break
                continue
            lines += 1
            cid_str, is_failed, fp = found
            if is_failed:
                failed_keys.append(id_key(cid_str))
            else:
                value = _fingerprint_value(fp)
                scan.ok.add_keys((hash(cid_str),), (value,))
                scan.fingerprinted += value != NO_FINGERPRINT
    if problems:
        shown = "".join(f"\n  {p}" for p in problems[:20])
        more = (
            f"\n  ... and {count_problems(len(problems) - 20)} more" if len(problems) > 20 else ""
        )
        raise OutputError(
            f"{scan.path}: {_count(problems)} in the existing results (not a torn last line, so "
            f"nothing is cut or changed); fix or remove these lines, or choose another -o:"
            f"{shown}{more}"
        )
    _add_done(scan, done, done_fps)
    failed_keys.extend(map(hash, _decode_all(own_failed)))
    scan.lines = lines
    scan.keep_bytes = offset if torn_at is None else torn_at
    scan.cut_bytes = offset - scan.keep_bytes
    repeated = find_duplicates(scan.path, scan.ok.colliding_hashes())
    if repeated:
        shown = "".join(f"\n  {problem}" for problem in repeated[:20])
        raise OutputError(
            f"{scan.path}: some requests have more than one successful line, as when two runs "
            f"write one file at once; keep one line per custom_id and run again:{shown}"
        )
    scan.failed = _only_failed(failed_keys, scan.ok)
    return scan


def check_output_file(path: str | os.PathLike[str]) -> bool:
    """Whether an output exists; raises if it is anything but a regular file (a FIFO would
    block the scan and the writer forever, a device or directory cannot hold results)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise OutputError(f"cannot read {os.fspath(path)}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise OutputError(
            f"{os.fspath(path)} is not a regular file ({_file_kind(st.st_mode)}); exec writes "
            "its results to a regular file: choose another -o"
        )
    return True


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"))
    kinds += ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _add_done(scan: OutputScan, ids: list[bytes], fps: list[bytes]) -> None:
    """Add a batch of successful own lines to `scan.ok`, with their fingerprints; empties both
    lists."""
    scan.fingerprinted += len(fps) - fps.count(_NO_FP_HEX)
    scan.ok.add_keys(map(hash, _decode_all(ids)), _fingerprint_values(fps))
    ids.clear()
    fps.clear()


def _only_failed(keys: array, ok: IdSet) -> IdSet:
    """The ids among `keys` without a successful line, each once (a success wins)."""
    out = IdSet()
    if not keys:
        return out
    everything = IdSet()
    everything.add_keys(keys)
    if not ok and not everything.colliding_hashes():
        return everything  # the common case of a big failed file: a dead server, no success
    met = bytearray(everything.capacity)
    slot, ok_slot, any_ok = everything.slot_key, ok.slot_key, len(ok) > 0
    kept = array("q")
    for key in keys:
        at = slot(key)
        if met[at] or (any_ok and ok_slot(key) >= 0):
            continue
        met[at] = 1
        kept.append(key)
    out.add_keys(kept)
    return out


# How `Result.to_line` starts a line: `{"id":"batch_req_<24 hex>","custom_id":"<id>",...`. The
# id and status of such a line are read from their fixed places without decoding the server's
# body (jsonlbatch writes a 2xx status only with `error` null, and `response: null` only with
# an error): a million-line resume starts seconds sooner. Other lines (other tools' files, ids with escapes, `response: null`) are
# decoded in full.
_OWN_LINE = re.compile(
    rb'\{"id":"batch_req_[0-9a-f]{24}","custom_id":"([^"\\\n]+)","response":'
    rb'(?:\{"status_code":(\d)|null,"error":\{)'
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


def _response_line(
    line: bytes, path: str, number: int, problems: list[Problem]
) -> tuple[str, bool, str | None] | None:
    """(custom_id, whether the line records a failure, its request fingerprint or None) of a
    complete response line; None (and its problems appended) when it is not one. The checks
    are `validate`'s, so both give one verdict on one file."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        problems.append(Problem(path, number, None, f"bad JSON: {exc}"))
        return None
    if isinstance(obj, dict) and "response" not in obj and "error" not in obj:
        problems.append(
            Problem(
                path,
                number,
                None,
                "not a response line (it has no `response` or `error`); "
                "is -o pointing at a request file?",
            )
        )
        return None
    found = check_response(obj)
    if found:
        problems.extend(Problem(path, number, f, m) for f, m in found)
        return None
    metrics = obj.get("metrics")
    fp = metrics.get("fingerprint") if isinstance(metrics, dict) else None
    return obj["custom_id"], is_failure(obj), fp if isinstance(fp, str) else None


#: What to do with requests whose fingerprint differs from the one their result was written for.
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
    replace: IdSet = field(default_factory=IdSet)  # ids whose old lines go before sending
    retried: int = 0  # failures sent again (--retry-failed)
    changed: int = 0  # requests edited since their result was written
    changed_ids: list[str] = field(default_factory=list)  # the first few of them
    unfingerprinted: int = 0  # done requests whose result predates fingerprints
    foreign: int = 0  # ids in the output with no request in the input (without a shard)
    size: int = 0  # the file's size and mtime when scanned: the sender checks them again
    mtime_ns: int = 0


def scan_input(
    path: str | os.PathLike[str],
    *,
    require_model: bool = True,
    existing: OutputScan | None = None,
    retry_failed: bool = False,
    changed: str = "refuse",
    select: Callable[[str], bool] | None = None,
    name: str | None = None,
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
    name in messages, when `path` is a copy (of a pipe).
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
        kept_failure = at < 0 and any_failed and type(cid) is str and failed_slot(cid) >= 0
        if at >= 0 or (kept_failure and not retry_failed):
            resend = False
            if at >= 0 and (select is None or select(cid)):
                stored = done_values[at] if check_fps else NO_FINGERPRINT
                if stored == NO_FINGERPRINT:
                    scan.unfingerprinted += 1
                elif stored & _LOW32 != crc32(raw) and (stored >> 32) & _LOW32 != request_crc(
                    obj.get("url"), obj.get("body")
                ):  # neither the same line nor the same request re-serialised: edited
                    scan.changed += 1
                    if len(scan.changed_ids) < 5:
                        scan.changed_ids.append(cid)
                    resend = changed == "resend"
            if not resend:
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
        found = check_request(obj, require_model=require_model)
        if found:
            problems += [Problem(scan.path, number, f, m) for f, m in found]
            if len(problems) >= MAX_PROBLEMS:
                break
            continue
        if at < 0:
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
        scan.urls[obj["url"]] += 1
        if at >= 0 or kept_failure:
            scan.replace.add(cid)
            scan.retried += kept_failure and at < 0 and retry_failed
        scan.pending.append(offset)
    seen.update(ids)
    if len(problems) < MAX_PROBLEMS:
        problems += find_duplicates(path, seen.colliding_hashes() | repeated, name=scan.path)
        problems.sort(key=lambda p: p.line or 0)
    if problems:
        raise InputError(f"{scan.path}: {_count(problems)}; nothing was sent", problems)
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


def stat_input(path: str | os.PathLike[str]) -> os.stat_result:
    """`os.stat` of a request file, failing as an `InputError` a user can act on."""
    try:
        return os.stat(path)
    except OSError as exc:
        raise InputError(f"cannot read {os.fspath(path)}: {exc.strerror}") from None


def find_duplicates(
    path: str | os.PathLike[str], suspects: set[int], name: str | None = None
) -> list[Problem]:
    """Confirm hash collisions (`suspects`, keys as `id_key` makes them) against the real
    custom_ids of `path` (a request or a response file), and name every line that repeats an
    earlier one (as `name`, when given)."""
    shown = name or os.fspath(path)
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
                Problem(shown, number, "custom_id", f"{cid!r} repeats line {first_line[cid]}")
            )
        else:
            first_line[cid] = number
    return problems


def _count(problems: list[Problem]) -> str:
    n = len(problems)
    return f"{count_problems(n)} problem{'s' if n != 1 else ''}"

"""What the output already holds, read for a resume: the ids done, failed, and their fingerprints.

`scan_output` streams the response file and keeps compact state (an `IdSet` of done ids, an
array of their request fingerprints), so a million-line resume costs a few megabytes. Lines
jsonlbatch wrote are read in place without decoding the server's body (`_OWN_LINE`). Nothing is
modified: a torn last line is only measured (`keep_bytes`) and cut later by `recorder.py`, once the
input is known to be good. `input_scan.py` (the input pass) compares the requests against this.
"""

from __future__ import annotations

import os
import re
import stat
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat

import orjson

from jsonlbatch.batch_format.idset import IdSet, id_key
from jsonlbatch.batch_format.records import check_response, is_failure
from jsonlbatch.errors import MAX_PROBLEMS, OutputError, Problem, count_problems, problems_text
from jsonlbatch.file_io.jsonl import BOM, iter_lines


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
LOW32 = 0xFFFFFFFF

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
                    if len(done) == BATCH_LINES:
                        _add_done(scan, done, done_fps)
                else:
                    own_failed.append(cid)
                    if len(own_failed) == BATCH_LINES:
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
            f"{scan.path}: {problems_text(problems)} in the existing results (not a torn last line, so "
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
    kinds: tuple[tuple[Callable[[int], bool], str], ...]
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
# body (jsonlbatch writes a 2xx status first only with `error` null: a 2xx answer that failed,
# one that broke its schema, has `error` before `response`; and `response: null` only with an
# error): a million-line resume starts seconds sooner. Other lines (other tools' files, ids with escapes, `response: null`) are
# decoded in full.
_OWN_LINE = re.compile(
    rb'\{"id":"batch_req_[0-9a-f]{24}","custom_id":"([^"\\\n]+)","response":'
    rb'(?:\{"status_code":(\d)|null,"error":\{)'
)
BATCH_LINES = 1 << 16


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
        problems.append(Problem.bad_json(path, number, exc))
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

"""Reading and crash-safe writing of JSONL files.

Output is only ever appended in whole lines with one `os.write` per batch on an
`O_APPEND` descriptor: a crash can at worst leave a torn last line (power loss), never
a line glued to another. `repair_tail` cuts such a tail off before anything new is
appended, and rewrites happen through a temporary file and an atomic rename. Which
output may be written at all (not an input, not one a running exec holds) is
`output_guard`'s.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Generator, Iterable, Iterator
from pathlib import Path
from typing import cast

from jsonlbatch.errors import InputError, JsonlbatchError, OutputError

_READ_BUFFER = 1 << 20
#: The UTF-8 byte order mark that Windows editors put at the start of a file.
BOM = b"\xef\xbb\xbf"
_SNIFF = 4096  # bytes looked at to tell JSON Lines from a JSON array


def iter_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, bytes]]:
    """Yield (1-based line number, line without surrounding whitespace), skipping blank lines."""
    for number, _, raw in iter_lines_at(path):
        yield number, raw


def iter_lines_at(path: str | os.PathLike[str]) -> Iterator[tuple[int, int, bytes]]:
    """Like `iter_lines`, with each line's byte offset, so a later pass can seek straight to it
    (`read_lines_at` gives the same bytes for it)."""
    try:
        # closed by the with below; a buffered binary file is a BufferedReader
        f = cast(io.BufferedReader, open(path, "rb", buffering=_READ_BUFFER))  # noqa: SIM115
    except OSError as exc:
        raise InputError(f"cannot read {os.fspath(path)}: {exc.strerror}") from None
    offset = 0
    with f:
        refuse_non_jsonl(f, path, InputError)
        for number, raw in enumerate(f, 1):
            start = offset
            offset += len(raw)
            if number == 1 and raw.startswith(BOM):  # files saved by Windows editors
                raw, start = raw[len(BOM) :], start + len(BOM)
            raw = raw.strip()  # the one rule for a line's edges: `read_lines_at` applies it too
            if raw:
                yield number, start, raw


def refuse_non_jsonl(
    f: io.BufferedReader, path: str | os.PathLike[str], error: type[JsonlbatchError]
) -> None:
    """Raise `error` when a file's first bytes show a JSON array rather than JSON Lines.

    Read line by line, a big `[...]` on one line would be loaded whole (a 184 MB array took
    1.46 GB) only to be refused: its first bytes tell it, without consuming them.
    """
    head = f.peek(_SNIFF).lstrip(BOM).lstrip()
    if head.startswith(b"["):
        name = os.fspath(path)
        raise error(
            f"{name} holds a JSON array, not JSON Lines (one JSON object per line); convert "
            f"it first, e.g. jq -c '.[]' {name}"
        )


def prefetch(path: str | os.PathLike[str], limit: int = 1 << 30) -> None:
    """Ask the kernel to start reading a file that is about to be scanned, so that after a
    reboot (a cold page cache) the disk works while the scans parse. Best effort: a no-op where
    `posix_fadvise` is missing or the file cannot be opened. Only the first `limit` bytes, so a
    file larger than memory does not evict its own beginning."""
    if not hasattr(os, "posix_fadvise"):
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block us here
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, limit, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_lines_at(
    path: str | os.PathLike[str], offsets: Iterable[int], *, strip: bool = True
) -> Generator[bytes, None, None]:
    """The lines starting at `offsets` (ascending reads sequentially; any order works, by seeking:
    exec's look-ahead window sends grouped lines), read without scanning the lines between,
    exactly as `iter_lines_at` gave them (edges stripped alike, so what was checked is sent);
    `strip=False` gives the physical lines, newline included (to tell a torn one)."""
    with open(path, "rb", buffering=_READ_BUFFER) as f:
        position = 0  # where the buffered file's next line starts
        for offset in offsets:
            if offset == position or not _PREAD or position < offset < position + _NEAR:
                if offset != position:
                    f.seek(offset)
                raw = f.readline()
                position = offset + len(raw)
            else:  # a jump (grouped lines): this line alone, not a refill of the whole buffer
                raw = _line_at(f.fileno(), offset)
            yield raw.strip() if strip else raw


_PREAD = hasattr(os, "pread")
_NEAR = 1 << 16  # a seek this far ahead most likely lands inside the buffer


def _line_at(fd: int, offset: int) -> bytes:
    """The line starting at `offset`, newline included, read with `pread` in growing chunks:
    a multi-MB line costs its size, a short one a few kilobytes (a seek and `readline` would
    read a whole 1 MB buffer each time, 40 times what a 25 KB image request needs)."""
    chunks = []
    size = 1 << 15
    while True:
        data = os.pread(fd, size, offset)
        cut = data.find(b"\n")
        if cut >= 0 or not data:
            chunks.append(data[: cut + 1] if cut >= 0 else data)
            return b"".join(chunks)
        chunks.append(data)
        offset += len(data)
        size = min(size * 2, _READ_BUFFER)


def spool(path: str | os.PathLike[str]) -> str:
    """Copy a file that cannot be read twice (a pipe, `/dev/stdin`, a FIFO) into a temporary
    file and return its path; the caller removes it. Bounded by disk, not memory."""
    fd, tmp = tempfile.mkstemp(prefix="jsonlbatch-input-", suffix=".jsonl")
    try:
        with open(path, "rb") as src, os.fdopen(fd, "wb") as dst:
            shutil.copyfileobj(src, dst, _READ_BUFFER)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"cannot read {os.fspath(path)}: {exc.strerror}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def is_regular(path: str | os.PathLike[str]) -> bool:
    """Whether `path` (links followed) is a regular file, the only kind a seek can come back to."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return True  # missing or unreadable: the reader says so, with the reason


def repair_tail(path: str | os.PathLike[str], keep: int) -> int:
    """Truncate the file to `keep` bytes (a torn tail); return the bytes cut."""
    try:
        size = os.path.getsize(path)
        if size > keep:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.ftruncate(fd, keep)
                os.fsync(fd)
            finally:
                os.close(fd)
    except OSError as exc:
        raise OutputError(
            f"cannot cut the torn last line of {os.fspath(path)}: {exc.strerror}; nothing was sent"
        ) from None
    return max(0, size - keep)


class AppendWriter:
    """Appends whole lines to a file; each `write` is one `os.write` of complete lines.

    A write that fails part-way (disk full) is cut back, so the file never holds half a line,
    and the writer refuses further writes: the caller stops and the next run resends.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise OutputError(f"cannot write {self.path}: {exc.strerror}") from None
        self._lock = threading.Lock()  # fsync runs in a thread; close must wait for it
        self._broken = False

    def write(self, data: bytes) -> None:
        if self._broken:
            raise OutputError(f"{self.path}: an earlier write failed")
        size = os.fstat(self._fd).st_size
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError as exc:
            self._broken = True
            with contextlib.suppress(OSError):  # else the next run cuts the torn tail
                os.ftruncate(self._fd, size)
            raise OutputError(
                f"cannot write {self.path}: {exc.strerror}; results not written will be sent "
                "again by the next run"
            ) from None

    def fsync(self) -> None:
        with self._lock:
            if self._fd >= 0:
                self._sync()

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                try:
                    self._sync()
                finally:
                    os.close(self._fd)
                    self._fd = -1

    def _sync(self) -> None:
        try:
            os.fsync(self._fd)
        except OSError as exc:
            raise OutputError(
                f"cannot save {self.path}: {exc.strerror}; results not on disk will be sent "
                "again by the next run"
            ) from None

    def __enter__(self) -> AppendWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def remove_stale_rewrites(path: str | os.PathLike[str]) -> int:
    """Delete temporary files that rewrites of this output left when killed (SIGKILL skips
    every cleanup); call with the output's lock held, so none is in use. Returns how many."""
    target = Path(os.path.realpath(path))
    pattern = re.compile(rf"\.{re.escape(target.name)}\.[A-Za-z0-9_]{{8}}\.tmp")
    removed = 0
    try:
        names = os.listdir(target.parent)
    except OSError:
        return 0
    for name in names:
        if pattern.fullmatch(name):
            with contextlib.suppress(OSError):
                os.unlink(target.parent / name)
                removed += 1
    return removed


def rewrite_atomically(path: str | os.PathLike[str], lines: Iterable[bytes]) -> None:
    """Write `lines` (each ending in a newline) to a temp file beside `path`, fsync, rename.

    The target is either the old file or the complete new one, whatever happens meanwhile. A
    symbolic link is written through (its target is replaced, the link stays); a failure (disk
    full, read-only file system) is an `OutputError` and leaves the old file as it was.
    """
    target = Path(os.path.realpath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise OutputError(f"cannot rewrite {os.fspath(path)}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb", buffering=_READ_BUFFER) as f:
            for line in lines:
                f.write(line)
            f.flush()
            os.fsync(f.fileno())
        if target.exists():
            os.chmod(tmp, target.stat().st_mode & 0o777)
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise OutputError(
            f"cannot rewrite {os.fspath(path)}: {exc.strerror}; it is unchanged"
        ) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def filter_lines(path: str | os.PathLike[str], keep: Callable[[bytes], bool]) -> Iterator[bytes]:
    """Lines of `path` (newline included) for which `keep(stripped_line)` is true."""
    with open(path, "rb", buffering=_READ_BUFFER) as f:
        for raw in f:
            stripped = raw.strip()
            if stripped and keep(stripped):
                yield stripped + b"\n"


def ends_with_newline(path: str | os.PathLike[str]) -> bool:
    """Whether the file's last byte is a newline: a last line without one that does not decode
    is a torn write (a run still writing, or a crash mid-write), not a malformed line."""
    try:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"
    except OSError:  # empty (nothing to seek back over) or gone: nothing torn to speak of
        return True

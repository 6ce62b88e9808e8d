"""Reading and crash-safe writing of JSONL files.

Output is only ever appended in whole lines with one `os.write` per batch on an `O_APPEND`
descriptor: a crash can at worst leave a torn last line (power loss), never a line glued to
another. `repair_tail` cuts such a tail off before anything new is appended, and rewrites
happen through a temporary file and an atomic rename.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from jsonlbatch.errors import InputError, OutputError

_READ_BUFFER = 1 << 20
#: The UTF-8 byte order mark that Windows editors put at the start of a file.
BOM = b"\xef\xbb\xbf"


def iter_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, bytes]]:
    """Yield (1-based line number, line without surrounding whitespace), skipping blank lines."""
    for number, _, raw in iter_lines_at(path):
        yield number, raw


def iter_lines_at(path: str | os.PathLike[str]) -> Iterator[tuple[int, int, bytes]]:
    """Like `iter_lines`, with each line's byte offset, so a later pass can seek straight to it."""
    try:
        f = open(path, "rb", buffering=_READ_BUFFER)  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        raise InputError(f"cannot read {os.fspath(path)}: {exc.strerror}") from None
    offset = 0
    with f:
        for number, raw in enumerate(f, 1):
            start = offset
            offset += len(raw)
            if number == 1 and raw.startswith(BOM):  # files saved by Windows editors
                raw, start = raw[len(BOM) :], start + len(BOM)
            raw = raw.strip()
            if raw:
                yield number, start, raw


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


def read_lines_at(path: str | os.PathLike[str], offsets: Iterable[int]) -> Iterator[bytes]:
    """The lines starting at `offsets` (ascending), read without scanning the lines between."""
    with open(path, "rb", buffering=_READ_BUFFER) as f:
        position = 0
        for offset in offsets:
            if offset != position:
                f.seek(offset)
            raw = f.readline()
            position = offset + len(raw)
            yield raw


def repair_tail(path: str | os.PathLike[str], keep: int) -> int:
    """Truncate the file to `keep` bytes (a torn or unreadable tail); return the bytes cut."""
    size = os.path.getsize(path)
    if size > keep:
        with open(path, "r+b") as f:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
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
                os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                try:
                    os.fsync(self._fd)
                finally:
                    os.close(self._fd)
                    self._fd = -1

    def __enter__(self) -> AppendWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class OutputLock:
    """Keeps two runs from writing one output at once (they would both send the same
    requests). An advisory `flock` on a hidden file beside the output: the kernel drops it
    when the process dies, however it dies, so there is no stale lock to clean up."""

    def __init__(self, output: str | os.PathLike[str]) -> None:
        output = Path(output)
        self.path = output.parent / f".{output.name}.lock"
        self._fd = -1

    def acquire(self) -> None:
        try:
            import fcntl
        except ImportError:  # no flock (Windows): run unguarded
            return
        try:
            os.makedirs(self.path.parent, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise OutputError(f"cannot write beside {self.path.parent}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            output = self.path.parent / self.path.name[1:-5]
            raise OutputError(
                f"{output} is being written by another jsonlbatch run (pid {holder}); wait for "
                "it, or stop it, before running again"
            ) from None
        try:
            same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # the holder released and removed it between our open and flock: retry
            os.close(fd)
            return self.acquire()
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self) -> None:
        """Remove the lock file (no clutter) and drop the lock; a run that opened the file
        meanwhile sees it gone after its flock and tries again, so two never both hold it."""
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                self.path.unlink()
            os.close(self._fd)
            self._fd = -1


def rewrite_atomically(path: str | os.PathLike[str], lines: Iterable[bytes]) -> None:
    """Write `lines` (each ending in a newline) to a temp file beside `path`, fsync, rename.

    The target is either the old file or the complete new one, whatever happens meanwhile.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb", buffering=_READ_BUFFER) as f:
            for line in lines:
                f.write(line)
            f.flush()
            os.fsync(f.fileno())
        if target.exists():
            os.chmod(tmp, target.stat().st_mode & 0o777)
        os.replace(tmp, target)
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

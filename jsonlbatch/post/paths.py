"""Model-chosen file names, used safely under a root directory we own.

A name written by a model is untrusted input: it may be absolute, climb out with `..`, or land
on a symlink planted in the output folder. Names are checked as text first, then opened one
component at a time relative to the root with `O_NOFOLLOW`, so no symlink is ever followed and
nothing outside the root is read or written.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import unicodedata
from collections.abc import Sequence

from jsonlbatch.errors import JsonlbatchError, UsageError

_MAX_DEPTH = 32
_MAX_COMPONENT = 255
_DRIVE = re.compile(r"^[A-Za-z]:")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


class UnsafePathError(JsonlbatchError):
    """A model-chosen path that would leave its root (or go through a symlink)."""


#: Unicode categories refused in file names: controls (C0, DEL, C1 such as U+0085), format
#: characters (bidi overrides such as U+202E that make `evil\u202egpj.exe` show as
#: `evilexe.jpg`, zero-width joiners), surrogates, and line/paragraph separators.
_INVISIBLE = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def safe_relpath(name: str, strip_prefixes: Sequence[str] = ()) -> str:
    """Turn a model's file name into a clean relative POSIX path, or raise `UnsafePathError`.

    `strip_prefixes` removes a known mount point first (e.g. `/testbed/` in tool calls of
    SWE-bench agents) so such absolute names map into the repository instead of being refused.
    """
    if not isinstance(name, str) or not name.strip():
        raise UnsafePathError("empty file name")
    path = name.strip()
    for prefix in strip_prefixes:
        if prefix and path.startswith(prefix):
            path = path[len(prefix) :]
            break
    bad = next((c for c in path if unicodedata.category(c) in _INVISIBLE), None)
    if bad is not None:
        what = unicodedata.name(bad, f"U+{ord(bad):04X}")
        raise UnsafePathError(f"control or invisible character {what} in file name {name!r}")
    if "\\" in path:
        raise UnsafePathError(f"backslash in file name {name!r}")
    if path.startswith("/") or path.startswith("~") or _DRIVE.match(path):
        raise UnsafePathError(f"absolute file name {name!r}")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts:
        raise UnsafePathError(f"empty file name {name!r}")
    if ".." in parts:
        raise UnsafePathError(f"'..' in file name {name!r}")
    if ".git" in parts:
        raise UnsafePathError(f"file name {name!r} points into .git")
    if len(parts) > _MAX_DEPTH or any(len(p.encode()) > _MAX_COMPONENT for p in parts):
        raise UnsafePathError(f"file name {name[:80]!r} is too long")
    return "/".join(parts)


def _require_posix() -> None:
    if not _NOFOLLOW or os.open not in os.supports_dir_fd:
        raise UsageError("safe file handling needs a POSIX system (O_NOFOLLOW and dir_fd)")


def _open_dirs(root: str, parts: Sequence[str], *, create: bool, what: str) -> int | None:
    """A descriptor of root/parts..., opened without following symlinks; None if missing."""
    _require_posix()
    fd = os.open(root, os.O_RDONLY | _DIRECTORY)
    try:
        for part in parts:
            try:
                child = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    os.close(fd)
                    return None
                os.mkdir(part, 0o755, dir_fd=fd)
                child = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise UnsafePathError(f"{what}: {part!r} is {_describe(fd, part)}") from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _describe(dir_fd: int, name: str) -> str:
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return "not usable"
    return "a symlink" if stat.S_ISLNK(mode) else "not a directory"


def read_inside(root: str, relpath: str, *, max_bytes: int) -> bytes | None:
    """The bytes of root/relpath (already checked by `safe_relpath`); None if it does not exist.

    Refuses symlinks anywhere below the root and anything but a regular file.
    """
    *dirs, name = relpath.split("/")
    fd = _open_dirs(root, dirs, create=False, what=relpath)
    if fd is None:
        return None
    try:
        try:
            # O_NONBLOCK: a FIFO must not block the open; the regular-file check refuses it
            file_fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW, dir_fd=fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK):
                raise UnsafePathError(f"{relpath} is a symlink") from None
            raise
    finally:
        os.close(fd)
    with os.fdopen(file_fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UnsafePathError(f"{relpath} is not a regular file")
        if info.st_size > max_bytes:
            raise UnsafePathError(f"{relpath} is larger than {max_bytes} bytes")
        return fh.read(max_bytes + 1)


def write_inside(root: str, relpath: str, data: bytes) -> None:
    """Write root/relpath (already checked by `safe_relpath`), creating folders as needed.

    Never follows a symlink: one planted at any component makes this raise `UnsafePathError`.
    """
    *dirs, name = relpath.split("/")
    fd = _open_dirs(root, dirs, create=True, what=relpath)
    assert fd is not None
    try:
        try:
            # O_NONBLOCK: a planted FIFO fails (ENXIO) instead of blocking until it has a reader
            file_fd = os.open(
                name,
                os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | _NOFOLLOW,
                0o644,
                dir_fd=fd,
            )
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK):
                raise UnsafePathError(f"{relpath} is a symlink") from None
            if exc.errno == errno.EISDIR:
                raise UnsafePathError(f"{relpath} is a directory") from None
            if exc.errno == errno.ENXIO:
                raise UnsafePathError(f"{relpath} is not a regular file") from None
            raise
    finally:
        os.close(fd)
    with os.fdopen(file_fd, "wb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):  # e.g. a FIFO someone is reading
            raise UnsafePathError(f"{relpath} is not a regular file")
        fh.write(data)

"""The answer cache on disk: one small compressed file per stored answer.

Why files and not a database (SQLite, `diskcache`): the cache is meant to be shared by several
processes and several machines over a network file system, where file locks (which SQLite
needs) are unreliable. Files need no lock at all:

- an entry is written to a temporary file beside its final name and then hard-linked there
  (`os.link` fails if the name is taken, so no answer ever overwrites another), or renamed
  where a file system has no hard links; readers see the old state or the whole new entry;
- every entry carries its length and a CRC-32 and is a zlib stream (which has its own
  checksum): a torn or corrupt file (a copy cut short, a disk error) is a miss, and the next
  store replaces it;
- a lookup is one `open` and one read of `answers/<k0k1>/<k2k3>/<key>.<draw>`: no index to
  load, so a million entries cost a run nothing before its first lookup.

Layout of a cache directory::

    jsonlbatch-cache.json        marks the directory as a cache (prune removes nothing elsewhere)
    CACHEDIR.TAG                 tells backup tools to skip it (bford.info/cachedir)
    answers/ab/cd/<key>.<draw>   the entries
    runs/<time>-<host>-<pid>.json  one line of counts per run (hits, misses, stored): `cache stats`
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import struct
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from jsonlbatch.errors import OutputError, UsageError

MODES = ("rw", "read", "write")
MARKER = "jsonlbatch-cache.json"
ANSWERS = "answers"
RUNS = "runs"
_TAG = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This directory is a jsonlbatch answer cache: see `jsonlbatch cache stats`.\n"
)
_MAGIC = b"JBC1"
_HEADER = struct.Struct("<4sII")  # magic, CRC-32 of the payload, payload length
_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_CHUNK = 1 << 16
#: How many draw numbers past the wanted one a store tries when others took them meanwhile.
_MAX_PROBE = 64


@dataclass(slots=True)
class Entry:
    """One stored answer: the server's body, byte for byte, and what was known about it."""

    body: bytes
    meta: dict[str, Any]


def encode_entry(meta: dict[str, Any], body: bytes) -> bytes:
    """The bytes of an entry file: header (magic, CRC-32, length) + zlib(meta JSON, newline,
    body)."""
    payload = zlib.compress(orjson.dumps(meta) + b"\n" + body, 6)
    return _HEADER.pack(_MAGIC, zlib.crc32(payload), len(payload)) + payload


def decode_entry(data: bytes, *, head_only: bool = False) -> Entry | None:
    """An entry from its file's bytes, or None if it is torn or corrupt. `head_only` decodes
    just enough for the metadata (`cache stats`)."""
    if len(data) < _HEADER.size:
        return None
    magic, crc, length = _HEADER.unpack_from(data)
    payload = memoryview(data)[_HEADER.size :]
    if magic != _MAGIC or len(payload) != length or zlib.crc32(payload) != crc:
        return None
    try:
        if head_only:
            text = zlib.decompressobj().decompress(payload, 1 << 16)
        else:
            text = zlib.decompress(payload)
        head, _, body = text.partition(b"\n")
        meta = orjson.loads(head)
    except (zlib.error, orjson.JSONDecodeError):
        return None
    return Entry(body, meta) if isinstance(meta, dict) else None


def entry_path(root: str, name: str) -> str:
    """Where entry `name` (`<key>.<draw>`) lives: two levels of 256 folders by key."""
    return f"{root}/{ANSWERS}/{name[:2]}/{name[2:4]}/{name}"


@dataclass
class CacheCounts:
    """What one run did with the cache (kept in `runs/`, summed by `cache stats`)."""

    hits: int = 0
    misses: int = 0
    stored: int = 0
    corrupt: int = 0  # entries found torn or corrupt: treated as misses
    store_failed: int = 0
    saved_prompt_tokens: int = 0
    saved_completion_tokens: int = 0
    saved_usd: float | None = None
    notes: list[str] = field(default_factory=list)


class Cache:
    """A cache directory opened in one mode: `rw` (look up, store misses), `read` (look up
    only) or `write` (store only: refresh answers without reading old ones).

    A `rw` cache whose directory cannot be written (a read-only mount, no permission) is used
    for reading only, with a note in `counts.notes`; `write` there is an error.
    """

    def __init__(self, root: str | os.PathLike[str], mode: str = "rw") -> None:
        if mode not in MODES:
            raise UsageError(f"--cache-mode must be one of: {', '.join(MODES)}")
        self.root = os.path.abspath(os.fspath(root))
        self.mode = mode
        self.counts = CacheCounts()
        self._dirs: set[str] = set()
        self._failed_once = False
        self.readable = mode in ("rw", "read")
        self.writable = mode in ("rw", "write")
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise OutputError(f"cache {self.root} is not a directory")
        if not os.path.isdir(self.root) and not self.writable:
            raise OutputError(f"cache {self.root} does not exist (--cache-mode read)")
        _check_is_cache(self.root)
        if self.writable:
            problem = self._init_dir()
            if problem is not None:
                if mode == "write":
                    raise OutputError(f"cannot write to cache {self.root}: {problem}")
                self.writable = False
                self.counts.notes.append(
                    f"cache {self.root} cannot be written ({problem}): reading it only"
                )

    def _init_dir(self) -> str | None:
        """Create the directory and its marker; None if it can be written, else why not."""
        try:
            os.makedirs(self.root, exist_ok=True)
            for name, text in ((MARKER, '{"format": 1}\n'), ("CACHEDIR.TAG", _TAG)):
                path = os.path.join(self.root, name)
                if not os.path.exists(path):
                    _write_atomically(path, text.encode())
            probe = os.path.join(self.root, f".probe.{_unique()}.tmp")
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            os.unlink(probe)
        except OSError as exc:
            return exc.strerror or str(exc)
        return None

    # -- lookups ------------------------------------------------------------------------------

    def get(self, name: str) -> Entry | None:
        """The entry stored as `name` (`keys.entry_name`), or None: absent, unreadable, torn or
        corrupt (counted in `counts.corrupt`). One open and one read."""
        try:
            fd = os.open(f"{self.root}/{ANSWERS}/{name[:2]}/{name[2:4]}/{name}", _READ)
        except OSError:
            return None
        try:
            data = _read_all(fd)
        except OSError:
            data = b""
        finally:
            os.close(fd)
        entry = decode_entry(data)
        if entry is None or entry.meta.get("name") != name:
            self.counts.corrupt += 1
            return None
        return entry

    # -- stores -------------------------------------------------------------------------------

    def put(self, key: str, draw: int, one_draw: bool, body: bytes, meta: dict[str, Any]) -> str:
        """Store an answer as draw `draw` of `key` and return the entry's name ('' if it could
        not be stored: the first failure is noted, the run goes on).

        A draw number another process took meanwhile is not overwritten: the answer goes to the
        next free one (two runs drawing the same body at once each add a draw). A body that is
        one draw keeps the answer already stored, if any. A torn or corrupt entry is replaced.
        """
        tries = 1 if one_draw else _MAX_PROBE
        for k in range(draw, draw + tries):
            name = f"{key}.{k}"
            data = encode_entry({**meta, "name": name, "created": round(time.time(), 3)}, body)
            try:
                placed = self._place(name, data)
            except OSError as exc:
                self._store_failed(exc)
                return ""
            if placed or one_draw:
                self.counts.stored += placed
                return name
        self._store_failed(OSError(errno.EEXIST, f"{tries} draws of one body taken"))
        return ""

    def _place(self, name: str, data: bytes) -> bool:
        """Put `data` at entry `name` unless a valid entry is there; True if it was placed."""
        final = entry_path(self.root, name)
        folder = os.path.dirname(final)
        if folder not in self._dirs:
            os.makedirs(folder, exist_ok=True)
            self._dirs.add(folder)
        tmp = os.path.join(folder, f".{name}.{_unique()}.tmp")
        _write_new(tmp, data)
        try:
            try:
                os.link(tmp, final)
                return True
            except FileExistsError:
                if _same_inode(tmp, final):  # an NFS retry of a link that had succeeded
                    return True
                if self._valid_at(final, name):
                    return False
                os.replace(tmp, final)  # a torn or corrupt entry: replace it
                return True
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                    raise
                if os.path.exists(final) and self._valid_at(final, name):
                    return False  # no hard links here: check, then rename (a narrow race)
                os.replace(tmp, final)
                return True
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def _valid_at(self, path: str, name: str) -> bool:
        try:
            with open(path, "rb", buffering=0) as f:
                entry = decode_entry(f.read())
        except OSError:
            return False
        return entry is not None and entry.meta.get("name") == name

    def _store_failed(self, exc: OSError) -> None:
        self.counts.store_failed += 1
        if not self._failed_once:
            self._failed_once = True
            self.counts.notes.append(
                f"cannot store answers in cache {self.root} ({exc.strerror or exc}); the run "
                "goes on without storing"
            )

    # -- the run log --------------------------------------------------------------------------

    def record_run(self, output: str) -> None:
        """Keep this run's counts in `runs/` (best effort) for `cache stats`."""
        c = self.counts
        if not self.writable or not (c.hits or c.misses or c.stored):
            return
        record = {
            "time": round(time.time(), 3),
            "host": socket.gethostname(),
            "output": os.path.abspath(output),
            "mode": self.mode,
            "hits": c.hits,
            "misses": c.misses,
            "stored": c.stored,
            "corrupt": c.corrupt,
            "saved_prompt_tokens": c.saved_prompt_tokens,
            "saved_completion_tokens": c.saved_completion_tokens,
            "saved_usd": c.saved_usd,
        }
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        path = os.path.join(self.root, RUNS, f"{stamp}-{_unique()}.json")
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            _write_atomically(path, orjson.dumps(record) + b"\n")


def _check_is_cache(root: str) -> None:
    """Refuse a directory with other things in it and no cache marker: a mistyped `--cache`
    must not fill (or `cache prune`, empty) someone's folder."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputError(f"cannot read cache {root}: {exc.strerror}") from None
    if names and MARKER not in names:
        raise OutputError(
            f"{root} is not a jsonlbatch cache (it has files but no {MARKER}): give a new or "
            "empty directory, or one a run made"
        )


def _read_all(fd: int) -> bytes:
    """A whole (small) file: one read in the common case."""
    data = os.read(fd, _CHUNK)
    if len(data) < _CHUNK:
        return data
    parts = [data]
    while data:
        data = os.read(fd, _CHUNK)
        parts.append(data)
    return b"".join(parts)


def _unique() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{os.urandom(4).hex()}"


def _write_new(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _write_atomically(path: str, data: bytes) -> None:
    tmp = f"{path}.{_unique()}.tmp"
    try:
        _write_new(tmp, data)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _same_inode(a: str, b: str) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)

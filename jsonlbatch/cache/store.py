"""The answer cache on disk: append-only packs of compressed answers, and indexes over them.

Why not a database (SQLite, `diskcache`): the cache is meant to be shared by several processes
and several machines over a network file system, where file locks (which SQLite needs) are
unreliable. Packs need no lock at all (`pack.py` has the format):

- every process that stores answers appends them to a pack of its own; a record is one `write`,
  made before the answer's output line, so an answer in any output is in the cache;
- every record carries a CRC-32 and is a zlib stream: a torn or corrupt record (a kill -9, a
  copy cut short, a disk error) is a miss, and the next store adds a good copy;
- when it ends, a process writes an index of its pack (a hash table, written whole under a
  temporary name and renamed), and when a cache has more than a few indexes, one index over
  all of them, which replaces them;
- a reader maps the indexes (a lookup is a probe into a table the kernel caches, then one
  `pread` of the record) and walks only what no index covers yet: the packs of running or
  killed processes.

Layout of a cache directory::

    jsonlbatch-cache.json        marks the directory as a cache (prune removes nothing elsewhere)
    CACHEDIR.TAG                 tells backup tools to skip it (bford.info/cachedir)
    packs/<time>-<host>-<pid>-<random>.pack   answers, appended by one process each
    packs/0-<time counted down>-<host>-<pid>-<random>.pack   the same, of a refresh
                                 (`--cache-mode write`): sorts first, so its copies win
    packs/<time>-<host>-<pid>-<random>.idx    indexes over the packs
    runs/<time>-<host>-<pid>.json  one line of counts per run (hits, misses, stored): `cache stats`
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from jsonlbatch.cache.pack import (
    INDEX_SUFFIX,
    PACK_SUFFIX,
    Cover,
    Entry,
    Index,
    Table,
    decode_record,
    encode_record,
    iter_records,
    key64,
    open_regular,
    read_small,
    write_index,
)
from jsonlbatch.errors import OutputError, UsageError

MODES = ("rw", "read", "write")
MARKER = "jsonlbatch-cache.json"
FORMAT = 2
PACKS = "packs"
RUNS = "runs"
_TAG = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This directory is a jsonlbatch answer cache: see `jsonlbatch cache stats`.\n"
)
#: Packs kept open at once (the longest unused is closed first).
_MAX_OPEN = 128
#: How many draw numbers past the wanted one a store tries when the cache has them already.
_MAX_PROBE = 64
#: A record longer than this is checked against its pack's size before it is read (a damaged
#: index slot may give any length).
_BIG_RECORD = 1 << 20
#: More sources than this (indexes, plus packs walked in part) and a closing writer merges them.
MERGE_AT = 4
#: As many records found by walking (packs of killed runs: no index) and a closing writer
#: merges too, so that later runs do not walk them again.
WALKED_MAX = 4096

__all__ = ["FORMAT", "MARKER", "MODES", "PACKS", "RUNS", "Cache", "CacheCounts", "Entry"]


@dataclass
class CacheCounts:
    """What one run did with the cache (kept in `runs/`, summed by `cache stats`)."""

    hits: int = 0
    misses: int = 0
    stored: int = 0
    corrupt: int = 0  # records found torn or corrupt: treated as misses
    refused: int = 0  # stored answers the run's checks refused (a schema): sent, as misses
    store_failed: int = 0
    saved_prompt_tokens: int = 0
    saved_completion_tokens: int = 0
    saved_usd: float | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class _View:
    """What a process knows of the cache: the packs (numbered in name order: the first of two
    records of one draw wins), the tables that index them, and what each covers."""

    packs: list[str]
    tables: list[tuple[Table, list[int]]]  # a table, and its pack numbers -> the view's
    indexes: list[Index]
    covered: dict[str, int]  # bytes of each pack that the tables cover
    sealed: set[str]
    redundant: list[str] = field(default_factory=list)  # index files that add nothing
    walked: int = 0  # records found by walking packs no index covers (all of them)


class Cache:
    """A cache directory opened in one mode: `rw` (look up, store misses), `read` (look up
    only) or `write` (store only: refresh answers without reading old ones).

    A `rw` cache whose directory cannot be written (a read-only mount, no permission) is used
    for reading only, with a note in `counts.notes`; `write` there is an error. Call `close`
    when done: it writes the index of what this process stored.
    """

    def __init__(self, root: str | os.PathLike[str], mode: str = "rw") -> None:
        if mode not in MODES:
            raise UsageError(f"--cache-mode must be one of: {', '.join(MODES)}")
        self.root = os.path.abspath(os.fspath(root))
        self.mode = mode
        self.counts = CacheCounts()
        self._failed_once = False
        self.readable = mode in ("rw", "read")
        self.writable = mode in ("rw", "write")
        self._view: _View | None = None
        self._fds: dict[int, int] = {}
        self._pack_fd: int | None = None  # this process's pack, once it stores something
        self._pack_name = ""
        self._pack_size = 0
        self._own = Table.empty(64)
        self._names: list[str] = []  # the packs of the view, in name order
        self._corrupt: set[tuple[int, int]] = set()  # (pack, offset) of damaged records met
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise OutputError(f"cache {self.root} is not a directory")
        if not os.path.isdir(self.root) and not self.writable:
            raise OutputError(f"cache {self.root} does not exist (--cache-mode read)")
        check_is_cache(self.root)
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
            os.makedirs(os.path.join(self.root, PACKS), exist_ok=True)
            marker = orjson.dumps({"format": FORMAT}) + b"\n"
            for name, text in ((MARKER, marker), ("CACHEDIR.TAG", _TAG.encode())):
                path = os.path.join(self.root, name)
                if not os.path.exists(path):
                    _write_atomically(path, text)
            probe = os.path.join(self.root, PACKS, f".probe.{_unique()}.tmp")
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            os.unlink(probe)
        except OSError as exc:
            return exc.strerror or str(exc)
        return None

    # -- lookups ------------------------------------------------------------------------------

    def get(self, key: bytes, draw: int) -> Entry | None:
        """The answer stored as draw `draw` of `key` (`keys.body_digest`), or None: absent, or
        torn or corrupt (counted in `counts.corrupt`; a later good copy is used instead)."""
        view = self._view or self.view()
        k = int.from_bytes(key[:8], "little", signed=True) or 1  # `key64`, inlined: per lookup
        found: list[tuple[int, int, int]] = []
        for table, numbers in view.tables:
            if table.entries:
                hit = table.find(k, draw)
                if hit is not None and hit[0] < len(numbers) and numbers[hit[0]] >= 0:
                    found.append((numbers[hit[0]], hit[1], hit[2]))
        if len(found) > 1:
            found = sorted(set(found))  # the first pack's record wins
        fds = self._fds
        for pack, offset, length in found:
            try:
                fd = fds.get(pack) or self._fd(pack)
                if length > _BIG_RECORD and offset + length > os.fstat(fd).st_size:
                    raise OSError("a damaged index slot")
                data = os.pread(fd, length, offset)
            except (OSError, OverflowError):
                data = b""
            entry = decode_record(data, key, draw)
            if entry is not None:
                return entry
            if (pack, offset) not in self._corrupt:  # counted once, however often met
                self._corrupt.add((pack, offset))
                self.counts.corrupt += 1
        return None

    def view(self) -> _View:
        """Open the indexes (and walk what they do not cover) once, on first need."""
        if self._view is None:
            self._view = self._load()
        return self._view

    def _fd(self, pack: int) -> int:
        """An open descriptor of pack `pack`; at most `_MAX_OPEN` are kept (a cache of
        thousands of packs, planted or not, must not use up the process's descriptors)."""
        fd = self._fds.get(pack)
        if fd is None:
            if len(self._fds) >= _MAX_OPEN:
                os.close(self._fds.pop(next(iter(self._fds))))
            name = self._names[pack] if pack < len(self._names) else self._pack_name
            fd = self._fds[pack] = open_regular(os.path.join(self.root, PACKS, name))
        return fd

    def _load(self) -> _View:
        for _ in range(3):  # an index merged away between listing and opening: list again
            view, vanished = self._try_load()
            if not vanished:
                return view
            for index in view.indexes:
                index.close()
        return view

    def _try_load(self) -> tuple[_View, bool]:
        folder = os.path.join(self.root, PACKS)
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            names = []
        except OSError as exc:
            raise OutputError(f"cannot read cache {self.root}: {exc.strerror}") from None
        self._names = packs = sorted(n for n in names if n.endswith(PACK_SUFFIX))
        number = {name: i for i, name in enumerate(packs)}
        indexes, vanished = [], False
        for name in sorted(n for n in names if n.endswith(INDEX_SUFFIX)):
            index = Index.open(os.path.join(folder, name))
            if index is None:
                vanished |= not os.path.exists(os.path.join(folder, name))
                continue
            indexes.append(index)
        indexes.sort(key=lambda i: -i.table.entries)
        view = _View(packs, [], [], {}, set())
        for index in indexes:  # the biggest first; one that adds nothing is left out
            if not any(c.covered > view.covered.get(c.pack, 0) for c in index.covers):
                view.redundant.append(index.path)
                index.close()
                continue
            view.indexes.append(index)
            view.tables.append((index.table, [number.get(c.pack, -1) for c in index.covers]))
            for c in index.covers:
                view.covered[c.pack] = max(c.covered, view.covered.get(c.pack, 0))
                if c.sealed:
                    view.sealed.add(c.pack)
        tail = self._walk_tails(view)
        if tail.entries:
            view.tables.append((tail, list(range(len(packs)))))
        view.tables.append((self._own, [len(packs)]))  # this process's pack comes last
        return view, vanished

    def _walk_tails(self, view: _View) -> Table:
        """Index in memory what no index file covers: packs being written by running
        processes, or left by killed ones."""
        table = Table.empty(1024)
        for number, name in enumerate(view.packs):
            start = view.covered.get(name, 0)
            try:
                fd = self._fd(number)
                size = os.fstat(fd).st_size
            except OSError:
                continue
            if size <= start:
                continue
            end = start  # of the last whole record: a record being written is not covered yet
            for rec in iter_records(fd, start, size):
                end = rec.offset + rec.length
                if not rec.valid:
                    self.counts.corrupt += 1
                    continue
                if table.full():
                    table = table.grown()
                table.add(key64(rec.key), rec.draw, number, rec.offset, rec.length)
            view.covered[name] = end
        view.walked = table.entries
        return table

    # -- stores -------------------------------------------------------------------------------

    def put(
        self, key: bytes, draw: int, one_draw: bool, body: bytes, meta: dict[str, Any]
    ) -> int | None:
        """Store an answer as draw `draw` of `key` and return the draw it was stored as (-1 if
        it could not be stored: the first failure is noted, the run goes on).

        A body that is one draw keeps the answer already stored, if any (None: nothing stored,
        the stored answer is the one lookups find). A draw already taken is not stored again:
        the answer goes to the next free one. Two processes storing the same draw at once each
        append it; the first pack's copy is the one every lookup finds.

        `--cache-mode write` refreshes: what other runs stored is replaced, not kept. Its pack
        is named to sort before every other pack (`_pack_name`), so its copy is the first
        pack's; only the draws this process stored itself count as taken."""
        own = self._own
        taken = self.get if self.readable else lambda k, d: own.find(key64(k), d)
        if one_draw and taken(key, 0) is not None:
            return None
        if not one_draw:
            for d in range(draw, draw + _MAX_PROBE):
                if taken(key, d) is None:
                    draw = d
                    break
            else:
                self._store_failed(OSError(f"{_MAX_PROBE} draws of one body taken"))
                return -1
        record = encode_record(key, draw, {**meta, "created": round(time.time(), 3)}, body)
        try:
            offset = self._append(record)
        except OSError as exc:
            self._store_failed(exc)
            return -1
        own = self._own
        if own.full():
            self._own = own = own.grown()
            if self._view is not None:
                self._view.tables[-1] = (own, self._view.tables[-1][1])
        own.add(key64(key), draw, 0, offset, len(record))
        self.counts.stored += 1
        return draw

    def _append(self, record: bytes) -> int:
        if self._pack_fd is None:
            self.view()  # packs listed before this one exists: its number is theirs + 1
            self._pack_name = _pack_name(refresh=not self.readable)
            path = os.path.join(self.root, PACKS, self._pack_name)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
            self._pack_fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
        offset = self._pack_size
        view = memoryview(record)
        while view:
            view = view[os.write(self._pack_fd, view) :]
        self._pack_size += len(record)
        return offset

    def _store_failed(self, exc: OSError) -> None:
        self.counts.store_failed += 1
        if not self._failed_once:
            self._failed_once = True
            self.counts.notes.append(
                f"cannot store answers in cache {self.root} ({exc.strerror or exc}); the run "
                "goes on without storing"
            )

    # -- closing ------------------------------------------------------------------------------

    def close(self) -> None:
        """Seal this process's pack: fsync it and write its index (or, when the cache has
        more than `MERGE_AT` sources, one index over everything, replacing theirs)."""
        try:
            if self._pack_fd is not None:
                with contextlib.suppress(OSError):
                    os.fsync(self._pack_fd)
                with contextlib.suppress(OSError):
                    self._write_indexes()
        finally:
            for fd in [*self._fds.values(), *([self._pack_fd] if self._pack_fd else [])]:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._fds.clear()
            self._pack_fd = None
            if self._view is not None:
                for index in self._view.indexes:
                    index.close()
                self._view = None

    def _write_indexes(self) -> None:
        view = self.view()
        folder = os.path.join(self.root, PACKS)
        path = os.path.join(folder, f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-"
                                    f"{_unique()}{INDEX_SUFFIX}")  # fmt: skip
        own = Cover(self._pack_name, self._pack_size, True)
        sources = len(view.indexes) + bool(view.walked) + 1
        if sources <= MERGE_AT and view.walked < WALKED_MAX:
            write_index(path, [own], self._own.items(), self._own.entries)
            return
        # one index over every pack this process knows, replacing the ones it read; numbered
        # in name order (this pack is the view's last, but a refreshing one sorts first)
        names = [*view.packs, self._pack_name]
        order = sorted(range(len(names)), key=names.__getitem__)
        renumber = [0] * len(names)
        for new, old in enumerate(order):
            renumber[old] = new
        covers = [*(Cover(p, view.covered.get(p, 0), p in view.sealed) for p in view.packs), own]
        covers = [covers[i] for i in order]

        def entries() -> Any:
            for table, numbers in view.tables:
                for k, d, pack, offset, length in table.items():
                    if pack < len(numbers) and numbers[pack] >= 0:  # not a damaged slot
                        yield k, d, renumber[numbers[pack]], offset, length

        def reads(pack: int, offset: int, length: int) -> bool:
            """Whether a record one of two entries of one draw points at is whole."""
            try:
                fd = self._fd(order[pack])
                if length > _BIG_RECORD and offset + length > os.fstat(fd).st_size:
                    return False  # a damaged index slot
                return decode_record(os.pread(fd, length, offset)) is not None
            except (OSError, OverflowError, IndexError):
                return False

        write_index(path, covers, entries(), sum(t.entries for t, _ in view.tables), reads)
        for stale in [i.path for i in view.indexes] + view.redundant:
            with contextlib.suppress(OSError):
                os.unlink(stale)

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


def check_is_cache(root: str) -> None:
    """Refuse a directory with other things in it and no cache marker (a mistyped `--cache`
    must not fill, or `cache prune` empty, someone's folder), and a cache of another format."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputError(f"cannot read cache {root}: {exc.strerror}") from None
    # what another process creating this cache right now has made before its marker
    being_made = {PACKS, RUNS, "CACHEDIR.TAG"}
    if MARKER not in names and any(
        n not in being_made and not n.startswith(f"{MARKER}.") for n in names
    ):
        raise OutputError(
            f"{root} is not a jsonlbatch cache (it has files but no {MARKER}): give a new or "
            "empty directory, or one a run made"
        )
    if MARKER in names:
        try:
            found = orjson.loads(read_small(os.path.join(root, MARKER))).get("format")
        except (OSError, orjson.JSONDecodeError, AttributeError):
            found = None
        if found != FORMAT:
            raise OutputError(
                f"cache {root} has format {found!r}, this jsonlbatch reads format {FORMAT} "
                "(an earlier development build wrote one file per answer): give a new "
                "directory, or delete this one"
            )


def _pack_name(refresh: bool) -> str:
    """A new pack's name: `<time>-<host>-<pid>-<random>.pack`, which sorts after the packs
    before it; refreshing (`--cache-mode write`), `0-<time counted down>-...`, which sorts
    before every other pack, the newest refresh first: its copies are the ones found."""
    if refresh:  # microseconds, counted down from 2**60
        return f"0-{(1 << 60) - time.time_ns() // 1000:019d}-{_unique()}{PACK_SUFFIX}"
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{_unique()}{PACK_SUFFIX}"


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

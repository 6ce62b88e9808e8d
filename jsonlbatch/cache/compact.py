"""Rewriting a cache's packs and indexes: what `cache prune` does on disk (`manage.py` decides
what goes; `pack.py` has the format, `store.py` the readers and writers this must not upset).

Packs are append-only, so pruning rewrites: a pack that loses records is copied without them to
a new pack whose name sorts where the old one did (the old stem, `~`, a random suffix: "the
first pack in name order wins" keeps its meaning), fsynced and renamed into place before the old
pack goes. A reader that listed the old pack keeps its open file, or gets a miss. A pack that a
writer may still append to is never rewritten: only one an index says is sealed (its writer
closed it) or one untouched for over an hour (its writer died). Then one index over all packs
replaces the old ones, so a lookup stays one probe.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from jsonlbatch.cache.pack import (
    INDEX_SUFFIX,
    PACK_SUFFIX,
    SLOT,
    Cover,
    Found,
    Index,
    decode_record,
    iter_records,
    key64,
    open_regular,
    write_index,
)
from jsonlbatch.cache.store import PACKS, _unique
from jsonlbatch.errors import OutputError

#: Seconds: a temporary file, or an unsealed pack, untouched this long was left by a dead run.
STALE = 3600.0
_REWRITTEN = re.compile(r"~[0-9a-f]{8}$")


@dataclass
class PackFile:
    """A pack as found by a survey, and what a prune does with it."""

    name: str
    size: int
    mtime: float
    sealed: bool  # an index says its writer closed it
    safe: bool = False  # may be rewritten: sealed, or its writer is dead
    valid: int = 0  # records whose CRC holds (what an index lists)
    dropped: int = 0
    oldest_kept: float = math.inf


@dataclass
class Survey:
    """A cache's packs (in name order) and indexes, as listed at one moment."""

    packs: list[PackFile]
    indexes: list[str]  # paths
    index_bytes: int


def rewrite(root: str, pack: PackFile, drop: Callable[[dict[str, Any]], bool]) -> bool:
    """Copy `pack` but for the records `drop` chooses and corrupt ones to a new pack (fsynced,
    then renamed into place), remove the old one and make `pack` the new one (size 0: none
    kept). False if the pack is in use after all (it grew) or was removed meanwhile."""
    folder = os.path.join(root, PACKS)
    old = os.path.join(folder, pack.name)
    name = f"{_REWRITTEN.sub('', pack.name[: -len(PACK_SUFFIX)])}~{os.urandom(4).hex()}"
    name, tmp = name + PACK_SUFFIX, os.path.join(folder, f"{name}.tmp")
    size = kept = 0
    try:
        if os.stat(old).st_size != pack.size:
            return False
        with open(tmp, "xb") as out:
            for _, meta, data in records(root, pack):
                if meta is not None and not drop(meta):
                    out.write(data)
                    size, kept = size + len(data), kept + 1
            out.flush()
            os.fsync(out.fileno())
        if kept:
            os.replace(tmp, os.path.join(folder, name))
            dir_fd = os.open(folder, os.O_RDONLY)  # the new name is on disk before the old goes
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        os.unlink(old)
    except FileNotFoundError:  # pruned meanwhile by another prune
        return False
    except OSError as exc:
        raise OutputError(f"cannot prune cache {root}: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    pack.name, pack.size, pack.valid, pack.sealed = name, size, kept, True
    return True


def reindex(root: str, survey: Survey) -> None:
    """Write one index over every pack (sealed where known) and remove the older indexes."""
    folder = os.path.join(root, PACKS)
    packs = sorted(survey.packs, key=lambda p: p.name)

    def entries() -> Iterator[tuple[int, int, int, int, int]]:
        for number, pack in enumerate(packs):
            try:
                fd = open_regular(os.path.join(folder, pack.name))
            except OSError:  # removed meanwhile (another prune), or not a file: left out
                continue
            try:
                for rec in iter_records(fd, 0, pack.size):
                    if rec.valid:
                        yield key64(rec.key), rec.draw, number, rec.offset, rec.length
            finally:
                os.close(fd)

    if packs:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        covers = [Cover(p.name, p.size, p.sealed) for p in packs]
        path = os.path.join(folder, f"{stamp}-{_unique()}{INDEX_SUFFIX}")
        write_index(path, covers, entries(), sum(p.valid for p in packs))
    for old in survey.indexes:
        with contextlib.suppress(OSError):
            os.unlink(old)


def list_cache(root: str, now: float) -> Survey:
    """The packs (in name order) and indexes of a cache, and which packs are sealed."""
    folder = os.path.join(root, PACKS)
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        names = []
    except OSError as exc:  # packs/ is a file, or cannot be read
        raise OutputError(f"cannot read cache {root}: {exc.strerror}") from None
    survey = Survey([], [], 0)
    sealed: set[str] = set()
    for name in names:
        if name.endswith(INDEX_SUFFIX):
            index = Index.open(os.path.join(folder, name))
            if index is not None:
                sealed.update(c.pack for c in index.covers if c.sealed)
                survey.indexes.append(index.path)
                table = index.table  # its file's size, as `Index.open` checked
                survey.index_bytes += table.base + table.n_slots * SLOT.size
                index.close()
    for name in names:
        if name.endswith(PACK_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(os.path.join(folder, name))
                pack = PackFile(name, st.st_size, st.st_mtime, name in sealed)
                pack.safe = pack.sealed or now - st.st_mtime > STALE
                survey.packs.append(pack)
    return survey


def records(root: str, pack: PackFile) -> Iterator[tuple[Found, dict[str, Any] | None, bytes]]:
    """(record, its metadata or None if torn or corrupt, its bytes) of the first `pack.size`
    bytes of a pack; a stretch that holds no record (a torn write) is one corrupt record.
    Counts the CRC-valid records into `pack.valid`."""
    try:
        fd = open_regular(os.path.join(root, PACKS, pack.name))
    except OSError:  # pruned meanwhile, or not a file (nothing of it is read)
        return
    pack.valid = pos = 0
    try:
        for rec in iter_records(fd, 0, pack.size):
            if rec.offset > pos:
                yield Found(pos, rec.offset - pos, b"", 0, False), None, b""
            pos = rec.offset + rec.length
            pack.valid += rec.valid
            data = os.pread(fd, rec.length, rec.offset) if rec.valid else b""
            entry = decode_record(data, head_only=True) if rec.valid else None
            yield rec, entry.meta if entry is not None else None, data
        if pos < pack.size:
            yield Found(pos, pack.size - pos, b"", 0, False), None, b""
    finally:
        os.close(fd)


def stored_at(meta: dict[str, Any], pack: PackFile) -> float:
    """When a record was stored: its `created`, else (a record of a foreign writer) its pack's
    last change, so that it still ages out."""
    created = meta.get("created")
    if isinstance(created, (int, float)) and not isinstance(created, bool):
        return float(created)
    return pack.mtime

"""`jsonlbatch cache stats|prune DIR`: what a cache holds, and making it smaller.

Both walk every pack once (`pack.iter_records`) and inflate the head of each record (its
metadata: model, time stored), so torn and corrupt records are found and pruned too. Memory is
a few counters a pack, plus 16 bytes a kept answer for `--max-size` (the ages and sizes that
find the cut-off time).

Packs are append-only, so pruning rewrites: a pack that loses records is copied without them to
a new pack whose name sorts where the old one did (the old stem, `~`, a random suffix: "the
first pack in name order wins" keeps its meaning), which is fsynced before the old pack goes.
A pack that another process may still append to is never rewritten: only one sealed by an index
(its writer closed it) or untouched for over an hour (its writer died). Then one index over all
packs replaces the old ones, so a lookup stays one probe.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import time
from array import array
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from jsonlbatch.cache.pack import (
    INDEX_SUFFIX,
    PACK_SUFFIX,
    Cover,
    Found,
    Index,
    decode_record,
    iter_records,
    key64,
    read_record,
    write_index,
)
from jsonlbatch.cache.store import MARKER, PACKS, RUNS, _unique, check_is_cache
from jsonlbatch.errors import OutputError, UsageError

_STALE = 3600.0  # seconds: a temporary file, or an unsealed pack, this old was left by a dead run
_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_REWRITTEN = re.compile(r"~[0-9a-f]{8}$")


@dataclass
class CacheStats:
    """What `jsonlbatch cache stats` shows."""

    root: str
    entries: int = 0
    bytes: int = 0  # packs and indexes on disk
    corrupt: int = 0  # torn or corrupt records (and stretches of a pack that hold none)
    temp_files: int = 0
    oldest: float | None = None
    newest: float | None = None
    models: Counter[str] = field(default_factory=Counter)  # entries by model
    model_bytes: Counter[str] = field(default_factory=Counter)
    packs: int = 0
    indexes: int = 0
    runs: int = 0  # runs that recorded their counts
    hits: int = 0
    misses: int = 0
    stored: int = 0
    saved_usd: float = 0.0

    def format(self) -> str:
        def when(t: float | None) -> str:
            return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "-"

        lines = [
            f"{self.root}: {self.entries:,} answers, {_size(self.bytes)} on disk "
            f"({self.packs} packs, {self.indexes} indexes)",
            f"  stored from {when(self.oldest)} to {when(self.newest)}",
        ]
        asked = self.hits + self.misses
        rate = f" ({self.hits / asked:.1%} of lookups)" if asked else ""
        saved = f", saved ${self.saved_usd:,.4f} at the runs' prices" if self.saved_usd else ""
        lines.append(
            f"  {self.runs} runs recorded: {self.hits:,} hits{rate}, {self.misses:,} misses, "
            f"{self.stored:,} answers stored{saved}"
        )
        if self.corrupt:
            lines.append(f"  {self.corrupt} torn or corrupt records (misses; prune removes them)")
        if self.temp_files:
            lines.append(f"  {self.temp_files} temporary files of unfinished writes")
        if self.models:
            lines.append("  by model:")
            for model, n in self.models.most_common():
                lines.append(f"    {model}: {n:,} answers, {_size(self.model_bytes[model])}")
        return "\n".join(lines)


@dataclass
class PruneResult:
    removed: int = 0  # answers, and torn or corrupt records
    freed: int = 0
    kept: int = 0
    kept_bytes: int = 0
    temp_removed: int = 0
    in_use: int = 0  # of `kept`: answers in packs still being written, left alone
    in_use_packs: int = 0

    def format(self, dry_run: bool = False) -> str:
        verb = "would remove" if dry_run else "removed"
        text = (
            f"{verb} {self.removed:,} answers ({_size(self.freed)}); kept {self.kept:,} "
            f"({_size(self.kept_bytes)})"
        )
        if self.in_use_packs:
            text += (
                f", of which {self.in_use:,} in {self.in_use_packs} packs still being written "
                "(left alone: prune again when those runs end)"
            )
        if self.temp_removed:
            text += f"; {verb} {self.temp_removed} stale temporary files"
        return text


@dataclass
class _Pack:
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
class _Survey:
    packs: list[_Pack]
    indexes: list[str]  # paths
    index_bytes: int


def cache_stats(root: str | os.PathLike[str]) -> CacheStats:
    """Count the answers of a cache by model, their size and age, and the runs' hit counts."""
    root = _cache_root(root)
    stats = CacheStats(root)
    survey = _survey(root, time.time())
    stats.packs, stats.indexes = len(survey.packs), len(survey.indexes)
    stats.bytes = survey.index_bytes + sum(p.size for p in survey.packs)
    stats.temp_files = sum(1 for _ in _temp_files(root))
    for pack in survey.packs:
        for rec, meta, _ in _records(root, pack):
            if meta is None:
                stats.corrupt += 1
                continue
            stats.entries += 1
            model = str(meta.get("model") or "-")
            stats.models[model] += 1
            stats.model_bytes[model] += rec.length
            t = _created(meta, pack)
            stats.oldest = t if stats.oldest is None else min(stats.oldest, t)
            stats.newest = t if stats.newest is None else max(stats.newest, t)
    for record in _run_records(root):
        stats.runs += 1
        stats.hits += _int(record.get("hits"))
        stats.misses += _int(record.get("misses"))
        stats.stored += _int(record.get("stored"))
        saved = record.get("saved_usd")
        stats.saved_usd += saved if isinstance(saved, (int, float)) else 0.0
    return stats


def prune(
    root: str | os.PathLike[str],
    *,
    older_than: float | None = None,
    max_bytes: int | None = None,
    model: str | None = None,
    dry_run: bool = False,
) -> PruneResult:
    """Remove answers: of `model` only (all of them, or those older than `older_than` seconds),
    else those older than `older_than`; then the oldest until at most `max_bytes` (of answers'
    records) remain. Torn or corrupt records and temporary files older than an hour always go,
    and with `older_than` alone, the runs' records (`runs/`) older than that. Age is the time an
    answer was stored. Packs still being written are left alone (`PruneResult.in_use`)."""
    if older_than is None and max_bytes is None and model is None:
        raise UsageError("say what to prune: --older-than, --max-size and/or --model")
    root = _cache_root(root)
    result = PruneResult()
    now = time.time()
    cutoff = now - older_than if older_than is not None else None

    def chosen(meta: dict[str, Any], pack: _Pack, cut: float | None) -> bool:
        created = _created(meta, pack)
        if (model is not None or cutoff is not None) and (
            (model is None or meta.get("model") == model) and (cutoff is None or created < cutoff)
        ):
            return True
        return cut is not None and created <= cut

    survey = _survey(root, now)
    ages, sizes = array("d"), array("q")
    for pack in survey.packs:
        result.in_use_packs += not pack.safe
        for rec, meta, _ in _records(root, pack):
            if not pack.safe:
                result.in_use += meta is not None
            elif meta is None or chosen(meta, pack, None):
                pack.dropped += 1
                result.removed += 1
                result.freed += rec.length
                continue
            elif max_bytes is not None:
                ages.append(_created(meta, pack))
                sizes.append(rec.length)
                pack.oldest_kept = min(pack.oldest_kept, ages[-1])
            if meta is not None:
                result.kept += 1
                result.kept_bytes += rec.length
    cut = None
    if max_bytes is not None and result.kept_bytes > max_bytes:
        cut = _cut(result, ages, sizes, result.kept_bytes - max_bytes)
    del ages, sizes
    for path in _temp_files(root):
        with contextlib.suppress(OSError):
            if now - os.stat(path).st_mtime > _STALE:
                result.temp_removed += 1
                if not dry_run:
                    os.unlink(path)
    if dry_run:
        return result
    changed = False
    for pack in survey.packs:
        if pack.safe and (pack.dropped or (cut is not None and pack.oldest_kept <= cut)):
            changed |= _rewrite(root, pack, functools.partial(chosen, pack=pack, cut=cut))
    survey.packs = [p for p in survey.packs if p.size]
    if changed or len(survey.indexes) != 1:
        try:
            _reindex(root, survey)
        except OSError as exc:
            raise OutputError(f"cannot prune cache {root}: {exc.strerror or exc}") from None
    if cutoff is not None and model is None:  # old runs' counts go too
        _prune_runs(root, cutoff)
    return result


def _cut(result: PruneResult, ages: array, sizes: array, excess: int) -> float | None:
    """The time up to which the oldest removable answers go to free `excess` bytes; counted
    into `result` (records stored at that very time too go)."""
    order = sorted(range(len(ages)), key=ages.__getitem__)
    freed, cut = 0, None
    for i in order:
        freed += sizes[i]
        cut = ages[i]
        if freed >= excess:
            break
    del order
    if cut is None:
        return None
    for age, size in zip(ages, sizes, strict=True):
        if age <= cut:
            result.removed += 1
            result.freed += size
            result.kept -= 1
            result.kept_bytes -= size
    return cut


def _rewrite(root: str, pack: _Pack, drop: Callable[[dict[str, Any]], bool]) -> bool:
    """Copy the records of `pack` but those `drop` chooses (and corrupt ones) to a new pack (fsynced, then renamed into
    place) and remove the old one; update `pack` to the new one (size 0: none kept). False if
    the pack turned out to be in use (it grew) or was removed meanwhile."""
    folder = os.path.join(root, PACKS)
    old = os.path.join(folder, pack.name)
    stem = _REWRITTEN.sub("", pack.name[: -len(PACK_SUFFIX)])
    name = f"{stem}~{os.urandom(4).hex()}{PACK_SUFFIX}"
    tmp = os.path.join(folder, f"{name}.tmp")
    try:
        if os.stat(old).st_size != pack.size:  # its writer is alive after all
            return False
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        size = kept = 0
        buf = bytearray()
        try:
            for _, meta, data in _records(root, pack):
                if meta is not None and not drop(meta):
                    buf += data
                    size, kept = size + len(data), kept + 1
                if len(buf) >= 1 << 20:
                    _write_all(out, buf)
                    buf.clear()
            _write_all(out, buf)
            os.fsync(out)
        finally:
            os.close(out)
        if kept:
            os.replace(tmp, os.path.join(folder, name))
        _fsync_dir(folder)
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


def _reindex(root: str, survey: _Survey) -> None:
    """Write one index over every pack (sealed where known) and remove the older indexes."""
    folder = os.path.join(root, PACKS)
    packs = sorted(survey.packs, key=lambda p: p.name)

    def entries() -> Iterator[tuple[int, int, int, int, int]]:
        for number, pack in enumerate(packs):
            try:
                fd = os.open(os.path.join(folder, pack.name), _READ)
            except OSError:  # removed meanwhile (another prune): a miss, nothing more
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


def _survey(root: str, now: float) -> _Survey:
    """The packs (in name order) and indexes of a cache, and which packs are sealed."""
    folder = os.path.join(root, PACKS)
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        names = []
    survey = _Survey([], [], 0)
    sealed: set[str] = set()
    for name in names:
        if name.endswith(INDEX_SUFFIX):
            index = Index.open(os.path.join(folder, name))
            if index is not None:
                sealed.update(c.pack for c in index.covers if c.sealed)
                survey.index_bytes += _file_size(index.path)
                survey.indexes.append(index.path)
                index.close()
    for name in names:
        if name.endswith(PACK_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(os.path.join(folder, name))
                pack = _Pack(name, st.st_size, st.st_mtime, name in sealed)
                pack.safe = pack.sealed or now - st.st_mtime > _STALE
                survey.packs.append(pack)
    return survey


def _records(root: str, pack: _Pack) -> Iterator[tuple[Found, dict[str, Any] | None, bytes]]:
    """(record, its metadata or None if torn or corrupt, its bytes) of the first `pack.size`
    bytes of a pack; a stretch that holds no record (a torn write) is one corrupt record.
    Counts the CRC-valid records into `pack.valid`."""
    try:
        fd = os.open(os.path.join(root, PACKS, pack.name), _READ)
    except FileNotFoundError:  # pruned meanwhile
        return
    pack.valid = pos = 0
    try:
        for rec in iter_records(fd, 0, pack.size):
            if rec.offset > pos:
                yield Found(pos, rec.offset - pos, b"", 0, False), None, b""
            pos = rec.offset + rec.length
            pack.valid += rec.valid
            data = read_record(fd, rec.offset, rec.length) if rec.valid else b""
            entry = decode_record(data, head_only=True) if rec.valid else None
            yield rec, entry.meta if entry is not None else None, data
        if pos < pack.size:
            yield Found(pos, pack.size - pos, b"", 0, False), None, b""
    finally:
        os.close(fd)


def _created(meta: dict[str, Any], pack: _Pack) -> float:
    created = meta.get("created")
    if isinstance(created, (int, float)) and not isinstance(created, bool):
        return float(created)
    return pack.mtime


def _temp_files(root: str) -> Iterator[str]:
    """Temporary files of unfinished writes (killed runs), in the cache's own folders."""
    for folder in (root, os.path.join(root, PACKS), os.path.join(root, RUNS)):
        with contextlib.suppress(FileNotFoundError):
            for name in sorted(os.listdir(folder)):
                if name.endswith(".tmp"):
                    yield os.path.join(folder, name)


def _prune_runs(root: str, cutoff: float) -> None:
    folder = os.path.join(root, RUNS)
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return
    for name in names:
        path = os.path.join(folder, name)
        with contextlib.suppress(OSError):
            if os.stat(path).st_mtime < cutoff:
                os.unlink(path)


def _cache_root(root: str | os.PathLike[str]) -> str:
    path = os.path.abspath(os.fspath(root))
    if not os.path.isdir(path):
        raise OutputError(f"cache {path} does not exist or is not a directory")
    if not os.path.exists(os.path.join(path, MARKER)):
        raise OutputError(f"{path} is not a jsonlbatch cache (no {MARKER})")
    check_is_cache(path)  # another format
    return path


def _run_records(root: str) -> Iterator[dict[str, Any]]:
    try:
        names = sorted(os.listdir(os.path.join(root, RUNS)))
    except FileNotFoundError:
        return
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(root, RUNS, name), "rb") as f:
                record = orjson.loads(f.read())
        except (OSError, orjson.JSONDecodeError):
            continue
        if isinstance(record, dict):
            yield record


def _write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_dir(folder: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} GB"

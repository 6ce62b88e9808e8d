"""`jsonlbatch cache stats|prune DIR`: what a cache holds, and making it smaller.

Both walk every pack once (`compact.records`) and inflate the head of each record (its
metadata: model, time stored), so torn and corrupt records are found and pruned too. Memory is
a few counters a pack, plus 16 bytes a kept answer for `--max-size` (the ages and sizes that
find the cut-off time). Prune rewrites only packs no writer may still append to, then writes
one index over all packs (`compact.py` says how, and why that is safe while runs go on).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from jsonlbatch.cache.compact import (
    STALE,
    PackFile,
    list_cache,
    records,
    reindex,
    rewrite,
    stored_at,
)
from jsonlbatch.cache.pack import read_small
from jsonlbatch.cache.store import MARKER, PACKS, RUNS, check_is_cache
from jsonlbatch.errors import OutputError, UsageError

_TEMP_IN = ("", PACKS, RUNS)  # where runs leave temporary files


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


def cache_stats(root: str | os.PathLike[str]) -> CacheStats:
    """Count the answers of a cache by model, their size and age, and the runs' hit counts."""
    root = _cache_root(root)
    stats = CacheStats(root)
    survey = list_cache(root, time.time())
    stats.packs, stats.indexes = len(survey.packs), len(survey.indexes)
    stats.bytes = survey.index_bytes + sum(p.size for p in survey.packs)
    stats.temp_files = len(_old_files(root, _TEMP_IN, ".tmp", math.inf))
    for pack in survey.packs:
        for rec, meta, _ in records(root, pack):
            if meta is None:
                stats.corrupt += 1
                continue
            stats.entries += 1
            model = str(meta.get("model") or "-")
            stats.models[model] += 1
            stats.model_bytes[model] += rec.length
            t = stored_at(meta, pack)
            stats.oldest = t if stats.oldest is None else min(stats.oldest, t)
            stats.newest = t if stats.newest is None else max(stats.newest, t)
    for record in _runrecords(root):
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

    def chosen(meta: dict[str, Any], pack: PackFile, cut: float | None) -> bool:
        created = stored_at(meta, pack)
        if (model is not None or cutoff is not None) and (
            (model is None or meta.get("model") == model) and (cutoff is None or created < cutoff)
        ):
            return True
        return cut is not None and created <= cut

    survey = list_cache(root, now)
    ages, sizes = array("d"), array("q")
    for pack in survey.packs:
        result.in_use_packs += not pack.safe
        for rec, meta, _ in records(root, pack):
            if not pack.safe:
                result.in_use += meta is not None
            elif meta is None or chosen(meta, pack, None):
                pack.dropped += 1
                result.removed += 1
                result.freed += rec.length
                continue
            elif max_bytes is not None:
                ages.append(stored_at(meta, pack))
                sizes.append(rec.length)
                pack.oldest_kept = min(pack.oldest_kept, ages[-1])
            if meta is not None:
                result.kept += 1
                result.kept_bytes += rec.length
    cut = None
    if max_bytes is not None and result.kept_bytes > max_bytes:
        cut = _cut(result, ages, sizes, result.kept_bytes - max_bytes)
    del ages, sizes
    stale = _old_files(root, _TEMP_IN, ".tmp", now - STALE)
    result.temp_removed = len(stale)
    if dry_run:
        return result
    _remove(stale)
    changed = False
    for pack in survey.packs:
        if pack.safe and (pack.dropped or (cut is not None and pack.oldest_kept <= cut)):
            changed |= rewrite(root, pack, functools.partial(chosen, pack=pack, cut=cut))
    survey.packs = [p for p in survey.packs if p.size]
    if changed or len(survey.indexes) != 1:
        try:
            reindex(root, survey)
        except OSError as exc:
            raise OutputError(f"cannot prune cache {root}: {exc.strerror or exc}") from None
    if cutoff is not None and model is None:  # old runs' counts go too
        _remove(_old_files(root, (RUNS,), "", cutoff))
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


def _old_files(root: str, folders: tuple[str, ...], suffix: str, cutoff: float) -> list[str]:
    """The files named `*suffix` in `folders` of the cache last changed before `cutoff`."""
    found = []
    for folder in (os.path.join(root, f) for f in folders):
        with contextlib.suppress(FileNotFoundError):
            for item in os.scandir(folder):
                with contextlib.suppress(OSError):
                    if item.name.endswith(suffix) and item.stat().st_mtime < cutoff:
                        found.append(item.path)
    return found


def _remove(paths: list[str]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _cache_root(root: str | os.PathLike[str]) -> str:
    path = os.path.abspath(os.fspath(root))
    if not os.path.isdir(path):
        raise OutputError(f"cache {path} does not exist or is not a directory")
    if not os.path.exists(os.path.join(path, MARKER)):
        raise OutputError(f"{path} is not a jsonlbatch cache (no {MARKER})")
    check_is_cache(path)  # another format
    return path


def _runrecords(root: str) -> Iterator[dict[str, Any]]:
    try:
        names = sorted(os.listdir(os.path.join(root, RUNS)))
    except FileNotFoundError:
        return
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            record = orjson.loads(read_small(os.path.join(root, RUNS, name)))
        except (OSError, orjson.JSONDecodeError):
            continue
        if isinstance(record, dict):
            yield record


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} GB"

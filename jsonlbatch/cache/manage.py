"""`jsonlbatch cache stats|prune DIR`: what a cache holds, and making it smaller.

Both walk the entry files once and read each (checksum, then the head of the zlib stream: the
model), so torn entries are found and pruned too. Memory is 16 bytes per entry, and only for
`--max-size` (the ages and sizes that find the cut-off time).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from array import array
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from jsonlbatch.cache.store import MARKER, RUNS  # TODO packs
ANSWERS = "answers"
decode_entry = None  # type: ignore
from jsonlbatch.errors import OutputError, UsageError

_ENTRY = re.compile(r"[0-9a-f]{32}\.\d+")
_STALE_TMP = 3600.0  # seconds: temporary files older than this were left by killed runs


@dataclass
class CacheStats:
    """What `jsonlbatch cache stats` shows."""

    root: str
    entries: int = 0
    bytes: int = 0
    corrupt: int = 0
    temp_files: int = 0
    oldest: float | None = None
    newest: float | None = None
    models: Counter[str] = field(default_factory=Counter)  # entries by model
    model_bytes: Counter[str] = field(default_factory=Counter)
    runs: int = 0  # runs that recorded their counts
    hits: int = 0
    misses: int = 0
    stored: int = 0
    saved_usd: float = 0.0

    def format(self) -> str:
        def when(t: float | None) -> str:
            return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "-"

        lines = [
            f"{self.root}: {self.entries:,} answers, {_size(self.bytes)} on disk",
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
            lines.append(f"  {self.corrupt} torn or corrupt entries (misses; prune removes them)")
        if self.temp_files:
            lines.append(f"  {self.temp_files} temporary files of unfinished writes")
        if self.models:
            lines.append("  by model:")
            for model, n in self.models.most_common():
                lines.append(f"    {model}: {n:,} answers, {_size(self.model_bytes[model])}")
        return "\n".join(lines)


@dataclass
class PruneResult:
    removed: int = 0
    freed: int = 0
    kept: int = 0
    kept_bytes: int = 0
    temp_removed: int = 0

    def format(self, dry_run: bool = False) -> str:
        verb = "would remove" if dry_run else "removed"
        text = (
            f"{verb} {self.removed:,} answers ({_size(self.freed)}); kept {self.kept:,} "
            f"({_size(self.kept_bytes)})"
        )
        if self.temp_removed:
            text += f"; {verb} {self.temp_removed} stale temporary files"
        return text


def cache_stats(root: str | os.PathLike[str]) -> CacheStats:
    """Count the entries of a cache by model, their size and age, and the runs' hit counts."""
    root = _cache_root(root)
    stats = CacheStats(root)
    for path, st in _walk(root, stats):
        entry = _head(path)
        if entry is None:
            stats.corrupt += 1
            continue
        stats.entries += 1
        stats.bytes += st.st_size
        model = str(entry.get("model") or "-")
        stats.models[model] += 1
        stats.model_bytes[model] += st.st_size
        t = st.st_mtime
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
    else those older than `older_than`; then the oldest until at most `max_bytes` remain.
    Torn or corrupt entries and temporary files older than an hour always go, and with
    `older_than` alone, the runs' records (`runs/`) older than that. Age is the time an answer
    was stored."""
    if older_than is None and max_bytes is None and model is None:
        raise UsageError("say what to prune: --older-than, --max-size and/or --model")
    root = _cache_root(root)
    result = PruneResult()
    now = time.time()
    cutoff = now - older_than if older_than is not None else None
    ages, sizes = array("d"), array("q")

    def remove(path: str, size: int) -> None:
        result.removed += 1
        result.freed += size
        if not dry_run:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def on_temp(path: str, st: os.stat_result) -> None:
        if now - st.st_mtime > _STALE_TMP:
            result.temp_removed += 1
            if not dry_run:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)

    for path, st in _walk(root, None, on_temp):
        head = _head(path)
        if head is None:  # corrupt: a miss anyway
            remove(path, st.st_size)
            continue
        selected = model is None or head.get("model") == model
        old = cutoff is None or st.st_mtime < cutoff
        if selected and old and (model is not None or cutoff is not None):
            remove(path, st.st_size)
            continue
        result.kept += 1
        result.kept_bytes += st.st_size
        if max_bytes is not None:
            ages.append(st.st_mtime)
            sizes.append(st.st_size)
    if max_bytes is not None and result.kept_bytes > max_bytes:
        _trim(root, result, ages, sizes, max_bytes, remove)
    if cutoff is not None and model is None and not dry_run:  # old runs' counts go too
        _prune_runs(root, cutoff)
    return result


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


def _trim(
    root: str,
    result: PruneResult,
    ages: array,
    sizes: array,
    max_bytes: int,
    remove: Callable[[str, int], None],
) -> None:
    """Remove the oldest entries until at most `max_bytes` are kept: find the cut-off time
    from the ages and sizes, then remove everything stored up to it in a second walk."""
    excess = result.kept_bytes - max_bytes
    order = sorted(range(len(ages)), key=ages.__getitem__)
    freed, cut = 0, None
    for i in order:
        freed += sizes[i]
        cut = ages[i]
        if freed >= excess:
            break
    del order
    if cut is None:
        return
    for path, st in _walk(root, None):
        if st.st_mtime <= cut:
            remove(path, st.st_size)
            result.kept -= 1
            result.kept_bytes -= st.st_size


def _cache_root(root: str | os.PathLike[str]) -> str:
    path = os.path.abspath(os.fspath(root))
    if not os.path.isdir(path):
        raise OutputError(f"cache {path} does not exist or is not a directory")
    if not os.path.exists(os.path.join(path, MARKER)):
        raise OutputError(f"{path} is not a jsonlbatch cache (no {MARKER})")
    return path


def _walk(
    root: str,
    stats: CacheStats | None,
    on_temp: Callable[[str, os.stat_result], None] | None = None,
) -> Iterator[tuple[str, os.stat_result]]:
    """(path, stat) of every entry file; temporary files are counted or handed to `on_temp`."""
    top = os.path.join(root, ANSWERS)
    for first in _dirs(top):
        for second in _dirs(first):
            with contextlib.suppress(FileNotFoundError), os.scandir(second) as it:
                for item in it:
                    try:
                        st = item.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if _ENTRY.fullmatch(item.name):
                        yield item.path, st
                    elif item.name.endswith(".tmp"):
                        if stats is not None:
                            stats.temp_files += 1
                        if on_temp is not None:
                            on_temp(item.path, st)


def _dirs(path: str) -> list[str]:
    try:
        with os.scandir(path) as it:
            return sorted(i.path for i in it if len(i.name) == 2 and i.is_dir())
    except FileNotFoundError:
        return []


def _head(path: str) -> dict[str, Any] | None:
    """An entry's metadata, from its first bytes; None if it is torn or corrupt."""
    try:
        with open(path, "rb", buffering=0) as f:
            data = f.read()
    except OSError:
        return None
    entry = decode_entry(data, head_only=True)
    if entry is None or entry.meta.get("name") != os.path.basename(path):
        return None
    return entry.meta


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


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} GB"

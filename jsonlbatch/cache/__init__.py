"""An answer cache shared by every run: never pay twice for the same request.

`keys` says when two requests are the same question, `draws` which copy of a sampled body a
line is, `store` keeps answers on disk (safely shared by processes and machines), `manage` is
`jsonlbatch cache stats|prune` (`compact` rewrites packs for it). exec looks requests up before sending and stores answers before
writing them (docs/exec.md, "Answer cache").
"""

from jsonlbatch.cache.draws import Draws, count_draws
from jsonlbatch.cache.keys import (
    ANSWER_NEUTRAL,
    body_digest,
    body_key,
    entry_name,
    key_scope,
    one_draw,
)
from jsonlbatch.cache.manage import CacheStats, PruneResult, cache_stats, prune
from jsonlbatch.cache.pack import Entry
from jsonlbatch.cache.store import MODES, Cache, CacheCounts

__all__ = [
    "ANSWER_NEUTRAL",
    "MODES",
    "Cache",
    "CacheCounts",
    "CacheStats",
    "Draws",
    "Entry",
    "PruneResult",
    "body_digest",
    "body_key",
    "cache_stats",
    "count_draws",
    "entry_name",
    "key_scope",
    "one_draw",
    "prune",
]

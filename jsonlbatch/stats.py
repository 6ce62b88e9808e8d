"""Small statistics shared by the stages (percentiles, counted nouns), free of other imports."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(ordered: Sequence[float], p: float) -> float:
    """The p-th percentile of sorted values, interpolating linearly between closest ranks.

    Same as `numpy.percentile(values, p)` (method "linear"): rank `p/100 * (n - 1)`.
    """
    if not ordered:
        raise ValueError("percentile of no values")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within 0..100, got {p}")
    rank = p / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def plural(count: int, word: str, words: str | None = None) -> str:
    """`1 sample`, `2 samples` (`words` for an irregular plural); counts get thousands commas."""
    return f"{count:,} {word}" if count == 1 else f"{count:,} {words or word + 's'}"

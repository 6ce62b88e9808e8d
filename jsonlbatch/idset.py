"""A set of custom_ids that costs 8 bytes per id, so a million-line resume stays small.

Ids are stored as their 64-bit `hash()` in a sorted `array`. The hash is salted per process,
which is fine: a set lives only as long as the run that built it. Two different ids share a
hash with probability about n²/2⁶⁵ (3e-8 for a million ids); callers that must be exact on a
hit (duplicate detection) confirm with a second pass over the real strings.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left


class IdSet:
    """Add ids, `freeze()`, then test membership. Adding after freezing re-sorts lazily."""

    __slots__ = ("_hashes", "_sorted")

    def __init__(self) -> None:
        self._hashes = array("q")
        self._sorted = True

    def add(self, custom_id: str) -> None:
        self._hashes.append(hash(custom_id))
        self._sorted = False

    def freeze(self) -> IdSet:
        if not self._sorted:
            self._hashes = array("q", sorted(self._hashes))
            self._sorted = True
        return self

    def __contains__(self, custom_id: object) -> bool:
        self.freeze()
        h = hash(custom_id)
        i = bisect_left(self._hashes, h)
        return i < len(self._hashes) and self._hashes[i] == h

    def __len__(self) -> int:
        return len(self._hashes)

    def colliding_hashes(self) -> set[int]:
        """Hashes added more than once: candidates for duplicate ids, to be confirmed."""
        self.freeze()
        hs = self._hashes
        return {hs[i] for i in range(1, len(hs)) if hs[i] == hs[i - 1]}

"""Which copy of its body each request line is, counted over a whole request file.

Identical bodies that sample (no seed, temperature above 0) are different draws: the k-th copy
of a body in the file (in file order, every line counted, before `--shard` picks its part and
whatever a resume skips) maps to the k-th stored draw. So shards and resumes map the same copy
to the same draw, and a re-run reuses draws one to one and asks only for the missing ones.

Memory: 8 bytes per sampling line while counting, then 12 bytes per line that is not the first
copy of its body (most lines of a file of distinct prompts are first copies and cost nothing).
"""

from __future__ import annotations

import os
from array import array
from bisect import bisect_left
from collections.abc import Iterable

import orjson

from jsonlbatch.cache.keys import body_key, one_draw
from jsonlbatch.idset import IdSet
from jsonlbatch.jsonl import iter_lines_at


class Draws:
    """Feed `add(offset, key)` for every sampling line in file order, then `finish()`;
    `draw_at(offset)` is the copy number of the line at that byte offset (0 for the first copy
    and for lines never added)."""

    def __init__(self) -> None:
        self._offsets = array("Q")
        self._hashes = array("q")
        self._repeat_offsets = array("Q")
        self._repeat_draws = array("I")

    def add(self, offset: int, key: str) -> None:
        """A sampling line at `offset` whose body key is `key` (hex); call in file order."""
        self._offsets.append(offset)
        self._hashes.append(int(key[:16], 16) - (1 << 63))

    def add_many(self, lines: Iterable[tuple[int, str]]) -> None:
        for offset, key in lines:
            self.add(offset, key)

    def finish(self) -> Draws:
        """Count the copies (one pass over the hashes); frees the per-line hashes."""
        seen = IdSet()
        seen.add_keys(self._hashes)
        if seen.colliding_hashes():  # some body repeats: count copies slot by slot
            slot = seen.slot_key
            counts = array("I", bytes(4 * seen.capacity))
            for offset, h in zip(self._offsets, self._hashes, strict=True):
                at = slot(h)
                k = counts[at]
                counts[at] = k + 1
                if k:
                    self._repeat_offsets.append(offset)
                    self._repeat_draws.append(k)
        self._offsets = array("Q")
        self._hashes = array("q")
        return self

    def draw_at(self, offset: int) -> int:
        """The copy number of the line at `offset` (0: the first, or a line that is one draw)."""
        offsets = self._repeat_offsets
        if not offsets:
            return 0
        i = bisect_left(offsets, offset)
        if i < len(offsets) and offsets[i] == offset:
            return self._repeat_draws[i]
        return 0

    @property
    def repeats(self) -> int:
        """Lines that are a second or later copy of their body."""
        return len(self._repeat_offsets)


def count_draws(
    path: str | os.PathLike[str], *, model: str | None = None, scope: bytes = b""
) -> Draws:
    """`Draws` of a (validated) request file, keyed as `body_key` keys its requests; `model`
    is exec's `--model` override, applied to every body as it will be sent."""
    draws = Draws()
    for _, offset, raw in iter_lines_at(path):
        try:
            obj = orjson.loads(raw)
            url, body = obj["url"], obj["body"]
        except (orjson.JSONDecodeError, TypeError, KeyError):
            continue  # a line the run will not send (checked by exec's scan)
        if type(body) is not dict or type(url) is not str:
            continue
        if model is not None:
            body["model"] = model
        if not one_draw(url, body):
            draws.add(offset, body_key(url, body, scope))
    return draws.finish()

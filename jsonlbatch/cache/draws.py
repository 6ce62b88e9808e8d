"""Which copy of its body each request line is, counted over a whole request file.

Identical bodies that sample (no seed, temperature above 0) are different draws: the k-th copy
of a body in the file (in file order, every line counted, before `--shard` picks its part and
whatever a resume skips) maps to the k-th stored draw. So shards and resumes map the same copy
to the same draw, and a re-run reuses draws one to one and asks only for the missing ones.

Memory: 16 bytes per sampling line while counting, then about 40 bytes per line that is not the
first copy of its body (an `IdSet` of their ids with the copy number; a file of distinct prompts
keeps nothing).
"""

from __future__ import annotations

import os
from array import array

import orjson

from jsonlbatch.batch_format.idset import IdSet
from jsonlbatch.cache.keys import body_digest, one_draw
from jsonlbatch.cache.pack import key64
from jsonlbatch.file_io.jsonl import iter_lines


class Draws:
    """Feed `add(custom_id, key)` for every sampling line in file order, then `finish()`;
    `draw_of(custom_id)` is that line's copy number (0 for the first copy and for lines never
    added)."""

    def __init__(self) -> None:
        self._ids = array("q")
        self._hashes = array("q")
        self._repeats = IdSet(values=True)  # ids of second and later copies -> copy number

    def add(self, custom_id: str, key: bytes) -> None:
        """A sampling line with body key `key` (`body_digest`); call in file order."""
        self._ids.append(hash(custom_id))
        self._hashes.append(key64(key))

    def finish(self) -> Draws:
        """Count the copies (one pass over the hashes); frees the per-line hashes."""
        seen = IdSet()
        seen.add_keys(self._hashes)
        if seen.colliding_hashes():  # some body repeats: count copies slot by slot
            slot = seen.slot_key
            counts = array("I", bytes(4 * seen.capacity))
            ids, draws = array("q"), array("q")
            for cid, h in zip(self._ids, self._hashes, strict=True):
                at = slot(h)
                k = counts[at]
                counts[at] = k + 1
                if k:
                    ids.append(cid)
                    draws.append(k)
            self._repeats.add_keys(ids, draws)
        self._ids = array("q")
        self._hashes = array("q")
        return self

    def draw_of(self, custom_id: str) -> int:
        """The copy number of the line with this id (0: the first, or a line that is one
        draw)."""
        repeats = self._repeats
        if not len(repeats):
            return 0
        at = repeats.slot(custom_id)
        return repeats.values()[at] if at >= 0 else 0

    @property
    def repeats(self) -> int:
        """Lines that are a second or later copy of their body."""
        return len(self._repeats)


def count_draws(
    path: str | os.PathLike[str], *, model: str | None = None, scope: bytes = b""
) -> Draws:
    """`Draws` of a (validated) request file, keyed as `body_key` keys its requests; `model`
    is exec's `--model` override, applied to every body as it will be sent."""
    draws = Draws()
    for _, raw in iter_lines(path):
        try:
            obj = orjson.loads(raw)
            cid, url, body = obj["custom_id"], obj["url"], obj["body"]
        except (orjson.JSONDecodeError, TypeError, KeyError):
            continue  # a line the run will not send (checked by exec's scan)
        if type(body) is not dict or type(url) is not str or type(cid) is not str:
            continue
        if model is not None:
            body["model"] = model
        if not one_draw(url, body):
            draws.add(cid, body_digest(url, body, scope))
    return draws.finish()

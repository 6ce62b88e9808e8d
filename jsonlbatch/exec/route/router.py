"""Which endpoint gets the next request: least busy, round robin, or by prompt prefix.

vLLM and SGLang keep the KV cache of recent prompt prefixes, but each replica only its own. With
several replicas, least-busy routing scatters the requests that share a long prompt (the samples
of one task, one big document asked many questions), so every replica prefills it again. The
`prefix` policy sends a request to the replica that already holds the longest part of its prompt,
unless that replica is clearly busier than the least busy one (the load guard), so no replica
idles while another queues.

The prefix index is an approximate radix tree, as in sglang-router's cache-aware policy but
keyed on what exec knows exactly: the request bodies and every request in flight. A prompt's text
is cut into blocks of about one KV-cache block (16 tokens, ~64 bytes); a chained hash of the first
k blocks names that prefix. Only geometrically spaced depths (1, 2, 3, 4, 6, 8, 12, ... blocks and
the whole prompt) are kept, so a request costs about 2*log2(blocks) index entries and a match is
found to within a factor 1.5 of its true length. The index is an LRU of fixed size: memory does
not grow with the input.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import orjson

from jsonlbatch.errors import UsageError
from jsonlbatch.file_io.jsonl import read_lines_at

POLICIES = ("prefix", "least-busy", "round-robin")

#: Bytes of prompt text per index block: one 16-token KV block at about 4 bytes per token.
BLOCK_BYTES = 64
#: Index entries kept (about 100 bytes each); at ~20 per request, the last few thousand prompts.
INDEX_SIZE = 1 << 16


class _Loaded(Protocol):
    in_flight: int


@dataclass(frozen=True, slots=True)
class PrefixKey:
    """A prompt's prefix hashes, shortest first, as (depth in bytes, hash) pairs."""

    length: int  # bytes of prompt text
    depths: tuple[tuple[int, int], ...]

    def group(self, share: float) -> int | None:
        """The hash of the shortest kept prefix covering `share` of the prompt: requests with
        equal groups share at least that much of their prompt. None for a prompt too short to
        share a cache block."""
        need = share * self.length
        for depth, digest in self.depths:
            if depth >= need:
                return digest
        return None


#: Depths kept, in blocks: 1, 2, 3, 4, 6, 8, 12, 16, ... (each at most 1.5 times the last).
_LADDER = (1, *(d for power in range(1, 40) for d in (1 << power, 3 << (power - 1))))


def _depths(blocks: int) -> tuple[int, ...]:
    """The kept depths below `blocks`, then `blocks` itself (none for 0)."""
    if blocks <= 0:
        return ()
    return (*_LADDER[: bisect.bisect_left(_LADDER, blocks)], blocks)


def prompt_bytes(body: dict[str, Any]) -> bytes:
    """The part of a request body a server's prefix cache sees: the messages, prompt or input,
    as JSON (which keeps the prefix property: equal leading messages give equal leading bytes)."""
    for name in ("messages", "prompt", "input"):
        value = body.get(name)
        if value is not None:
            return value.encode() if isinstance(value, str) else orjson.dumps(value)
    return b""


def prefix_key(body: dict[str, Any], block: int = BLOCK_BYTES) -> PrefixKey:
    """The prefix hashes of a request body, each chained on the one before, so every byte is
    hashed once. The model is part of every hash: two models never share a cache. (Python's
    `hash` is salted per process; the index lives only as long as the run.)"""
    text = prompt_bytes(body)
    chained = hash(body.get("model"))
    out = []
    done = 0
    for depth in _depths(len(text) // block):
        end = depth * block
        chained = hash((chained, text[done:end]))
        done = end
        out.append((end, chained))
    return PrefixKey(len(text), tuple(out))


def prefix_group(body: dict[str, Any], share: float, block: int = BLOCK_BYTES) -> int | None:
    """What `prefix_key(body).group(share)` tells apart, in one hash: requests with equal
    groups share the model and the shortest kept prefix covering `share` of the prompt. The
    look-ahead window asks this of every line and needs no other depth: 3.0 us a line instead
    of 4.8 for bench_exec.py's chat requests."""
    text = prompt_bytes(body)
    need = share * len(text)
    for depth in _depths(len(text) // block):
        end = depth * block
        if end >= need:
            return hash((body.get("model"), text[:end]))
    return None


#: The automatic load guard's largest gap (sglang-router's default absolute threshold).
AUTO_ABS_CAP = 16


@dataclass
class RouteOptions:
    """How `--route prefix` trades cache affinity against load (sglang-router's names)."""

    policy: str = "prefix"
    #: Affinity is dropped when the preferred endpoint has this many more requests in flight
    #: than the least busy one ... None: automatic (see `Router.gap_allowed`).
    balance_abs_threshold: int | None = None
    #: ... and more than this multiple of the least busy one's.
    balance_rel_threshold: float = 1.5
    #: Share of a prompt that must already sit on an endpoint for affinity to count; shorter
    #: matches (a common system prompt) go to the least busy endpoint.
    min_match: float = 0.5
    #: Pending requests looked ahead to group those sharing a prefix; 0 keeps the file order.
    order_window: int = 1024
    #: Requests in flight at most (exec's `-c`): the automatic guard scales with it.
    concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise UsageError(f"--route must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if (
            self.balance_abs_threshold is not None and self.balance_abs_threshold < 0
        ) or self.balance_rel_threshold < 1:
            raise UsageError(
                "--balance-abs-threshold must be 0 or more and --balance-rel-threshold at least 1"
            )
        if not 0 < self.min_match <= 1:
            raise UsageError(f"min_match must be in (0, 1], got {self.min_match}")
        if self.order_window < 0:
            raise UsageError("--order-window must be 0 or more")


class Router:
    """Chooses among the endpoints that are up; tracks which endpoint saw which prefix."""

    def __init__(self, endpoints: Sequence[Hashable], options: RouteOptions | None = None) -> None:
        self.options = options or RouteOptions()
        self._bit = {ep: 1 << i for i, ep in enumerate(endpoints)}
        self._index: OrderedDict[int, tuple[int, int]] = OrderedDict()  # hash -> (mask, last)
        self._turn = 0
        self.affine = 0  # requests sent where their prefix was
        self.guarded = 0  # ... that the load guard sent elsewhere instead

    def key(self, body: dict[str, Any]) -> PrefixKey | None:
        """What `choose` needs of a request: None unless the policy looks at prompts and there
        is a choice to make."""
        if self.options.policy != "prefix" or len(self._bit) < 2:
            return None
        return prefix_key(body)

    def choose(self, up: Sequence[Any], key: PrefixKey | None = None) -> Any:
        """The endpoint for a request among `up` (non-empty, each with `in_flight`)."""
        self._turn += 1
        if self.options.policy == "round-robin":
            return up[self._turn % len(up)]
        least = self._least(up)
        if key is None or not key.depths:
            return least
        chosen = least
        holder = self._holder(up, key)
        if holder is not None:
            if self._imbalanced(holder, least, len(up)):
                self.guarded += 1
            else:
                chosen = holder
                self.affine += 1
        self._record(key, chosen)
        return chosen

    def _least(self, up: Sequence[_Loaded]) -> Any:
        """The least busy; ties rotate, so idle endpoints take turns instead of the first
        one taking every new prefix."""
        n = len(up)
        start = self._turn % n
        best = up[start]
        for i in range(1, n):
            ep = up[(start + i) % n]
            if ep.in_flight < best.in_flight:
                best = ep
        return best

    def _holder(self, up: Sequence[Any], key: PrefixKey) -> Any:
        """The least busy endpoint holding the longest indexed prefix of `key` that covers at
        least `min_match` of the prompt (the last one to see it on a tie), or None."""
        need = self.options.min_match * key.length
        for depth, digest in reversed(key.depths):
            if depth < need:
                return None
            entry = self._index.get(digest)
            if entry is None:
                continue
            mask, last = entry
            holders = [ep for ep in up if self._bit.get(ep, 0) & mask]
            if holders:
                best = min(holders, key=lambda ep: (ep.in_flight, self._bit[ep] != last))
                return best
        return None

    def gap_allowed(self, replicas: int) -> int:
        """How many more requests in flight the preferred endpoint may have than the least busy
        one. Automatic: half a fair share (`-c` over the endpoints up), at most 16 and at least
        1. A fixed 16 can never trigger at `-c 16` or below, which pinned every request on one
        replica when one prefix (a template's fixed part) covered most of every prompt."""
        given = self.options.balance_abs_threshold
        if given is not None:
            return given
        concurrency = self.options.concurrency
        if concurrency is None:
            return AUTO_ABS_CAP
        return max(1, min(AUTO_ABS_CAP, concurrency // (2 * max(1, replicas))))

    def _imbalanced(self, preferred: _Loaded, least: _Loaded, replicas: int) -> bool:
        """The load guard: both an absolute and a relative gap, as sglang-router's; and, unless
        the threshold is given, never an idle endpoint while the preferred one has work (the
        prefix is then cached in one more place, which the index records)."""
        if preferred is least:
            return False
        if (
            self.options.balance_abs_threshold is None
            and least.in_flight == 0
            and preferred.in_flight > 0
        ):
            return True
        gap = preferred.in_flight - least.in_flight
        return (
            gap > self.gap_allowed(replicas)
            and preferred.in_flight > self.options.balance_rel_threshold * least.in_flight
        )

    def _record(self, key: PrefixKey, endpoint: Hashable) -> None:
        bit = self._bit.get(endpoint, 0)
        index = self._index
        for _, digest in key.depths:
            mask, _ = index.pop(digest, (0, 0))
            index[digest] = (mask | bit, bit)
        while len(index) > INDEX_SIZE:
            index.popitem(last=False)


def grouped(items: Iterable[tuple[int, Hashable | None]], window: int) -> Iterator[int]:
    """Reorder (offset, group) pairs so that equal groups come together, looking at most
    `window` items ahead: the oldest waiting item goes next, with every item of its group seen
    so far. Each offset comes out exactly once, and only `window` offsets are held at a time;
    items of group None, and all items when `window` is below 2, keep their order."""
    if window < 2:
        yield from (offset for offset, _ in items)
        return
    groups: OrderedDict[Hashable, list[int]] = OrderedDict()
    held = 0
    for offset, group in items:
        if group is None:
            group = ("alone", offset)
        waiting = groups.get(group)
        if waiting is None:
            groups[group] = [offset]
        else:
            waiting.append(offset)
        held += 1
        if held >= window:
            _, offsets = groups.popitem(last=False)
            held -= len(offsets)
            yield from offsets
    for offsets in groups.values():
        yield from offsets


def window_group(route: RouteOptions) -> Callable[[dict[str, Any]], int | None] | None:
    """What the look-ahead window groups a request body by (`prefix_group`), or None when
    the window keeps the file's order: the input scan notes it for each pending line."""
    if route.policy != "prefix" or route.order_window < 2:
        return None
    return partial(prefix_group, share=route.min_match)


def ordered_lines(
    path: str,
    offsets: Sequence[int],
    route: RouteOptions,
    groups: Sequence[int] | None = None,
) -> Iterator[bytes]:
    """The request lines at `offsets`; with `--route prefix`, those sharing most of their prompt
    are grouped within the look-ahead window, so they reach a server while the prefix is still
    in its cache. Only offsets wait in the window, never bodies. `groups`, beside `offsets`, are
    their groups as the input scan noted them (`window_group`, -1 for none); without them each
    line is read twice (once for its group, once to send)."""
    group = window_group(route)
    if group is None:
        return read_lines_at(path, offsets)
    if groups is not None:
        noted = (None if key == -1 else key for key in groups)
        keyed = zip(offsets, noted, strict=True)
    else:
        found = (group(orjson.loads(raw)["body"]) for raw in read_lines_at(path, offsets))
        keyed = zip(offsets, found, strict=True)
    return read_lines_at(path, grouped(keyed, route.order_window))

"""The cache as one exec run uses it: look a request up before sending, store its answer after.

`RunCache` is exec's before-send lookup and after-answer store (`exec/hooks/store_hook.py`'s
`AnswerStore`): `lookup` turns a stored answer into the `Result` to write instead of sending,
`store` keeps a usable answer before its output line is written, so an answer that is in any
output is in the cache (a kill -9 loses at most the requests in flight, as for the output).

A hit's line is a normal response line (the stored body, byte for byte) whose `metrics` say
`"cache": "hit"` and `"cache_key": "<key>.<draw>"`, with the token counts of the stored answer;
a stored miss says `"cache": "stored"` and its key. Hits cost no attempt, no rate-limit token
and no budget; what they saved is counted at the run's `--price`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import orjson

from jsonlbatch.batch_format.idset import IdSet
from jsonlbatch.batch_format.records import Request, Result
from jsonlbatch.cache.draws import Draws, count_draws
from jsonlbatch.cache.keys import body_digest, key_scope, one_draw
from jsonlbatch.cache.pack import Entry, key64
from jsonlbatch.cache.store import Cache, CacheCounts
from jsonlbatch.exec.hooks.store_hook import StoreBase
from jsonlbatch.pricing.cost import Price
from jsonlbatch.redact import redact_line
from jsonlbatch.stats import plural

#: The usage metrics kept with an answer and written into a hit's metrics.
_USAGE_KEYS = ("prompt_tokens", "completion_tokens", "reasoning_tokens")
#: Environment variable naming a cache directory for every exec (`--no-cache` wins over it).
ENV_VAR = "JSONLBATCH_CACHE"
#: Bits (as bytes) marking the sampled bodies the scan has met: at 1,000,000 distinct bodies
#: about 3% of lines share a bit with an earlier one and wait for the full count.
_SEEN_BYTES = 1 << 22
#: The key and draw in a response line's metrics (`_hit`, `store`).
_CACHE_KEY = re.compile(rb'"cache_key":"([0-9a-f]{32}\.[0-9]+)"')


def cache_dir_from(option: str | None, no_cache: bool) -> str | None:
    """The cache directory a run uses: `--cache`, else `$JSONLBATCH_CACHE`; none with
    `--no-cache` (which wins over both) or when neither is set."""
    if no_cache:
        return None
    return option or os.environ.get(ENV_VAR) or None


class RunCache(StoreBase):
    """Lookups and stores of one run over one request file (`requests`, read once more to
    count the copies of sampled bodies: see `draws.py`)."""

    #: Copies of a body are told apart here, by the canonical key (exec's own count, by exact
    #: body, is skipped): 64 and 64.0, or two `metadata`, make copies of one body too.
    counts_copies = True

    def __init__(
        self,
        root: str | os.PathLike[str],
        requests: str | os.PathLike[str],
        *,
        mode: str = "rw",
        model: str | None = None,
        key_urls: Sequence[str] | None = None,
        price: Price | None = None,
    ) -> None:
        self.cache = Cache(root, mode)
        self.requests = os.fspath(requests)
        self.model = model  # exec's --model (None: bodies as they are; "auto": as resolved)
        self.scope = key_scope(key_urls) if key_urls else b""
        self.price = price
        self._draws: Draws | None = None
        self._counting: Draws | None = None  # fed by `scan_line`, finished on first `_draw`
        self._seen = bytearray()  # bits of the sampled bodies `scan_line` met (sized once used)
        self.deferred = 0  # pending lines `scan_line` left for `settle_line`
        # misses of sampled bodies' first copies counted in the scan: `settle_line` looks every
        # sampled pending line up (those too) and counts its misses, so these are taken back
        self._scan_sampled_misses = 0
        self._output = ""  # an output being resumed: its lines' draws are not used again
        self._in_output: IdSet | None = None  # "<key>.<draw>" of its lines (read on first need)

    def key_by(self, urls: Sequence[str]) -> None:
        """`--cache-key-url`: put these endpoint URLs in every key (before the first lookup)."""
        scope = key_scope(urls)
        if scope != self.scope:
            self.scope = scope
            self._draws = self._counting = None

    def resume_into(self, output: str) -> None:
        """The run appends to `output`, which has answers already. A draw one of its lines
        holds is not given to another line (a copy added to the file, or the file's lines
        reordered, since that line was written: the copy numbers moved): that request is
        sent, and its answer stored as a new draw. Sampled lines are then all looked up once
        the whole file is counted (`settle_line`)."""
        self._output = output

    def _used(self, key: bytes, draw: int) -> bool:
        """Whether a line of the output being resumed holds draw `draw` of `key`."""
        if not self._output:
            return False
        if self._in_output is None:
            self._in_output = IdSet()
            with open(self._output, "rb") as f:
                for line in f:
                    found = _CACHE_KEY.search(line)
                    if found is not None:
                        self._in_output.add(found.group(1).decode())
        return f"{key.hex()}.{draw}" in self._in_output

    @property
    def answers_early(self) -> bool:
        """Whether `scan_line` may answer lines while exec scans its input: the cache is read,
        and every key is known then (`--model auto` is resolved only once a server answers)."""
        return self.cache.readable and self.model != "auto"

    def scan_line(
        self, obj: dict[str, Any], raw: bytes, pending: bool, sorted_body: bytes | None = None, /
    ) -> Result | None:
        """The before-send lookup made during exec's input scan (`scan_input(answer=...)`),
        which sees every line once, in file order: copies of sampled bodies are counted here
        (no second pass over the file), and a pending line whose draw is certain is answered
        now. A sampled body met before (or sharing a bit of `_seen` with one) may be a second
        copy, whose draw is known only once the whole file is counted: it is left to `lookup`.
        `sorted_body`: the body as `orjson.dumps(..., option=OPT_SORT_KEYS)` writes it, if the
        caller made it (exec does, for the request's fingerprint): not made twice.
        """
        url, body = obj.get("url"), obj.get("body")
        if type(url) is not str or type(body) is not dict:
            return None  # a line that is not sent (checked only for pending lines)
        if self.model is not None:
            body, sorted_body = {**body, "model": self.model}, None
        single = one_draw(url, body)
        if single and not pending:
            return None
        key = body_digest(url, body, self.scope, sorted_body)
        if not single:
            if self._counting is None:
                self._counting, self._seen = Draws(), bytearray(_SEEN_BYTES)
            self._counting.add(obj["custom_id"], key)
            bit = key64(key) & (_SEEN_BYTES * 8 - 1)
            mask, seen = 1 << (bit & 7), self._seen
            met = seen[bit >> 3] & mask
            seen[bit >> 3] |= mask
            if met or not pending or self._output:
                self.deferred += pending
                return None
        entry = self.cache.get(key, 0)
        if entry is None:
            self.counts.misses += 1  # exec does not ask again (`lookup` is for other runs)
            self._scan_sampled_misses += not single
            return None
        return self._hit(obj["custom_id"], key, 0, entry)

    def settle_line(self, obj: dict[str, Any], /) -> Result | None:
        """A pending line `scan_line` left (a later copy of a sampled body), looked up once the
        whole file is counted, before the run decides whether it needs a server: a file of
        samples the cache holds whole is answered with none. After the scan and this, every
        pending line has been looked up once, and each miss counted."""
        url, body = obj["url"], obj["body"]
        if self.model is not None:
            body = {**body, "model": self.model}
        if one_draw(url, body):
            return None  # looked up during the scan already
        # a sampled first copy missed in the scan is looked up again here: one miss, not two
        self.counts.misses -= self._scan_sampled_misses
        self._scan_sampled_misses = 0
        key, draw, _ = self._draw(Request(obj["custom_id"], url, body))
        entry = None if self._used(key, draw) else self.cache.get(key, draw)
        if entry is None:
            self.counts.misses += 1
            return None
        return self._hit(obj["custom_id"], key, draw, entry)

    @property
    def counts(self) -> CacheCounts:
        return self.cache.counts

    def _draw(self, request: Request) -> tuple[bytes, int, bool]:
        """(key, draw, whether the body is one draw) of a request as it will be sent."""
        key = body_digest(request.url, request.body, self.scope)
        if one_draw(request.url, request.body):
            return key, 0, True
        if self._draws is None and self._counting is not None:  # counted during the scan
            self._draws, self._counting = self._counting.finish(), None
        if self._draws is None:  # counted on first need: after --model auto is resolved
            model = self.model
            if model == "auto":
                model = request.body.get("model")
            self._draws = count_draws(self.requests, model=model, scope=self.scope)
        return key, self._draws.draw_of(request.custom_id), False

    def lookup(self, request: Request, occurrence: int = 0, /) -> Result | None:
        """The stored answer of this request as a `Result`, or None to send it. `occurrence`
        (exec's count of identical earlier lines) is not used: copies are counted here over
        the canonical key, so 64 and 64.0 are copies of one body too."""
        if not self.cache.readable:
            self.counts.misses += 1
            return None
        key, draw, single = self._draw(request)
        entry = None if not single and self._used(key, draw) else self.cache.get(key, draw)
        if entry is None:
            self.counts.misses += 1
            return None
        return self._hit(request.custom_id, key, draw, entry)

    def _hit(self, custom_id: str, key: bytes, draw: int, entry: Entry) -> Result:
        """A stored answer as the `Result` to write, counted with what it saved."""
        meta = entry.meta
        metrics: dict[str, Any] = {"cache": "hit", "cache_key": f"{key.hex()}.{draw}"}
        usage = meta.get("usage")
        if type(usage) is dict:
            for name in _USAGE_KEYS:
                value = usage.get(name)
                if type(value) is int:
                    metrics[name] = value
        self._count_hit(metrics, 1)
        status = meta.get("status")
        return Result(
            custom_id,
            status if type(status) is int else 200,
            orjson.Fragment(entry.body),
            meta.get("request_id"),
            None,
            metrics,
        )

    def _count_hit(self, metrics: dict[str, Any], sign: int) -> None:
        """A hit (`sign` 1) and what it saved; -1 takes one back that the checks refused."""
        counts = self.counts
        counts.hits += sign
        prompt, completion = metrics.get("prompt_tokens", 0), metrics.get("completion_tokens", 0)
        counts.saved_prompt_tokens += sign * prompt
        counts.saved_completion_tokens += sign * completion
        if self.price is not None:
            counts.saved_usd = (counts.saved_usd or 0.0) + sign * self.price.of(prompt, completion)

    def refused(self, request: Request, result: Result, /) -> None:
        """A stored answer the run's checks refused (it breaks the request's schema, or is no
        answer for its endpoint): not a hit but a miss, and the request is sent."""
        self._count_hit(result.metrics, -1)
        self.counts.misses += 1
        self.counts.refused += 1

    def store(self, request: Request, occurrence: int, result: Result, /) -> None:
        """Keep a usable answer (never an error, a 429 or an invalid body) before its line is
        written; its metrics gain `"cache": "stored"` and the key."""
        if not self.cache.writable or not result.ok or result.metrics.get("cache") == "hit":
            return
        body = result.body
        raw = orjson.dumps(body)  # an exact Fragment stays the server's bytes
        raw = redact_line(raw, thorough=False)  # a registered secret echoed back is not kept
        key, draw, single = self._draw(request)
        meta = {
            "url": request.url,
            "model": request.body.get("model"),
            "status": result.status_code,
            "request_id": result.request_id,
            "usage": {k: result.metrics[k] for k in _USAGE_KEYS if k in result.metrics},
        }
        stored = self.cache.put(key, draw, single, raw, meta)
        if stored is not None and stored >= 0:  # not when another copy's answer is the one
            result.metrics["cache"] = "stored"
            result.metrics["cache_key"] = f"{key.hex()}.{stored}"

    def notes(self) -> list[str]:
        """What the user should hear as the run starts: the cache used (every pending request
        is looked up before the first is sent) and anything wrong with it (read-only)."""
        cache = self.cache
        what = ", ".join(
            (["looking requests up"] if cache.readable else [])
            + (["storing answers"] if cache.writable else [])
        )
        return [f"answer cache {cache.root}: {what}", *self.counts.notes]

    def finish(self, output: str) -> None:
        """Seal what this run stored (its pack's index) and record its counts in the cache's
        `runs/` (for `cache stats`)."""
        try:
            self.cache.close()
        finally:
            self.cache.record_run(output)

    def progress(self) -> str:
        """For the progress bar: hits so far and what they saved."""
        c = self.counts
        if not c.hits:
            return ""
        saved = f" saved=${c.saved_usd:,.4f}" if c.saved_usd is not None else ""
        return f"cache_hits={c.hits}{saved}"

    def describe(self) -> str:
        """One line for the summary: hits, what they saved, misses, answers stored."""
        c = self.counts
        saved = f", saved ${c.saved_usd:,.4f} at --price" if c.saved_usd is not None else ""
        tokens = c.saved_prompt_tokens + c.saved_completion_tokens
        text = (
            f"cache {self.cache.root}: {plural(c.hits, 'hit')} ({tokens:,} tokens not paid for"
            f"{saved}), "
            f"{plural(c.misses, 'miss', 'misses')}, {plural(c.stored, 'answer')} stored"
        )
        if c.refused:
            text += (f", {c.refused} refused by the checks (sent instead; a run with "
                     "--cache-mode write replaces them)")  # fmt: skip
        if c.corrupt:
            text += f", {c.corrupt} corrupt entries ignored"
        if c.store_failed:
            text += f", {c.store_failed} not stored"
        return text

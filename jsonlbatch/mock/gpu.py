"""An optional GPU model for the mock: prefix cache, prefill cost and continuous batching.

The plain mock answers after a fixed latency, so how requests are routed and ordered changes
nothing. With this model each mock replica behaves like one vLLM engine in the ways that matter
for routing:

- an LRU prefix cache counted in KV blocks of `block_size` tokens (a block is found only if
  every block before it is: the chained hashes vLLM uses);
- prefill time for every prompt token not found in the cache (`prefill_tokens_per_s`);
- decode in steps: every running request gains one token per step of `decode_step_s`, up to
  `max_batch` requests at once (continuous batching); the others wait in a queue. A step that
  admits new requests also pays for their prefill, so long uncached prompts slow everyone down,
  as they do on a GPU.

Tokens are the words of the prompt (the mock's usual count). `time_scale` runs the whole model
that many times faster than the GPU it describes, so a benchmark of thousands of requests ends
in seconds. `/metrics` reports vLLM's Prometheus names. Not modelled: KV blocks held by running
requests (the cache is a separate pool), chunked prefill, preemption.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field, fields
from typing import Any

from aiohttp import web

from jsonlbatch.errors import UsageError

_CATCH_UP = 0.05  # seconds of event-loop lag the step clock makes up for


@dataclass
class GpuModel:
    """One replica's speed and memory. Defaults: an 8B model in bf16 on one 80 GB GPU."""

    block_size: int = 16  # tokens per KV block (vLLM's default)
    cache_blocks: int = 16384  # 262k tokens of prefix cache
    prefill_tokens_per_s: float = 16000.0
    decode_step_s: float = 0.025  # 40 tokens/s per request, for up to max_batch at once
    max_batch: int = 128
    time_scale: float = 1.0  # run this many times faster than the modelled GPU

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) <= 0:
                raise UsageError(f"gpu {f.name} must be positive, got {getattr(self, f.name)}")


# (flag, GpuModel field, type, help) of `python -m jsonlbatch.mock`
OPTIONS: tuple[tuple[str, str, type, str], ...] = (
    ("--gpu-block-size", "block_size", int, "tokens per KV cache block"),
    ("--gpu-cache-blocks", "cache_blocks", int, "KV blocks of prefix cache (LRU)"),
    ("--gpu-prefill-tps", "prefill_tokens_per_s", float, "prefill tokens per second"),
    ("--gpu-decode-step", "decode_step_s", float, "seconds per decode step (1 token per request)"),
    ("--gpu-max-batch", "max_batch", int, "requests decoded together; more wait"),
    ("--gpu-time-scale", "time_scale", float, "run this many times faster than the GPU"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("GPU model (see docs/mock.md)")
    group.add_argument(
        "--gpu-model", action="store_true", help="behave like a GPU server: prefix cache, "
        "prefill time, continuous batching, /metrics"
    )  # fmt: skip
    defaults = GpuModel()
    for flag, name, kind, text in OPTIONS:
        group.add_argument(flag, dest=f"gpu_{name}", type=kind, default=getattr(defaults, name),
                           help=f"{text} (default: %(default)s)")  # fmt: skip


def from_args(args: argparse.Namespace) -> GpuModel | None:
    if not args.gpu_model:
        return None
    return GpuModel(**{name: getattr(args, f"gpu_{name}") for _, name, _, _ in OPTIONS})


def prompt_words(body: dict[str, Any]) -> list[Any]:
    """The prompt as the mock's tokens: words of every message's text, or of the prompt or
    input (token id lists as they are)."""
    messages = body.get("messages")
    if messages is None:
        value = body.get("prompt", body.get("input"))
        if isinstance(value, str):
            return value.split()
        if isinstance(value, list):
            if all(isinstance(v, int) for v in value):
                return value
            return [w for v in value for w in (v.split() if isinstance(v, str) else v)]
        return []
    words: list[Any] = []
    for message in messages:
        text = message.get("content")
        if isinstance(text, str):
            words += text.split()
        elif isinstance(text, list):
            for part in text:
                if part.get("type") == "text" and isinstance(part.get("text"), str):
                    words += part["text"].split()
    return words


@dataclass(eq=False)
class _Sequence:
    blocks: list[int]  # chained hashes of the prompt's full blocks
    tokens: int
    steps: int  # tokens to generate
    finish: str
    generated: int = 0
    first: asyncio.Future[None] = field(default_factory=lambda: _future())
    done: asyncio.Future[None] = field(default_factory=lambda: _future())


def _future() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()


class GpuEngine:
    """One replica's scheduler: a waiting queue, a running batch, the prefix cache."""

    def __init__(self, model: GpuModel, model_name: str) -> None:
        self.model = model
        self.label = f'engine="0",model_name="{model_name}"'
        self.cache: OrderedDict[int, None] = OrderedDict()
        self.waiting: deque[_Sequence] = deque()
        self.running: list[_Sequence] = []
        self.queries = self.hits = self.prompt_tokens = self.generation_tokens = 0
        self.finished: Counter[str] = Counter()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def blocks_of(self, words: list[Any]) -> list[int]:
        size, out, chained = self.model.block_size, [], 0
        for start in range(0, len(words) - size + 1, size):
            chained = hash((chained, tuple(words[start : start + size])))
            out.append(chained)
        return out

    async def generate(self, body: dict[str, Any], steps: int, finish: str) -> _Sequence:
        """Queue a request; the caller awaits `.first` (first token) and `.done`."""
        words = prompt_words(body)
        seq = _Sequence(self.blocks_of(words), len(words), max(1, steps), finish)
        self.waiting.append(seq)
        self._wake.set()
        if self._task is None:
            self._task = asyncio.ensure_future(self._loop())
        return seq

    def _admit(self, seq: _Sequence) -> int:
        """Look the prompt up in the cache, then cache it; returns the tokens to prefill."""
        cache, usable = self.cache, (seq.tokens - 1) // self.model.block_size
        hit = 0
        for digest in seq.blocks[:usable]:  # vLLM recomputes at least the last token
            if digest not in cache:
                break
            cache.move_to_end(digest)
            hit += 1
        for digest in seq.blocks[hit:]:
            cache[digest] = None
        while len(cache) > self.model.cache_blocks:
            cache.popitem(last=False)
        cached = hit * self.model.block_size
        self.queries += seq.tokens
        self.hits += cached
        self.prompt_tokens += seq.tokens
        return seq.tokens - cached

    async def _loop(self) -> None:
        m, loop = self.model, asyncio.get_running_loop()
        due = loop.time()
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                due = loop.time()
            prefill = 0
            while self.waiting and len(self.running) < m.max_batch:
                seq = self.waiting.popleft()
                prefill += self._admit(seq)
                self.running.append(seq)
            # Steps keep to a running deadline, so event-loop lag (up to _CATCH_UP) is made up.
            step = (m.decode_step_s + prefill / m.prefill_tokens_per_s) / m.time_scale
            due = max(due, loop.time() - _CATCH_UP) + step
            await asyncio.sleep(max(0.0, due - loop.time()))
            still = []
            for seq in self.running:
                seq.generated += 1
                if seq.generated == 1 and not seq.first.done():
                    seq.first.set_result(None)
                if seq.generated >= seq.steps:
                    self.finished[seq.finish] += 1
                    if not seq.done.done():
                        seq.done.set_result(None)
                else:
                    still.append(seq)
            self.generation_tokens += len(self.running)
            self.running = still

    async def close(self, app: web.Application | None = None) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def metrics_text(self) -> str:
        """The engine's state in vLLM's Prometheus names (token counters count prompt tokens
        looked up in / found in the prefix cache)."""
        lab = self.label
        usage = len(self.cache) / self.model.cache_blocks
        lines = []
        for name, kind, text, values in (
            ("vllm:num_requests_running", "gauge", "Requests in the running batch.",
             [(lab, len(self.running))]),
            ("vllm:num_requests_waiting", "gauge", "Requests waiting to run.",
             [(lab, len(self.waiting))]),
            ("vllm:kv_cache_usage_perc", "gauge", "KV cache usage (1 = 100%).", [(lab, usage)]),
            ("vllm:prefix_cache_queries_total", "counter",
             "Prefix cache queries, in prompt tokens.", [(lab, self.queries)]),
            ("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in prompt tokens.",
             [(lab, self.hits)]),
            ("vllm:prompt_tokens_total", "counter", "Prompt tokens.", [(lab, self.prompt_tokens)]),
            ("vllm:generation_tokens_total", "counter", "Generated tokens.",
             [(lab, self.generation_tokens)]),
            ("vllm:request_success_total", "counter", "Finished requests.",
             [(f'{lab},finished_reason="{r}"', n) for r, n in sorted(self.finished.items())]),
        ):  # fmt: skip
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
            lines += [f"{name}{{{labels}}} {float(v)}" for labels, v in values]
        return "\n".join(lines) + "\n"

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics_text(), content_type="text/plain")

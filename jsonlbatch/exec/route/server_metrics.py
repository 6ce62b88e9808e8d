"""The servers' own view of a run: their Prometheus `/metrics`, read before and after it.

What the client cannot see is how much prefill the servers skipped. vLLM and SGLang count it:
vLLM as `vllm:prefix_cache_queries_total` / `vllm:prefix_cache_hits_total` (prompt tokens looked
up / found; `gpu_`-prefixed in older releases, which also had a `vllm:gpu_prefix_cache_hit_rate`
gauge), SGLang as `sglang:cached_tokens_total` over `sglang:prompt_tokens_total`, with a
`sglang:cache_hit_rate` gauge. The difference of two scrapes is this run's share of a server
that may have served others before. The text format is simple enough to read here without a
Prometheus client.

Each run's figures are kept beside the output in `<output>.servers.json`, where `report` finds
them.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
import orjson

from jsonlbatch.file_io.jsonl import rewrite_atomically
from jsonlbatch.redact import redact_line

if TYPE_CHECKING:
    from jsonlbatch.exec.route.endpoints import Endpoint

_TIMEOUT = 5.0  # a server too busy to answer /metrics in this long is skipped, not waited for
_MAX_BYTES = 16 << 20

#: (queries, hits, requests, hit-rate gauge) metric names per server kind; the first name
#: present wins. Queries and hits are prompt tokens.
_NAMES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "vllm": (
        ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        ("vllm:request_success_total",),
        ("vllm:gpu_prefix_cache_hit_rate",),
    ),
    "sglang": (
        ("sglang:prompt_tokens_total",),
        ("sglang:cached_tokens_total",),
        ("sglang:num_requests_total",),
        ("sglang:cache_hit_rate",),
    ),
}


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum each metric's samples over their labels: {name: total}. Comments, blank lines and
    lines that do not parse are skipped (a scrape is a hint, never a reason to fail a run)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        if brace >= 0:
            name, rest = line[:brace], line[line.rfind("}") + 1 :]
        else:
            name, _, rest = line.partition(" ")
        fields = rest.split()
        if not name or not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if not math.isnan(value):
            out[name] = out.get(name, 0.0) + value
    return out


@dataclass
class ServerCounters:
    """What one scrape says about the prefix cache and the requests served so far."""

    kind: str  # "vllm" or "sglang"
    queries: float | None = None
    hits: float | None = None
    requests: float | None = None
    hit_rate: float | None = None  # the server's own gauge, where it has one


def counters(samples: Mapping[str, float]) -> ServerCounters | None:
    """The cache and request counters of a parsed scrape; None for a server with neither
    vLLM's nor SGLang's names."""
    for kind, names in _NAMES.items():
        values = [next((samples[n] for n in group if n in samples), None) for group in names]
        if any(v is not None for v in values):
            return ServerCounters(kind, *values)
    return None


@dataclass
class ServerStats:
    """One endpoint's figures for one run: the difference of its scrapes."""

    endpoint: str
    kind: str
    requests: int | None  # finished requests the server counted during the run
    prefix_cache_queries: int | None  # prompt tokens looked up in its prefix cache
    prefix_cache_hits: int | None  # ... and found there
    prefix_cache_hit_rate: float | None  # hits / queries, else the server's gauge after the run

    @classmethod
    def between(cls, endpoint: str, before: ServerCounters, after: ServerCounters) -> ServerStats:
        def delta(name: str) -> int | None:
            # A labelled counter has no samples until its first event (vLLM's finished
            # requests by reason): absent before, present after, it started at 0.
            a, b = getattr(after, name), getattr(before, name)
            return None if a is None else max(0, round(a - (b or 0.0)))

        queries, hits = delta("queries"), delta("hits")
        rate = hits / queries if queries and hits is not None else after.hit_rate
        return cls(endpoint, after.kind, delta("requests"), queries, hits, rate)


async def fetch(
    session: aiohttp.ClientSession, url: str, headers: Mapping[str, str], proxy: str | None
) -> dict[str, float] | None:
    """A parsed `/metrics` scrape, or None when there is none (or it is too slow)."""
    try:
        async with session.get(
            url,
            headers={k: v for k, v in headers.items() if k.lower() != "content-type"},
            proxy=proxy,
            timeout=aiohttp.ClientTimeout(total=_TIMEOUT),
            allow_redirects=False,
        ) as resp:
            if resp.status != 200:
                return None
            raw = await resp.content.read(_MAX_BYTES)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
        return None
    return parse_prometheus(raw.decode("utf-8", "replace"))


async def scrape(
    session: aiohttp.ClientSession, url: str, headers: Mapping[str, str], proxy: str | None
) -> ServerCounters | None:
    """One endpoint's counters, or None when it has no usable `/metrics` (or is too slow)."""
    samples = await fetch(session, url, headers, proxy)
    return None if samples is None else counters(samples)


#: (waiting, running, KV-cache usage 0-1) gauge names per server kind; the first present wins.
_LOAD: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "vllm": (
        ("vllm:num_requests_waiting",),
        ("vllm:num_requests_running",),
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ),
    "sglang": (("sglang:num_queue_reqs",), ("sglang:num_running_reqs",), ("sglang:token_usage",)),
}


@dataclass(frozen=True)
class ServerLoad:
    """How busy a server says it is now: its queue, its running batch, its KV cache."""

    kind: str
    waiting: float
    running: float | None
    kv_usage: float | None


def load(samples: Mapping[str, float]) -> ServerLoad | None:
    """The load gauges of a parsed scrape; None without a queue gauge of vLLM or SGLang."""
    for kind, names in _LOAD.items():
        waiting, running, kv = (
            next((samples[n] for n in group if n in samples), None) for group in names
        )
        if waiting is not None:
            return ServerLoad(kind, waiting, running, kv)
    return None


async def scrape_all(
    session: aiohttp.ClientSession,
    endpoints: Sequence[Endpoint],
    headers: Mapping[Endpoint, Mapping[str, str]],
) -> list[ServerCounters | None]:
    """Every endpoint's counters, scraped at once."""
    return await asyncio.gather(
        *(scrape(session, ep.root_url("/metrics"), headers[ep], ep.proxy) for ep in endpoints)
    )


def compare(
    endpoints: Sequence[Endpoint],
    before: Sequence[ServerCounters | None],
    after: Sequence[ServerCounters | None],
) -> list[ServerStats]:
    """Per endpoint with a scrape both times (of the same kind), what changed."""
    return [
        ServerStats.between(ep.name, b, a)
        for ep, b, a in zip(endpoints, before, after, strict=True)
        if a is not None and b is not None and a.kind == b.kind
    ]


def servers_path(output: str | os.PathLike[str]) -> str:
    """Where a run's server figures are kept: beside the output, `<output>.servers.json`."""
    return os.fspath(output) + ".servers.json"


class RunFigures(Protocol):
    """What `keep_servers` reads of a run (a `run_summary.RunSummary` is one): kept here so this
    module, which the summary reads `ServerStats` from, does not know the summary back."""

    @property
    def servers(self) -> Sequence[ServerStats]: ...

    @property
    def started_at(self) -> float | None: ...


def keep_servers(output: str | os.PathLike[str], summary: RunFigures) -> bool:
    """Add a run's server figures (if any) to the output's `.servers.json`, where a resumed
    job has one entry per run. Written atomically; a file that cannot be read is started
    afresh. False when it could not be written (the results are safe all the same)."""
    if not summary.servers:
        return True
    run = {"started_at": summary.started_at, "endpoints": [asdict(s) for s in summary.servers]}
    path = servers_path(output)
    runs: list[Any] = []
    try:
        with open(path, "rb") as f:
            old = orjson.loads(f.read())
        if isinstance(old, dict) and isinstance(old.get("runs"), list):
            runs = old["runs"]
    except (OSError, orjson.JSONDecodeError):
        pass
    runs.append(run)
    try:
        text = orjson.dumps({"runs": runs}, option=orjson.OPT_INDENT_2) + b"\n"
        rewrite_atomically(path, [redact_line(text, thorough=True)])  # as the output is
    except OSError:
        return False
    return True

"""The servers' own figures of a run: `<responses>.servers.json`, written by `jsonlbatch exec`
when the endpoints expose `/metrics` (vLLM, SGLang, the mock's GPU model).

Each run of exec on the output (a resumed job has several) adds its endpoints' differences of
requests, prompt tokens looked up in the prefix cache and tokens found there. The report sums
them per endpoint over the runs, so the hit rate is that of the whole job.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import orjson

SUFFIX = ".servers.json"


@dataclass
class ServerFigures:
    """One endpoint's figures over every run of one response file."""

    endpoint: str
    kind: str
    runs: int = 0
    requests: int | None = None
    prefix_cache_queries: int | None = None
    prefix_cache_hits: int | None = None
    gauge: float | None = None  # the server's own hit-rate gauge, where counters are missing

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        if self.prefix_cache_queries and self.prefix_cache_hits is not None:
            return self.prefix_cache_hits / self.prefix_cache_queries
        return self.gauge


def _add(a: int | None, b: Any) -> int | None:
    if not isinstance(b, (int, float)) or isinstance(b, bool):
        return a
    return (a or 0) + int(b)


def load_servers(path: str) -> list[ServerFigures]:
    """The figures beside response file `path`; none when there is no (readable) file: they
    are a bonus, never a reason for the report to fail."""
    try:
        with open(os.fspath(path) + SUFFIX, "rb") as f:
            doc = orjson.loads(f.read())
    except (OSError, orjson.JSONDecodeError):
        return []
    runs = doc.get("runs") if isinstance(doc, dict) else None
    found: dict[str, ServerFigures] = {}
    for run in runs if isinstance(runs, list) else []:
        endpoints = run.get("endpoints") if isinstance(run, dict) else None
        for item in endpoints if isinstance(endpoints, list) else []:
            if not isinstance(item, dict) or not isinstance(item.get("endpoint"), str):
                continue
            name = item["endpoint"]
            fig = found.setdefault(name, ServerFigures(name, str(item.get("kind", ""))))
            fig.runs += 1
            fig.requests = _add(fig.requests, item.get("requests"))
            fig.prefix_cache_queries = _add(
                fig.prefix_cache_queries, item.get("prefix_cache_queries")
            )
            fig.prefix_cache_hits = _add(fig.prefix_cache_hits, item.get("prefix_cache_hits"))
            rate = item.get("prefix_cache_hit_rate")
            if isinstance(rate, (int, float)) and not isinstance(rate, bool):
                fig.gauge = float(rate)
    return list(found.values())

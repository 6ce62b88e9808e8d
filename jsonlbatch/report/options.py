"""The report's user-given thresholds and prices: `--sla ttft=2s`, `--price in=0.15,out=0.60`.

Parsed into small records once, at the edge, so the statistics never see strings and a typo
fails before a large file is read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from jsonlbatch.errors import UsageError
from jsonlbatch.pricing.cost import Price, parse_price  # noqa: F401 - the report's --price

#: SLA metric names and the per-request column each one bounds.
SLA_METRICS: dict[str, str] = {
    "ttft": "ttft",
    "tpot": "tpot",
    "itl": "itl",
    "e2e": "e2e",
    "e2el": "e2e",
    "latency": "e2e",
}

_UNITS = {"ms": 1e-3, "us": 1e-6, "s": 1.0, "m": 60.0, "min": 60.0}


@dataclass(frozen=True)
class Sla:
    """A bound on one per-request latency: the request meets it when `value <= bound_s`."""

    metric: str  # canonical column: ttft, tpot, itl or e2e
    bound_s: float

    def __str__(self) -> str:
        return f"{self.metric} <= {format_duration(self.bound_s)}"


def parse_duration(text: str) -> float:
    """Seconds from `2s`, `50ms`, `800us`, `1.5m` or a bare number of seconds."""
    raw = text.strip().lower()
    for unit in sorted(_UNITS, key=len, reverse=True):
        if raw.endswith(unit):
            number, scale = raw[: -len(unit)], _UNITS[unit]
            break
    else:
        number, scale = raw, 1.0
    try:
        value = float(number) * scale
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (e.g. 2s, 500ms, 0.5)") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"a duration must be a finite, non-negative number, got {text!r}")
    return value


def format_duration(seconds: float) -> str:
    return f"{seconds * 1000:g}ms" if seconds < 1 else f"{seconds:g}s"


def parse_sla(values: Iterable[str]) -> list[Sla]:
    """`["ttft=2s", "e2e=5s"]` -> SLAs; one per metric (the last given wins)."""
    out: dict[str, Sla] = {}
    for item in values:
        name, sep, bound = item.partition("=")
        metric = SLA_METRICS.get(name.strip().lower())
        if not sep or metric is None:
            known = ", ".join(sorted(SLA_METRICS))
            raise UsageError(f"--sla wants METRIC=DURATION with METRIC in {known}, got {item!r}")
        try:
            out[metric] = Sla(metric, parse_duration(bound))
        except ValueError as exc:
            raise UsageError(f"--sla {item}: {exc}") from None
    return list(out.values())

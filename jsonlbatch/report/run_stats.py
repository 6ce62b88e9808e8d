"""The numbers of a report, computed from loaded run data.

Definitions follow the vLLM and SGLang serving benchmarks, so figures can be set beside theirs:
throughput is over the time spent sending (first attempt start to last attempt end of each run of
exec that wrote the file, summed: a resumed file's idle gaps are left out), TPOT is
`(e2e - ttft) / (completion_tokens - 1)`, goodput is requests meeting every SLA per second.
Percentiles interpolate linearly between closest ranks (numpy's default); `std` is the
population standard deviation (numpy's default, ddof=0). Failed requests count in the outcome
counters, never in the latency or token distributions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from jsonlbatch.pricing.prices import PriceBook, Tokens, bill
from jsonlbatch.report.conversations import turns_per_conversation
from jsonlbatch.report.load import RunData
from jsonlbatch.report.options import Price, Sla
from jsonlbatch.stats import percentile

PERCENTILES: tuple[int, ...] = (10, 25, 40, 50, 90, 95, 99)
#: `decode` is E2E - TTFT: the time spent generating after the first token (prefill aside).
LATENCIES: tuple[str, ...] = ("e2e", "ttft", "decode", "tpot", "itl")
TOKENS: tuple[str, ...] = ("prompt", "completion", "reasoning")


@dataclass
class Distribution:
    """Summary of one per-request number over the successful requests that have it."""

    count: int
    mean: float
    std: float
    min: float
    p10: float
    p25: float
    p40: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float


def describe(values: Iterable[float]) -> Distribution | None:
    """The distribution of the finite values (NaN marks "not measured"); None if there are none."""
    ordered = sorted(v for v in values if not math.isnan(v))
    n = len(ordered)
    if n == 0:
        return None
    mean = math.fsum(ordered) / n
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in ordered) / n)
    ranks = {f"p{p}": percentile(ordered, p) for p in PERCENTILES}
    return Distribution(n, mean, std, ordered[0], max=ordered[-1], **ranks)


@dataclass
class SlaResult:
    """How many successful requests had the metric (`judged`) and met the bound."""

    metric: str
    bound_s: float
    judged: int
    met: int
    share: float | None  # met / judged


@dataclass
class Cost:
    """Dollars for the tokens reported, at the given price per million tokens."""

    input_usd: float
    output_usd: float
    total_usd: float
    per_request_usd: float | None  # per successful request
    saved_usd: float = 0.0  # what the answers taken from exec's cache would have cost
    unpriced_models: list[str] = field(default_factory=list)  # answers left out: no price


@dataclass
class RunStats:
    """Everything a report shows for one run (or one group of a run's lines)."""

    label: str
    lines: int
    succeeded: int
    failed: int
    status_codes: dict[str, int]
    errors: dict[str, int]
    retries: int
    retried_requests: int
    max_attempts: int
    schema_valid: int
    schema_invalid: int
    reasked: int
    reasks: int
    finish_reasons: dict[str, int]
    choices: int
    truncated: int  # choices with finish_reason "length": cut by max_tokens
    aborted: int  # choices with finish_reason "abort" (SGLang)
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    start_time: float | None
    end_time: float | None
    wall_s: float | None  # time spent sending: the runs' windows summed, not the gaps between
    runs: int  # runs of exec the file spans (a resumed file: several; unmarked lines: one)
    windows: list[tuple[float, float]]  # the runs' sending windows, in time order, disjoint
    requests_per_s: float | None
    output_tokens_per_s: float | None
    total_tokens_per_s: float | None
    latency: dict[str, Distribution | None]
    itl_pooled_mean_s: float | None  # mean over every inter-chunk gap of every request
    tokens: dict[str, Distribution | None]
    sla: list[SlaResult]
    good: int | None  # successful requests meeting every SLA
    goodput_per_s: float | None
    cost: Cost | None
    untimed: int  # lines without timings (not written by jsonlbatch exec)
    cache_hits: int  # lines answered from exec's answer cache (`exec --cache`)
    torn_tail: bool
    breakdown: dict[str, dict[str, RunStats]] = field(default_factory=dict)
    tool_calls: dict[str, int] = field(default_factory=dict)  # calls per tool name, most first
    #: a calls file (conversations.py): conversations by their number of turns, and the asks
    turns: dict[int, int] = field(default_factory=dict)
    asks: int = 0
    files: int = 0  # files `exec --files-dir` collected, and their bytes
    file_bytes: int = 0

    @property
    def conversations(self) -> int:
        return sum(self.turns.values())

    @property
    def truncated_share(self) -> float | None:
        return self.truncated / self.choices if self.choices else None


def sending_windows(data: RunData) -> list[tuple[float, float]]:
    """The windows in which the file's runs were sending (first attempt start to last attempt
    end of each run exec marked; overlaps merged), in time order. A resumed file's runs are
    apart by however long nobody ran it: that time is no part of its throughput."""
    spans = sorted((a, b) for a, b in data.run_windows.values() if b >= a)
    merged: list[tuple[float, float]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return merged


def summarize(
    data: RunData,
    *,
    sla: Sequence[Sla] = (),
    price: Price | None = None,
    windows: list[tuple[float, float]] | None = None,
) -> RunStats:
    """Compute the stats of a run; `windows` override its sending windows (for groups, whose
    throughput is their share of the whole run's)."""
    if windows is None:
        windows = sending_windows(data)
    wall = sum(b - a for a, b in windows) if windows else None
    cols = data.columns

    def rate(count: float) -> float | None:
        return count / wall if wall else None

    results, good = _judge(cols, sla, data.succeeded)
    reasons = dict(data.finish_reasons.most_common())
    stats = RunStats(
        label=data.label,
        lines=data.lines,
        succeeded=data.succeeded,
        failed=data.failed,
        status_codes=dict(sorted(data.status_codes.items())),
        errors=dict(data.errors.most_common()),
        retries=data.retries,
        retried_requests=data.retried,
        max_attempts=data.max_attempts,
        schema_valid=data.schema_valid,
        schema_invalid=data.schema_invalid,
        reasked=data.reasked,
        reasks=data.reasks,
        finish_reasons=reasons,
        choices=sum(reasons.values()),
        truncated=reasons.get("length", 0),
        aborted=reasons.get("abort", 0),
        prompt_tokens=data.prompt_tokens,
        completion_tokens=data.completion_tokens,
        reasoning_tokens=data.reasoning_tokens,
        start_time=windows[0][0] if windows else None,
        end_time=windows[-1][1] if windows else None,
        wall_s=wall,
        runs=len(data.run_windows) or 1,
        windows=windows,
        # what the servers did: answers from exec's cache were not sent
        requests_per_s=rate(data.succeeded - data.cache_hits),
        output_tokens_per_s=rate(data.completion_tokens - data.cache_completion_tokens),
        total_tokens_per_s=rate(
            data.prompt_tokens
            + data.completion_tokens
            - data.cache_prompt_tokens
            - data.cache_completion_tokens
        ),
        latency={name: describe(cols[name]) for name in LATENCIES},
        itl_pooled_mean_s=data.itl_gap_sum / data.itl_gaps if data.itl_gaps else None,
        tokens={name: describe(cols[name]) for name in TOKENS},
        sla=results,
        good=good,
        goodput_per_s=rate(good) if good is not None else None,
        cost=_cost(data, price),
        untimed=data.untimed,
        cache_hits=data.cache_hits,
        torn_tail=data.torn_tail,
        tool_calls=dict(data.tool_calls.most_common()),
        turns=turns_per_conversation(data.turn_lines),
        asks=data.asks,
        files=data.files,
        file_bytes=data.file_bytes,
    )
    for key, groups in data.groups.items():
        stats.breakdown[key] = {
            value: summarize(group, sla=sla, price=price, windows=windows)
            for value, group in sorted(groups.items())
        }
    return stats


def _judge(
    cols: Mapping[str, Sequence[float]], slas: Sequence[Sla], succeeded: int
) -> tuple[list[SlaResult], int | None]:
    """Per-SLA shares, and how many requests meet them all; an unmeasured value meets none."""
    if not slas:
        return [], None
    all_met = [True] * succeeded
    results = []
    for sla in slas:
        judged = met = 0
        for i, value in enumerate(cols[sla.metric]):
            if math.isnan(value):
                all_met[i] = False
                continue
            judged += 1
            if value <= sla.bound_s:
                met += 1
            else:
                all_met[i] = False
        results.append(
            SlaResult(sla.metric, sla.bound_s, judged, met, met / judged if judged else None)
        )
    return results, sum(all_met)


def _cost(data: RunData, price: Price | None) -> Cost | None:
    """Dollars as billed: each answer's usage at its model's price (`--price` for all, else
    the built-in table), cached input as cached, batch results at the batch share. None when
    no answer has a price."""
    book = PriceBook(price)
    input_usd = output_usd = 0.0
    unpriced: set[str] = set()
    priced = False
    # answers from the cache were paid for by the run that stored them, not by this one
    for (model, batch), tokens in data.billing.items():
        found = book.for_model(model)
        if found is None:
            unpriced.add(model or "(no model)")
            continue
        priced = True
        input_usd += bill(
            Tokens(tokens.uncached, tokens.cached, tokens.written), found, batch=batch
        )
        output_usd += bill(Tokens(output=tokens.output), found, batch=batch)
    if not priced and price is None:
        return None
    total = input_usd + output_usd
    saved = price.of(data.cache_prompt_tokens, data.cache_completion_tokens) if price else 0.0
    per_request = total / data.succeeded if data.succeeded else None
    return Cost(input_usd, output_usd, total, per_request, saved, sorted(unpriced))

"""The report as tables of typed cells: what the text, Markdown and HTML renderers lay out.

Building the tables once, here, keeps the three human formats saying exactly the same thing;
a renderer only decides borders and markup. In a comparison, every cell of a later run keeps
the baseline's value so the renderer can show the change beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from jsonlbatch.pricing.prices import PriceBook
from jsonlbatch.report.conversations import turn_figures
from jsonlbatch.report.model import Report
from jsonlbatch.report.options import Price, format_duration
from jsonlbatch.report.run_stats import LATENCIES, PERCENTILES, TOKENS, Distribution, RunStats

LATENCY_NAMES = {
    "e2e": "E2E latency",
    "ttft": "TTFT",
    "decode": "decode",
    "tpot": "TPOT",
    "itl": "ITL (mean per request)",
}
_DIST_FIELDS = ("count", "mean", "std", *(f"p{p}" for p in PERCENTILES), "max")

#: Latency columns of a breakdown table (when measured): enough to spot the slow group.
_BREAKDOWN_PERCENTILES = (("e2e", 50), ("e2e", 90), ("ttft", 50), ("ttft", 90), ("tpot", 50))

NOTE_FAILED = "Failed requests count in the outcomes, never in the distributions."
NOTE_PERCENTILES = (
    "Percentiles interpolate linearly between closest ranks (numpy's default); std is the "
    "population standard deviation."
)


@dataclass(frozen=True)
class Cell:
    """One value, how to show it (count, seconds, rate, share, number, usd or text), and in a
    comparison the baseline value it changed from; `better` ("higher" or "lower") lets a
    renderer colour the change."""

    value: Any
    kind: str = "text"
    base: Any = None
    better: str | None = None


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[Cell]]
    notes: list[str] = field(default_factory=list)


def format_value(value: Any, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "count":
        return f"{int(value):,}"
    if kind == "seconds":
        return f"{value * 1000:.1f} ms" if abs(value) < 1 else f"{value:,.3f} s"
    if kind == "rate":
        return f"{value:,.2f}"
    if kind == "share":
        return f"{value * 100:.1f}%"
    if kind == "number":
        return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"
    if kind == "usd":
        return f"${value:,.2f}" if abs(value) >= 1 else f"${value:.6f}"
    return str(value)


def format_delta(cell: Cell) -> str:
    """The change from the baseline: relative (%), or in points for shares; '' if unchanged or
    not comparable (no baseline, or a baseline of 0)."""
    value, base = cell.value, cell.base
    if not isinstance(value, (int, float)) or not isinstance(base, (int, float)) or value == base:
        return ""
    if cell.kind == "share":
        text = f"{(value - base) * 100:+.1f} pp"
    elif base == 0:  # no relative change from 0: the absolute one ("failed 0 -> 13": +13)
        shown = format_value(abs(value), cell.kind)
        return ("-" if value < 0 else "+") + shown if cell.kind != "text" else ""
    else:
        text = f"{(value - base) / abs(base) * 100:+.1f}%"
    return "" if text[1:].startswith("0.0") else text  # below the shown precision: unchanged


def format_cell(cell: Cell) -> str:
    text = format_value(cell.value, cell.kind)
    delta = format_delta(cell)
    return f"{text} ({delta})" if delta else text


def headline(report: Report) -> Table:
    """The report at a glance, first in every format: what a reader wants before any table."""
    runs = report.runs
    present = present_latencies(runs)
    rows: list[tuple[str, str, Callable[[RunStats], Any], str | None]] = [
        ("requests ok", "count", lambda r: r.succeeded, "higher"),
        ("requests failed", "count", lambda r: r.failed, "lower"),
        ("time sending", "seconds", lambda r: r.wall_s, "lower"),
        ("requests/s", "rate", lambda r: r.requests_per_s, "higher"),
        ("output tokens/s", "rate", lambda r: r.output_tokens_per_s, "higher"),
    ]
    for name in ("e2e", "ttft"):
        if name in present:
            for p in (50, 99):
                rows.append((f"{name.upper()} p{p}", "seconds", _percentile(name, p), "lower"))
    if report.sla:
        rows.append(("meeting every SLA", "share", _good_share, "higher"))
    if any(r.cost for r in runs):
        rows.append(("cost", "usd", lambda r: r.cost.total_usd if r.cost else None, "lower"))
    out = []
    for label, kind, get, better in rows:
        base = get(runs[0])
        cells = [Cell(base, kind, better=better)]
        for run in runs[1:]:
            # A run that answered fewer requests spends less: that is no saving to colour.
            fewer = label == "cost" and run.succeeded < runs[0].succeeded
            cells.append(Cell(get(run), kind, base, None if fewer else better))
        out.append([Cell(label), *cells])
    return Table("At a glance", _header(runs), out)


def _percentile(name: str, p: int) -> Callable[[RunStats], Any]:
    def get(run: RunStats) -> Any:
        dist = run.latency[name]
        return getattr(dist, f"p{p}") if dist else None

    return get


def _good_share(run: RunStats) -> float | None:
    return run.good / run.succeeded if run.good is not None and run.succeeded else None


def build_tables(report: Report) -> list[Table]:
    """Every table of the report, in reading order (empty sections left out)."""
    runs = report.runs
    tables = [
        _outcomes(runs),
        _finish_reasons(runs),
        _tool_calls(runs),
        _conversations(runs),
        _tokens(runs),
        _throughput(runs),
        _distributions("Latency", runs, LATENCIES, LATENCY_NAMES, "seconds", _latency_notes(runs)),
        _distributions("Tokens per request", runs, TOKENS, {}, "number", [NOTE_FAILED]),
    ]
    if report.sla:
        tables.append(_sla(runs))
    if any(r.cost for r in runs):
        tables.append(_cost(runs, report.price))
    for key in report.by:
        tables += [_breakdown(key, run, len(runs) > 1, report.sla) for run in runs]
        tables += [_breakdown_latency(key, run, len(runs) > 1) for run in runs]
    tables.append(_servers(report))
    return [t for t in tables if t.rows]


def present_latencies(runs: Iterable[RunStats]) -> list[str]:
    """The latency metrics measured in at least one run (TTFT and up need `exec --stream`)."""
    runs = list(runs)
    return [name for name in LATENCIES if any(run.latency[name] for run in runs)]


# ---------------------------------------------------------------------------------------------


def _by_run(
    runs: list[RunStats], rows: list[tuple[str, str, Callable[[RunStats], Any]]]
) -> list[list[Cell]]:
    """One row per (label, kind, getter): a cell per run, later runs against the first."""
    out = []
    for label, kind, get in rows:
        base = get(runs[0])
        cells = [Cell(base, kind)] + [Cell(get(run), kind, base) for run in runs[1:]]
        out.append([Cell(label), *cells])
    return out


def _header(runs: list[RunStats]) -> list[str]:
    return ["", *(run.label for run in runs)]


def _count_of(field: str, key: str) -> Callable[[RunStats], int]:
    """A row's getter: how many times `key` is in a run's counter `field`."""
    return lambda r: getattr(r, field).get(key, 0)


def _run_sla(i: int) -> Callable[[RunStats], Any]:
    return lambda r: r.sla[i].share


def _group_latency(name: str, field: str) -> Callable[[Any], Any]:
    return lambda g: getattr(g.latency[name], field) if g.latency[name] else None


def _group_sla(i: int) -> Callable[[Any], Any]:
    return lambda g: g.sla[i].share if g.sla else None


def _union(runs: list[RunStats], get: Callable[[RunStats], dict[str, int]]) -> list[str]:
    keys: dict[str, None] = {}
    for run in runs:
        keys.update(dict.fromkeys(get(run)))
    return list(keys)


def _outcomes(runs: list[RunStats]) -> Table:
    rows: list[tuple[str, str, Callable[[RunStats], Any]]] = [
        ("lines", "count", lambda r: r.lines),
        ("succeeded", "count", lambda r: r.succeeded),
        ("failed", "count", lambda r: r.failed),
    ]
    for code in sorted(_union(runs, lambda r: r.status_codes)):
        rows.append((f"status {code}", "count", _count_of("status_codes", code)))
    for code in _union(runs, lambda r: r.errors):
        rows.append((f"error {code}", "count", _count_of("errors", code)))
    rows += [
        ("retries", "count", lambda r: r.retries),
        ("requests retried", "count", lambda r: r.retried_requests),
        ("most attempts", "count", lambda r: r.max_attempts),
    ]
    if any(r.schema_valid or r.schema_invalid for r in runs):  # answers under a schema
        rows += [
            ("schema valid", "count", lambda r: r.schema_valid),
            ("schema invalid", "count", lambda r: r.schema_invalid),
            ("requests re-asked", "count", lambda r: r.reasked),
            ("re-asks", "count", lambda r: r.reasks),
        ]
    if any(r.files for r in runs):  # exec --files-dir
        rows += [
            ("files collected", "count", lambda r: r.files),
            ("file bytes", "count", lambda r: r.file_bytes),
        ]
    notes = []
    if any(run.cache_hits for run in runs):
        rows.append(("from the answer cache", "count", lambda r: r.cache_hits))
        notes.append(
            "Answers from the cache (exec --cache) were not sent: no timings of their own, "
            "not in latencies, throughput or cost."
        )
    for run in runs:
        if run.torn_tail:
            notes.append(f"{run.label}: torn last line ignored (a run still writing?)")
        if run.untimed:
            notes.append(
                f"{run.label}: {run.untimed} line(s) without timings (not written by "
                "jsonlbatch exec): counted, but not in latencies or throughput"
            )
    return Table("Outcomes", _header(runs), _by_run(runs, rows), notes)


def _finish_reasons(runs: list[RunStats]) -> Table:
    rows: list[tuple[str, str, Callable[[RunStats], Any]]] = [
        (reason, "count", _count_of("finish_reasons", reason))
        for reason in _union(runs, lambda r: r.finish_reasons)
    ]
    if rows:
        rows.append(("truncated (length) share", "share", lambda r: r.truncated_share))
    notes = []
    for run in runs:
        if run.truncated:
            notes.append(
                f"{run.label}: {run.truncated} of {run.choices} choices were cut by max_tokens "
                "(finish_reason length)"
            )
        if run.aborted:
            notes.append(f"{run.label}: {run.aborted} choices aborted by the server (abort)")
    return Table("Finish reasons (choices)", _header(runs), _by_run(runs, rows), notes)


def _tool_calls(runs: list[RunStats]) -> Table:
    rows: list[tuple[str, str, Callable[[RunStats], Any]]] = [
        (name, "count", _count_of("tool_calls", name))
        for name in _union(runs, lambda r: r.tool_calls)
    ]
    if rows:
        rows.append(("all calls", "count", lambda r: sum(r.tool_calls.values())))
    return Table("Tool calls (by tool name)", _header(runs), _by_run(runs, rows))


def _conversations(runs: list[RunStats]) -> Table:
    """A calls file's conversations (report/conversations.py): how many turns each took."""
    if not any(run.turns for run in runs):
        return Table("Conversations", _header(runs), [])
    rows: list[tuple[str, str, Callable[[RunStats], Any]]] = [
        ("conversations", "count", lambda r: r.conversations),
        ("turns", "count", lambda r: sum(k * n for k, n in r.turns.items())),
        ("asks", "count", lambda r: r.asks),
    ]
    for name in ("mean", "p50", "p90", "max"):
        rows.append((f"turns per conversation, {name}", "number", _turn_figure(name)))
    for k in sorted({k for run in runs for k in run.turns}):
        label = f"conversations of {k} turn{'s' if k > 1 else ''}"
        rows.append((label, "count", _conversations_of(k)))
    notes = ["From a calls file's ids (<conversation>#t<N>, asks #t<N>.ask<K>)."]
    return Table("Conversations", _header(runs), _by_run(runs, rows), notes)


def _turn_figure(name: str) -> Callable[[RunStats], Any]:
    return lambda r: turn_figures(r.turns).get(name)


def _conversations_of(turns: int) -> Callable[[RunStats], int]:
    return lambda r: r.turns.get(turns, 0)


def _tokens(runs: list[RunStats]) -> Table:
    rows: list[tuple[str, str, Callable[[RunStats], Any]]] = [
        ("prompt tokens", "count", lambda r: r.prompt_tokens),
        ("completion tokens", "count", lambda r: r.completion_tokens),
    ]
    if any(run.reasoning_tokens for run in runs):
        rows.append(("of which reasoning", "count", lambda r: r.reasoning_tokens))
    rows.append(("total tokens", "count", lambda r: r.prompt_tokens + r.completion_tokens))
    return Table("Tokens", _header(runs), _by_run(runs, rows))


def _throughput(runs: list[RunStats]) -> Table:
    rows: list[tuple[str, str, Callable[[RunStats], Any]]] = [
        ("started (UTC)", "text", lambda r: utc_text(r.start_time)),
        ("time sending", "seconds", lambda r: r.wall_s),
        ("requests/s", "rate", lambda r: r.requests_per_s),
        ("output tokens/s", "rate", lambda r: r.output_tokens_per_s),
        ("total tokens/s", "rate", lambda r: r.total_tokens_per_s),
    ]
    resumed = [run for run in runs if run.runs > 1]
    if resumed:
        rows.insert(1, ("runs of exec", "count", lambda r: r.runs))
        rows.insert(2, ("ended (UTC)", "text", lambda r: utc_text(r.end_time)))
    notes = [
        "Over the time spent sending: first attempt start to last attempt end of each run of "
        "exec, summed over the runs a resumed file spans (the time between them is left out); "
        "requests/s counts successful requests."
    ]
    notes += [f"{run.label} spans {run.runs} runs of exec (resumed)." for run in resumed]
    return Table("Throughput", _header(runs), _by_run(runs, rows), notes)


def utc_text(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _distributions(
    title: str,
    runs: list[RunStats],
    names: tuple[str, ...],
    shown: dict[str, str],
    kind: str,
    notes: list[str],
) -> Table:
    """Rows = metric (x run in a comparison), columns = count, mean, std, percentiles, max."""
    many = len(runs) > 1
    header = ["metric", *(["run"] if many else []), *_DIST_FIELDS]
    rows = []
    for name in names:
        source = "latency" if kind == "seconds" else "tokens"
        dists: list[Distribution | None] = [getattr(run, source)[name] for run in runs]
        if not any(dists):
            continue
        base = dists[0]
        for i, (run, dist) in enumerate(zip(runs, dists, strict=True)):
            cells = [Cell(shown.get(name, name))] + ([Cell(run.label)] if many else [])
            for f in _DIST_FIELDS:
                value = getattr(dist, f) if dist else None
                prior = getattr(base, f) if (i and base) else None
                cells.append(Cell(value, "count" if f == "count" else kind, prior))
            rows.append(cells)
    return Table(title, header, rows, notes)


def _latency_notes(runs: list[RunStats]) -> list[str]:
    notes = [NOTE_FAILED, NOTE_PERCENTILES]
    present = present_latencies(runs)
    if "e2e" in present and "ttft" not in present:
        notes.append("TTFT, TPOT and ITL are measured by `jsonlbatch exec --stream` only.")
    for run in runs:
        if run.itl_pooled_mean_s is not None:
            notes.append(
                f"{run.label}: ITL over every inter-chunk gap of every request has mean "
                f"{format_value(run.itl_pooled_mean_s, 'seconds')}; the row shows the "
                "distribution of each request's mean gap."
            )
    return notes


def _sla(runs: list[RunStats]) -> Table:
    rows: list[tuple[str, str, Callable[[RunStats], Any]]] = []
    for i, result in enumerate(runs[0].sla):
        rows.append(
            (
                f"{result.metric} within {format_duration(result.bound_s)}",
                "share",
                _run_sla(i),
            )
        )
    rows += [
        ("meeting every SLA", "count", lambda r: r.good),
        ("share meeting every SLA", "share", _good_share),
        ("goodput (requests/s)", "rate", lambda r: r.goodput_per_s),
    ]
    notes = [
        "Shares are over the successful requests that have the metric; a request "
        "without it (no --stream for ttft/tpot/itl) never counts as meeting every SLA."
    ]
    return Table("SLA", _header(runs), _by_run(runs, rows), notes)


def _cost(runs: list[RunStats], price: Price | None) -> Table:
    rows: list[tuple[str, str, Callable[[RunStats], Any]]] = [
        ("input", "usd", lambda r: r.cost.input_usd if r.cost else None),
        ("output", "usd", lambda r: r.cost.output_usd if r.cost else None),
        ("total", "usd", lambda r: r.cost.total_usd if r.cost else None),
        ("per successful request", "usd", lambda r: r.cost.per_request_usd if r.cost else None),
    ]
    if any(r.cost and r.cost.saved_usd for r in runs):
        rows.append(
            ("saved by the answer cache", "usd", lambda r: r.cost.saved_usd if r.cost else None)
        )
    notes = [PriceBook(price).describe()]
    unpriced = sorted({m for r in runs if r.cost for m in r.cost.unpriced_models})
    if unpriced:
        notes.append(f"Not counted (no price for the model; give --price): {', '.join(unpriced)}.")
    return Table("Cost", _header(runs), _by_run(runs, rows), notes)


def _servers(report: Report) -> Table:
    """Per endpoint, what the server itself counted (its /metrics, read by exec)."""
    many = len(report.runs) > 1
    rows = [
        [*([Cell(run.label)] if many else []), Cell(fig.endpoint), Cell(fig.kind),
         Cell(fig.requests, "count"), Cell(fig.prefix_cache_queries, "count"),
         Cell(fig.prefix_cache_hits, "count"), Cell(fig.prefix_cache_hit_rate, "share")]
        for run, figures in zip(report.runs, report.servers, strict=False)  # [] when not loaded
        for fig in figures
    ]  # fmt: skip
    header = ["endpoint", "server", "requests", "prompt tok looked up", "found in cache",
              "prefix cache hit rate"]  # fmt: skip
    notes = ["From each server's /metrics before and after every exec run on this output."]
    return Table("Servers", ["run", *header] if many else header, rows, notes)


def _breakdown(key: str, run: RunStats, many: bool, slas: Iterable[Any] = ()) -> Table:
    groups = run.breakdown.get(key, {})
    present = present_latencies(groups.values())
    columns: list[tuple[str, str, Callable[[RunStats], Any]]] = [
        ("requests", "count", lambda g: g.lines),
        ("failed", "count", lambda g: g.failed),
        ("length", "count", lambda g: g.truncated),
        ("prompt tok", "count", lambda g: g.prompt_tokens),
        ("output tok", "count", lambda g: g.completion_tokens),
        ("req/s", "rate", lambda g: g.requests_per_s),
        ("output tok/s", "rate", lambda g: g.output_tokens_per_s),
    ]
    for name, p in _BREAKDOWN_PERCENTILES:
        if name in present:
            columns.append(
                (
                    f"{name} p{p}",
                    "seconds",
                    _group_latency(name, f"p{p}"),
                )
            )
    slas = list(slas)
    for i, sla in enumerate(slas):
        columns.append(
            (
                f"{sla.metric} <= {format_duration(sla.bound_s)}",
                "share",
                _group_sla(i),
            )
        )
    if len(slas) > 1:
        columns.append(("every SLA", "share", _good_share))
    rows = [
        [Cell(value), *(Cell(get(group), kind) for _, kind, get in columns)]
        for value, group in groups.items()
    ]
    title = f"By {key}" + (f": {run.label}" if many else "")
    notes = ["Rates are each group's share of the whole run's wall window."]
    if slas:
        notes.append("SLA columns: the share of the group's successful requests within the bound.")
    return Table(title, [key, *(name for name, _, _ in columns)], rows, notes)


#: The latencies a per-group table shows (prefill, decode and the whole), and at which ranks.
_GROUP_LATENCIES = ("ttft", "decode", "e2e")
_GROUP_PERCENTILES = (10, 25, 40, 50, 90, 99)


def _breakdown_latency(key: str, run: RunStats, many: bool) -> Table:
    """Per group (a model of a fleet), TTFT (prefill) and decode (E2E - TTFT) apart, then E2E:
    where each model's time goes."""
    groups = run.breakdown.get(key, {})
    present = [n for n in _GROUP_LATENCIES if n in present_latencies(groups.values())]
    header = [key, "metric", "count", *(f"p{p}" for p in _GROUP_PERCENTILES)]
    rows = []
    for value, group in groups.items():
        for name in present:
            dist = group.latency[name]
            if dist is None:
                continue
            cells = [Cell(value), Cell(LATENCY_NAMES[name]), Cell(dist.count, "count")]
            cells += [Cell(getattr(dist, f"p{p}"), "seconds") for p in _GROUP_PERCENTILES]
            rows.append(cells)
    title = f"Latency by {key}" + (f": {run.label}" if many else "")
    notes = ["decode is E2E - TTFT: generation after the first token (needs exec --stream)."]
    if present == ["e2e"]:
        notes = ["TTFT and decode are measured by `jsonlbatch exec --stream` only."]
    return Table(title, header, rows, notes)

"""Charts for the HTML report, drawn by matplotlib (the optional `report` extra) as PNG bytes.

One small figure per chart, so the page can lay them out in a grid that reflows with the window:
throughput over time first (completed requests/s and output tokens/s, binned to a round width
that holds enough completions to read as a rate), then a histogram and a CDF per latency metric
with the SLA bounds drawn in. Runs of a comparison share each chart, one colour per run; a
single run gets no legend. Only matplotlib's object API is used (no pyplot), so drawing changes
no global backend state and needs no display.
"""

from __future__ import annotations

import bisect
import io
import itertools
import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jsonlbatch.extras import check
from jsonlbatch.report.model import Report
from jsonlbatch.report.options import format_duration
from jsonlbatch.report.tables import LATENCY_NAMES, present_latencies

CHARTS_EXTRA = "report"

if TYPE_CHECKING:  # matplotlib is the optional `report` extra
    from matplotlib.typing import RcKeyType

_SIZE = (6.4, 3.3)  # inches; drawn at _DPI and shown at about 100 px an inch: sharp on HiDPI
_DPI = 150
_COLORS = ("#0969da", "#e16f24", "#1a7f37", "#8250df", "#bf3989", "#57606a")
_SLA_COLOR = "#cf222e"
_STYLE: dict[RcKeyType, Any] = {
    "font.size": 10,
    "axes.titlesize": 11.5,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
    "axes.labelsize": 10,
    "axes.labelcolor": "#424a53",
    "axes.edgecolor": "#8c959f",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#d8dee4",
    "grid.linewidth": 0.7,
    "xtick.color": "#424a53",
    "ytick.color": "#424a53",
    "legend.frameon": False,
    "legend.fontsize": 9,
}
#: Throughput bins: at least this many completions each on average, and at most _MAX_BINS.
_PER_BIN, _MAX_BINS, _MIN_BINS = 40, 60, 5
_NICE_WIDTHS = (0.05, 0.1, 0.2, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800)


@dataclass
class Chart:
    title: str
    png: bytes
    alt: str = ""  # what the chart shows, for screen readers and a missing image


def charts_missing() -> str | None:
    """Why an HTML page would have no charts (matplotlib, the `report` extra), or None."""
    return check("matplotlib", extra=CHARTS_EXTRA, for_what="drawing charts in the HTML report")


def draw_charts(report: Report) -> list[Chart]:
    """Throughput over time, then a histogram and a CDF per measured latency; empty if nothing
    was timed."""
    import matplotlib
    from matplotlib.figure import Figure

    charts: list[Chart] = []
    with matplotlib.rc_context(_STYLE):
        if any(run.wall_s for run in report.runs):
            charts += _throughput(Figure, report)
        for name in present_latencies(report.runs):
            series = _latency_series(report, name)
            bounds = [sla.bound_s for sla in report.sla if sla.metric == name]
            title = LATENCY_NAMES[name]
            charts.append(
                Chart(
                    f"{title}: distribution",
                    _histogram(Figure, title, series, bounds),
                    f"Histogram of {title} per request",
                )
            )
            charts.append(
                Chart(
                    f"{title}: CDF",
                    _cdf(Figure, title, series, bounds),
                    f"Share of requests within each {title}",
                )
            )
        for key in report.by:
            charts += _by_group(Figure, report, key)
    return charts


_MAX_GROUP_CHARTS = 12  # more lines than this in one chart is no longer readable


def _by_group(figure: Any, report: Report, key: str) -> list[Chart]:
    """A CDF per latency with a line per group of the first run (per model of a fleet)."""
    groups = report.data[0].groups.get(key, {}) if report.data else {}
    if not 1 < len(groups) <= _MAX_GROUP_CHARTS:
        return []
    out = []
    for name in ("ttft", "decode", "e2e"):
        series = [
            (value, sorted(v for v in data.columns[name] if not math.isnan(v)))
            for value, data in sorted(groups.items())
        ]
        series = [(label, values) for label, values in series if values]
        if len(series) < 2:
            continue
        bounds = [sla.bound_s for sla in report.sla if sla.metric == name]
        title = f"{LATENCY_NAMES[name]} by {key}"
        out.append(
            Chart(
                f"{title}: CDF",
                _cdf(figure, title, series, bounds),
                f"Share of requests within each {LATENCY_NAMES[name]}, per {key}",
            )
        )
    return out


# -- throughput --------------------------------------------------------------------------------


def bin_width(span_s: float, completions: int) -> float:
    """A round bin width (seconds) for rates over `span_s`: wide enough that a bin holds about
    `_PER_BIN` completions (so a steady run draws a steady line, not counting noise), narrow
    enough for `_MIN_BINS`..`_MAX_BINS` bins."""
    if span_s <= 0:
        return 1.0
    bins = max(_MIN_BINS, min(_MAX_BINS, completions // _PER_BIN))
    wanted = span_s / bins
    return next((w for w in _NICE_WIDTHS if w >= wanted), math.ceil(wanted / 3600) * 3600.0)


def sending_clock(windows: list[tuple[float, float]]) -> Callable[[float], float]:
    """Wall-clock time -> seconds spent sending: the runs' windows laid end to end, so a
    resumed file's idle days do not flatten its chart."""
    starts = [a for a, _ in windows]
    before = list(itertools.accumulate((b - a for a, b in windows), initial=0.0))

    def offset(t: float) -> float:
        i = max(0, bisect.bisect_right(starts, t) - 1)
        a, b = windows[i]
        return before[i] + min(max(t - a, 0.0), b - a)

    return offset


def throughput_bins(
    ends: Sequence[float], weights: Sequence[float] | None, run: Any, width: float
) -> tuple[list[float], list[float]]:
    """(edges, rates): `ends` (each weighted, or counted once) binned over the run's sending
    time, as rates per second. The last bin runs to the end of the run and spans half to one and
    a half widths: a sliver of a bin would turn a few completions into a spike. Every end lands
    in a bin, so the rates' time-weighted mean is the total over the time spent sending."""
    bins = max(1, int(run.wall_s / width + 0.5))
    counts = [0.0] * bins
    offset = sending_clock(run.windows)
    for n, end in enumerate(ends):
        if math.isnan(end):
            continue
        slot = min(bins - 1, max(0, int(offset(end) / width)))
        counts[slot] += 1.0 if weights is None else weights[n]
    edges = [k * width for k in range(bins)] + [run.wall_s]
    spans = [b - a for a, b in itertools.pairwise(edges)]  # the last may be short
    return edges, [c / s if s > 0 else 0.0 for c, s in zip(counts, spans, strict=True)]


def _throughput(figure: Any, report: Report) -> list[Chart]:
    return [
        Chart(f"{title} over time", _png(fig), alt)
        for fig, title, alt in _throughput_figures(figure, report)
    ]


def _throughput_figures(figure: Any, report: Report) -> list[tuple[Any, str, str]]:
    """The requests/s and output tokens/s figures (fig, title, alt text)."""
    timed = [
        (data, run)
        for data, run in zip(report.data, report.runs, strict=True)
        if run.wall_s and run.start_time is not None
    ]
    span = max(run.wall_s or 0.0 for _, run in timed)
    width = bin_width(span, max(run.succeeded for _, run in timed))
    many = len(report.runs) > 1
    req_fig, req_ax = _axes(figure)
    tok_fig, tok_ax = _axes(figure)
    for i, (data, run) in enumerate(timed):
        assert run.start_time is not None and run.wall_s is not None
        offset = sending_clock(run.windows)
        color = _COLORS[i % len(_COLORS)]
        # requests: the answered ones (as the headline's requests/s); output tokens: every sent
        # line's, failed ones too (as the headline's output tokens/s)
        for ax, (edges, rates), mean in (
            (req_ax, throughput_bins(data.columns["end"], None, run, width), run.requests_per_s),
            (tok_ax, throughput_bins(data.token_ends, data.token_counts, run, width),
             run.output_tokens_per_s),
        ):  # fmt: skip
            ax.stairs(rates, edges, color=color, linewidth=1.8, label=data.label, baseline=None)
            ax.fill_between(
                edges, [*rates, rates[-1]], step="post", color=color, alpha=0.08, linewidth=0
            )
            if mean:
                ax.axhline(mean, color=color, linestyle=":", linewidth=1.2)
            for a, _ in run.windows[1:]:  # where a resumed run took over
                ax.axvline(offset(a), color=color, linestyle="--", linewidth=0.8, alpha=0.6)
    note = f"completed per {format_duration(width)}; dotted: the run's mean"
    resumed = "; dashed: a resumed run starts" if any(len(r.windows) > 1 for _, r in timed) else ""
    figures = []
    for fig, ax, title in (
        (req_fig, req_ax, "Requests/s"),
        (tok_fig, tok_ax, "Output tokens/s"),
    ):
        ax.set_title(title)
        # wrapped: constrained layout makes room for lines, but cuts a line wider than the figure
        ax.set_xlabel("\n".join(textwrap.wrap(f"seconds spent sending ({note}{resumed})", 70)))
        ax.set_xlim(0, span)
        ax.set_ylim(bottom=0)
        _legend(fig, ax, many)
        figures.append((fig, title, f"{title} over time, {note}"))
    return figures


# -- latency -----------------------------------------------------------------------------------


def _latency_series(report: Report, name: str) -> list[tuple[str, list[float]]]:
    """(run label, sorted latencies in seconds) of the runs that measured `name`."""
    series = [
        (data.label, sorted(v for v in data.columns[name] if not math.isnan(v)))
        for data in report.data
    ]
    return [(label, values) for label, values in series if values]


def _unit(series: Sequence[tuple[str, list[float]]], bounds: Sequence[float]) -> tuple[str, float]:
    top = max([v[-1] for _, v in series] + list(bounds))
    return ("s", 1.0) if top >= 5 else ("ms", 1000.0)


def _histogram(
    figure: Any, title: str, series: list[tuple[str, list[float]]], bounds: Sequence[float]
) -> bytes:
    from matplotlib.ticker import MaxNLocator

    unit, scale = _unit(series, bounds)
    fig, ax = _axes(figure)
    # One set of bin edges for every run, so the bars of a comparison line up.
    low = min(v[0] for _, v in series) * scale
    high = max(v[-1] for _, v in series) * scale
    if high - low < 1e-6 * max(1.0, abs(high)):  # (nearly) one value: numpy cannot bin it
        low, high = low - 0.5, high + 0.5
    bins = min(40, max(8, max(len(v) for _, v in series) // 10))
    many = len(series) > 1
    for i, (label, values) in enumerate(series):
        ax.hist(
            [v * scale for v in values],
            bins=bins,
            range=(low, high) if high > low else None,
            color=_COLORS[i % len(_COLORS)],
            alpha=0.55 if many else 0.85,
            label=label,
            histtype="stepfilled",
            edgecolor=_COLORS[i % len(_COLORS)],
            linewidth=1.0,
        )
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # requests come in whole numbers
    ax.set_title(title)
    ax.set_xlabel(unit)
    ax.set_ylabel("requests")
    _sla_lines(ax, bounds, scale)
    _legend(fig, ax, many)
    return _png(fig)


def _cdf(
    figure: Any, title: str, series: list[tuple[str, list[float]]], bounds: Sequence[float]
) -> bytes:
    from matplotlib.ticker import PercentFormatter

    unit, scale = _unit(series, bounds)
    fig, ax = _axes(figure)
    for i, (label, values) in enumerate(series):
        shares = [(k + 1) / len(values) for k in range(len(values))]
        ax.step(
            [v * scale for v in values],
            shares,
            where="post",
            color=_COLORS[i % len(_COLORS)],
            linewidth=1.8,
            label=label,
        )
    ax.set_ylim(0, 1.02)
    ax.set_yticks([0, 0.25, 0.5, 0.75, 0.9])
    ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.set_title(f"{title}: share of requests within")
    ax.set_xlabel(unit)
    _sla_lines(ax, bounds, scale, top=False)
    _legend(fig, ax, len(series) > 1)
    return _png(fig)


def _sla_lines(ax: Any, bounds: Sequence[float], scale: float, *, top: bool = True) -> None:
    """A dashed line at each SLA bound, labelled at the top (histograms) or the bottom (CDFs,
    whose curves run along the top)."""
    for bound in bounds:
        ax.axvline(bound * scale, color=_SLA_COLOR, linestyle="--", linewidth=1.4)
        ax.annotate(
            f"SLA {format_duration(bound)}",
            xy=(bound * scale, 1 if top else 0),
            xycoords=("data", "axes fraction"),
            xytext=(4, -4 if top else 4),
            textcoords="offset points",
            va="top" if top else "bottom",
            color=_SLA_COLOR,
            fontsize=9,
            bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none"},
        )


# -- plumbing ----------------------------------------------------------------------------------


def _legend(fig: Any, ax: Any, many: bool) -> None:
    """One entry per run, above the plot where it hides no data; none for a single run."""
    if many:
        handles, labels = ax.get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside upper right", ncols=min(4, len(labels)))


def _axes(figure: Any) -> tuple[Any, Any]:
    fig = figure(figsize=_SIZE, layout="constrained")
    return fig, fig.add_subplot()


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=_DPI)
    return buffer.getvalue()

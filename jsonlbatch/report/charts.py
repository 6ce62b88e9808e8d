"""Charts for the HTML report, drawn by matplotlib (the optional `report` extra) as PNG bytes.

Only matplotlib's object API is used (no pyplot), so drawing changes no global backend state
and needs no display. Runs of a comparison share each chart, one colour per run.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any

from jsonlbatch.report.model import Report
from jsonlbatch.report.tables import LATENCY_NAMES, present_latencies

INSTALL_HINT = "pip install 'jsonlbatch[report]'"
_MAX_BINS = 60


@dataclass
class Chart:
    title: str
    png: bytes


def charts_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def draw_charts(report: Report) -> list[Chart]:
    """Latency histograms and CDFs, and throughput over time; empty if nothing was timed."""
    from matplotlib.figure import Figure

    names = present_latencies(report.runs)
    charts = []
    if names:
        series = {name: _latency_series(report, name) for name in names}
        charts.append(Chart("Latency histograms", _latency(Figure, series, cdf=False)))
        charts.append(Chart("Latency CDFs", _latency(Figure, series, cdf=True)))
    if any(run.wall_s for run in report.runs):
        charts.append(Chart("Throughput over time", _throughput(Figure, report)))
    return charts


def _latency_series(report: Report, name: str) -> list[tuple[str, list[float]]]:
    """(run label, sorted latencies in ms) of the runs that measured `name`."""
    series = [
        (data.label, sorted(v * 1000 for v in data.columns[name] if not math.isnan(v)))
        for data in report.data
    ]
    return [(label, values) for label, values in series if values]


def _latency(
    figure: Any, series_by_name: dict[str, list[tuple[str, list[float]]]], *, cdf: bool
) -> bytes:
    names = list(series_by_name)
    fig = figure(figsize=(4.2 * len(names), 3.4), layout="constrained")
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    for ax, name in zip(axes, names, strict=True):
        series = series_by_name[name]
        # One set of bin edges for every run, so bars of a comparison line up.
        span = (min(v[0] for _, v in series), max(v[-1] for _, v in series))
        bins = min(40, max(5, max(len(v) for _, v in series) // 5))
        for label, values in series:
            if cdf:
                shares = [(i + 1) / len(values) for i in range(len(values))]
                ax.step(values, shares, where="post", label=label)
            else:
                ax.hist(values, bins=bins, range=span, alpha=0.55, label=label)
        ax.set_title(LATENCY_NAMES[name])
        ax.set_xlabel("ms")
        ax.set_ylabel("share of requests" if cdf else "requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return _png(fig)


def _throughput(figure: Any, report: Report) -> bytes:
    fig = figure(figsize=(9, 3.4), layout="constrained")
    requests_ax, tokens_ax = fig.subplots(1, 2)
    for data, run in zip(report.data, report.runs, strict=True):
        if not run.wall_s or run.start_time is None:
            continue
        bins = max(1, min(_MAX_BINS, run.succeeded // 5))
        width = run.wall_s / bins
        done, tokens = [0] * bins, [0.0] * bins
        for end, count in zip(data.columns["end"], data.columns["completion"], strict=True):
            if math.isnan(end):
                continue
            slot = min(bins - 1, max(0, int((end - run.start_time) / width)))
            done[slot] += 1
            tokens[slot] += 0.0 if math.isnan(count) else count
        xs = [(i + 0.5) * width for i in range(bins)]
        requests_ax.plot(xs, [d / width for d in done], marker=".", label=data.label)
        tokens_ax.plot(xs, [t / width for t in tokens], marker=".", label=data.label)
    for ax, title in ((requests_ax, "requests/s"), (tokens_ax, "output tokens/s")):
        ax.set_title(f"{title} (completed, per interval)")
        ax.set_xlabel("seconds since the run started")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return _png(fig)


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=96)
    return buffer.getvalue()

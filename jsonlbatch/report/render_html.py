"""The report as one self-contained HTML page: inline CSS, charts as PNG `data:` URIs.

Laid out to be read at a glance: the headline numbers first (one card each, every run with its
change in a comparison, coloured by whether it got better), then the charts in a grid that
reflows with the window, then the detailed tables, each scrolling inside its own box when it is
wider than the window so the page itself never scrolls sideways. Nothing on the page refers to
the network, so it opens anywhere (an air-gapped cluster, an attachment); without matplotlib the
page is still written, with the tables, and says why the charts are missing.
"""

from __future__ import annotations

import base64
from html import escape

from jsonlbatch.report.charts import charts_missing, draw_charts
from jsonlbatch.report.model import Report
from jsonlbatch.report.tables import (
    Cell,
    Table,
    build_tables,
    format_delta,
    format_value,
    headline,
    utc_text,
)

_CSS = """
:root { color-scheme: light; --fg: #1f2328; --muted: #59636e; --line: #d1d9e0;
        --soft: #f6f8fa; --good: #1a7f37; --bad: #cf222e; }
* { box-sizing: border-box; }
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
       margin: 0 auto; max-width: 1320px; padding: 24px clamp(12px, 3vw, 32px) 48px; }
h1 { font-size: 1.55em; margin: 0 0 2px; }
h2 { font-size: 1.2em; margin: 32px 0 12px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 1em; margin: 0 0 6px; }
p.sub { color: var(--muted); margin: 0 0 18px; overflow-wrap: anywhere; }
.glance { display: grid; gap: 12px; grid-template-columns: repeat(auto-fill, minmax(190px, 1fr)); }
.glance.many { grid-template-columns: repeat(auto-fill, minmax(min(100%, 250px), 1fr)); }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; background: #fff;
        min-width: 0; }
.card .label { color: var(--muted); font-size: .85em; text-transform: uppercase;
               letter-spacing: .03em; }
.card .value { font-size: 1.6em; font-weight: 600; font-variant-numeric: tabular-nums;
               line-height: 1.25; }
.card .value.bad { color: var(--bad); }
.card table { width: 100%; border-collapse: collapse; margin-top: 2px; }
.card td { padding: 1px 0; font-variant-numeric: tabular-nums; white-space: nowrap; }
.card td.run { color: var(--muted); font-size: .85em; max-width: 0; width: 45%;
               overflow: hidden; text-overflow: ellipsis; padding-right: 6px; }
.card td.v { text-align: right; font-weight: 600; }
.card td.d { text-align: right; font-size: .82em; padding-left: 6px; width: 1%; }
.good { color: var(--good); } .bad { color: var(--bad); } .same { color: var(--muted); }
.charts { display: grid; gap: 16px;
          grid-template-columns: repeat(auto-fill, minmax(min(100%, 520px), 1fr)); }
figure { margin: 0; border: 1px solid var(--line); border-radius: 8px; padding: 6px; min-width: 0;
         background: #fff; }
figure img { display: block; width: 100%; height: auto; }
.tables { display: grid; gap: 16px 24px;
          grid-template-columns: repeat(auto-fill, minmax(min(100%, var(--col, 360px)), 1fr)); }
.wide { margin-top: 24px; }
.box { max-width: 100%; overflow-x: auto; border: 1px solid var(--line); border-radius: 8px; }
table.t { border-collapse: collapse; width: 100%; font-size: .93em; }
table.t th, table.t td { padding: 5px 10px; border-bottom: 1px solid var(--line); }
table.t tr:last-child td { border-bottom: 0; }
table.t th { background: var(--soft); text-align: right; font-weight: 600; }
table.t th.run { overflow-wrap: anywhere; min-width: 7em; }
table.t th:first-child, table.t td:first-child { text-align: left; }
table.t td { vertical-align: top; }
table.t td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.t td.key { overflow-wrap: anywhere; min-width: 8em; }
table.t td.key.url { overflow-wrap: normal; white-space: nowrap; }
table.t td.text { white-space: nowrap; }
table.t th.l { text-align: left; }
table.t tr.again td { border-top: 0; }
table.t tr:has(+ tr.again) td { border-bottom-color: transparent; }
table.t span.delta { display: block; font-size: .82em; line-height: 1.2; }
ul.notes { color: var(--muted); font-size: .88em; margin: 6px 0 0; padding-left: 1.2em; }
p.note { color: var(--muted); }
code { font-size: .92em; background: var(--soft); padding: 1px 4px; border-radius: 4px; }
"""


def render_html(report: Report) -> str:
    body = [
        "<h1>jsonlbatch report</h1>",
        f'<p class="sub">{_subtitle(report)}</p>',
        _glance(headline(report), many=len(report.runs) > 1),
        "<h2>Charts</h2>",
        _charts(report),
        "<h2>Details</h2>",
    ]
    tables = build_tables(report)
    small = [t for t in tables if len(t.header) <= 4]
    wide = [t for t in tables if len(t.header) > 4]
    if small:
        # A column per run, each with its change beside it: wider columns in a comparison, so
        # side-by-side tables never cut a run's column off (three across fit one run only).
        col = 360 if len(report.runs) == 1 else 280 + 200 * (len(report.runs) - 1)
        body.append(
            f'<div class="tables" style="--col: {col}px">'
            + "".join(_table(t) for t in small)
            + "</div>"
        )
    body += [f'<div class="wide">{_table(t)}</div>' for t in wide]
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(report.title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


def _subtitle(report: Report) -> str:
    runs = report.runs
    names = " vs ".join(f"<b>{escape(run.label)}</b>" for run in runs)
    parts = [names + (" (each against the first)" if len(runs) > 1 else "")]
    started = [run.start_time for run in runs if run.start_time is not None]
    if started:
        parts.append("started " + escape(utc_text(min(started)) or "") + " UTC")
    if report.sla:
        parts.append("SLA " + escape(", ".join(str(s) for s in report.sla)))
    return " · ".join(parts)


def _glance(table: Table, *, many: bool) -> str:
    cards = []
    for label, *cells in table.rows:
        head = f'<div class="label">{escape(str(label.value))}</div>'
        if not many:
            cell = cells[0]
            bad = " bad" if label.value == "requests failed" and cell.value else ""
            text = escape(format_value(cell.value, cell.kind))
            cards.append(f'<div class="card">{head}<div class="value{bad}">{text}</div></div>')
            continue
        rows = []
        for run, cell in zip(table.header[1:], cells, strict=True):
            delta = format_delta(cell)
            rows.append(
                f'<tr><td class="run" title="{escape(run)}">{escape(run)}</td>'
                f'<td class="v">{escape(format_value(cell.value, cell.kind))}</td>'
                f'<td class="d {_direction(cell)}">{escape(delta)}</td></tr>'
            )
        cards.append(f'<div class="card">{head}<table>{"".join(rows)}</table></div>')
    return f'<div class="glance{" many" if many else ""}">' + "".join(cards) + "</div>"


def _direction(cell: Cell) -> str:
    """`good`, `bad` or `same`: how the change reads, for the colour of its text."""
    value, base = cell.value, cell.base
    if not format_delta(cell) or cell.better is None:
        return "same"
    up = value > base
    return "good" if up == (cell.better == "higher") else "bad"


def _charts(report: Report) -> str:
    missing = charts_missing()
    if missing is not None:
        return f'<p class="note">{escape(missing)}.</p>'
    charts = draw_charts(report)
    if not charts:
        return '<p class="note">No timings to chart (no metrics in the lines).</p>'
    figures = []
    for chart in charts:
        data = base64.b64encode(chart.png).decode("ascii")
        figures.append(
            f'<figure><img src="data:image/png;base64,{data}" alt="{escape(chart.title)}" '
            f'title="{escape(chart.alt or chart.title)}"></figure>'
        )
    return '<div class="charts">' + "".join(figures) + "</div>"


def _table(table: Table) -> str:
    text = [bool(table.rows) and table.rows[0][i].kind == "text" for i in range(len(table.header))]
    # Run names (file names, often long) may break anywhere: a column is as wide as its
    # numbers, not as its name, so a comparison's tables fit side by side.
    head = "".join(
        f"<th class={'l' if left else 'run' if i else 'h'}>{escape(h)}</th>"
        for i, (h, left) in enumerate(zip(table.header, text, strict=True))
    )
    rows = []
    for n, row in enumerate(table.rows):
        # A metric's rows for later runs leave its name out: the runs read as one group.
        again = n > 0 and len(table.header) > 4 and row[0] == table.rows[n - 1][0]
        cells = ["<td></td>" if again else _cell(row[0], True)]
        cells += [_cell(cell, False) for cell in row[1:]]
        rows.append(f"<tr{' class=again' if again else ''}>" + "".join(cells) + "</tr>")
    notes = "".join(f"<li>{escape(note)}</li>" for note in table.notes)
    return (
        f"<section><h3>{escape(table.title)}</h3>"
        f'<div class="box"><table class="t"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
        + (f'<ul class="notes">{notes}</ul>' if notes else "")
        + "</section>"
    )


def _cell(cell: Cell, first: bool) -> str:
    text = escape(format_value(cell.value, cell.kind))
    if first:  # an address (--by endpoint) breaks nowhere: its box scrolls instead
        url = " url" if "://" in text else ""
        return f'<td class="key{url}">{text}</td>'
    if cell.kind == "text":
        return f'<td class="text">{text}</td>'
    delta = format_delta(cell)
    extra = f'<span class="delta">{escape(delta)}</span>' if delta else ""
    return f'<td class="num">{text}{extra}</td>'

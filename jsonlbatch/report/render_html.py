"""The report as one self-contained HTML page: inline CSS, charts as PNG `data:` URIs.

Nothing on the page refers to the network, so it opens anywhere (an air-gapped cluster, an
attachment); without matplotlib the page is still written, with the tables, and says why the
charts are missing.
"""

from __future__ import annotations

import base64
from html import escape

from jsonlbatch.report.charts import INSTALL_HINT, charts_available, draw_charts
from jsonlbatch.report.model import Report
from jsonlbatch.report.tables import Cell, Table, build_tables, format_delta, format_value

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto;
       max-width: 1200px; padding: 0 1em; color: #1f2328; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.8em; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { padding: .25em .7em; border-bottom: 1px solid #d0d7de; white-space: nowrap; }
th { background: #f6f8fa; text-align: right; } th:first-child { text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
span.delta { color: #57606a; font-size: .9em; }
p.note, li { color: #57606a; } ul.notes { margin: .3em 0; padding-left: 1.2em; }
figure { margin: 1em 0; } img { max-width: 100%; }
"""


def render_html(report: Report) -> str:
    title = escape(report.title)
    body = [f"<h1>{title}</h1>"]
    body += [_table(table) for table in build_tables(report)]
    body.append("<h2>Charts</h2>")
    if not charts_available():
        body.append(
            f'<p class="note">Charts need matplotlib, which is not installed: '
            f"<code>{escape(INSTALL_HINT)}</code>.</p>"
        )
    else:
        charts = draw_charts(report)
        if not charts:
            body.append('<p class="note">No timings to chart (no metrics in the lines).</p>')
        for chart in charts:
            data = base64.b64encode(chart.png).decode("ascii")
            body.append(
                f'<figure><img src="data:image/png;base64,{data}" alt="{escape(chart.title)}">'
                f"<figcaption>{escape(chart.title)}</figcaption></figure>"
            )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{title}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


def _table(table: Table) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in table.header)
    rows = "".join(
        "<tr>" + "".join(_cell(cell, i == 0) for i, cell in enumerate(row)) + "</tr>"
        for row in table.rows
    )
    notes = "".join(f"<li>{escape(note)}</li>" for note in table.notes)
    return (
        f"<h2>{escape(table.title)}</h2>\n<table><thead><tr>{head}</tr></thead>"
        f"<tbody>{rows}</tbody></table>" + (f'<ul class="notes">{notes}</ul>' if notes else "")
    )


def _cell(cell: Cell, first: bool) -> str:
    text = escape(format_value(cell.value, cell.kind))
    if first or cell.kind == "text":
        return f"<td>{text}</td>"
    delta = format_delta(cell)
    extra = f' <span class="delta">({escape(delta)})</span>' if delta else ""
    return f'<td class="num">{text}{extra}</td>'

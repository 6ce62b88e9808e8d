"""The report as Markdown: pipe tables that read well in a terminal and render on GitHub."""

from __future__ import annotations

from jsonlbatch.report.model import Report
from jsonlbatch.report.tables import Table, build_tables, format_cell, headline


def render_markdown(report: Report) -> str:
    parts = [f"# {_escape(report.title)}", ""]
    for table in [headline(report), *build_tables(report)]:
        parts += [*_table(table), ""]
    return "\n".join(parts)


def _table(table: Table) -> list[str]:
    out = [f"## {_escape(table.title)}", ""]
    out.append("| " + " | ".join(_escape(h) for h in table.header) + " |")
    out.append("|" + "|".join([":---"] + ["---:"] * (len(table.header) - 1)) + "|")
    for row in table.rows:
        out.append("| " + " | ".join(_escape(format_cell(c)) for c in row) + " |")
    if table.notes:
        out.append("")
        out += [f"- {note}" for note in table.notes]
    return out


def _escape(text: str) -> str:
    return text.replace("|", "\\|")

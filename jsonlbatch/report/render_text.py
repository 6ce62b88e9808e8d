"""The report as a terminal table: what `jsonlbatch report` prints without `-o`."""

from __future__ import annotations

from jsonlbatch.report.model import Report
from jsonlbatch.report.tables import Table, build_tables, format_cell, headline


def render_text(report: Report) -> str:
    parts = [report.title, ""]
    for table in [headline(report), *build_tables(report)]:
        parts += [*_table(table), ""]
    return "\n".join(parts)


def _table(table: Table) -> list[str]:
    grid = [table.header] + [[format_cell(c) for c in row] for row in table.rows]
    widths = [max(len(row[i]) for row in grid) for i in range(len(table.header))]

    def line(row: list[str]) -> str:
        first = row[0].ljust(widths[0])
        rest = (text.rjust(width) for text, width in zip(row[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    out = [table.title, "-" * len(table.title), line(grid[0])]
    out += [line(row) for row in grid[1:]]
    out += [f"  * {note}" for note in table.notes]
    return out

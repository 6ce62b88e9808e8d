"""How a run's results print for a person: one line for `repr`, a small table for a notebook.

`RunSummary`, `Answer` and `Results` are what `execute` hands back; in a REPL or a notebook they
are printed as they are, so their `__repr__` says in one line what matters (counts, the first
words of an answer, the failure's code) and their `_repr_html_` a few rows of a table, built
with these helpers. Texts are cut to a few dozen characters and escaped; the whole body stays on
the object (`answer.body`).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any

TEXT_CHARS = 60  # of an answer's text, in a repr
CELL_CHARS = 120  # of a text in a table cell
HTML_ROWS = 10  # answers shown by Results' table
COUNT_UP_TO = 64 << 20  # a results file this big or smaller is counted for its repr


def cut(text: Any, limit: int) -> str:
    """`text` on one line, at most `limit` characters (an ellipsis where it was cut)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def table(rows: Iterable[Sequence[Any]], header: Sequence[str] | None = None) -> str:
    """A small HTML table, every cell escaped."""
    out = ["<table>"]
    if header is not None:
        out.append("<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>")
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>")
    out.append("</table>")
    return "".join(out)

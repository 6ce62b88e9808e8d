"""The report of one or more runs, and its rendering to a file or a string.

`build_report` is the library entry point of `jsonlbatch report`: it loads each response file
(streaming, compactly), computes its stats, and keeps the compact columns for the charts.
Several files make a comparison, the first being the baseline the others are measured against.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from jsonlbatch.errors import OutputError, UsageError
from jsonlbatch.file_io.output_guard import check_output
from jsonlbatch.redact import redact
from jsonlbatch.report.load import load_request_fields, load_run, request_fields_for
from jsonlbatch.report.model import Report
from jsonlbatch.report.options import Price, Sla
from jsonlbatch.report.render_html import render_html
from jsonlbatch.report.render_json import render_json
from jsonlbatch.report.render_md import render_markdown
from jsonlbatch.report.render_text import render_text
from jsonlbatch.report.run_stats import summarize
from jsonlbatch.report.servers import load_servers

FORMATS = ("text", "md", "json", "html")
_SUFFIXES = {".txt": "text", ".md": "md", ".markdown": "md", ".json": "json", ".html": "html"}
_SUFFIXES[".htm"] = "html"


def build_report(
    paths: Sequence[str],
    *,
    sla: Sequence[Sla] = (),
    by: Sequence[str] = (),
    requests: Sequence[str] = (),
    price: Price | None = None,
    labels: Sequence[str] | None = None,
) -> Report:
    """Load and summarize each response file; `requests` files supply `--by` request fields;
    `labels` name the runs (default: their file names)."""
    if not paths:
        raise UsageError("give at least one response file")
    if labels is not None and len(labels) != len(paths):
        raise UsageError(f"give one label per response file ({len(paths)}), got {len(labels)}")
    fields = request_fields_for(by) if requests else []
    index = load_request_fields(requests, fields) if fields else None
    data = [
        load_run(path, by=by, requests=index, request_fields=fields, label=label)
        for path, label in zip(paths, labels or _labels(paths), strict=True)
    ]
    runs = [summarize(d, sla=sla, price=price) for d in data]
    servers = [load_servers(path) for path in paths]
    report = Report(runs, data, list(sla), price, list(by), servers)
    report.sources = [*paths, *requests]
    return report


def format_for(path: str | None, fmt: str | None) -> str:
    """The output format: the one asked for, else the file's suffix, else the terminal table."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise UsageError(f"unknown report format {fmt!r} (known: {', '.join(FORMATS)})")
        return fmt
    if path is None:
        return "text"
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in _SUFFIXES:
        raise UsageError(
            f"cannot tell the report format from {path!r}: name it .html, .md, .json or .txt, "
            "or pass --format"
        )
    return _SUFFIXES[suffix]


def render(report: Report, fmt: str = "text") -> str:
    """The report as text in one of `FORMATS`, masked (`redact`): response files may hold
    what a server echoed (error codes, endpoint URLs with their query)."""
    renderers = {
        "text": render_text,
        "md": render_markdown,
        "json": render_json,
        "html": render_html,
    }
    return redact(renderers[format_for(None, fmt)](report))


def write_report(report: Report, path: str, fmt: str | None = None) -> str:
    """Write the report to `path` (format from `fmt` or the suffix); return the format used."""
    fmt = format_for(path, fmt)
    check_output(path, report.sources)
    text = render(report, fmt)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror}") from None
    return fmt


def _labels(paths: Sequence[str]) -> list[str]:
    """Short names for the runs: file names, or the paths as given where names repeat."""
    names = [os.path.basename(p) or p for p in paths]
    return names if len(set(names)) == len(names) else list(paths)

"""`jsonlbatch report`: what a batch run did and how fast, from its response file(s).

from jsonlbatch.report import build_report, parse_sla, write_report
report = build_report(["responses.jsonl"], sla=parse_sla(["ttft=2s", "e2e=5s"]))
print(report.runs[0].latency["e2e"].p90)
write_report(report, "report.html")
"""

from __future__ import annotations

from jsonlbatch.report.build import FORMATS, build_report, format_for, render, write_report
from jsonlbatch.report.load import RunData, load_request_fields, load_run
from jsonlbatch.report.model import Report
from jsonlbatch.report.options import Price, Sla, parse_duration, parse_price, parse_sla
from jsonlbatch.report.run_stats import (
    Cost,
    Distribution,
    RunStats,
    SlaResult,
    describe,
    percentile,
    summarize,
)

__all__ = [
    "FORMATS",
    "Cost",
    "Distribution",
    "Price",
    "Report",
    "RunData",
    "RunStats",
    "Sla",
    "SlaResult",
    "build_report",
    "describe",
    "format_for",
    "load_request_fields",
    "load_run",
    "parse_duration",
    "parse_price",
    "parse_sla",
    "percentile",
    "render",
    "summarize",
    "write_report",
]

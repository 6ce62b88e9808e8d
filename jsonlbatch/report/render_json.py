"""The report as JSON, for scripts and dashboards: every number, raw (seconds, dollars, shares
as fractions), and in a comparison the change of each number against the baseline run."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from jsonlbatch.report.model import Report
from jsonlbatch.report.run_stats import RunStats
from jsonlbatch.report.tables import NOTE_FAILED, NOTE_PERCENTILES

SCHEMA_VERSION = 1


def report_dict(report: Report) -> dict[str, Any]:
    """The report as plain data (what `render_json` encodes)."""
    runs = [_run(run) for run in report.runs]
    out: dict[str, Any] = {
        "version": SCHEMA_VERSION,
        "notes": [NOTE_FAILED, NOTE_PERCENTILES],
        "sla": [dataclasses.asdict(s) for s in report.sla],
        "price_per_million": dataclasses.asdict(report.price) if report.price else None,
        "by": report.by,
        "runs": runs,
    }
    if any(report.servers):
        out["servers"] = {
            run["label"]: [
                dataclasses.asdict(fig) | {"prefix_cache_hit_rate": fig.prefix_cache_hit_rate}
                for fig in figures
            ]
            for run, figures in zip(runs, report.servers, strict=True)
        }
    if len(runs) > 1:
        base = _numbers(runs[0])
        out["comparison"] = {
            "baseline": runs[0]["label"],
            "runs": [
                {"label": run["label"], "changes": _changes(base, _numbers(run))}
                for run in runs[1:]
            ],
        }
    return out


def render_json(report: Report) -> str:
    return orjson.dumps(report_dict(report), option=orjson.OPT_INDENT_2).decode() + "\n"


def _run(run: RunStats) -> dict[str, Any]:
    out = dataclasses.asdict(dataclasses.replace(run, breakdown={}))  # rebuilt below
    out["truncated_share"] = run.truncated_share
    out["turns"] = {str(k): n for k, n in run.turns.items()}  # JSON keys are text
    out["conversations"] = run.conversations
    out["breakdown"] = {
        key: {value: _run(group) for value, group in groups.items()}
        for key, groups in run.breakdown.items()
    }
    return out


def _numbers(run: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Dotted path -> number, for every numeric leaf outside the breakdown."""
    out: dict[str, float] = {}
    for key, value in run.items():
        if key == "breakdown":
            continue
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_numbers(value, path + "."))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    out.update(_numbers(item, f"{path}.{i}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[path] = value
    return out


def _changes(base: dict[str, float], run: dict[str, float]) -> dict[str, dict[str, Any]]:
    out = {}
    for path, value in run.items():
        if path not in base or path in ("start_time", "end_time"):
            continue
        before = base[path]
        out[path] = {
            "baseline": before,
            "value": value,
            "change": value - before,
            "relative": (value - before) / abs(before) if before else None,
        }
    return out

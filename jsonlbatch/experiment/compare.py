"""The one report at the end of an experiment: the conditions side by side.

Quality comes from what the steps recorded (`steps.json`: judge pass rates and rounds, vote
accuracy); volume and speed come from `jsonlbatch.report` over each condition's response file,
labelled by condition, so the numbers are the same ones `jsonlbatch report` prints.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from jsonlbatch.experiment.spec import Experiment
from jsonlbatch.experiment.state import StepState
from jsonlbatch.file_io.jsonl import rewrite_atomically
from jsonlbatch.report import build_report, render, write_report

_WHERE_KEYS = ("url", "serve", "api_key_env")


@dataclass
class Comparison:
    paths: list[str]  # the report files written
    table: str  # the conditions side by side (Markdown), as the report opens with


def write_comparison(
    exp: Experiment, root: str, compared: Sequence[str], *, formats: Sequence[str] = ("md", "json")
) -> Comparison:
    """Write `report.<fmt>` under `root` for each format."""
    rows = {name: _condition(exp, root, name) for name in compared}
    responses = [os.path.join(root, n, "responses.jsonl") for n in compared]
    have = [(n, p) for n, p in zip(compared, responses, strict=True) if os.path.isfile(p)]
    exec_report = build_report([p for _, p in have], labels=[n for n, _ in have]) if have else None
    if exec_report is not None:
        for run in exec_report.runs:
            rows[run.label] |= {
                "requests": run.lines,
                "failed": run.failed,
                "prompt_tokens": run.prompt_tokens,
                "completion_tokens": run.completion_tokens,
                "truncated": run.truncated,
                "container_files": run.files,  # exec's files_dir: deliverables collected
            }
    written = []
    for fmt in formats:
        path = os.path.join(root, f"report.{fmt if fmt != 'text' else 'txt'}")
        if fmt == "json":
            text = orjson.dumps(
                {"experiment": exp.id, "conditions": rows}, option=orjson.OPT_INDENT_2
            ).decode()
        elif fmt == "html":
            if exec_report is None:
                continue
            write_report(exec_report, path, "html")
            written.append(path)
            continue
        else:
            text = _markdown(exp, rows, exec_report, fmt)
        rewrite_atomically(path, [text.encode() + b"\n"])
        written.append(path)
    return Comparison(written, "\n".join(_table(rows)))


def _condition(exp: Experiment, root: str, name: str) -> dict[str, Any]:
    settings = next(c.settings for c in exp.conditions if c.name == name)
    state = StepState(os.path.join(root, name))
    row: dict[str, Any] = {
        "settings": {k: v for k, v in settings.items() if k not in _WHERE_KEYS},
    }
    for step in ("gen", "exec", "judge", "post.votes", "post.files", "post.patches"):
        summary = state.summary(step)
        if summary is not None:
            row[step] = summary
    return row


def _markdown(exp: Experiment, rows: dict[str, dict[str, Any]], exec_report: Any, fmt: str) -> str:
    lines = [f"# Experiment {exp.id}", "", f"Conditions compared: {', '.join(rows)}.", ""]
    lines += _table(rows)
    if exec_report is not None and fmt == "md":
        rendered = render(exec_report, "md").splitlines()
        demoted = ["#" + x if x.startswith("#") else x for x in rendered]  # under our title
        lines += ["", "Requests, tokens and latency of the first-round answers", "", *demoted]
    elif exec_report is not None:
        lines += ["", render(exec_report, "text")]
    return "\n".join(lines)


def _table(rows: dict[str, dict[str, Any]]) -> list[str]:
    """One line per condition: the settings that differ, volume, judge and post outcomes."""
    names = list(rows)
    varying = _varying([rows[n]["settings"] for n in names])
    head = ["condition", *varying, "requests", "failed", "completion tokens (round 1)"]
    judged = any("judge" in rows[n] for n in names)
    voted = any(rows[n].get("post.votes", {}).get("accuracy") for n in names)
    filed = any("post.files" in rows[n] for n in names)
    patched = any("post.patches" in rows[n] for n in names)
    collected = any(rows[n].get("container_files") for n in names)
    if judged:
        head += ["judge passed", "by round", "mean rounds"]
    if voted:
        head += ["maj@1", "pass@k", "k"]
    if filed:
        head += ["files written"]
    if patched:
        head += ["instances with a patch"]
    if collected:
        head += ["files collected"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name in names:
        row = rows[name]
        cells = [name, *(_cell(row["settings"].get(k)) for k in varying)]
        cells += [_cell(row.get("requests")), _cell(row.get("failed"))]
        cells.append(_cell(row.get("completion_tokens")))
        if judged:
            j = row.get("judge")
            cells += (
                [
                    f"{j['passed']}/{j['items']} ({_pct(j['passed'], j['items'])})",
                    " + ".join(str(x) for x in j["passed_by_round"]),
                    f"{j['mean_rounds']:.2f}",
                ]
                if j
                else ["-"] * 3
            )
        if voted:
            acc = row.get("post.votes", {}).get("accuracy") or []
            cells += (
                [f"{acc[0]['maj']:.3f}", f"{acc[-1]['pass']:.3f}", str(acc[-1]["k"])]
                if acc
                else ["-"] * 3
            )
        if filed:
            f = row.get("post.files")
            cells.append(f"{f['written']} from {f['samples']} samples" if f else "-")
        if patched:
            p = row.get("post.patches")
            cells.append(f"{p['predictions']}/{p['instances']}" if p else "-")
        if collected:
            cells.append(_cell(row.get("container_files")))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _varying(settings: list[dict[str, Any]]) -> list[str]:
    """The setting keys whose values differ between conditions (all of them for one)."""
    keys = list(dict.fromkeys(k for s in settings for k in s))
    if len(settings) < 2:
        return keys
    return [k for k in keys if len({orjson.dumps(s.get(k)) for s in settings}) > 1]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return (
        repr(text) if isinstance(value, str) and text != text.strip() else text.replace("|", "\\|")
    )


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.0f}%" if b else "-"

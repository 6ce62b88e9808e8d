"""The parts of an experiment's `post` step, each a call into `jsonlbatch.post`, and `export`.

Each part is its own step in `steps.json` (`post.votes`, `post.files`, `post.patches`), so a
changed vote setting does not extract the deliverable files again. A part returns what it wrote
and a summary for the comparison report.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from jsonlbatch.post.export import export
from jsonlbatch.post.files import MANIFEST, Limits, extract_files
from jsonlbatch.post.patches import instance_sources, run_patches
from jsonlbatch.post.sandbox import RunLimits
from jsonlbatch.post.votes import run_votes
from jsonlbatch.stats import plural

_MB = 1 << 20


@dataclass(frozen=True)
class Part:
    """One kind of post-processing: its output (a file or folder in the condition's folder),
    the settings naming input files (hashed by content), and the function that runs it."""

    output: str
    input_files: tuple[str, ...]
    run: Callable[[str, str, Mapping[str, Any]], dict[str, Any]]


def _votes(source: str, out: str, s: Mapping[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {"gold": s.get("gold")}
    if s.get("extract"):
        options["extractors"] = [s["extract"]] if isinstance(s["extract"], str) else s["extract"]
    for key in ("normalize", "tie_break"):
        if s.get(key):
            options[key] = s[key]
    summary = run_votes(source, out, **options)
    accuracy = [{"k": a.k, "maj": a.maj, "pass": a.pass_, "mean": a.mean} for a in summary.accuracy]
    return {
        "groups": summary.groups,
        "samples": summary.samples,
        "scored": summary.scored,
        "accuracy": accuracy,
    }


def _files(source: str, out: str, s: Mapping[str, Any]) -> dict[str, Any]:
    max_files = s.get("max_files", 100)
    limits = Limits(
        int(s.get("max_file_mb", 10.0) * _MB), max_files, int(s.get("max_total_mb", 50.0) * _MB)
    )
    summary = extract_files(
        source,
        out,
        limits=limits,
        run=s.get("run", False),
        run_limits=RunLimits(
            timeout=s.get("timeout", 60.0),
            memory_bytes=s.get("memory_mb", 4096) * _MB,
            file_bytes=limits.max_file_bytes,
            max_files=max_files,
            max_total_bytes=limits.max_total_bytes,
        ),
        script=s.get("script"),
        use_truncated=s.get("use_truncated", False),
    )
    return {"samples": summary.samples, "written": summary.written, "runs": summary.runs}


def _patches(source: str, out: str, s: Mapping[str, Any]) -> dict[str, Any]:
    prefixes = s.get("strip_prefix") or ()
    summary = run_patches(
        source,
        out,
        instance_sources(
            s.get("repo_root"), s.get("repo", "{{ instance_id }}"), s.get("files_json")
        ),
        model_name=s.get("model_name"),
        vote=s.get("vote", False),
        strip_prefixes=[prefixes] if isinstance(prefixes, str) else list(prefixes),
        partial=s.get("partial", False),
        use_truncated=s.get("use_truncated", False),
    )
    return {
        "instances": summary.instances,
        "samples": summary.samples,
        "usable": summary.usable,
        "predictions": summary.predictions,
    }


#: The parts in the order they run, by their key under `post:`.
PARTS: dict[str, Part] = {
    "votes": Part("votes.jsonl", ("gold",), _votes),
    "files": Part("files", (), _files),
    "patches": Part("predictions.jsonl", ("files_json",), _patches),
}


_SINGULAR = {"groups": "group", "samples": "sample", "runs": "run", "instances": "instance",
             "predictions": "prediction", "rows": "row"}  # fmt: skip


def describe(summary: Mapping[str, Any]) -> str:
    """A part's summary as a line for people (`5 groups, 5 samples, maj@1 0.800, ...`), not
    the dict it is kept as in `steps.json`."""
    parts = []
    for key, value in summary.items():
        if isinstance(value, int) and not isinstance(value, bool):
            one = _SINGULAR.get(key)
            parts.append(plural(value, one, key) if one else f"{value:,} {key}")
        elif key == "accuracy" and isinstance(value, list):
            for a in value:
                parts.append(f"maj@{a['k']} {a['maj']:.3f}, pass@{a['k']} {a['pass']:.3f}")
    return ", ".join(parts)


def input_files(part: Part, settings: Mapping[str, Any]) -> list[str | None]:
    """The files a part reads besides the responses (for its hash); a templated path is
    hashed as text (its files are found per instance at run time)."""
    out: list[str | None] = []
    for key in part.input_files:
        value = settings.get(key)
        out.append(value if isinstance(value, str) and os.path.isfile(value) else None)
    return out


def export_results(
    source: str, out: str, requests: str, folder: str, s: Mapping[str, Any]
) -> dict[str, Any]:
    """`jsonlbatch export` of the condition's answers, joined with whatever post wrote in
    `folder` (votes, patches, files)."""
    joins = {
        "votes": os.path.join(folder, PARTS["votes"].output),
        "patches": os.path.join(folder, PARTS["patches"].output),
        "files": os.path.join(folder, PARTS["files"].output),
    }
    given: dict[str, Any] = {k: v for k, v in joins.items() if os.path.exists(v)}
    columns = s.get("columns") or ()
    summary = export(
        source,
        out,
        requests=requests,
        per=s.get("per", "request"),
        columns=[columns] if isinstance(columns, str) else list(columns),
        into=s.get("into"),
        on=s.get("on"),
        fmt=s.get("format", "jsonl"),
        **given,
    )
    return {"rows": summary.rows, "format": summary.format, "missing": summary.missing}


def export_inputs(folder: str, requests: str) -> list[str | None]:
    """The files an export reads besides the answers, for the hash computed before it runs."""
    return [
        requests,
        os.path.join(folder, PARTS["votes"].output),
        os.path.join(folder, PARTS["patches"].output),
        os.path.join(folder, PARTS["files"].output, MANIFEST),
    ]

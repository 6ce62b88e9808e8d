"""`jsonlbatch export`: results as a table for dataset tools (Parquet, CSV, JSONL).

One row per request (or per choice): ids, group and sample, model, status and error, answer and
reasoning, finish reason, tokens, latency and TTFT; joined, when given, with what the other
post-processors wrote (votes per group, patches per group or per sample, deliverable files per
sample). `into` adds the columns to an existing dataset table instead, keeping every one of its
rows and columns (the step that fills `deliverable_text` and `deliverable_files` into a dataset
before upload).

Responses are streamed and written in row groups, so a million-line file exports in bounded
memory; the post outputs given for joining and the result columns of an `into` join are held in
memory (they are per group, or what the dataset needs).

A picture or file an answer carries as a base64 `data:` URL is exported as a short placeholder
(type, size, SHA-256 prefix: `media_placeholders.py`), never as its base64; the rows of an
`into` dataset are the user's own and are kept as they are.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from jsonlbatch.batch_format.answers import number as json_number
from jsonlbatch.batch_format.idset import IdSet
from jsonlbatch.batch_format.samples import load_line
from jsonlbatch.errors import InputError, Problem, UsageError
from jsonlbatch.extras import require
from jsonlbatch.file_io.jsonl import iter_lines
from jsonlbatch.file_io.output_guard import check_output
from jsonlbatch.post.fields import FieldColumns, field_columns
from jsonlbatch.post.files import MANIFEST, sample_dir
from jsonlbatch.post.media_placeholders import row_without_base64
from jsonlbatch.post.responses import KeyFunc, Sample, check_responses, read_responses, split_key
from jsonlbatch.post.table_io import TableWriter, open_table, table_format

PER = ("request", "choice")
_SAMPLE = re.compile(r"^[^0-9]+([0-9]+)$")  # the separator, then ASCII digits only
#: The result columns and their types, in order (`list` is a list of strings).
COLUMNS: dict[str, type] = {
    "custom_id": str,
    "group": str,
    "sample": int,
    "choice": int,
    "choices": int,
    "model": str,
    "status": str,
    "error": str,
    "answer": str,
    "reasoning": str,
    "finish_reason": str,
    "tool_calls": str,
    "prompt_tokens": int,
    "completion_tokens": int,
    "latency_s": float,
    "ttft_s": float,
}
#: Columns of answers without text, added when a response file holds such answers.
KIND_COLUMNS: dict[str, dict[str, type]] = {
    "embedding": {"dimensions": int},
    "moderation": {"flagged": bool, "categories": list},
    # what `exec --files-dir` collected (metrics.files): DIR-relative paths, and their bytes
    "container_files": {"container_files": list, "container_file_bytes": int},
}
#: What marks each kind's answers in a line's bytes (a cheap search, not a parse): a key of the
#: response body that an answer's own JSON is unlikely to have (`flagged` alone is a plausible
#: field of a user's schema, recorded in `metrics.contract`).
_KIND_MARKS = {"embedding": b'"embedding"', "moderation": b'"category_scores"',
               "container_files": b'"files":[{"name"'}  # fmt: skip
VOTE_COLUMNS: dict[str, type] = {"voted_answer": str, "gold": str, "correct": bool}
PATCH_COLUMNS: dict[str, type] = {"patch": str, "patch_status": str}
FILE_COLUMNS: dict[str, type] = {"files": list}


@dataclass
class ExportSummary:
    path: str
    format: str
    rows: int = 0
    missing: int = 0  # requests without a response line (with `requests`)
    repeated: int = 0  # custom_ids with more than one response line (each exported)
    base_rows: int = 0  # with `into`
    unmatched: int = 0  # dataset rows that got no result
    replaced_columns: list[str] = field(default_factory=list)
    clashes: list[str] = field(default_factory=list)  # schema fields named like result columns

    def lines(self) -> list[str]:
        head = f"export: {self.rows} rows -> {self.path} ({self.format})"
        out = [head]
        if self.base_rows:
            out.append(
                f"  {self.base_rows} dataset rows, {self.unmatched} without a result "
                "(kept, with empty result columns)"
            )
        out += [f"  {clash}" for clash in self.clashes]
        if self.replaced_columns:
            out.append(f"  replaced dataset columns: {', '.join(self.replaced_columns)}")
        if self.missing:
            out.append(f"  {self.missing} requests have no response line (status 'missing')")
        if self.repeated:
            out.append(f"  {self.repeated} custom_ids have several response lines (each exported)")
        return out


def sample_number(custom_id: str, group: str) -> int | None:
    """The sample index after the group's separator (`task|3` -> 3), when it is a number."""
    found = _SAMPLE.match(custom_id[len(group) :]) if custom_id.startswith(group) else None
    return int(found[1]) if found else None


def export(
    responses: str | Sequence[str],
    out: str,
    *,
    requests: str | None = None,
    per: str = "request",
    votes: str | None = None,
    patches: str | None = None,
    files: str | None = None,
    into: str | None = None,
    on: str | None = None,
    columns: Sequence[str] = (),
    key: KeyFunc | None = None,
    fmt: str | None = None,
    csv_escape: bool = True,
    fields: Sequence[str] | None = None,
) -> ExportSummary:
    """Write the result table to `out` (format from `fmt` or the suffix); see the module doc.

    `columns` picks and renames result columns (`NAME` or `NEW=NAME`); by default all.
    `csv_escape`: CSV text cells that a spreadsheet would run as a formula start with `'`.
    `fields` picks the top-level fields of answers under a schema as typed columns (`NAME` or
    `COLUMN=NAME`; `post/fields.py`); by default every field of the recorded schemas.
    """
    if per not in PER:
        raise UsageError(f"--per must be one of {', '.join(PER)}, not {per!r}")
    if (into is None) != (on is None):
        raise UsageError("--into and --on go together: the dataset table and its key column")
    fmt = table_format(out, fmt)
    if fmt == "parquet" or into is not None:  # a dataset table is read with pyarrow too
        what = "export to Parquet" if into is None else "export --into (reading the dataset table)"
        require("pyarrow.parquet", extra="parquet", for_what=what)
    paths = [responses] if isinstance(responses, str) else list(responses)
    check_output(out, [*paths, requests, votes, patches, files, into])
    check_responses(paths)  # bad input stops before anything is written
    joins = _Joins.load(votes, patches, files)
    kinds = _kind_columns(paths)
    joins.fields = field_columns(paths, fields, joins.columns() | kinds)
    available = joins.columns() | kinds
    chosen = _choose_columns(available, columns)
    key = key or split_key()
    summary = ExportSummary(out, fmt, clashes=joins.fields.clashes)
    rows = _rows(paths, requests, per, key, joins, summary)
    types = {new: available[old] for new, old in chosen.items()}
    if into is None:
        with TableWriter(out, fmt, dict(types), csv_escape=csv_escape) as writer:
            for row in rows:
                writer.write(_pick(row, chosen))
        summary.rows = writer.rows
        return summary
    assert on is not None
    _join_into(into, on, out, fmt, rows, chosen, types, summary, csv_escape)
    return summary


def _kind_columns(paths: Sequence[str]) -> dict[str, type]:
    """The columns of the answer kinds without text (embeddings, moderations) that the files
    hold: chat exports keep their columns, and an embeddings export gets its own."""
    found: dict[str, type] = {}
    left = dict(_KIND_MARKS)
    for path in paths:
        for _, raw in iter_lines(path):
            for kind, mark in list(left.items()):
                if mark in raw:
                    found |= KIND_COLUMNS[kind]
                    del left[kind]
            if not left:
                return found
    return found


def _pick(row: dict[str, Any], chosen: dict[str, str]) -> dict[str, Any]:
    return {new: row.get(old) for new, old in chosen.items()}


def _choose_columns(available: dict[str, type], specs: Sequence[str]) -> dict[str, str]:
    if not specs:
        return {name: name for name in available}
    chosen: dict[str, str] = {}
    for spec in specs:
        new, _, old = spec.partition("=")
        old = old or new
        if old not in available:
            raise UsageError(
                f"--column {spec!r}: no result column {old!r} (known: {', '.join(available)})"
            )
        chosen[new] = old
    return chosen


@dataclass
class _Joins:
    """What the other post-processors wrote, indexed for the rows."""

    votes: dict[str, dict[str, Any]] | None = None  # group -> vote line
    group_patches: dict[str, str] | None = None  # instance_id -> model_patch
    sample_patches: dict[tuple[str, int], tuple[str, str]] | None = None  # -> (patch, status)
    files: dict[tuple[str, int], list[str]] | None = None  # (custom_id, choice) -> paths
    fields: FieldColumns | None = None  # typed columns from answers under a schema

    @classmethod
    def load(cls, votes: str | None, patches: str | None, files: str | None) -> _Joins:
        joins = cls()
        if votes:
            joins.votes = {line["id"]: line for line in _lines(votes, ("id", "answer"))}
        if patches:
            joins._load_patches(patches)
        if files:
            joins.files = {}
            for line in _lines(files, ("id", "path", "status")):
                if line["status"] == "written":
                    choice = line.get("choice")
                    if not isinstance(choice, int):
                        choice = 0
                    joins.files.setdefault((line["id"], choice), []).append(line["path"])
        return joins

    def _load_patches(self, path: str) -> None:
        lines = list(_lines(path, ()))
        if all("instance_id" in x and "model_patch" in x and "custom_id" not in x for x in lines):
            self.group_patches = {x["instance_id"]: x["model_patch"] or "" for x in lines}
        elif all("custom_id" in x and "patch" in x for x in lines):
            self.sample_patches = {
                (x["custom_id"], x.get("index") or 0): (x["patch"], x.get("status", ""))
                for x in lines
            }
        else:
            raise InputError(
                f"{path}: neither SWE-bench predictions (instance_id, model_patch) nor "
                "post patches --samples-out lines (custom_id, patch)"
            )

    def columns(self) -> dict[str, type]:
        found = dict(COLUMNS)
        if self.votes is not None:
            found |= VOTE_COLUMNS
        if self.group_patches is not None or self.sample_patches is not None:
            found |= PATCH_COLUMNS
        if self.files is not None:
            found |= FILE_COLUMNS
        if self.fields is not None:
            found |= self.fields.types
        return found

    def add(self, row: dict[str, Any], samples: Sequence[Sample]) -> None:
        group = row["group"]
        if self.fields is not None and self.fields.columns:
            row.update(self.fields.values(samples[0]))
        if self.votes is not None and group in self.votes:
            vote = self.votes[group]
            row.update(
                voted_answer=vote["answer"], gold=vote.get("gold"), correct=vote.get("correct")
            )
        if self.group_patches is not None and group in self.group_patches:
            row["patch"] = self.group_patches[group]
        if self.sample_patches is not None and samples:
            found = self.sample_patches.get((samples[0].custom_id, samples[0].index))
            if found:
                row["patch"], row["patch_status"] = found
        if self.files is not None:
            paths = [
                f"{sample_dir(s)}/{p}"
                for s in samples
                for p in self.files.get((s.custom_id, s.index), ())
            ]
            row["files"] = paths


def _lines(path: str, required: Sequence[str]) -> Iterator[dict[str, Any]]:
    if os.path.isdir(path):  # a post files output folder: its manifest
        path = os.path.join(path, MANIFEST)
    problems: list[Problem] = []
    for number, raw in iter_lines(path):
        try:
            obj = load_line(raw)
        except orjson.JSONDecodeError as exc:
            problems.append(Problem.bad_json(path, number, exc))
            continue
        missing = [k for k in required if not isinstance(obj, dict) or k not in obj]
        if missing:
            problems.append(Problem(path, number, missing[0], "missing"))
            continue
        yield obj
    if problems:
        raise InputError(f"{path}: not a file this option reads", problems)


def _row(samples: list[Sample], key: KeyFunc, per: str) -> dict[str, Any]:
    first = samples[0]
    group = key(first.custom_id)
    usage = first.usage or {}
    metrics = first.metrics or {}
    details = first.details or {}
    row: dict[str, Any] = {
        "custom_id": first.custom_id,
        "group": group,
        "sample": sample_number(first.custom_id, group),
        "choice": first.index if per == "choice" else None,
        # a failure that kept its answer (`schema_invalid`) still has its model and text
        "choices": first.choices if not first.failed or first.text else 0,
        "model": first.model,
        "status": "failed" if first.failed else "ok",
        "error": first.error,
        "answer": None
        if (first.failed and not first.text) or "dimensions" in details
        else first.text,
        "reasoning": first.reasoning or None,
        "finish_reason": first.finish_reason,
        "tool_calls": tool_calls_text(first.tool_calls),
        "prompt_tokens": _number(usage.get("prompt_tokens"), int),
        "completion_tokens": _number(usage.get("completion_tokens"), int),
        "latency_s": _number(metrics.get("latency_s"), float),
        "ttft_s": _number(metrics.get("ttft_s"), float),
        **details,
    }
    collected = metrics.get("files")
    if isinstance(collected, list):  # exec --files-dir: where each file went under DIR
        records = [r for r in collected if isinstance(r, dict)]
        row["container_files"] = [str(r.get("path") or r.get("name")) for r in records]
        row["container_file_bytes"] = sum(
            r["bytes"] for r in records if type(r.get("bytes")) is int and r["bytes"] > 0
        )
    return row


def tool_calls_text(calls: Sequence[dict[str, Any]]) -> str | None:
    """The calls an answer made as one JSON text, `[{"name", "arguments"}]` in order, the
    arguments decoded where they are JSON (as a tool would get them); None for no call."""
    if not calls:
        return None
    out = []
    for call in calls:
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            with contextlib.suppress(orjson.JSONDecodeError):  # else kept as the model wrote it
                arguments = orjson.loads(arguments)
        out.append({"name": function.get("name"), "arguments": arguments})
    return orjson.dumps(out).decode()


def _number(value: Any, kind: type) -> Any:
    """A metric as its column's type, when it is a number as `answers` accepts them."""
    found = json_number(value)
    return None if found is None else kind(found)


def _rows(
    paths: list[str],
    requests: str | None,
    per: str,
    key: KeyFunc,
    joins: _Joins,
    summary: ExportSummary,
) -> Iterator[dict[str, Any]]:
    seen = IdSet()
    pending: list[Sample] = []
    for sample in _with_end(read_responses(paths)):
        if pending and (
            sample is None or (sample.path, sample.line) != (pending[0].path, pending[0].line)
        ):
            seen.add(pending[0].custom_id)  # looked up only once all are in: built once
            groups = [[s] for s in pending] if per == "choice" else [pending]
            for samples in groups:
                row = _row(samples, key, per)
                joins.add(row, samples)
                yield row_without_base64(row)
            pending = []
        if sample is not None:
            pending.append(sample)
    summary.repeated = len(seen.colliding_hashes())  # 64-bit hashes: a collision is a repeat
    if requests:
        for cid, model in _request_ids(requests):
            if cid not in seen:
                summary.missing += 1
                group = key(cid)
                yield {
                    "custom_id": cid,
                    "group": group,
                    "sample": sample_number(cid, group),
                    "choices": 0,
                    "model": model,
                    "status": "missing",
                }


def _with_end(samples: Iterator[Sample]) -> Iterator[Sample | None]:
    yield from samples
    yield None


def _request_ids(path: str) -> Iterator[tuple[str, str | None]]:
    for line in _lines(path, ("custom_id",)):
        body = line.get("body")
        model = body.get("model") if isinstance(body, dict) else None
        yield line["custom_id"], model if isinstance(model, str) else None


def _join_into(
    base: str,
    on: str,
    out: str,
    fmt: str,
    rows: Iterator[dict[str, Any]],
    chosen: dict[str, str],
    types: dict[str, type],
    summary: ExportSummary,
    csv_escape: bool = True,
) -> None:
    """Left join: every dataset row, once per matching result (by custom_id, else group)."""
    base_types, batches = open_table(base)
    if on not in base_types:
        raise UsageError(f"--on {on!r}: {base} has no such column (has: {', '.join(base_types)})")
    by_id: dict[str, list[dict[str, Any]]] = {}
    by_group: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        picked = _pick(row, chosen)
        by_id.setdefault(str(row["custom_id"]), []).append(picked)
        by_group.setdefault(str(row["group"]), []).append(picked)
    summary.replaced_columns = [c for c in types if c in base_types]
    columns: dict[str, type | None] = dict.fromkeys(c for c in base_types if c not in types)
    kept = {c: t for c, t in base_types.items() if c not in types}
    empty = dict.fromkeys(types)
    with TableWriter(
        out, fmt, {**columns, **types}, arrow_types=kept, csv_escape=csv_escape
    ) as writer:
        for batch in batches:
            for record in batch:
                summary.base_rows += 1
                value = record.get(on)
                found = (
                    (by_id.get(str(value)) or by_group.get(str(value)))
                    if value is not None
                    else None
                )
                summary.unmatched += not found
                for result in found or [empty]:
                    writer.write(record | result)
    summary.rows = writer.rows

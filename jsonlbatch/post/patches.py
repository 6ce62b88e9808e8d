"""The patches pipeline: responses -> edits -> applied files -> git diffs -> predictions.

Each sample of an instance becomes a `PatchSample` (its git-style patch, its normalized patch,
or the reason it is unusable). One prediction per instance is chosen: the first usable sample,
or with `vote` the majority over normalized patches (ties to the first group seen; the output
is the original patch of that group's first sample), written as a SWE-bench predictions file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import jinja2
import orjson

from jsonlbatch.errors import InputError, UsageError
from jsonlbatch.file_io.output_guard import check_output
from jsonlbatch.post.apply import FileSource, MappedFiles, RepoFiles, apply_edits
from jsonlbatch.post.diffs import make_diff, normalized_diff, syntax_errors
from jsonlbatch.post.edits import extract_edits
from jsonlbatch.post.outputs import JsonlWriter
from jsonlbatch.post.paths import UnsafePathError
from jsonlbatch.post.responses import Group, KeyFunc, Sample, iter_groups
from jsonlbatch.post.summary import FAILED, TRUNCATED, Unused
from jsonlbatch.stats import plural

NO_SOURCE = "original files not available"
NO_EDITS = "no edits found"
MALFORMED = "edit could not be parsed"
NOT_APPLIED = "edit did not apply"
BAD_PYTHON = "edited Python file no longer parses"
COSMETIC = "only comments, docstrings or blank lines changed"

SourceFactory = Callable[[str], FileSource]


@dataclass
class PatchSample:
    """One sample's patch, or why it has none (`status` is "ok" or a reason label)."""

    instance_id: str
    custom_id: str
    index: int = 0
    status: str = "ok"
    reasons: list[str] = field(default_factory=list)
    edits: int = 0
    applied: int = 0
    patch: str = ""
    normalized_patch: str = ""
    selected: bool = False

    @property
    def usable(self) -> bool:
        return self.status == "ok"

    def fail(self, status: str, reasons: Iterable[str]) -> PatchSample:
        self.status, self.reasons = status, list(reasons)
        return self


def patch_sample(
    sample: Sample,
    source: FileSource,
    instance_id: str,
    *,
    strip_prefixes: Sequence[str] = (),
    partial: bool = False,
    use_truncated: bool = False,
) -> PatchSample:
    """Turn one sample into a patch against the original files of its instance.

    With `partial`, edits that fail are reported but the others still make a patch; by
    default one failed edit makes the sample unusable (half a fix is rarely a fix).
    """
    out = PatchSample(instance_id, sample.custom_id, sample.index)
    if sample.failed:
        return out.fail(FAILED, [sample.error or ""])
    if sample.truncated and not use_truncated:
        return out.fail(TRUNCATED, [])
    parsed = extract_edits(sample.text, sample.tool_calls)
    out.edits = len(parsed.edits)
    if not parsed.edits:
        return out.fail(MALFORMED if parsed.problems else NO_EDITS, parsed.problems)
    if parsed.problems and not partial:
        return out.fail(MALFORMED, parsed.problems)
    applied = apply_edits(parsed.edits, source, strip_prefixes=strip_prefixes)
    out.applied = len(applied.results) - len(applied.failed)
    failures = [r.reason for r in applied.failed]
    if failures and (not partial or not out.applied):
        return out.fail(NOT_APPLIED, failures)
    errors = syntax_errors(applied.original, applied.updated)
    if errors:
        return out.fail(BAD_PYTHON, errors)
    out.patch = make_diff(applied.original, applied.updated)
    out.normalized_patch = normalized_diff(applied.original, applied.updated)
    out.reasons = parsed.problems + failures
    if not out.patch or not out.normalized_patch:
        return out.fail(COSMETIC, []) if out.patch else out.fail(NO_EDITS, ["edits change nothing"])
    return out


def make_patches(
    group: Group, sources: SourceFactory | FileSource, **options: Any
) -> list[PatchSample]:
    """The patches of every sample of one instance (`options` as for `patch_sample`)."""
    try:
        source = sources(group.key) if callable(sources) else sources
    except UnsafePathError as exc:
        return [
            PatchSample(group.key, s.custom_id, s.index).fail(NO_SOURCE, [str(exc)])
            for s in group.samples
        ]
    return [patch_sample(s, source, group.key, **options) for s in group.samples]


def choose_patch(samples: Sequence[PatchSample], *, vote: bool = False) -> PatchSample | None:
    """The sample whose patch becomes the prediction (None if no sample is usable)."""
    usable = [s for s in samples if s.usable]
    if not usable:
        return None
    if not vote:
        return usable[0]
    by_fix: dict[str, list[PatchSample]] = {}
    for s in usable:
        by_fix.setdefault(s.normalized_patch, []).append(s)
    return max(by_fix.values(), key=len)[0]  # max keeps the first of equals: ties go to first seen


_templates = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)


def render(template: str, **values: str) -> str:
    """Fill a `{{ instance_id }}`-style template (a user's option, so errors are usage errors)."""
    try:
        return _templates.from_string(template).render(**values)
    except jinja2.TemplateError as exc:
        raise UsageError(f"template {template!r}: {exc}") from None


def instance_sources(
    repo_root: str | None = None,
    repo: str = "{{ instance_id }}",
    files_json: str | None = None,
) -> SourceFactory:
    """Where each instance's original files come from.

    `repo_root` + `repo`: a directory per instance (read only; it must stay inside the root).
    `files_json`: a JSON file (templated path) holding `{path: content}`, or one file holding
    `{instance_id: {path: content}}` for all instances.
    """
    if (repo_root is None) == (files_json is None):
        raise UsageError(
            "give either --repo-root (the folder of checkouts; --repo, optional, says where "
            "each instance's checkout is under it) or --files-json"
        )
    if repo_root is not None:
        root = os.path.realpath(repo_root)
        if not os.path.isdir(root):
            raise InputError(f"--repo-root {repo_root} is not a directory")

        def from_repo(instance_id: str) -> FileSource:
            where = os.path.realpath(os.path.join(root, render(repo, instance_id=instance_id)))
            if os.path.commonpath([root, where]) != root:
                raise UnsafePathError(f"repository of {instance_id!r} is outside {repo_root}")
            if not os.path.isdir(where):
                raise UnsafePathError(f"no repository directory {where}")
            return RepoFiles(where)

        return from_repo

    cache: dict[str, Any] = {}

    def from_json(instance_id: str) -> FileSource:
        path = render(files_json or "", instance_id=instance_id)
        if path not in cache:
            cache.clear()
            cache[path] = _load_map(path)
        files = cache[path]
        if files and all(isinstance(v, dict) for v in files.values()):
            files = files.get(instance_id)
            if files is None:
                raise UnsafePathError(f"{path} has no files for {instance_id!r}")
        if not all(isinstance(v, str) for v in files.values()):
            raise InputError(f"{path}: file contents must be strings")
        return MappedFiles(files)

    return from_json


def _load_map(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            data = orjson.loads(fh.read())
    except FileNotFoundError:
        raise UnsafePathError(f"no file map {path}") from None
    except (OSError, orjson.JSONDecodeError) as exc:
        raise InputError(f"cannot read file map {path}: {exc}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: must be a JSON object of path -> content")
    return data


@dataclass
class PatchesSummary:
    """Counts of one run, and what could not be used."""

    instances: int = 0
    samples: int = 0
    usable: int = 0
    predictions: int = 0  # instances with a non-empty patch
    unused: Unused = field(default_factory=Unused)

    def lines(self) -> list[str]:
        head = (
            f"patches: {plural(self.samples, 'sample')} of {plural(self.instances, 'instance')},"
            f" {self.usable} usable; {self.predictions} with a patch"
        )
        return [head, *self.unused.section()]


def run_patches(
    paths: str | Sequence[str],
    out: str,
    sources: SourceFactory,
    *,
    model_name: str | None = None,
    vote: bool = False,
    samples_out: str | None = None,
    key: KeyFunc | None = None,
    strict: bool = False,
    **options: Any,
) -> PatchesSummary:
    """Write a SWE-bench predictions file (one line per instance) and, optionally, every sample.

    `options` go to `patch_sample` (strip_prefixes, partial, use_truncated). Under `strict`
    the outputs are still written, then `UnusableSamplesError` is raised if anything was skipped.
    """
    inputs = [paths] if isinstance(paths, str) else list(paths)
    check_output(out, inputs)
    if samples_out:
        check_output(samples_out, inputs)
    summary = PatchesSummary()
    per_sample_file = JsonlWriter(samples_out) if samples_out else nullcontext()
    with JsonlWriter(out) as preds, per_sample_file as per_sample:
        for group in iter_groups(paths, key, summary.unused):
            results = make_patches(group, sources, **options)
            winner = choose_patch(results, vote=vote)
            if winner is not None:
                winner.selected = True
            for r in results:
                if not r.usable:
                    summary.unused.add(r.status, r.custom_id, "; ".join(r.reasons))
                if per_sample is not None:
                    per_sample.write(asdict(r))
            name = model_name or next((s.model for s in group.samples if s.model), None)
            preds.write(
                {
                    "instance_id": group.key,
                    "model_name_or_path": name or "jsonlbatch",
                    "model_patch": winner.patch if winner else "",
                }
            )
            summary.instances += 1
            summary.samples += len(results)
            summary.usable += sum(r.usable for r in results)
            summary.predictions += winner is not None
    summary.unused.check(strict, "samples")
    return summary

"""`jsonlbatch post`: post-process saved responses (patches, votes, deliverable files).

Thin: options are parsed here, the work is done by `jsonlbatch.post`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import click

from jsonlbatch.cli.params import COUNT, MEGABYTES, MEMORY_MB, SECONDS, WEIGHT
from jsonlbatch.cli.sections import Sectioned
from jsonlbatch.post.extract import DEFAULT_EXTRACTORS
from jsonlbatch.post.files import Limits, extract_files
from jsonlbatch.post.patches import instance_sources, run_patches
from jsonlbatch.post.render import schema
from jsonlbatch.post.responses import DEFAULT_SEPARATORS, KeyFunc, make_key
from jsonlbatch.post.sandbox import ISOLATIONS, RunLimits
from jsonlbatch.post.summary import Unused
from jsonlbatch.post.votes import TIE_BREAKS, format_table, run_votes

_MB = 1024 * 1024
_INPUTS = click.argument(
    "responses", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False)
)


def _grouping(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option(
        "--split",
        "separators",
        multiple=True,
        metavar="SEP",
        help=f"custom_id separator before the sample number (repeatable; default: "
        f"{' '.join(DEFAULT_SEPARATORS)}).",
    )(fn)
    fn = click.option("--no-split", is_flag=True, help="Each custom_id is its own group.")(fn)
    fn = click.option(
        "--group-field",
        metavar="PATH",
        help="Group by this dotted field of the request line instead (needs --requests).",
    )(fn)
    return click.option(
        "--requests",
        type=click.Path(exists=True, dir_okay=False),
        help="The request file, for --group-field.",
    )(fn)


def _skips(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option(
        "--use-truncated",
        is_flag=True,
        help="Use answers cut off by max_tokens (finish_reason length) instead of skipping them.",
    )(fn)
    return click.option(
        "--strict", is_flag=True, help="Exit non-zero if anything could not be used."
    )(fn)


def _key(
    separators: Sequence[str], no_split: bool, group_field: str | None, requests: str | None
) -> KeyFunc:
    return make_key(() if no_split else (separators or None), requests, group_field)


def _report(lines: list[str], unused: Unused, strict: bool, what: str) -> None:
    """Print the summary; under --strict the error lists what was not used (once)."""
    for line in lines[:1] if strict and unused.total else lines:
        click.echo(line, err=True)
    unused.check(strict, what)


#: A group's help ends with examples like a command's (`Sectioned`); `\b` keeps click from
#: re-wrapping the command lines.
_POST_EXAMPLES = """Examples:

\b
  jsonlbatch post votes responses.jsonl --extract json:answer -o votes.jsonl
  jsonlbatch post votes responses.jsonl --extract boxed --gold gold.jsonl -o votes.jsonl
  jsonlbatch post patches responses.jsonl --repo-root repos/ --vote -o predictions.jsonl
  jsonlbatch post files responses.jsonl -o deliverables/
"""


@click.group("post", epilog=_POST_EXAMPLES)
def post() -> None:
    """Post-process saved response files offline: patches, votes, deliverable files."""


@post.command(
    cls=Sectioned,
    sections=[
        ("Checkouts", ("repo_root", "repo", "files_json", "strip_prefix")),
        ("Choosing a patch", ("vote", "partial", "use_truncated", "model_name")),
        ("Grouping samples", ("requests", "group_field", "no_split", "separators")),
        ("Output", ("output", "samples_out", "strict")),
    ],
    examples=(
        "jsonlbatch post patches responses.jsonl --repo-root repos/ --vote -o predictions.jsonl",
    ),
)
@_INPUTS
@click.option("-o", "--output", required=True, help="SWE-bench predictions JSONL to write.")
@click.option(
    "--repo-root", type=click.Path(exists=True, file_okay=False), help="Folder of checkouts."
)
@click.option(
    "--repo",
    default="{{ instance_id }}",
    show_default=True,
    help="Checkout of an instance, relative to --repo-root (a template).",
)
@click.option(
    "--files-json",
    metavar="TEMPLATE",
    help="JSON {path: content} per instance (templated path), or one {instance_id: {...}} file.",
)
@click.option("--model-name", help="model_name_or_path (default: the model of the responses).")
@click.option("--vote", is_flag=True, help="Majority over normalized patches per instance.")
@click.option("--samples-out", help="Also write every sample's patch and failure reasons here.")
@click.option(
    "--strip-prefix",
    multiple=True,
    metavar="PREFIX",
    help="Map absolute paths of tool calls into the repo (e.g. /testbed/).",
)
@click.option("--partial", is_flag=True, help="Keep samples whose edits only partly apply.")
@_grouping
@_skips
def patches(responses: tuple[str, ...], output: str, repo_root: str | None, repo: str,
            files_json: str | None, model_name: str | None, vote: bool, samples_out: str | None,
            strip_prefix: tuple[str, ...], partial: bool, separators: tuple[str, ...],
            no_split: bool, group_field: str | None, requests: str | None,
            use_truncated: bool, strict: bool) -> None:  # fmt: skip
    """Turn edits in responses into SWE-bench predictions (one patch per instance)."""
    summary = run_patches(
        responses,
        output,
        instance_sources(repo_root, repo, files_json),
        model_name=model_name,
        vote=vote,
        samples_out=samples_out,
        key=_key(separators, no_split, group_field, requests),
        strip_prefixes=strip_prefix,
        partial=partial,
        use_truncated=use_truncated,
    )
    _report(summary.lines(), summary.unused, strict, "samples")


@post.command(
    cls=Sectioned,
    sections=[
        ("Answers", ("extractors", "normalize", "weights", "gold", "tie_break", "use_truncated")),
        ("Grouping samples", ("requests", "group_field", "no_split", "separators")),
        ("Output", ("output", "strict")),
    ],
    examples=(
        "jsonlbatch post votes responses.jsonl --extract boxed --gold tasks.jsonl -o votes.jsonl",
    ),
)
@_INPUTS
@click.option("-o", "--output", required=True, help="Votes JSONL to write (one line per group).")
@click.option(
    "--extract",
    "extractors",
    multiple=True,
    metavar="SPEC",
    help="boxed, answer-is, last-number, choice, full, regex:PATTERN, json:PATH, tool:PATH "
    "(the first tool call: tool:name, tool:arguments.order_id); repeat for "
    f"fallbacks (default: {' '.join(DEFAULT_EXTRACTORS)}).",
)
@click.option(
    "--normalize",
    default="default",
    show_default=True,
    help="default, text, none, or module:function.",
)
@click.option(
    "--weight", "weights", multiple=True, type=WEIGHT, help="Weight of each input, in order."
)
@click.option("--gold", type=click.Path(exists=True, dir_okay=False), help="JSONL of id -> answer.")
@click.option("--tie-break", type=click.Choice(TIE_BREAKS), default="first", show_default=True)
@_grouping
@_skips
def votes(responses: tuple[str, ...], output: str, extractors: tuple[str, ...], normalize: str,
          weights: tuple[float, ...], gold: str | None, tie_break: str,
          separators: tuple[str, ...], no_split: bool, group_field: str | None,
          requests: str | None, use_truncated: bool, strict: bool) -> None:  # fmt: skip
    """Majority vote over extracted answers per group; maj@k/pass@k/mean@k with --gold."""
    summary = run_votes(
        responses,
        output,
        extractors=extractors,
        normalize=normalize,
        weights=weights or None,
        gold=gold,
        key=_key(separators, no_split, group_field, requests),
        tie_break=tie_break,
        use_truncated=use_truncated,
    )
    if summary.accuracy:
        click.echo(format_table(summary.accuracy, summary.scored))
    _report(summary.lines(), summary.unused, strict, "samples")


@post.command(
    cls=Sectioned,
    sections=[
        ("Limits", ("max_files", "max_file_mb", "max_total_mb")),
        ("Running the files", ("run", "script", "timeout", "sandbox", "memory_mb")),
        ("Output", ("out_dir", "render", "strict", "use_truncated")),
    ],
    examples=("jsonlbatch post files responses.jsonl -o deliverables/",),
)
@_INPUTS
@click.option("--out-dir", required=True, type=click.Path(file_okay=False), help="Where files go.")
@click.option("--max-files", type=COUNT, default=100, show_default=True, help="Files per sample.")
@click.option(
    "--max-file-mb", type=MEGABYTES, default=10.0, show_default=True, help="Size of one file."
)
@click.option(
    "--max-total-mb", type=MEGABYTES, default=50.0, show_default=True, help="All files of a sample."
)
@click.option("--run", is_flag=True, help="Run the sample's Python script and collect its files.")
@click.option("--script", help="Which extracted file --run executes (default: the only .py).")
@click.option(
    "--timeout", type=SECONDS, default=60.0, show_default=True, help="Seconds per --run script."
)
@click.option(
    "--sandbox",
    type=click.Choice(ISOLATIONS),
    default="auto",
    show_default=True,
    help="How --run isolates a script: bwrap (bubblewrap: no network, read-only system, only "
    "its folder writable), launcher (a clean environment only), auto (bwrap where it works).",
)
@click.option(
    "--memory-mb", type=MEMORY_MB, default=4096, show_default=True, help="Address space per script."
)
@click.option(
    "--render",
    is_flag=True,
    help="Render JSON file specs ({path, spec}) into xlsx, docx, pdf, pptx, csv or md "
    "(the render extra; schema: jsonlbatch post render-schema).",
)
@_skips
def files(responses: tuple[str, ...], out_dir: str, max_files: int, max_file_mb: float,
          max_total_mb: float, run: bool, script: str | None, timeout: float, sandbox: str,
          memory_mb: int, render: bool, use_truncated: bool, strict: bool) -> None:  # fmt: skip
    """Extract deliverable files into OUT/<custom_id>/ with a manifest.jsonl."""
    limits = Limits(int(max_file_mb * _MB), max_files, int(max_total_mb * _MB))
    summary = extract_files(
        responses,
        out_dir,
        limits=limits,
        run=run,
        run_limits=RunLimits(
            timeout=timeout,
            memory_bytes=memory_mb * _MB,
            file_bytes=limits.max_file_bytes,
            max_files=max_files,
            max_total_bytes=limits.max_total_bytes,
            isolation=sandbox,
        ),
        script=script,
        use_truncated=use_truncated,
        render=render,
    )
    _report(summary.lines(), summary.unused, strict, "samples or files")


@post.command("render-schema")
def render_schema() -> None:
    """Print the JSON Schema of a render spec (for prompts): one entry of {"files": [...]}."""
    click.echo(json.dumps(schema(), indent=2))

"""`jsonlbatch export`: responses (and what post made of them) as a Parquet, CSV or JSONL table."""

from __future__ import annotations

import click

from jsonlbatch.cli.sections import Section, Sectioned
from jsonlbatch.post.export import PER, export
from jsonlbatch.post.responses import DEFAULT_SEPARATORS, make_key
from jsonlbatch.post.table_io import TABLE_FORMATS

_FILE = click.Path(exists=True, dir_okay=False)


_SECTIONS: list[Section] = [
    ("Rows", ("requests", "per", "separators", "no_split", "fields")),
    ("Joined from post", ("votes", "patches", "files")),
    ("Into a dataset", ("into", "on")),
    ("Output", ("output", "fmt", "columns", "csv_raw", "quiet")),
]
_EXAMPLES = (
    "jsonlbatch export responses.jsonl -o results.parquet --requests requests.jsonl",
    "jsonlbatch export responses.jsonl -o results.csv --votes votes.jsonl --per choice",
    "jsonlbatch export responses.jsonl --into dataset.parquet --on id -o with-results.parquet",
)


@click.command("export", cls=Sectioned, sections=_SECTIONS, examples=_EXAMPLES)
@click.argument("responses", nargs=-1, required=True, type=_FILE)
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False),
    help="results.parquet, .csv or .jsonl (format from the suffix, or --format).",
)
@click.option("--format", "fmt", type=click.Choice(TABLE_FORMATS), help="Table format.")
@click.option(
    "--requests",
    type=_FILE,
    help="The request file: requests without a response get a row (status missing).",
)
@click.option(
    "--per",
    type=click.Choice(PER),
    default="request",
    show_default=True,
    help="One row per request, or per choice (n > 1).",
)
@click.option("--votes", type=_FILE, help="A `post votes` output: voted_answer, gold, correct.")
@click.option(
    "--patches",
    type=_FILE,
    help="SWE-bench predictions or `post patches --samples-out` lines: patch.",
)
@click.option(
    "--files",
    type=click.Path(exists=True),
    help="A `post files` output folder (or its manifest.jsonl): files.",
)
@click.option(
    "--into", type=_FILE, help="A dataset table to add the columns to (every row and column kept)."
)
@click.option("--on", help="With --into: its key column, matched to custom_id, else the group.")
@click.option(
    "--column",
    "columns",
    multiple=True,
    metavar="[NEW=]NAME",
    help="Result columns to write, optionally renamed (repeatable; default: all), "
    "e.g. --column deliverable_text=answer.",
)
@click.option(
    "--split",
    "separators",
    multiple=True,
    metavar="SEP",
    help=f"custom_id separator before the sample number (repeatable; default: "
    f"{' '.join(DEFAULT_SEPARATORS)}).",
)
@click.option("--no-split", is_flag=True, help="Each custom_id is its own group.")
@click.option(
    "--csv-raw",
    is_flag=True,
    help="CSV: keep text cells as they are (by default one starting with = + - @ gets a ' "
    "first, so a spreadsheet does not run it as a formula).",
)
@click.option(
    "--fields",
    multiple=True,
    metavar="NAME[,NAME]",
    help="Top-level fields of answers under a schema, as typed columns (COLUMN=NAME renames; "
    "repeatable; default: every field of the recorded schemas).",
)
@click.option("-q", "--quiet", is_flag=True, help="No summary.")
def export_(responses: tuple[str, ...], output: str, fmt: str | None, requests: str | None,
            per: str, votes: str | None, patches: str | None, files: str | None,
            into: str | None, on: str | None, columns: tuple[str, ...],
            separators: tuple[str, ...], no_split: bool, csv_raw: bool,
            fields: tuple[str, ...],
            quiet: bool) -> None:  # fmt: skip
    """Write one row per request (or choice) of RESPONSES to a table for dataset tools."""
    summary = export(
        responses,
        output,
        requests=requests,
        per=per,
        votes=votes,
        patches=patches,
        files=files,
        into=into,
        on=on,
        columns=columns,
        key=make_key(() if no_split else (separators or None), None, None),
        fmt=fmt,
        csv_escape=not csv_raw,
        fields=fields or None,
    )
    if not quiet:
        for line in summary.lines():
            click.echo(line, err=True)

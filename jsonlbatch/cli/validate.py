"""`jsonlbatch validate FILE`."""

from __future__ import annotations

import sys

import click

from jsonlbatch.cli.sections import Sectioned
from jsonlbatch.errors import count_problems
from jsonlbatch.exec.prepare.validate import validate_file
from jsonlbatch.exec.prepare.wrong_file_hints import hint
from jsonlbatch.stats import plural


@click.command(
    cls=Sectioned,
    examples=("jsonlbatch validate requests.jsonl", "jsonlbatch validate responses.jsonl"),
)
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "--kind",
    type=click.Choice(["auto", "requests", "responses"]),
    default="auto",
    show_default=True,
    help="What the files hold; auto looks at the first line.",
)
def validate(files: tuple[str, ...], kind: str) -> None:
    """Check request or response JSONL files; list every problem with file, line and field.

    Exits 1 if any file has a problem.
    """
    bad = 0
    for path in files:
        report = validate_file("/dev/stdin" if path == "-" else path, kind)
        if report.ok:
            click.echo(f"{path}: ok ({plural(report.lines, report.kind[:-1] + ' line')})")
            continue
        bad += 1
        for problem in report.problems:
            click.echo(str(problem))
        count = count_problems(len(report.problems))
        noun = "problem" if count == "1" else "problems"
        click.echo(f"{path}: {count} {noun} in {report.kind}", err=True)
        # the same hint exec gives (bare chat bodies, a CSV table: how `gen` makes requests of it)
        shown = hint(path) if report.kind == "requests" and path != "-" else None
        if shown:
            click.echo(f"hint: {shown}", err=True)
    sys.exit(1 if bad else 0)

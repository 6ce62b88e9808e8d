"""`jsonlbatch report FILES...`: the command-line face of `jsonlbatch.report`."""

from __future__ import annotations

import click

from jsonlbatch.cli.sections import Sectioned
from jsonlbatch.report import (
    FORMATS,
    build_report,
    format_for,
    parse_price,
    parse_sla,
    render,
    write_report,
)
from jsonlbatch.report.charts import charts_missing


@click.command(
    cls=Sectioned,
    examples=(
        "jsonlbatch report responses.jsonl",
        "jsonlbatch report responses.jsonl -o report.html --sla ttft=500ms --price in=1,out=4",
        "jsonlbatch report baseline.jsonl tuned.jsonl -o compare.html --by endpoint",
    ),
)
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    help="Write the report here (.html, .md or .json); without it, print a table.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    help="Output format, when the -o suffix does not say it (or to print md/json).",
)
@click.option(
    "--sla",
    multiple=True,
    metavar="METRIC=DURATION",
    help="Bound on ttft, tpot, itl or e2e, e.g. ttft=2s, tpot=50ms (repeatable); adds goodput.",
)
@click.option(
    "--by",
    multiple=True,
    metavar="KEY",
    help="Break down by endpoint, model, status or a request field such as body.temperature "
    "(needs --requests); repeatable.",
)
@click.option(
    "--requests",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="Request JSONL the runs came from, joined by custom_id, for --by on request fields.",
)
@click.option(
    "--price",
    metavar="in=USD,out=USD",
    help="Dollars per million input and output tokens, e.g. in=0.15,out=0.60; adds cost.",
)
def report(
    files: tuple[str, ...],
    output: str | None,
    fmt: str | None,
    sla: tuple[str, ...],
    by: tuple[str, ...],
    requests: tuple[str, ...],
    price: str | None,
) -> None:
    """Outcomes, tokens, throughput and latency percentiles of response files.

    Several FILES are compared side by side, each against the first.
    """
    if output is not None and format_for(output, fmt) == "html":
        missing = charts_missing()  # said in the page too, but who looks there
        if missing is not None:
            click.echo(f"note: the page will have no charts: {missing}", err=True)
    built = build_report(
        files, sla=parse_sla(sla), by=by, requests=requests, price=parse_price(price)
    )
    if output is None:
        click.echo(render(built, fmt or "text"), nl=False)
        return
    used = write_report(built, output, fmt)
    click.echo(f"wrote {used} report to {output}", err=True)

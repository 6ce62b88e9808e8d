"""`jsonlbatch merge`: join the outputs of `exec --shard K/N` jobs into one response file."""

from __future__ import annotations

import click

from jsonlbatch.cli.sections import Sectioned
from jsonlbatch.exec.prepare.shard import merge


@click.command(
    "merge",
    cls=Sectioned,
    examples=("jsonlbatch merge out.shard-*.jsonl --requests requests.jsonl -o responses.jsonl",),
)
@click.argument("parts", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option(
    "--requests",
    required=True,
    type=click.Path(dir_okay=False),
    help="The request file the shards were cut from: every id must have one result.",
)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Merged file.")
@click.option("-q", "--quiet", is_flag=True, help="No summary line.")
def merge_(parts: tuple[str, ...], requests: str, output: str, quiet: bool) -> None:
    """Merge shard outputs PARTS into one file, in request order.

    Fails, writing nothing, naming the ids, when a request has no result, has two successful
    ones, or a result belongs to no request. A success beats a failed line for the same id.
    """
    summary = merge(parts, requests, output)
    if not quiet:
        click.echo(summary.format(), err=True)

"""`jsonlbatch view OUT.jsonl [OUT2.jsonl ...]`: the command-line face of `jsonlbatch.view`."""

from __future__ import annotations

import click

from jsonlbatch.cli.params import NonEmpty
from jsonlbatch.cli.sections import Sectioned
from jsonlbatch.pricing.cost import parse_price


@click.command(
    cls=Sectioned,
    examples=(
        "jsonlbatch view responses.jsonl",
        "jsonlbatch view baseline.jsonl tuned.jsonl --requests requests.jsonl",
    ),
)
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, exists=True))
@click.option(
    "--requests",
    multiple=True,
    type=click.Path(dir_okay=False, exists=True),
    help="Request JSONL the runs came from, to show prompts and search them (repeatable).",
)
@click.option(
    "--host",
    type=NonEmpty(),
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on; anything but loopback lets other machines read the answers.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    help="Port to listen on (default: a free one).",
)
@click.option(
    "--price",
    metavar="in=USD,out=USD",
    help="Dollars per million input and output tokens, for a cost column where lines have none.",
)
@click.option("--open", "open_browser", is_flag=True, help="Open the page in a browser.")
def view(
    files: tuple[str, ...],
    requests: tuple[str, ...],
    host: str,
    port: int,
    price: str | None,
    open_browser: bool,
) -> None:
    """Browse response files in a local web page: filter, read, compare side by side.

    The page lists every request (status, finish reason, tokens, latency, cost, verdict) with
    filters and sorting, shows one request's prompt and answers, puts the same custom_id from
    several FILES side by side, and follows a file that a run is still writing. Read-only;
    served on 127.0.0.1 unless --host says otherwise.
    """
    from jsonlbatch.view import serve_viewer

    serve_viewer(
        list(files),
        requests=list(requests),
        host=host,
        port=port,
        price=parse_price(price),
        open_browser=open_browser,
    )

"""`jsonlbatch batches status|cancel OUT`: the batches an `exec --batch-api` run made for OUT."""

from __future__ import annotations

from typing import Any

import click

from jsonlbatch.batchapi.client.batch_status import batches_of
from jsonlbatch.cli.params import HttpUrl
from jsonlbatch.cli.sections import Sectioned
from jsonlbatch.exec.job import run_coroutine
from jsonlbatch.exec.route.credentials import clean_secret

_COMMON = [
    click.argument("output", type=click.Path(dir_okay=False)),
    click.option(
        "--url",
        type=HttpUrl(),
        metavar="URL",
        help="The Batch API's base URL (default: the run's).",
    ),
    click.option(
        "--api-key",
        envvar="OPENAI_API_KEY",
        show_envvar=True,
        help="Sent as a Bearer token (as `api-key` to Azure OpenAI).",
    ),
]


def _common(func: Any) -> Any:
    for option in reversed(_COMMON):
        func = option(func)
    return func


@click.group(
    "batches",
    epilog="""Examples:

\b
  jsonlbatch batches status responses.jsonl
  jsonlbatch batches cancel responses.jsonl --url https://api.openai.com/v1
""",
)
def batches() -> None:
    """See or cancel the remote batches of an `exec --batch-api` output."""


def _show(output: str, url: str | None, api_key: str | None, cancel: bool) -> None:
    api_key = clean_secret(api_key, "--api-key (or $OPENAI_API_KEY)")
    rows = run_coroutine(batches_of(output, url=url, api_key=api_key, cancel=cancel))
    for row in rows:
        merged = f"merged into {output}" if row["merged"] else "not merged yet"
        click.echo(
            f"part {row['part']}: {row['batch_id'] or '(not created)'} {row['status'] or '-'}: "
            f"{row['completed']} completed, {row['failed']} failed of {row['requests']}; {merged}"
        )
    if cancel:
        click.echo(
            "cancel asked; run the same exec command again to collect what finished "
            "(the rest gets batch_cancelled lines)",
            err=True,
        )


@batches.command("status", cls=Sectioned, examples=("jsonlbatch batches status responses.jsonl",))
@_common
def status(output: str, url: str | None, api_key: str | None) -> None:
    """Each batch of OUTPUT with its live status and request counts."""
    _show(output, url, api_key, cancel=False)


@batches.command("cancel", cls=Sectioned, examples=("jsonlbatch batches cancel responses.jsonl",))
@_common
def cancel(output: str, url: str | None, api_key: str | None) -> None:
    """Cancel OUTPUT's batches that are still running (finished work is kept)."""
    _show(output, url, api_key, cancel=True)

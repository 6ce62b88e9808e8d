"""`jsonlbatch cache stats|prune DIR`: inspect and shrink an answer cache (`exec --cache`)."""

from __future__ import annotations

import re
from typing import Any

import click

from jsonlbatch.cache import cache_stats, prune
from jsonlbatch.cli.sections import Sectioned

_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class _Age(click.ParamType):
    """`30d`, `12h`, `90m`, `3600s` or `2w`: seconds."""

    name = "age"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, (int, float)):
            return float(value)
        found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", str(value).lower())
        if found is None:
            self.fail(
                f"{value!r}: give a number and a unit (s, m, h, d or w), e.g. 30d", param, ctx
            )
        return float(found[1]) * _AGE_UNITS[found[2]]


class _Size(click.ParamType):
    """`500M`, `10G`, `2.5g`, `1T` or a number of bytes."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int):
            return value
        found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", str(value).lower())
        if found is None:
            self.fail(f"{value!r}: give a size such as 500M or 10G", param, ctx)
        return int(float(found[1]) * _SIZE_UNITS[found[2]])


@click.group()
def cache() -> None:
    """Inspect and prune an answer cache (made by `exec --cache DIR`)."""


@cache.command(cls=Sectioned, examples=("jsonlbatch cache stats .jsonlbatch-cache",))
@click.argument("directory", type=click.Path(file_okay=False))
def stats(directory: str) -> None:
    """Answers stored (by model), size on disk, age, and the hits the runs recorded."""
    click.echo(cache_stats(directory).format())


@cache.command(
    "prune",
    cls=Sectioned,
    examples=("jsonlbatch cache prune .jsonlbatch-cache --older-than 30d --dry-run",),
)
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--older-than", type=_Age(), help="Remove answers stored longer ago, e.g. 30d.")
@click.option("--max-size", type=_Size(), help="Then remove the oldest until at most this is kept.")
@click.option("--model", help="Remove only this model's answers (all, or with --older-than).")
@click.option("--dry-run", is_flag=True, help="Say what would go; remove nothing.")
def prune_(
    directory: str, older_than: float | None, max_size: int | None, model: str | None, dry_run: bool
) -> None:
    """Remove answers by age, size and/or model (torn entries and stale temporary files too).

    Safe while runs use the cache: a removed answer is a miss for them, nothing more.
    """
    result = prune(
        directory, older_than=older_than, max_bytes=max_size, model=model, dry_run=dry_run
    )
    click.echo(result.format(dry_run))

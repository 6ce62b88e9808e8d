"""The `jsonlbatch` command line: a thin layer over the importable library.

Each command lives in its own module beside this one (none imports another) and is registered
below. Errors of the package's own hierarchy become one clean message and an exit code here,
in one place.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from jsonlbatch.cli import batches as _batches
from jsonlbatch.cli import cache as _cache
from jsonlbatch.cli import exec as _exec
from jsonlbatch.cli import export as _export
from jsonlbatch.cli import gen as _gen
from jsonlbatch.cli import merge as _merge
from jsonlbatch.cli import post as _post
from jsonlbatch.cli import report as _report
from jsonlbatch.cli import run as _run
from jsonlbatch.cli import serve as _serve
from jsonlbatch.cli import validate as _validate
from jsonlbatch.cli import view as _view
from jsonlbatch.errors import JsonlbatchError
from jsonlbatch.redact import RedactingStream, redact, register_environment


class _Group(click.Group):
    """A click group that renders `JsonlbatchError` without a traceback, and masks secrets in
    everything written to stderr (`RedactingStream`: progress, notes, click's own messages)."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        register_environment()
        if not isinstance(sys.stderr, RedactingStream):
            sys.stderr = RedactingStream(sys.stderr)
        return super().main(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except JsonlbatchError as exc:
            click.echo(f"Error: {redact(str(exc))}", err=True)
            sys.exit(exc.exit_code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="jsonlbatch")
def main() -> None:
    """Offline LLM batch work over JSONL: gen -> exec -> post/report."""


for _command in (
    _batches.batches,
    _cache.cache,
    _exec.exec_,
    _export.export_,
    _gen.gen,
    _merge.merge_,
    _post.post,
    _report.report,
    _run.run,
    _serve.serve,
    _validate.validate,
    _view.view,
):
    main.add_command(_command)

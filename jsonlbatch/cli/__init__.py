"""The `jsonlbatch` command line: a thin layer over the importable library.

Each command lives in its own module beside this one and is registered below. Errors of the
package's own hierarchy become one clean message and an exit code here, in one place.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from jsonlbatch.errors import JsonlbatchError
from jsonlbatch.redact import redact


class _Group(click.Group):
    """A click group that renders `JsonlbatchError` without a traceback."""

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


# Command registration: one line per command module.
# (commands are imported here, after `main` exists, so modules stay independent of each other)
from jsonlbatch.cli import exec as _exec  # noqa: E402
from jsonlbatch.cli import validate as _validate  # noqa: E402

main.add_command(_exec.exec_)
main.add_command(_validate.validate)
from jsonlbatch.cli import merge as _merge  # noqa: E402
from jsonlbatch.cli import serve as _serve  # noqa: E402

main.add_command(_serve.serve)
main.add_command(_merge.merge_)
from jsonlbatch.cli import gen as _gen  # noqa: E402

main.add_command(_gen.gen)
from jsonlbatch.cli import post as _post  # noqa: E402

main.add_command(_post.post)
from jsonlbatch.cli import report as _report  # noqa: E402

main.add_command(_report.report)

"""The `jsonlbatch` command line: a thin layer over the importable library.

Each command lives in its own module beside this one (none imports another) and is listed in
`COMMANDS`, in the order `--help` shows them (the pipeline first). A command's module, and with
it its stage, is imported only when that command runs: `jsonlbatch --help`, a tab completion or
`jsonlbatch gen` never pay for aiohttp or the executor. Errors of the package's own hierarchy
become one clean message and an exit code here, in one place.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from jsonlbatch.errors import JsonlbatchError
from jsonlbatch.redact import RedactingStream, redact, register_environment

#: name -> (module, attribute, one-line summary). `--help` lists the commands in this order from
#: the summaries alone (tests/test_cli_options.py checks them against the commands' own help).
COMMANDS: dict[str, tuple[str, str, str]] = {
    "gen": (
        "jsonlbatch.cli.gen",
        "gen",
        "Write an OpenAI Batch request file: one request per data row (or --samples per row).",
    ),
    "exec": (
        "jsonlbatch.cli.exec",
        "exec_",
        "Send the REQUESTS file (OpenAI Batch JSONL) and write one result line per request.",
    ),
    "post": (
        "jsonlbatch.cli.post",
        "post",
        "Post-process saved response files offline: patches, votes, deliverable files.",
    ),
    "report": (
        "jsonlbatch.cli.report",
        "report",
        "Outcomes, tokens, throughput and latency percentiles of response files.",
    ),
    "export": (
        "jsonlbatch.cli.export",
        "export_",
        "Write one row per request (or choice) of RESPONSES to a table for dataset tools.",
    ),
    "run": (
        "jsonlbatch.cli.run",
        "run",
        "Run EXPERIMENT_FILE (YAML): gen, exec, judge rounds, post (votes, files, patches) for "
        "each condition, then one report comparing them; plain files under RUNS/<experiment "
        "id>/.",
    ),
    "rollout": (
        "jsonlbatch.cli.rollout",
        "rollout_command",
        "Run each request as a conversation with tools, to its end (agent rollouts).",
    ),
    "serve": (
        "jsonlbatch.cli.serve",
        "serve",
        "Launch a server (or replicas) and keep it up; prints one base URL per line.",
    ),
    "view": (
        "jsonlbatch.cli.view",
        "view",
        "Browse response files in a local web page: filter, read, compare side by side.",
    ),
    "validate": (
        "jsonlbatch.cli.validate",
        "validate",
        "Check request or response JSONL files; list every problem with file, line and field.",
    ),
    "merge": (
        "jsonlbatch.cli.merge",
        "merge_",
        "Merge shard outputs PARTS into one file, in request order.",
    ),
    "batches": (
        "jsonlbatch.cli.batches",
        "batches",
        "See or cancel the remote batches of an `exec --batch-api` output.",
    ),
    "cache": (
        "jsonlbatch.cli.cache",
        "cache",
        "Inspect and prune an answer cache (made by `exec --cache DIR`).",
    ),
}


class _Group(click.Group):
    """A click group that imports a command only when it is run, renders `JsonlbatchError`
    without a traceback, and masks secrets in everything written to stderr
    (`RedactingStream`: progress, notes, click's own messages)."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        register_environment()
        if not isinstance(sys.stderr, RedactingStream):
            sys.stderr = RedactingStream(sys.stderr)
        return super().main(*args, **kwargs)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*COMMANDS, *(name for name in self.commands if name not in COMMANDS)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = self.commands.get(cmd_name)
        if command is None and cmd_name in COMMANDS:
            module, attribute, _ = COMMANDS[cmd_name]
            command = getattr(importlib.import_module(module), attribute)
            self.add_command(command, cmd_name)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list from `COMMANDS` alone: `--help` imports no command."""
        names = self.list_commands(ctx)
        rows = []
        for name in names:
            # the whole summary, wrapped, never cut to "...": it is what a newcomer reads first
            known = self.commands.get(name)
            text = (
                COMMANDS[name][2]
                if name in COMMANDS or known is None
                else known.get_short_help_str(10_000)
            )
            rows.append((name, text))
        with formatter.section("Commands"):
            formatter.write_dl(rows)

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

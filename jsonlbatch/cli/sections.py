"""`--help` in sections: a command's options grouped by what they are for, then examples.

`exec --help` has about 70 options; one flat list hides the five a first run needs. A command
made with `cls=Sectioned` names its sections (title and option names, in order) and a few
example command lines; options no section names are listed last, so a new option is never
lost from the help. An unknown option is answered with the options it begins (`--temp`:
`--temperature`, `--template`) before click's guesses by similarity.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

Section = tuple[str, Sequence[str]]


class Sectioned(click.Command):
    """A click command whose help lists its options in `sections`, then `examples`."""

    def __init__(
        self,
        *args: Any,
        sections: Sequence[Section] = (),
        examples: Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.sections = tuple(sections)
        self.examples = tuple(examples)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        records: dict[str, tuple[str, str]] = {}
        for param in self.get_params(ctx):
            if not isinstance(param, click.Option):  # arguments are in the usage line
                continue
            record = param.get_help_record(ctx)
            if record is not None and param.name is not None:
                records[param.name] = record
        for title, names in self.sections:
            rows = [records.pop(name) for name in names if name in records]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)
        if records:
            with formatter.section("Other options" if self.sections else "Options"):
                formatter.write_dl(list(records.values()))

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if self.examples:
            with formatter.section("Examples"):
                for line in self.examples:  # command lines: as written, never re-wrapped
                    formatter.write(f"{'':>{formatter.current_indent}}{line}\n")
        super().format_epilog(ctx, formatter)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            begun = begun_options(self, ctx, exc.option_name)
            if not begun:
                raise
            shown = ", ".join(repr(name) for name in begun)
            raise click.NoSuchOption(
                exc.option_name,
                f"No such option {exc.option_name!r}. Did you mean {shown}?",
                ctx=ctx,
            ) from None


def begun_options(command: click.Command, ctx: click.Context, typed: str) -> list[str]:
    """The long options of `command` that `typed` is the beginning of (`--temp`)."""
    if not typed.startswith("--") or len(typed) < 4:
        return []
    names = [
        name
        for param in command.get_params(ctx)
        for name in (*param.opts, *param.secondary_opts)
        if name.startswith(typed) and name != typed
    ]
    return sorted(names, key=len)[:4]

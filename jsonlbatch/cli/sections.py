"""`--help` in sections: a command's options grouped by what they are for, then examples.

`exec --help` has about 70 options; one flat list hides the five a first run needs. A command
made with `cls=Sectioned` names its sections (title and option names, in order) and a few
example command lines; options no section names are listed last, so a new option is never
lost from the help. An unknown option is answered with the options it begins (`--temp`:
`--temperature`, `--template`), else with the option it is a choice of (`--html`: `--format
html`), before click's guesses by similarity.

A command with many tuning knobs names its `brief` options: `--help` shows only those, and
`--help-all` (added then) shows every option. The others stay hidden, not removed: they work
on the command line and in a settings file (`jsonlbatch/cli/settings.py`). An old spelling kept
for one release is a `Deprecated` option: hidden, and noted on stderr when used.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import click
from click.core import ParameterSource

Section = tuple[str, Sequence[str]]

#: `ctx.meta` key of the line naming the settings file `$JSONLBATCH_CONFIG` applied (set by
#: `cli/settings.py`, which imports this module; shown by `Sectioned.settled`).
SETTINGS_NOTE = "jsonlbatch.settings_note"


class Sectioned(click.Command):
    """A click command whose help lists its options in `sections`, then `examples`."""

    def __init__(
        self,
        *args: Any,
        sections: Sequence[Section] = (),
        examples: Sequence[str] = (),
        brief: Sequence[str] | None = None,
        settle: Callable[[click.Context], None] | None = None,
        **kwargs: Any,
    ) -> None:
        """`brief`: the options `--help` shows (None: all); `settle`: turns the parsed values
        into what the command's function takes (old spellings folded into new ones)."""
        super().__init__(*args, **kwargs)
        self.sections = tuple(sections)
        self.examples = tuple(examples)
        self.settle = settle
        if brief is not None:
            shown = {*brief, "help_all"}
            self.params.append(
                click.Option(
                    ["--help-all"],
                    is_flag=True,
                    expose_value=False,
                    is_eager=True,
                    callback=_help_all,
                    help="Show every option, the tuning knobs --help leaves out too.",
                )
            )
            for param in self.params:
                if isinstance(param, click.Option) and param.name not in shown:
                    param.hidden = True

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        every = bool(ctx.meta.get(_HELP_ALL))
        records: dict[str, tuple[str, str]] = {}
        for param in self.get_params(ctx):
            if not isinstance(param, click.Option):  # arguments are in the usage line
                continue
            if every and param.hidden:  # the record of a hidden option, as if it were shown
                param = copy.copy(param)
                param.hidden = False
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
        if not every and any(
            p.hidden
            for p in self.params
            if isinstance(p, click.Option) and not isinstance(p, Deprecated)
        ):
            formatter.write_paragraph()
            formatter.write_text(
                "More options (tuning knobs) are listed by --help-all; they can also be set "
                "in a settings file (--config)."
                if any(p.name == "config" for p in self.params)
                else "More options are listed by --help-all."
            )

    def invoke(self, ctx: click.Context) -> Any:
        self.settled(ctx)
        return super().invoke(ctx)

    def settled(self, ctx: click.Context, given: tuple[ParameterSource, ...] = ()) -> None:
        """The parsed values made final: a note for each deprecated spelling used (on the
        command line, in the environment, or in `given` sources: the library's options), and
        the command's `settle`. `invoke` calls it; so does `cli/library.py`, which parses
        without invoking."""
        note = ctx.meta.pop(SETTINGS_NOTE, None)  # which settings file $JSONLBATCH_CONFIG applied
        if note is not None and not ctx.params.get("quiet"):
            click.echo(note, err=True)
        sources = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT, *given)
        for param in self.params:
            if isinstance(param, Deprecated) and ctx.get_parameter_source(str(param.name)) in (
                sources
            ):
                param.note(ctx)
        if self.settle is not None:
            self.settle(ctx)

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
            begun = begun_options(self, ctx, exc.option_name) or chosen_options(
                self, ctx, exc.option_name
            )
            if not begun:
                raise
            shown = ", ".join(repr(name) for name in begun)
            raise click.NoSuchOption(
                exc.option_name,
                f"No such option {exc.option_name!r}. Did you mean {shown}?",
                ctx=ctx,
            ) from None


class Deprecated(click.Option):
    """An old spelling kept for one release so users' scripts go on working: hidden from
    `--help`, listed by `--help-all`, and noted on stderr when used (a note, not a Python
    warning: no traceback, no warnings filter to set). `instead` is what to write now."""

    def __init__(self, *args: Any, instead: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", f"Use {instead} instead.")
        kwargs["hidden"] = True
        super().__init__(*args, **kwargs)
        self.instead = instead

    def note(self, ctx: click.Context) -> None:
        click.echo(
            f"Note: {self.opts[0]} is deprecated and goes in the next release; use {self.instead}.",
            err=True,
        )


#: `ctx.meta` key set while `--help-all` renders the help.
_HELP_ALL = "jsonlbatch.help_all"


def _help_all(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    ctx.meta[_HELP_ALL] = True
    click.echo(ctx.get_help(), color=ctx.color)
    ctx.exit()


def chosen_options(command: click.Command, ctx: click.Context, typed: str) -> list[str]:
    """`--html` where `--format html` is meant: the options that take `typed`'s name as one of
    their choices, written with it (`report --html` -> `--format html`)."""
    if not typed.startswith("--"):
        return []
    value = typed[2:]
    return [
        f"{param.opts[0]} {value}"
        for param in command.get_params(ctx)
        if isinstance(param, click.Option)
        and isinstance(param.type, click.Choice)
        and value in param.type.choices
        and not param.hidden
    ]


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

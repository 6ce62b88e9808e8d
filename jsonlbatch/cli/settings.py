"""Settings files: a command's options written once in a file (`--config FILE`, or
`$JSONLBATCH_CONFIG`) instead of on every command line.

`exec` has some 70 options; `--help` shows the thirty a run is made of, and the tuning knobs
(routing thresholds, the order window, body caps, the stall timeout, backoff, cache details...)
live in a settings file. The file becomes click's `default_map`, so the precedence is click's
own: the command line, then an environment variable, then the file, then the built-in default.

```yaml
exec:                      # one mapping per command (`exec`, `serve`)
  order-window: 64         # an option's long name without its dashes
  stream-stall-timeout: 120
  url: [http://node1:8000/v1, http://node2:8000/v1]
serve:
  backend: vllm
  server-arg: [--max-num-seqs=512]
```

The file is hostile input like any other: an unknown command or key is an error naming the
file, the line and the key, with the nearest known key; a value of the wrong type (`"64"` for a
count, `yes` for a path) or out of range is an error naming its line too; all problems at once,
nothing run. It is read with `jsonlbatch.file_io.filecheck` (YAML's safe loader, or JSON; duplicated
keys and alias bombs refused).
"""

from __future__ import annotations

import difflib
import importlib
import os
import stat
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from jsonlbatch.cli.params import ByteSize, CacheDir, CountOrAuto
from jsonlbatch.cli.sections import SETTINGS_NOTE, Deprecated
from jsonlbatch.errors import InputError
from jsonlbatch.file_io.filecheck import ANY, BOOL, INT, NUM, STR, FileChecker, kind_of
from jsonlbatch.redact import register_secret

_F = TypeVar("_F", bound=Callable[..., Any])

#: Environment variable naming a settings file for every command that reads one.
ENV_VAR = "JSONLBATCH_CONFIG"
#: The commands that read a section of the settings file (the top-level keys it may have).
COMMANDS = ("exec", "serve")
#: Options that are never settings: the run's own output, and those about the file itself.
_NOT_SETTINGS = {"output", "config", "help_all"}


def settings_option(command: str) -> Callable[[_F], _F]:
    """Add `--config FILE` (and `$JSONLBATCH_CONFIG`) to a click command: the file's
    `command:` section becomes the defaults of the command's options."""
    assert command in COMMANDS, command

    def load(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        if value is None or ctx.resilient_parsing:
            return
        from_env = ctx.get_parameter_source("config") is ParameterSource.ENVIRONMENT
        what = f"settings file (${ENV_VAR})" if from_env else "settings file"
        settings = read_settings(value, command, ctx.command, ctx, what=what)
        if from_env:  # a file nobody named on this command line: say which one applies
            ctx.meta[SETTINGS_NOTE] = f"settings: {value} (from ${ENV_VAR})"
        # what a caller already set as defaults (the library's options: `cli/library.py`)
        # wins over the file, as the command line does
        ctx.default_map = {**settings, **(ctx.default_map or {})}

    return click.option(
        "--config",
        type=click.Path(dir_okay=False),
        envvar=ENV_VAR,
        show_envvar=True,
        is_eager=True,  # read before the other options take their defaults
        expose_value=False,
        callback=load,
        metavar="FILE",
        help=f"Settings file (YAML or JSON): its `{command}:` keys set options' defaults; "
        "the command line wins (docs/exec.md#settings-file).",
    )


def setting_keys(command: click.Command) -> dict[str, click.Option]:
    """Key -> option: each option by its long names without the dashes (`order-window`, `url`,
    `backoff`; `serve` and `backend`). Deprecated spellings are not keys: a settings file is
    new."""
    keys = {}
    for param in command.params:
        if not isinstance(param, click.Option) or isinstance(param, Deprecated):
            continue
        if param.name in _NOT_SETTINGS or not param.expose_value:
            continue
        for name in param.opts:
            if name.startswith("--"):
                keys[name[2:]] = param
    return keys


def read_settings(
    path: str,
    section: str,
    command: click.Command,
    ctx: click.Context,
    *,
    what: str = "settings file",
) -> dict[str, Any]:
    """The `section` of the settings file at `path` as a `default_map` (parameter name ->
    value), every key and value checked; `InputError` listing every problem otherwise."""
    _plain_file(path, what)
    checker = FileChecker(path)
    data = checker.load(what)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        checker.problem(
            (), f"must be a mapping of command: settings (exec: ...), got {kind_of(data)}"
        )
        checker.raise_problems(what)
    for key in data:
        if key not in COMMANDS:
            _unknown(checker, (key,), COMMANDS, "the commands that read settings")
    body = data.get(section)
    if body is None:  # `exec:` alone, or a file for other commands
        body = {}
    if not isinstance(body, dict):
        checker.problem((section,), f"must be a mapping of option: value, got {kind_of(body)}")
        body = {}
    out = _section(checker, section, body, command, ctx)
    for other in COMMANDS:  # the file's other sections are checked too: a typo there is
        if other != section and isinstance(data.get(other), dict):  # found now, not later
            _section(checker, other, data[other], _command(other), ctx)
        elif other != section and data.get(other) is not None:
            checker.problem((other,), f"must be a mapping of option: value, got {kind_of(data[other])}")  # fmt: skip
    checker.raise_problems(what)
    return out


def _section(
    checker: FileChecker,
    section: str,
    body: dict[str, Any],
    command: click.Command,
    ctx: click.Context,
) -> dict[str, Any]:
    """One command's section as a `default_map`; its problems go to `checker`."""
    keys = setting_keys(command)
    out: dict[str, Any] = {}
    for key, value in body.items():
        option = keys.get(key)
        if option is None:
            owners = _owners(str(key), section)
            if owners:
                checker.problem((section, key), owners)
            else:
                _unknown(
                    checker, (section, key), keys, f"`{section} --help-all` lists every option"
                )
            continue
        if option.name in out:
            checker.problem((section, key), f"sets {option.opts[0]} again (another spelling)")
            continue
        checked = _typed(checker, (section, key), option, value, ctx)
        if checked is not _BAD:
            out[str(option.name)] = checked
    return out


def _command(name: str) -> click.Command:
    """The click command `name` (the command table's entry, imported now)."""
    from jsonlbatch.cli import COMMANDS as TABLE

    module, attribute, _ = TABLE[name]
    command: click.Command = getattr(importlib.import_module(module), attribute)
    return command


def _owners(key: str, section: str) -> str:
    """For a key `section`'s command does not have: which other command's option it is, as
    the problem to show ("" when none has it). Every command is looked at (imported): this
    is the path of a mistake only."""
    from jsonlbatch.cli import COMMANDS as TABLE

    flag = "--" + key.lstrip("-")
    if any(flag in p.opts for p in _command(section).params if isinstance(p, click.Option)):
        return ""  # the section's own option that is no setting (a deprecated spelling)
    for name in TABLE:
        if name == section:
            continue
        command = _command(name)
        subcommands = command.commands if isinstance(command, click.Group) else {}
        for label, each in [(name, command), *((f"{name} {n}", c) for n, c in subcommands.items())]:
            if any(flag in p.opts for p in each.params if isinstance(p, click.Option)):
                if name in COMMANDS:
                    return f"not an option of `{section}`: {key} is a `{label}` option; put it under `{name}:`"
                return (
                    f"not an option of `{section}`: {key} is a `{label}` option, and `{name}` "
                    "reads no settings file: give it on its command line"
                )
    return ""


#: A settings file holds a few dozen lines; anything much larger is not one (`/dev/zero`).
MAX_BYTES = 1 << 20


def _plain_file(path: str, what: str) -> None:
    """Refuse what is no settings file before reading it: a FIFO would hang the command,
    `/dev/zero` fill its memory."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{what} {path} is not a regular file")
    if info.st_size > MAX_BYTES:
        raise InputError(f"{what} {path} is larger than {MAX_BYTES >> 20} MiB: not a settings file")


def _unknown(
    checker: FileChecker, at: tuple[str, ...], known: Sequence[str] | dict[str, Any], see: str
) -> None:
    """An unknown key, with the nearest known one (`order_window`: `order-window`)."""
    names = list(known)
    near = difflib.get_close_matches(at[-1].replace("_", "-").lstrip("-"), names, n=1)
    shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
    hint = f"did you mean {near[0]!r}?" if near else f"known: {shown}"
    checker.problem(at, f"unknown key; {hint} ({see})")


_BAD = object()
#: Options whose values are secrets: never quoted in a problem, masked once read.
SECRETS = frozenset({"api_key", "headers", "server_api_key", "upstream_api_key"})


def _kind(option: click.Option) -> str:
    """The YAML kind a value of `option` must have before click converts it (click would take
    the string "64" for a count, or "no" for a flag, as `true`)."""
    if option.is_flag or option.is_bool_flag:
        return BOOL
    kind = option.type
    if isinstance(kind, (CountOrAuto, ByteSize)):
        return ANY  # a number, or a string (auto, 64MiB): click's convert tells
    if isinstance(kind, click.types.IntParamType):
        return INT
    if isinstance(kind, click.types.FloatParamType):
        return NUM
    if isinstance(kind, click.types.BoolParamType):
        return BOOL
    return STR


def _path(checker: FileChecker, item: str) -> str:
    """A path in the file: `~` expanded, and relative to the file's own folder (as in the
    fleet and experiment files), so the file works from any directory."""
    if item == CacheDir.OFF:
        return item
    return os.path.join(checker.base, os.path.expanduser(item))


def _takes_on_off(option: click.Option, value: bool) -> bool:
    kind = option.type
    return (isinstance(kind, CacheDir) and not value) or (
        isinstance(kind, click.Choice) and {"on", "off"} <= set(map(str, kind.choices))
    )


def _typed(
    checker: FileChecker, at: tuple[str, ...], option: click.Option, value: Any, ctx: click.Context
) -> Any:
    kind = _kind(option)
    if kind == STR and isinstance(value, bool) and _takes_on_off(option, value):
        value = "on" if value else "off"  # YAML 1.1 reads an unquoted on/off as a boolean
    items = value if option.multiple and isinstance(value, list) else [value]
    if str(option.name) in SECRETS:
        for item in items:
            if isinstance(item, str):
                register_secret(item)  # masked in every message from here on
            else:  # not quoted back: it is a key, whatever its type
                # "(secret)" is what the masking of `api-key: ...` eats, not the message
                checker.problem(at, f"(secret) must be a string, got {kind_of(item)}")
                return _BAD
    for item in items:
        if kind == ANY and isinstance(item, (int, float, str)) and not isinstance(item, bool):
            continue
        if kind != ANY and checker.typed(item, at, kind) is not None:
            continue
        if kind == ANY:
            checker.problem(at, f"must be a number or a string, got {kind_of(item)} {item!r}")
        return _BAD
    if isinstance(option.type, click.Path):
        items = [_path(checker, item) for item in items]
    value = tuple(items) if option.multiple else items[0]
    try:
        return option.type_cast_value(ctx, value)
    except click.BadParameter as exc:
        checker.problem(at, exc.message)
        return _BAD

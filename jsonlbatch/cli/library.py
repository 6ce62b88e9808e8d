"""`jsonlbatch.execute` / `aexecute`: everything `jsonlbatch exec` does, from Python, with its
option names (dashes as underscores).

    summary = jsonlbatch.execute("in.jsonl", "out.jsonl", serve="mock", cache="cache/", reask=2)
    summary.results["q-17"].value        # typed answers by custom_id (exec/output/run_outcome.py)

The options go through the command's own parameters (click's types, ranges, choices and
defaults, written once there), then through the same `spec_from_params` the command uses, and
the `RunSpec` it returns is started by the same `exec.front_door.start`: a Python run and a command
line run are one run. An unknown option name is a `UsageError` naming the nearest one; an option
the run's kind does not use is refused in the command's words (`cli/option_use.py`; the options
given here count as given, though click sees them as a `default_map`); a value of the wrong
Python type is refused before it is converted (`cli/python_values.py`: `timeout=True` is no
second). These are the one public `execute`/`aexecute` (`jsonlbatch.exec.execute` is a
deprecated alias); they live under `cli/` because their options are the command's parameters.

Values take their Python forms as well as the command line's: a list or a single string for an
option that repeats (`url=`, `served_model_name=`), a mapping for `headers=`, True/False for
`rate_limits=`, a `(k, n)` pair for `shard=`, a `cost.Price` for `price=`, paths as `Path`s;
`None` is "not given".
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Callable, Mapping
from typing import Any

import click
from click.core import ParameterSource

from jsonlbatch.cli.option_use import GIVEN
from jsonlbatch.cli.python_values import check_field, check_value
from jsonlbatch.cli.sections import Sectioned
from jsonlbatch.errors import UsageError
from jsonlbatch.exec.exec_options import ExecOptions
from jsonlbatch.exec.front_door import RunSpec, astart, start
from jsonlbatch.exec.hooks.seams import Seams
from jsonlbatch.pricing.cost import Price

#: The command's positional parameters: given as `requests` and `output`, never as options.
_POSITIONAL = ("requests", "output")
#: Parameters that print and exit, not options of a run.
_NOT_OPTIONS = ("help", "help_all")


def _command() -> Sectioned:
    from jsonlbatch.cli.exec import exec_

    assert isinstance(exec_, Sectioned)
    return exec_


def _names(command: click.Command) -> dict[str, tuple[str, bool]]:
    """Every accepted option name -> (the parameter it sets, whether it negates a flag): the
    parameter's own name and each spelling of the option (`--url` -> `url`, `--serve` ->
    `serve`, `--no-schema-check` -> schema_check negated)."""
    names: dict[str, tuple[str, bool]] = {}
    for param in command.params:
        if param.name is None or param.name in _POSITIONAL or param.name in _NOT_OPTIONS:
            continue
        names[param.name] = (param.name, False)
        for opt in param.opts:
            if opt.startswith("--"):
                names.setdefault(opt[2:].replace("-", "_"), (param.name, False))
        for opt in param.secondary_opts:
            if opt.startswith("--"):
                names.setdefault(opt[2:].replace("-", "_"), (param.name, True))
    return names


def _value(param: click.Parameter, value: Any) -> Any:
    """A Python value in the form the command line's parameter takes."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if param.name in ("headers", "batch_metadata") and isinstance(value, Mapping):
        return [f"{k}={v}" for k, v in value.items()]
    if param.name == "rate_limits" and isinstance(value, bool):
        return "on" if value else "off"
    if param.name == "shard" and isinstance(value, tuple):
        k, n = value
        return f"{k}/{n}"
    if param.name == "view_address" and isinstance(value, tuple):  # checked as text, as typed
        host, port = value
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    if param.name == "price" and isinstance(value, Price):
        text = f"in={value.input_per_m},out={value.output_per_m}"
        if value.cached_input_per_m is not None:
            text += f",cached={value.cached_input_per_m}"
        if value.cache_write_per_m is not None:
            text += f",write={value.cache_write_per_m}"
        return text
    if param.multiple and (isinstance(value, (str, bytes)) or not hasattr(value, "__iter__")):
        return [value]
    if param.multiple:
        return [os.fspath(v) if isinstance(v, os.PathLike) else v for v in value]
    return value


def build_spec(
    requests: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    seams: Seams | None = None,
    watchdog: Callable[[], None] | None = None,
    **options: Any,
) -> RunSpec:
    """The `RunSpec` of `jsonlbatch exec REQUESTS -o OUTPUT --option value ...`."""
    for name, path in (("requests", requests), ("output", output)):
        if not isinstance(path, (str, os.PathLike)):
            raise UsageError(f"{name} wants a path (str or os.PathLike), got {type(path).__name__}")
    if seams is not None and not isinstance(seams, Seams):
        raise UsageError(f"seams wants a jsonlbatch.Seams, got {type(seams).__name__}")
    if watchdog is not None and not callable(watchdog):
        raise UsageError(
            f"watchdog wants a function of no arguments, got {type(watchdog).__name__}"
        )
    command = _command()
    names = _names(command)
    by_param = {p.name: p for p in command.params}
    given: dict[str, Any] = {}
    # `ExecOptions` fields that have no option (grace, ...): the library may set them too
    unflagged = {f.name: f for f in dataclasses.fields(ExecOptions) if f.name not in by_param}
    extra = {name: options.pop(name) for name in list(options) if name in unflagged}
    for name, value in extra.items():
        check_field(unflagged[name], value)
    for name, value in options.items():
        if name not in names:
            near = difflib.get_close_matches(name, [*names, *unflagged], n=1, cutoff=0.6)
            hint = f": did you mean {near[0]!r}?" if near else " (see `jsonlbatch exec --help-all`)"
            raise UsageError(f"unknown option {name!r}{hint}")
        param_name, negate = names[name]
        if param_name in given:
            raise UsageError(f"option {name!r} is given twice (as {param_name!r} too)")
        param = by_param[param_name]
        if value is None:  # Python's "not given": the option's default (or a settings file's)
            continue
        check_value(name, param, value)  # its type, before click converts it
        given[param_name] = (not value) if negate else _value(param, value)
    args = [os.fspath(requests), "-o", os.fspath(output)]
    try:
        ctx = command.make_context("exec", args, default_map=given)
    except click.ClickException as exc:
        raise UsageError(exc.format_message()) from None
    from jsonlbatch.cli.exec_spec import spec_from_params

    ctx.meta[GIVEN] = frozenset(given)  # the caller's, though click sees a default_map
    with ctx:
        command.settled(ctx, given=(ParameterSource.DEFAULT_MAP,))
        params = dict(ctx.params)
        spec = spec_from_params(params.pop("requests"), params.pop("output"), params, seams)
    if extra:
        spec = dataclasses.replace(spec, options=dataclasses.replace(spec.options, **extra))
    if watchdog is not None:
        spec = dataclasses.replace(spec, watchdog=watchdog)
    return spec


def execute(
    requests: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    seams: Seams | None = None,
    watchdog: Callable[[], None] | None = None,
    handle_signals: bool = True,
    **options: Any,
) -> Any:
    """Run what `jsonlbatch exec` would run with these options, to its end, and return its
    summary (`RunSummary`; a Batch API run's `SubmitSummary`; `dry_run=True`: the count),
    whose `results` are the answers by custom_id. Raises the package's errors as the command
    does (`Interrupted` with `.summary` on Ctrl-C); the same call again resumes."""
    from jsonlbatch.exec.job import refuse_running_loop

    refuse_running_loop("jsonlbatch.execute", "jsonlbatch.aexecute")  # before the output lock
    if not isinstance(handle_signals, bool):
        raise UsageError(f"handle_signals wants True or False, got {type(handle_signals).__name__}")
    spec = build_spec(requests, output, seams=seams, watchdog=watchdog, **options)
    outcome = start(spec, handle_signals=handle_signals)
    return outcome.dry if outcome.dry is not None else outcome.summary


async def aexecute(
    requests: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    seams: Seams | None = None,
    watchdog: Callable[[], None] | None = None,
    **options: Any,
) -> Any:
    """`execute` inside a running event loop (a notebook): the run goes on in a worker thread,
    and cancelling the awaiting task stops it cleanly (exec/front_door.py's `astart`)."""
    outcome = await astart(build_spec(requests, output, seams=seams, watchdog=watchdog, **options))
    return outcome.dry if outcome.dry is not None else outcome.summary

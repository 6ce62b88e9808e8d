"""Which `exec` options each kind of run uses: one table, and the one check built on it.

A run goes to one target (exec/front_door.py): URLs already running, servers launched for it
(`--serve`), a fleet (`--fleet`), an endpoints file (`--endpoints`) or a provider's Batch API
(`--batch-api`). An option the chosen target does not use would be accepted and silently do
nothing (`--rpm` with `--batch-api`, `--poll-interval` without it), so `check_use` refuses it
when the caller gave it (on the command line, or as an argument of `jsonlbatch.execute`: the
same refusal, in the same words), and when it comes from a settings file, which holds defaults
for every kind of run, notes it once and leaves it out. A value equal to the option's default
changes nothing, so it is never refused. `tests/test_option_parity.py` runs every option of
the command both ways against this table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click
from click.core import ParameterSource

from jsonlbatch.cli.batch_options import BATCH_NAMES
from jsonlbatch.cli.exec_watch import WATCH_NAMES
from jsonlbatch.cli.serve_options import FLEET_NAMES, SERVE_NAMES
from jsonlbatch.errors import UsageError

URLS, LAUNCH, FLEET, ENDPOINTS, BATCH = "urls", "launch", "fleet", "endpoints", "batch"
#: Every target that sends from this machine.
LIVE = frozenset({URLS, LAUNCH, FLEET, ENDPOINTS})
EVERY = LIVE | {BATCH}

#: Parameter name -> the targets that use it. Options not named here are used by every live
#: target (the sending, routing, retry and cache knobs); see `uses`.
_TABLE: dict[str, frozenset[str]] = {
    # what the run is, and what a provider's batch run uses too
    **dict.fromkeys(
        ("model", "api_key", "headers", "max_retries", "retry_failed", "changed", "quiet",
         "price", "max_cost", "schema_check"),
        EVERY,
    ),
    "urls": frozenset({URLS, LAUNCH, BATCH}),  # a fleet's and an endpoints file's come from it
    "fleet": frozenset({FLEET}),
    "endpoint_files": frozenset({ENDPOINTS}),
    **dict.fromkeys(SERVE_NAMES, frozenset({LAUNCH})),
    **dict.fromkeys(FLEET_NAMES, frozenset({LAUNCH, FLEET})),
    "ready_timeout": LIVE,  # waits for servers; a batch API's calls have --max-retries
    **dict.fromkeys(BATCH_NAMES, frozenset({BATCH})),
    **dict.fromkeys(WATCH_NAMES, LIVE),
}  # fmt: skip
#: Parameters that are about the command itself, not a run: never refused.
_ALWAYS = frozenset({"requests", "output", "config", "help_all"})
#: `ctx.meta` key: the parameters `jsonlbatch.execute` was given (cli/library.py). They reach
#: click as `default_map` entries, as a settings file's do; they are the caller's all the same.
GIVEN = "jsonlbatch.given"


def uses(name: str) -> frozenset[str]:
    """The targets that use the parameter `name`."""
    if name in _ALWAYS:
        return EVERY
    return _TABLE.get(name, LIVE)


def target_of(params: Mapping[str, Any]) -> str:
    """The kind of run exec's parameters ask for (conflicts are refused by `spec_from_params`)."""
    if params.get("batch_api"):
        return BATCH
    if params.get("endpoint_files"):
        return ENDPOINTS
    if params.get("fleet"):
        return FLEET
    if params.get("backend"):
        return LAUNCH
    return URLS


def given_by_caller(ctx: click.Context, name: str) -> bool:
    """Whether the caller set `name` for this run: on the command line, or as an argument of
    `jsonlbatch.execute` (not a settings file, an environment variable or a default)."""
    return ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE or name in ctx.meta.get(
        GIVEN, ()
    )


#: The options that choose a run's kind (`target_of`).
_KINDS = ("batch_api", "endpoint_files", "fleet", "backend")


def settle_kind(ctx: click.Context, command: click.Command, params: dict[str, Any]) -> None:
    """The caller chooses the kind of run over a settings file, as for any option: a file's
    `fleet:`, `endpoints:`, `serve:` or `batch-api:` is left out, noted once, when the caller
    chose another kind (`--serve`, `--fleet`, ...), and a file's fleet or endpoints when the
    caller gave `--url` (a file's `serve:` or `batch-api:` takes the URLs: documented runs).
    Before this, the file's fleet made the caller's `--url` an error (`params` is changed)."""
    chosen = [n for n in _KINDS if params.get(n) and given_by_caller(ctx, n)]
    urls = bool(params.get("urls")) and given_by_caller(ctx, "urls")
    if not chosen and not urls:
        return
    left_out = []
    for param in command.params:
        name = param.name
        if name not in _KINDS or name in chosen or not params.get(name):
            continue
        if given_by_caller(ctx, name) or ctx.get_parameter_source(name) is not (
            ParameterSource.DEFAULT_MAP
        ):
            continue  # the caller's own (refused as two kinds later), or the environment's
        if not chosen and name not in ("fleet", "endpoint_files"):
            continue
        left_out.append(_flag(param))
        params[name] = _defaults(command).get(name)
    if left_out and not params.get("quiet"):
        click.echo(
            f"note: {', '.join(left_out)} from the settings file: the command line chose "
            "another kind of run: left out",
            err=True,
        )


def check_use(ctx: click.Context, command: click.Command, params: dict[str, Any]) -> None:
    """Refuse each option the caller gave that the run's target does not use; set each such
    option from a settings file back to its default, noted once (`params` is changed)."""
    target = target_of(params)
    from_file = []
    defaults: dict[str, Any] | None = None
    for param in command.params:
        name = param.name
        if name is None or name not in params or target in uses(name):
            continue
        if defaults is None:
            defaults = _defaults(command)
        if _is_default(param, params[name], defaults):
            continue
        if given_by_caller(ctx, name):
            raise UsageError(_refusal(param, target))
        if ctx.get_parameter_source(name) is ParameterSource.DEFAULT_MAP:
            from_file.append(_flag(param))
        params[name] = defaults.get(name)  # an environment variable: left alone, silently
    if from_file and not params.get("quiet"):
        click.echo(
            f"note: {', '.join(from_file)} from the settings file "
            f"{'do' if len(from_file) > 1 else 'does'} nothing for {_run_name(target)}: left out",
            err=True,
        )


#: Why an option does not go with a provider's batch, where the reason is not plain.
_NOT_IN_A_BATCH = {
    "files_dir": "a code interpreter's container expires 20 minutes after its last use, long "
    "before a batch's results arrive, so its files could not be collected (docs/files.md); "
    "run it directly",
}


def _refusal(param: click.Parameter, target: str) -> str:
    flag, users = _flag(param), uses(str(param.name))
    if target == BATCH:
        why = _NOT_IN_A_BATCH.get(str(param.name))
        return f"{flag} does not go with --batch-api" + (f": {why}" if why else "")
    if param.name == "urls":
        return "--url goes with --serve or alone: a fleet's URLs come from its file"
    if users == {BATCH}:
        return f"{flag} is a Batch API option: it needs --batch-api"
    if target == FLEET:
        return (
            f"{flag} describes one model: with --fleet, each model's options go in the fleet file"
        )
    return f"{flag} is a server option: it needs --serve mock|vllm|sglang"


def _run_name(target: str) -> str:
    return {
        URLS: "a run on --url servers",
        LAUNCH: "a --serve run",
        FLEET: "a --fleet run",
        ENDPOINTS: "an --endpoints run",
        BATCH: "a --batch-api run",
    }[target]


def _flag(param: click.Parameter) -> str:
    """The option as a user writes it (`--serve`, `--no-schema-check` when negated)."""
    longs = [o for o in param.opts if o.startswith("--")]
    return longs[0] if longs else param.opts[0]


def _defaults(command: click.Command) -> dict[str, Any]:
    """Every parameter's own default as click gives it (no settings file, no caller's value),
    from a context parsed with nothing but the two files."""
    ctx = command.make_context("exec", ["-", "-o", "-"], resilient_parsing=True)
    return dict(ctx.params)


def _is_default(param: click.Parameter, value: Any, defaults: Mapping[str, Any]) -> bool:
    default = defaults.get(str(param.name))
    if param.multiple:
        return tuple(value or ()) == tuple(default or ())
    return bool(value == default)

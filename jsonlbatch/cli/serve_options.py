"""The server-launch options shared by `jsonlbatch serve` and `jsonlbatch exec --serve`.

Names follow the servers' own where they agree (`--tp-size`, `--dp-size`, `--model-path`,
`--reasoning-parser`), with vLLM's long names as aliases. Options whose plain name would be
ambiguous next to `exec`'s client options carry a `server-` prefix (`--server-api-key`,
`--server-seed`). `--ready-timeout` is read, not defined here: `exec` already has one with the
same meaning.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from jsonlbatch.cli.params import Finite, NonEmpty, ShellWords
from jsonlbatch.errors import UsageError
from jsonlbatch.serve.backends import BACKEND_NAMES, DP_MODES, ServeOptions

_F = TypeVar("_F", bound=Callable[..., Any])

_FIELDS = {field.name: field.default for field in fields(ServeOptions)}
#: Parameter name -> default, to tell "given" from "left alone" when there is no --serve; the
#: options' defaults too, so each is written once (in `ServeOptions`).
_DEFAULTS: dict[str, Any] = {
    "backend": None,
    **{name: _FIELDS[name] for name in ("model_path", "served_model_name", "tp_size", "dp_size",
                                        "dp_mode", "gpus", "host", "port")},
    "server_api_key": _FIELDS["api_key"],
    **{name: _FIELDS[name] for name in ("gpu_memory_utilization", "context_length",
                                        "chat_template", "reasoning_parser", "tool_call_parser",
                                        "seed", "server_args", "executable", "restart", "log_dir",
                                        "ray", "ray_address")},
}  # fmt: skip

_OPTIONS = [
    click.option(
        "--serve",
        "--backend",
        "backend",
        type=click.Choice(BACKEND_NAMES),
        help="Server to launch: the built-in mock, vLLM or SGLang (always stopped when jsonlbatch ends).",
    ),
    click.option(
        "--model-path", type=NonEmpty(), metavar="PATH|HF_ID", help="Model the server loads."
    ),
    click.option(
        "--served-model-name",
        multiple=True,
        type=NonEmpty(),
        metavar="NAME",
        help="Name clients use for the model (default: the model path). vLLM takes several.",
    ),
    click.option(
        "--tp-size",
        "--tensor-parallel-size",
        "tp_size",
        type=click.IntRange(min=1),
        default=_DEFAULTS["tp_size"],
        show_default=True,
        help="GPUs per model copy (tensor parallelism).",
    ),
    click.option(
        "--dp-size",
        "--data-parallel-size",
        "dp_size",
        type=click.IntRange(min=1),
        default=_DEFAULTS["dp_size"],
        show_default=True,
        help="Model copies (data parallelism); uses TP x DP GPUs.",
    ),
    click.option(
        "--dp-mode",
        type=click.Choice(DP_MODES),
        default=_DEFAULTS["dp_mode"],
        show_default=True,
        help="native: one server with its own DP flag; replicas: DP servers on their own "
        "ports and GPUs, requests spread over them.",
    ),
    click.option(
        "--gpus",
        metavar="0,1,...",
        help="GPUs to use (default: CUDA_VISIBLE_DEVICES, else all that nvidia-smi lists).",
    ),
    click.option(
        "--host",
        type=NonEmpty(),
        default=_DEFAULTS["host"],
        show_default=True,
        help="Address the server binds (0.0.0.0 to serve other machines).",
    ),
    click.option(
        "--port",
        type=click.IntRange(1, 65535),
        help="First server port (default: a free one from 8000, 30000 for SGLang).",
    ),
    click.option(
        "--server-api-key",
        "server_api_key",
        envvar="JSONLBATCH_SERVER_API_KEY",
        show_envvar=True,
        help="Key the launched server requires (SGLang only takes it on its command line).",
    ),
    click.option(
        "--gpu-memory-utilization",
        "--mem-fraction-static",
        "gpu_memory_utilization",
        type=Finite(min=0, max=1, min_open=True),
        help="Share of GPU memory the server may take (lower it, e.g. 0.88, for MTP).",
    ),
    click.option(
        "--context-length",
        "--max-model-len",
        "context_length",
        type=click.IntRange(min=1),
        help="Longest prompt + completion, in tokens.",
    ),
    click.option("--chat-template", metavar="FILE", help="Chat template for the server."),
    click.option("--reasoning-parser", metavar="NAME", help="e.g. qwen3, deepseek-r1."),
    click.option("--tool-call-parser", metavar="NAME", help="Enables tool calls with this parser."),
    click.option("--server-seed", "seed", type=int, help="The server's random seed."),
    click.option(
        "--server-arg",
        "server_args",
        multiple=True,
        type=ShellWords(),
        metavar="ARG",
        help="Any other server flag, passed on as is: --server-arg=--max-num-seqs=512 (repeat).",
    ),
    click.option(
        "--server-executable",
        "executable",
        type=ShellWords(),
        metavar="CMD",
        help="Run this instead of `vllm` / `python -m sglang.launch_server`, e.g. a path or "
        "'python -m my.server'.",
    ),
    click.option(
        "--restart-server",
        "restart",
        type=click.IntRange(min=0),
        default=_DEFAULTS["restart"],
        show_default=True,
        help="Restart a server that dies mid-run up to N times (requests wait meanwhile).",
    ),
    click.option(
        "--ray",
        is_flag=True,
        help="Place each replica as a Ray actor on the cluster (RAY_ADDRESS, else a local one).",
    ),
    click.option(
        "--ray-address",
        metavar="ADDR",
        help="Join this Ray cluster (e.g. ray://head:10001 or head:6379); implies --ray.",
    ),
    click.option(
        "--server-log-dir",
        "log_dir",
        type=click.Path(file_okay=False),
        help="Directory for server logs (default: beside exec's output file; for serve, a new "
        "directory under the system's temp dir, named on stderr).",
    ),
]

#: The server-launch options' names, in the order `--help` lists them under "Server launch".
SERVE_NAMES = (*_DEFAULTS, "ready_timeout")


def serve_options(func: _F) -> _F:
    """Add the server-launch options to a click command."""
    for option in reversed(_OPTIONS):
        func = option(func)
    return func


def serve_options_from_kwargs(kwargs: dict[str, Any]) -> ServeOptions | None:
    """Take the server-launch options out of a command's kwargs (they are popped, so the rest
    can go on to the command's own code). None when no server is to be launched."""
    values = {name: kwargs.pop(name, default) for name, default in _DEFAULTS.items()}
    if values["backend"] is None:
        ctx = click.get_current_context(silent=True)
        given = [
            name
            for name, value in values.items()
            if value != _DEFAULTS[name]
            # a variable or a setting made for `serve` (or for runs that launch) is no mistake
            and (ctx is None or ctx.get_parameter_source(name) not in _NOT_GIVEN)
        ]
        if given:
            # the option that picks a backend is spelt as the command's own help shows it
            command = ctx.command.name if ctx is not None else "exec"
            launch = "--backend" if command == "serve" else "--serve"
            raise UsageError(
                f"{_flag(given[0])} is an option of a server `{command}` launches: it needs "
                f"{launch} mock|vllm|sglang"
            )
        return None
    values["api_key"] = values.pop("server_api_key")
    gpus = values.pop("gpus")
    args = values.pop("server_args")
    return ServeOptions(
        **values,
        gpus=tuple(gpus.split(",")) if gpus else None,
        server_args=tuple(a for item in args for a in shlex.split(item)),
        ready_timeout=kwargs.get("ready_timeout", ServeOptions.ready_timeout),
    )


#: Where a value comes from that the user did not give for this run.
_NOT_GIVEN = (ParameterSource.ENVIRONMENT, ParameterSource.DEFAULT_MAP)


def _flag(name: str) -> str:
    """The option as the user typed it (`server_api_key` is `--server-api-key`)."""
    ctx = click.get_current_context(silent=True)
    for param in ctx.command.params if ctx is not None else ():
        if param.name == name and param.opts:
            return param.opts[0]
    return "--" + name.replace("_", "-")


_FLEET_OPTIONS = [
    click.option(
        "--fleet",
        type=click.Path(dir_okay=False),
        metavar="FILE",
        help="Launch every model of this fleet file (YAML or JSON; see docs/serve.md).",
    ),
    click.option(
        "--node",
        type=NonEmpty(),
        help="With --fleet: launch only the models whose `node:` is this one.",
    ),
    click.option(
        "--advertise",
        type=NonEmpty(),
        metavar="HOST",
        help="With --fleet: the host name other machines reach a 0.0.0.0 server by (default: "
        "this host's name).",
    ),
]

#: Launch options that apply to a whole fleet, as defaults for entries that do not set them.
_FLEET_DEFAULTS = ("host", "restart", "ready_timeout", "log_dir", "ray", "ray_address")
#: The launch options a fleet run reads too (the defaults of every model in its file).
FLEET_NAMES = (*_FLEET_DEFAULTS, "gpus")


def fleet_options(func: _F) -> _F:
    """Add --fleet, --node and --advertise to a click command that has `serve_options`."""
    for option in reversed(_FLEET_OPTIONS):
        func = option(func)
    return func


def fleet_plan(
    path: str,
    kwargs: dict[str, Any],
    *,
    node: str | None,
    advertise: str | None,
    quiet: bool,
    log_stem: str | None = None,
    keep_going: bool = False,
) -> dict[str, Any]:
    """The fleet file and `serving_fleet`'s arguments from a command's kwargs (the launch
    options are popped; those that describe one model are a mistake beside --fleet)."""
    from jsonlbatch.serve.fleet import load_fleet

    gpus = kwargs.pop("gpus", None)
    defaults = {
        name: kwargs.pop(name, _DEFAULTS.get(name))
        for name in _FLEET_DEFAULTS
        if name != "ready_timeout"
    }
    defaults["ready_timeout"] = kwargs.get("ready_timeout", ServeOptions.ready_timeout)
    defaults["ray"] = bool(defaults["ray"] or defaults["ray_address"])
    given = {k: v for k, v in defaults.items() if v != _DEFAULTS.get(k, ServeOptions.ready_timeout)}
    try:
        options = serve_options_from_kwargs(kwargs)
    except UsageError as exc:
        raise UsageError(
            f"{exc}; with --fleet, each model's options go in the fleet file"
        ) from None
    if options is not None:
        raise UsageError("--serve/--backend describe one model: with --fleet, use the fleet file")
    return {
        "fleet": load_fleet(path),
        "quiet": quiet,
        "log_stem": log_stem,
        "node": node,
        "gpus": tuple(gpus.split(",")) if gpus else None,
        "defaults": given,
        "keep_going": keep_going,
        "advertise": advertise,
    }

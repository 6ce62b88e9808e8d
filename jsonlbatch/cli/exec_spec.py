"""The run an `exec` command line describes: its parameters, as click parsed them, made into one
`RunSpec` (exec/front_door.py). The command (`cli/exec.py`) and the library
(`jsonlbatch.execute`, `cli/library.py`) both come here, so a Python run and a command line run
are one run; what each kind of run uses is one table (`cli/option_use.py`).
"""

from __future__ import annotations

from typing import Any

import click

from jsonlbatch.cli.batch_options import batch_target, pop_batch_kwargs
from jsonlbatch.cli.exec_watch import pop_watch_kwargs
from jsonlbatch.cli.option_use import check_use, settle_kind
from jsonlbatch.cli.serve_options import fleet_plan, serve_options_from_kwargs
from jsonlbatch.errors import UsageError
from jsonlbatch.exec.exec_options import ExecOptions
from jsonlbatch.exec.front_door import EndpointsFiles, RunSpec, Target, Urls, Watcher
from jsonlbatch.exec.hooks.answer_cache import cache_dir_from
from jsonlbatch.exec.hooks.seams import Seams
from jsonlbatch.exec.prepare.shard import parse_shard
from jsonlbatch.pricing.cost import parse_price
from jsonlbatch.redact import register_secret
from jsonlbatch.serve.target import Fleet, Launch


def parse_headers(values: tuple[str, ...]) -> dict[str, str]:
    """`--header KEY=VALUE` items. Every value is a secret (registered at once); a malformed
    item is not quoted back, since it may be `Authorization: Bearer ...` written with a colon."""
    headers = {}
    for item in values:
        key, sep, value = item.partition("=")
        register_secret(value if sep else item)
        if not sep or not key.strip():
            raise UsageError("--header wants KEY=VALUE (the value is kept secret)")
        headers[key.strip()] = value
    return headers


def spec_from_params(
    requests: str, output: str, params: dict[str, Any], seams: Seams | None = None
) -> RunSpec:
    """The run `jsonlbatch exec` describes, from its parameters as click gives them (every
    option, defaults included): the one place where the modes (URLs, --serve, --fleet,
    --endpoints, --batch-api, --dry-run) and what does not go together are decided. The
    library's `execute(**options)` comes here too (`cli/library.py`); what each mode uses is
    one table (`cli/option_use.py`)."""
    kwargs = dict(params)
    ctx = click.get_current_context()
    settle_kind(ctx, ctx.command, kwargs)  # the caller's kind of run over the settings file's
    if sum(map(bool, (kwargs["fleet"], kwargs["endpoint_files"], kwargs["backend"]))) > 1:
        raise UsageError("give one of --serve, --fleet and --endpoints")
    check_use(ctx, ctx.command, kwargs)  # what the run's target does not use: refused
    urls: tuple[str, ...] = tuple(kwargs.pop("urls"))
    headers = parse_headers(tuple(kwargs.pop("headers")))
    shard, rate_limits, price = kwargs.pop("shard"), kwargs.pop("rate_limits"), kwargs.pop("price")
    dry_run, cache, no_cache = kwargs.pop("dry_run"), kwargs.pop("cache"), kwargs.pop("no_cache")
    if requests == "-":  # read once into a temporary file, like any other pipe
        requests = "/dev/stdin"
    batch = pop_batch_kwargs(kwargs)
    watching = pop_watch_kwargs(kwargs)
    watchers: tuple[Watcher, ...] = ()
    if watching["view"] or watching["metrics_port"] is not None:
        if dry_run:
            raise UsageError("--view and --metrics-port watch a run that sends: not with --dry-run")
        from jsonlbatch.view.watch import Watch  # the page's server only when asked for

        watchers = (Watch(view=watching["view"], view_port=watching["view_port"],
                          metrics_port=watching["metrics_port"], host=watching["watch_host"]),)  # fmt: skip
    seams = seams or Seams()
    fleet, endpoint_files = kwargs.pop("fleet"), tuple(kwargs.pop("endpoint_files"))
    if (fleet or endpoint_files) and urls:
        raise UsageError("--url goes with --serve or alone: a fleet's URLs come from its file")
    register_secret(kwargs["api_key"])
    target: Target
    if batch["batch_api"]:
        if len(urls) != 1:
            raise UsageError("--batch-api takes exactly one --url: the Batch API's base URL")
        if kwargs["model"] == "auto":
            raise UsageError("--model auto needs a live server; name the model with --batch-api")
        serve_options_from_kwargs(kwargs)  # pops them: refused above unless at their defaults
        target = batch_target(batch, kwargs.pop("max_cost"))
        options = ExecOptions(urls=urls, headers=headers, price=parse_price(price), cache=None,
                              **kwargs)  # fmt: skip
        return RunSpec(requests=requests, output=output, options=options, target=target,
                       seams=_batch_seams(seams))  # fmt: skip
    plan = None
    if fleet:
        plan = fleet_plan(
            fleet, kwargs, node=None, advertise=None, quiet=kwargs["quiet"], log_stem=output,
            keep_going=True,
        )  # fmt: skip
    serve = serve_options_from_kwargs(kwargs)
    options = ExecOptions(
        urls=urls,
        headers=headers,
        shard=parse_shard(shard) if shard else None,
        rate_limits=rate_limits == "on",
        price=parse_price(price),
        cache=cache_dir_from(cache, no_cache),
        **kwargs,
    )
    if endpoint_files:
        target = EndpointsFiles(endpoint_files)
    elif plan is not None:
        target = Fleet(plan)
    elif serve is not None:
        target = Launch(serve, urls)
    else:
        target = Urls(urls)
    return RunSpec(requests=requests, output=output, options=options, target=target,
                   seams=seams, dry_run=dry_run, watchers=watchers)  # fmt: skip


def _batch_seams(seams: Seams) -> Seams:
    """A Batch API run takes a caller's check and listeners; a store, pools or concurrency
    controllers would never be called (the provider sends), so they are refused, not dropped."""
    named = (("store", seams.store), ("pools", seams.pools), ("concurrency", seams.concurrency))
    unused = [name for name, value in named if value is not None]
    if unused:
        raise UsageError(f"Seams({unused[0]}=...) does not go with --batch-api: the provider sends")
    return seams

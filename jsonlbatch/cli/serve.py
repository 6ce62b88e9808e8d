"""`jsonlbatch serve`: launch servers and keep them up until Ctrl-C or SIGTERM.

For runs that outlive one `exec` (several request files, other nodes' clients, a router): the
URLs go to stdout, one per line, for scripts to read; everything else goes to stderr. With
`--batch-api` the one URL printed is a front that adds `/v1/files` and `/v1/batches` to the
backend (launched here, or an `--upstream` server already running).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import click

from jsonlbatch.cli.params import SECONDS, HttpUrl, NonEmpty
from jsonlbatch.cli.sections import Section, Sectioned
from jsonlbatch.cli.serve_options import (
    SERVE_NAMES,
    fleet_options,
    fleet_plan,
    serve_options,
    serve_options_from_kwargs,
)
from jsonlbatch.cli.settings import settings_option
from jsonlbatch.errors import Interrupted, UsageError
from jsonlbatch.exec.route.credentials import clean_secret
from jsonlbatch.redact import register_secret
from jsonlbatch.serve.backends import ServeOptions
from jsonlbatch.serve.start import serving

_CHECK_EVERY = 1.0


_SECTIONS: list[Section] = [
    ("Server launch", SERVE_NAMES),
    ("Fleet (several models)", ("fleet", "node", "advertise", "endpoints_out")),
    ("Batch API server (--batch-api)", ("batch_api", "upstream", "upstream_api_key",
                                        "batch_dir", "batch_port", "batch_concurrency",
                                        "batch_expiry", "batch_max_queued")),
    ("Output", ("quiet",)),
    ("Settings", ("config", "help_all")),
]  # fmt: skip
#: What `serve --help` shows; `--help-all` lists the server's finer flags, Ray, and the batch
#: front's knobs too (all of them settable in a settings file's `serve:` section).
_BRIEF = (
    "backend", "model_path", "served_model_name", "tp_size", "dp_size", "dp_mode", "gpus",
    "host", "port", "server_api_key", "gpu_memory_utilization", "context_length", "server_args",
    "ready_timeout", "ray", "fleet", "node", "endpoints_out", "batch_api", "upstream",
    "batch_port", "quiet", "config",
)  # fmt: skip
_EXAMPLES = (
    "jsonlbatch serve --backend vllm --model-path Qwen/Qwen3-8B --dp-size 8 --dp-mode replicas",
    "jsonlbatch serve --backend mock                    # a stand-in server, no GPU",
    "jsonlbatch serve --fleet fleet.yaml --endpoints-out endpoints.json",
    "jsonlbatch serve --backend mock --batch-api        # the OpenAI Batch API, locally",
)


@click.command("serve", cls=Sectioned, sections=_SECTIONS, examples=_EXAMPLES, brief=_BRIEF)
@serve_options
@click.option(
    "--ready-timeout",
    type=SECONDS,
    default=ServeOptions.ready_timeout,
    show_default=True,
    metavar="SECONDS",
    help="How long a server may take to start (cold starts take many minutes).",
)
@click.option(
    "--batch-api",
    is_flag=True,
    help="Add the OpenAI Files and Batches API (/v1/files, /v1/batches) in front of the "
    "backend; live endpoints keep working on the same URL.",
)
@click.option(
    "--upstream",
    type=HttpUrl(),
    metavar="URL",
    help="With --batch-api: front this already running server instead of launching one.",
)
@click.option(
    "--upstream-api-key",
    envvar="JSONLBATCH_UPSTREAM_API_KEY",
    show_envvar=True,
    help="Key the --upstream server wants.",
)
@click.option(
    "--batch-dir",
    default="jsonlbatch-batches",
    show_default=True,
    type=click.Path(file_okay=False, path_type=str),
    callback=lambda ctx, param, value: NonEmpty().convert(value, param, ctx),
    help="Where --batch-api keeps files, batches and progress (survives restarts).",
)
@click.option(
    "--batch-port",
    type=click.IntRange(0, 65535),
    default=0,
    help="Port of the --batch-api front (default: a free one).",
)
@click.option(
    "--batch-concurrency",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="Requests in flight for batches (one budget, the oldest batch first).",
)
@click.option(
    "--batch-expiry",
    type=SECONDS,
    metavar="SECONDS",
    help="Expire Anthropic and Gemini batches after this long (default: theirs, 24 h and 48 h).",
)
@click.option(
    "--batch-max-queued",
    type=click.IntRange(min=1),
    metavar="N",
    help="Requests that may wait in unfinished batches; a batch beyond is refused as each "
    "provider does (OpenAI: token_limit_exceeded; Anthropic, Gemini: 429).",
)
@fleet_options
@click.option(
    "--endpoints-out",
    type=click.Path(dir_okay=False),
    help="With --fleet: write the endpoints file (model -> URLs) here once every model serves.",
)
@click.option("-q", "--quiet", is_flag=True, help="Only the URLs and errors.")
@settings_option("serve")
def serve(
    quiet: bool,
    fleet: str | None,
    node: str | None,
    advertise: str | None,
    endpoints_out: str | None,
    batch_api: bool,
    upstream: str | None,
    upstream_api_key: str | None,
    batch_dir: str,
    batch_port: int,
    batch_concurrency: int,
    batch_expiry: float | None,
    batch_max_queued: int | None,
    **kwargs: Any,
) -> None:
    """Launch a server (or replicas) and keep it up; prints one base URL per line.

    \b
    jsonlbatch serve --backend vllm --model-path M --dp-size 4 --dp-mode replicas
    jsonlbatch exec requests.jsonl -o out.jsonl --url URL1 --url URL2 ...
    jsonlbatch serve --batch-api --backend mock       # OpenAI Batch API on one URL
    jsonlbatch serve --batch-api --upstream http://gpu-node:8000/v1
    """
    if upstream is not None and not batch_api:
        raise UsageError("--upstream goes with --batch-api")
    if fleet is not None:
        if batch_api:
            raise UsageError("--batch-api serves one model: leave out --fleet")
        _serve_fleet(fleet, node, advertise, endpoints_out, quiet, kwargs)
        return
    if endpoints_out or node or advertise:
        raise UsageError("--endpoints-out, --node and --advertise go with --fleet")
    if not batch_api:
        options = serve_options_from_kwargs(kwargs)
        if options is None:
            raise UsageError("which server? give --backend mock|vllm|sglang")
        with serving(options, quiet=quiet) as servers:
            try:
                for url in servers.urls:
                    click.echo(url)
                if not quiet:
                    click.echo("serving; Ctrl-C to stop", err=True)
                while True:
                    servers.check()
                    time.sleep(_CHECK_EVERY)
            except (KeyboardInterrupt, Interrupted):
                pass  # the usual way to end `serve`: stop the servers, exit 0
        return
    from jsonlbatch.batchapi.server.batch_runner import RunnerOptions
    from jsonlbatch.batchapi.server.batch_server import BatchServerOptions

    front = BatchServerOptions(
        batch_dir,
        RunnerOptions(
            urls=[], concurrency=batch_concurrency, ready_timeout=kwargs["ready_timeout"]
        ),
        host=kwargs["host"],
        port=batch_port,
        api_key=kwargs["server_api_key"],
        expiry=batch_expiry,
        max_queued=batch_max_queued,
    )
    if upstream is not None:
        if kwargs["backend"] is not None:
            raise UsageError("give --upstream URL or --backend, not both")
        for name in ("host", "server_api_key"):  # the front's own, not a launch's
            kwargs.pop(name)
        if kwargs["port"] is not None:  # the launched server's: there is none to launch
            raise UsageError(
                "--port is the port of a server `serve` launches, and with --upstream none is: "
                "the Batch API front's port is --batch-port (serve --batch-api --upstream URL "
                f"--batch-port {kwargs['port']})"
            )
        serve_options_from_kwargs(kwargs)  # any other server option is a mistake
        key = clean_secret(upstream_api_key, "--upstream-api-key (or $JSONLBATCH_UPSTREAM_API_KEY)")
        front.runner.urls, front.runner.api_key = [upstream], key
        _run_front(front, quiet)
        return
    options = serve_options_from_kwargs(kwargs)
    if options is None:
        raise UsageError("which server? give --backend mock|vllm|sglang, or --upstream URL")
    with serving(options, quiet=quiet) as servers:
        front.runner.urls, front.runner.api_key = servers.urls, servers.api_key
        _run_front(front, quiet, servers.check)


def _serve_fleet(
    path: str,
    node: str | None,
    advertise: str | None,
    endpoints_out: str | None,
    quiet: bool,
    kwargs: dict[str, Any],
) -> None:
    from jsonlbatch.exec.route.endpoints_file import write_endpoints
    from jsonlbatch.file_io.output_guard import check_output
    from jsonlbatch.serve.fleetrun import serving_fleet

    if endpoints_out:  # before any server starts: the fleet file is never written over
        check_output(endpoints_out, [path])
    plan = fleet_plan(path, kwargs, node=node, advertise=advertise, quiet=quiet)
    with serving_fleet(plan.pop("fleet"), **plan) as servers:
        try:
            if endpoints_out:
                write_endpoints(endpoints_out, servers.endpoints())
            for model, urls in servers.model_urls().items():
                for url in urls:
                    click.echo(f"{model} {url}")
            if not quiet:
                where = f"; endpoints in {endpoints_out}" if endpoints_out else ""
                click.echo(f"serving the fleet{where}; Ctrl-C to stop", err=True)
            while True:
                servers.check()
                time.sleep(_CHECK_EVERY)
        except (KeyboardInterrupt, Interrupted):
            pass


def _run_front(front: Any, quiet: bool, check: Callable[[], None] | None = None) -> None:
    from jsonlbatch.batchapi.server.batch_server import serve_batch_api
    from jsonlbatch.exec.job import run_coroutine

    for secret in (front.api_key, front.runner.api_key):
        if secret:
            register_secret(secret)

    def ready(url: str) -> None:
        click.echo(url)
        if not quiet:
            click.echo(
                f"serving the Batch API (state in {front.directory}); Ctrl-C to stop", err=True
            )

    with contextlib.suppress(KeyboardInterrupt, Interrupted):
        run_coroutine(serve_batch_api(front, on_ready=ready, check=check))

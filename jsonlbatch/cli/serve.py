"""`jsonlbatch serve`: launch servers and keep them up until Ctrl-C or SIGTERM.

For runs that outlive one `exec` (several request files, other nodes' clients, a router): the
URLs go to stdout, one per line, for scripts to read; everything else goes to stderr.
"""

from __future__ import annotations

import time
from typing import Any

import click

from jsonlbatch.cli.params import SECONDS
from jsonlbatch.cli.serve_options import serve_options, serve_options_from_kwargs
from jsonlbatch.errors import Interrupted, UsageError
from jsonlbatch.serve.launch import serving

_CHECK_EVERY = 1.0


@click.command("serve")
@serve_options
@click.option(
    "--ready-timeout",
    type=SECONDS,
    default=1800.0,
    show_default=True,
    metavar="SECONDS",
    help="How long a server may take to start (cold starts take many minutes).",
)
@click.option("-q", "--quiet", is_flag=True, help="Only the URLs and errors.")
def serve(quiet: bool, **kwargs: Any) -> None:
    """Launch a server (or replicas) and keep it up; prints one base URL per line.

    \b
    jsonlbatch serve --backend vllm --model-path M --dp-size 4 --dp-mode replicas
    jsonlbatch exec requests.jsonl -o out.jsonl --url URL1 --url URL2 ...
    """
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

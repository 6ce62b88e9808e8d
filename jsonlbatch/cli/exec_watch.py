"""`exec --view` and `exec --metrics-port`: a run watched from a browser or a Prometheus server.

Both are subscribers of the run's event stream (`Seams.subscribers`), started before the run
and stopped after it, on threads of their own so the run's loop only sends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import click

from jsonlbatch.cli.params import NonEmpty
from jsonlbatch.cost import Price

Subscription = tuple[Callable[[Any], None], tuple[type, ...]]

watch_options = [
    click.option(
        "--view",
        is_flag=True,
        help="Serve a live page of the run (jsonlbatch view) on 127.0.0.1; its address is printed.",
    ),
    click.option(
        "--view-port",
        type=click.IntRange(0, 65535),
        default=0,
        metavar="N",
        help="Port of the --view page (default: a free one).",
    ),
    click.option(
        "--metrics-port",
        type=click.IntRange(0, 65535),
        metavar="N",
        help="Serve Prometheus metrics of the run at :N/metrics (needs jsonlbatch[metrics]).",
    ),
    click.option(
        "--watch-host",
        type=NonEmpty(),
        default="127.0.0.1",
        show_default=True,
        help="Address the --view page and --metrics-port listen on.",
    ),
]


def add_watch_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(watch_options):
        command = option(command)
    return command


def pop_watch_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {name: kwargs.pop(name) for name in ("view", "view_port", "metrics_port", "watch_host")}


@contextlib.contextmanager
def watching(
    watch: dict[str, Any], *, output: str, requests: str, price: Price | None
) -> Iterator[list[Subscription]]:
    """The subscribers for the run's seams; the page and the metrics server live as long as the
    block. Nothing is imported or started unless asked for."""
    subscribers: list[Subscription] = []
    if not watch["view"] and watch["metrics_port"] is None:
        yield subscribers
        return
    from jsonlbatch.view import BackgroundViewer, LiveState, PrometheusExporter

    with contextlib.ExitStack() as stack:
        if watch["metrics_port"] is not None:
            exporter = PrometheusExporter(price=price)
            port = exporter.start(watch["metrics_port"], watch["watch_host"])
            stack.callback(exporter.close)
            subscribers += exporter.subscriptions()
            click.echo(f"metrics: http://{_host(watch['watch_host'])}:{port}/metrics", err=True)
        if watch["view"]:
            live = LiveState()
            viewer = BackgroundViewer(
                [output],
                requests=[requests] if requests not in ("-", "/dev/stdin") else [],
                host=watch["watch_host"],
                port=watch["view_port"],
                price=price,
                live=live,
            )
            stack.callback(viewer.close)
            subscribers += live.subscriptions()
            click.echo(
                f"view: {viewer.url}  (closes with the run; afterwards: jsonlbatch view {output})",
                err=True,
            )
        yield subscribers


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host

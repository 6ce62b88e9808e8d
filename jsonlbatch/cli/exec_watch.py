"""`exec --view` and `exec --metrics-port`: the options of a run watched from a browser or a
Prometheus server (`view/watch.py` starts and stops what they ask for)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from jsonlbatch.cli.params import NonEmpty

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

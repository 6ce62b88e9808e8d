"""`exec --view` and `exec --metrics-port`: the options of a run watched from a browser or a
Prometheus server (`view/watch.py`'s `Watch` starts and stops what they ask for, as a watcher of
the run's `RunSpec`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from jsonlbatch.cli.params import NonEmpty
from jsonlbatch.cli.sections import Deprecated


class ViewAddress(click.ParamType):
    """`HOST:PORT`, `HOST`, `:PORT` or `[IPv6]:PORT`; a port left out (or 0) is a free one."""

    name = "address"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        text = str(value).strip()
        if not text:
            self.fail("must not be empty.", param, ctx)
        host, port = text, "0"
        if text.startswith("["):  # [::1] or [::1]:8765
            inside, closed, rest = text[1:].partition("]")
            if not closed:
                self.fail(f"{value!r}: want [IPv6]:PORT", param, ctx)
            host, port = inside, rest.removeprefix(":") or "0"
            if not rest.startswith(":") and rest:
                self.fail(f"{value!r}: want [IPv6]:PORT", param, ctx)
        elif text.count(":") == 1:
            host, port = text.split(":")
        host = host or _DEFAULT_HOST
        try:
            number = int(port)
        except ValueError:
            number = -1
        if not 0 <= number <= 65535 or not host.strip():
            self.fail(f"{value!r} is not HOST:PORT (port 0 to 65535)", param, ctx)
        return (host, number)


_DEFAULT_HOST = "127.0.0.1"

watch_options = [
    click.option(
        "--view",
        is_flag=True,
        help="Serve a live page of the run (jsonlbatch view) on 127.0.0.1; its address is printed.",
    ),
    click.option(
        "--view-address",
        type=ViewAddress(),
        default=f"{_DEFAULT_HOST}:0",
        show_default=True,
        metavar="HOST:PORT",
        help="Where the --view page listens (port 0: a free one); --metrics-port listens on "
        "its host too.",
    ),
    click.option(
        "--metrics-port",
        type=click.IntRange(0, 65535),
        metavar="N",
        help="Serve Prometheus metrics of the run at :N/metrics (needs jsonlbatch[metrics]).",
    ),
    click.option(
        "--view-port",
        cls=Deprecated,
        type=click.IntRange(0, 65535),
        metavar="N",
        instead="--view-address HOST:N",
    ),
    click.option(
        "--watch-host", cls=Deprecated, type=NonEmpty(), instead="--view-address HOST:PORT"
    ),
]

#: The watch options' names, in the order `--help` lists them.
WATCH_NAMES = ("view", "view_address", "metrics_port")


def add_watch_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(watch_options):
        command = option(command)
    return command


def pop_watch_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the watch options out of exec's kwargs: `view`, `metrics_port`, and the address
    as `watch_host` and `view_port` (the deprecated spellings, where given, win over
    `--view-address`: they are what an old script means)."""
    host, port = kwargs.pop("view_address")
    old_port, old_host = kwargs.pop("view_port"), kwargs.pop("watch_host")
    return {
        "view": kwargs.pop("view"),
        "view_port": port if old_port is None else old_port,
        "metrics_port": kwargs.pop("metrics_port"),
        "watch_host": host if old_host is None else old_host,
    }

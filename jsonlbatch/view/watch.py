"""A run watched while it lasts (`exec --view`, `exec --metrics-port`): a `RunSpec` watcher
(exec/front_door.py). Both are subscribers of the run's event stream, started before the run and
stopped after it, on threads of their own so the run's loop only sends. Nothing is imported
or started unless asked for.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jsonlbatch.exec.front_door import Subscription

if TYPE_CHECKING:
    from jsonlbatch.exec.front_door import RunSpec


@dataclass(frozen=True)
class Watch:
    """`view`: a live page of the run on `host` (port `view_port`, 0: a free one);
    `metrics_port`: Prometheus metrics at :N/metrics (needs jsonlbatch[metrics])."""

    view: bool = False
    view_port: int = 0
    metrics_port: int | None = None
    host: str = "127.0.0.1"

    @property
    def wanted(self) -> bool:
        return self.view or self.metrics_port is not None

    @contextlib.contextmanager
    def watching(self, spec: RunSpec, /) -> Iterator[Sequence[Subscription]]:
        """The subscribers for the run's seams; the page and the metrics server live as long
        as the block. Their addresses are said on stderr."""
        subscribers: list[Subscription] = []
        if not self.wanted:
            yield subscribers
            return
        from jsonlbatch.view import BackgroundViewer, LiveState, PrometheusExporter

        price = spec.options.price
        with contextlib.ExitStack() as stack:
            if self.metrics_port is not None:
                exporter = PrometheusExporter(price=price)
                port = exporter.start(self.metrics_port, self.host)
                stack.callback(exporter.close)
                subscribers += exporter.subscriptions()
                _say(f"metrics: http://{_host(self.host)}:{port}/metrics")
            if self.view:
                live = LiveState()
                piped = spec.requests in ("-", "/dev/stdin")
                viewer = BackgroundViewer(
                    [spec.output],
                    requests=[] if piped else [spec.requests],
                    host=self.host,
                    port=self.view_port,
                    price=price,
                    live=live,
                )
                stack.callback(viewer.close)
                subscribers += live.subscriptions()
                _say(f"view: {viewer.url}  (closes with the run; afterwards: jsonlbatch view "
                     f"{spec.output})")  # fmt: skip
            yield subscribers


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host

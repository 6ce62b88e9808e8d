"""A run seen from outside while it goes on: the live state the viewer's status strip shows, and
Prometheus metrics a dashboard scrapes. Both are subscribers of exec's event stream
(`jsonlbatch.exec.output.events`): the run loop does not know they exist.

Subscribers run on the run's event loop and only bump counters; the viewer and the metrics
server read them from their own threads (plain reads of numbers, and dicts replaced whole, are
safe across threads in CPython).
"""

from __future__ import annotations

import asyncio
import socket
import socketserver
import threading
import urllib.parse
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import aiohttp

from jsonlbatch.errors import UsageError
from jsonlbatch.exec.output.events import Answered, Failed, RateLimited, Retried, Sent, Snapshot
from jsonlbatch.exec.route.server_metrics import ServerCounters, scrape
from jsonlbatch.extras import load
from jsonlbatch.pricing.cost import Price
from jsonlbatch.view.hosts import allowed_hosts

if TYPE_CHECKING:  # the alias only: viewing a file must not load the run loop
    from jsonlbatch.exec.front_door import Subscription

#: Latency buckets (seconds) for LLM requests: from a cached prefix's first token to a long
#: reasoning answer.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class LiveState:
    """What a run is doing now, for `exec --view`: counts, in flight per endpoint, pacing, and
    the servers' prefix-cache hit rate (their `/metrics`, read every few seconds by
    `watch_servers` on the viewer's own loop)."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {"state": "starting"}
        self._in_flight: Counter[str] = Counter()  # attempts out, by endpoint
        self._where: dict[str, str] = {}  # custom_id -> endpoint of its attempt in flight
        self._seen: dict[str, None] = {}  # endpoints attempts went to, in order
        self._first: dict[str, ServerCounters] = {}
        self.hit_rate: float | None = None

    def subscriptions(self) -> list[Subscription]:
        return [
            (self._sent, (Sent,)),
            (self._settled, (Answered, Failed, Retried)),
            (self._snapshot, (Snapshot,)),
        ]

    def _sent(self, event: Sent) -> None:
        self._in_flight[event.endpoint] += 1
        self._where[event.custom_id] = event.endpoint
        self._seen.setdefault(event.endpoint)

    def _settled(self, event: Answered | Failed | Retried) -> None:
        endpoint = self._where.pop(event.custom_id, None)
        if endpoint is not None:
            self._in_flight[endpoint] -= 1
            if self._in_flight[endpoint] <= 0:
                del self._in_flight[endpoint]

    def _snapshot(self, event: Snapshot) -> None:
        summary = event.summary
        self.state = {
            "state": "finished" if event.final else (event.status or "sending"),
            "total": summary.requests,
            "written": summary.already_done + summary.written,
            "in_flight": sum(self._in_flight.values()),
            "per_endpoint": dict(self._in_flight),
            "retrying": event.retrying,
            "paced": event.extra or None,
            "spent": summary.spent,
            "rate_limited": summary.rate_limited,
        }

    def __call__(self) -> dict[str, Any]:
        return {**self.state, "prefix_cache_hit_rate": self.hit_rate}

    async def watch_servers(self, every: float = 5.0) -> None:
        """Read the servers' `/metrics` now and then: the prefix-cache hit rate since the first
        read, over every endpoint that has vLLM's or SGLang's counters (others are skipped)."""
        async with aiohttp.ClientSession() as session:
            while True:
                await asyncio.sleep(every)
                names = [n for n in list(self._seen) if n.startswith(("http://", "https://"))]
                queried = hits = 0.0
                for name in names:
                    found = await scrape(session, _metrics_url(name), {}, None)
                    if found is None or found.queries is None or found.hits is None:
                        continue
                    first = self._first.setdefault(name, found)
                    queried += found.queries - (first.queries or 0.0)
                    hits += found.hits - (first.hits or 0.0)
                if queried > 0:
                    self.hit_rate = hits / queried


def _metrics_url(base: str) -> str:
    split = urllib.parse.urlsplit(base)
    return urllib.parse.urlunsplit((split.scheme, split.netloc, "/metrics", "", ""))


class PrometheusExporter:
    """Prometheus metrics of a run (`exec --metrics-port N`), served by prometheus-client's own
    HTTP server on a thread, from a registry of its own (not the library's global one)."""

    def __init__(self, *, price: Price | None = None) -> None:
        prom = load("prometheus_client", extra="metrics", for_what="--metrics-port")
        self.price = price
        self.registry = prom.CollectorRegistry()
        r = self.registry
        self.requests = prom.Counter(
            "jsonlbatch_requests",
            "Requests finished in this run, by outcome",
            ["outcome"],
            registry=r,
        )
        self.failures = prom.Counter(
            "jsonlbatch_failures",
            "Requests that failed for good, by error code",
            ["code"],
            registry=r,
        )
        self.attempts = prom.Counter(
            "jsonlbatch_attempts", "Attempts sent, by endpoint", ["endpoint"], registry=r
        )
        self.retries = prom.Counter(
            "jsonlbatch_retries",
            "Attempts that failed and will be retried, by reason",
            ["reason"],
            registry=r,
        )
        self.limited = prom.Counter(
            "jsonlbatch_rate_limited",
            "Answers with status 429, by endpoint",
            ["endpoint"],
            registry=r,
        )
        self.tokens = prom.Counter(
            "jsonlbatch_tokens", "Tokens of answered requests", ["kind"], registry=r
        )
        self.cost = prom.Counter(
            "jsonlbatch_cost_dollars",
            "Dollars spent on answered requests (needs --price)",
            registry=r,
        )
        self.latency = prom.Histogram(
            "jsonlbatch_request_latency_seconds",
            "End-to-end latency of answered requests",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = prom.Histogram(
            "jsonlbatch_ttft_seconds",
            "Time to first token of streamed requests",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.in_flight = prom.Gauge(
            "jsonlbatch_in_flight", "Attempts sent and not yet answered", registry=r
        )
        self.pending = prom.Gauge(
            "jsonlbatch_requests_pending", "Requests of the job without a result yet", registry=r
        )
        self.total = prom.Gauge("jsonlbatch_requests_total_in_job", "Requests in the job (this shard)", registry=r)  # fmt: skip
        self.cache_hits = prom.Counter(
            "jsonlbatch_cache_hits",
            "Requests answered from the answer cache (--cache): written, not sent",
            registry=r,
        )
        self._out: set[str] = set()
        self._server: Any = None

    def subscriptions(self) -> list[Subscription]:
        return [
            (self._sent, (Sent,)),
            (self._answered, (Answered,)),
            (self._failed, (Failed,)),
            (self._retried, (Retried,)),
            (self._limited, (RateLimited,)),
            (self._snapshot, (Snapshot,)),
        ]

    def _settle(self, custom_id: str) -> None:
        if custom_id in self._out:
            self._out.discard(custom_id)
            self.in_flight.dec()

    def _sent(self, event: Sent) -> None:
        self.attempts.labels(event.endpoint).inc()
        if event.custom_id not in self._out:
            self._out.add(event.custom_id)
            self.in_flight.inc()

    def _answered(self, event: Answered) -> None:
        self._settle(event.custom_id)
        self.requests.labels("ok").inc()
        metrics = event.metrics
        if metrics.get("cache") == "hit":
            self.cache_hits.inc()
        prompt, completion = (
            _num(metrics.get("prompt_tokens")),
            _num(metrics.get("completion_tokens")),
        )
        if prompt is not None:
            self.tokens.labels("prompt").inc(prompt)
        if completion is not None:
            self.tokens.labels("completion").inc(completion)
        if self.price is not None and metrics.get("cache") != "hit":
            self.cost.inc(self.price.of(prompt or 0.0, completion or 0.0))
        latency, ttft = _num(metrics.get("latency_s")), _num(metrics.get("ttft_s"))
        if latency is not None:
            self.latency.observe(latency)
        if ttft is not None:
            self.ttft.observe(ttft)

    def _failed(self, event: Failed) -> None:
        self._settle(event.custom_id)
        self.requests.labels("failed").inc()
        self.failures.labels(event.code).inc()

    def _retried(self, event: Retried) -> None:
        self._settle(event.custom_id)
        self.retries.labels(event.reason).inc()

    def _limited(self, event: RateLimited) -> None:
        self.limited.labels(event.endpoint).inc()

    def _snapshot(self, event: Snapshot) -> None:
        summary = event.summary
        # (lines the cache answered while the input was scanned have an `Answered` each too)
        self.total.set(summary.requests)
        self.pending.set(max(summary.requests - summary.already_done - summary.written, 0))

    def start(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve `GET /metrics` on host:port (0: a free port); the port it listens on.

        Only that path answers (404 for any other: prometheus-client's own server answers the
        metrics at every path), only GET (405), and, bound to loopback, only a
        loopback `Host` (421), as the viewer does: a web page elsewhere cannot read the run's
        endpoints, models and error codes through DNS rebinding."""
        import prometheus_client as prom

        allowed: list[tuple[str, ...]] = [()]  # known once the port is
        app = _guarded(prom.make_wsgi_app(self.registry), lambda: allowed[0])
        try:
            self._server = _serve(app, host, port)
        except OSError as exc:
            raise UsageError(
                f"--metrics-port {port}: cannot listen on {host}: {exc.strerror or exc}"
            ) from None
        bound = int(self._server.server_port)
        allowed[0] = allowed_hosts(host, bound)
        return bound

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access log on the run's stderr."""


def _serve(app: Any, host: str, port: int) -> WSGIServer:
    """A threaded WSGI server for `app` on host:port (IPv6 too), serving on a thread."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    server_class = type("_MetricsServer", (_Server,), {"address_family": family})
    server: WSGIServer = make_server(host, port, app, server_class, _Quiet)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


def _guarded(app: Any, allowed: Callable[[], tuple[str, ...]]) -> Any:
    """`app` behind the checks `PrometheusExporter.start` describes."""

    def guarded(environ: dict[str, Any], start_response: Any) -> Any:
        refusal = None
        hosts = allowed()
        if environ.get("REQUEST_METHOD") != "GET":
            refusal = "405 Method Not Allowed", b"read-only: GET /metrics\n"
        elif hosts and environ.get("HTTP_HOST", "") not in hosts:
            refusal = "421 Misdirected Request", b"unexpected Host\n"
        elif environ.get("PATH_INFO") != "/metrics":
            refusal = "404 Not Found", b"the metrics are at /metrics\n"
        if refusal is None:
            return app(environ, start_response)
        status, body = refusal
        headers = [("Content-Type", "text/plain")]
        if status.startswith("405"):
            headers.append(("Allow", "GET"))
        start_response(status, headers)
        return [body]

    return guarded


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return float(value)

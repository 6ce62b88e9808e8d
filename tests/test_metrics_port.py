"""`exec --metrics-port`'s server answers `GET /metrics` only: another path is a 404, another
method a 405, and bound to loopback a `Host` that is not loopback is a 421 (DNS rebinding), as
the viewer does. The exporter's real server over 127.0.0.1."""

from __future__ import annotations

import http.client

import pytest


def _ask(
    port: int, path: str, *, method: str = "GET", host: str | None = None, at: str = "127.0.0.1"
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(at, port, timeout=30)
    try:
        conn.putrequest(method, path, skip_host=host is not None)
        if host is not None:
            conn.putheader("Host", host)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_only_get_metrics_answers_and_only_to_a_loopback_host() -> None:
    pytest.importorskip("prometheus_client")
    from jsonlbatch.view import PrometheusExporter

    exporter = PrometheusExporter()
    port = exporter.start(0, "127.0.0.1")
    try:
        status, body = _ask(port, "/metrics")
        assert status == 200 and b"jsonlbatch_requests" in body
        assert _ask(port, "/metrics", host=f"localhost:{port}")[0] == 200
        for path in ("/", "/anything", "/metrics/x", "/favicon.ico"):
            assert _ask(port, path)[0] == 404, path
        for method in ("POST", "PUT", "DELETE", "HEAD"):
            assert _ask(port, "/metrics", method=method)[0] == 405, method
        status, body = _ask(port, "/metrics", host="attacker.example")
        assert status == 421 and b"jsonlbatch" not in body
        assert _ask(port, "/metrics", host=f"attacker.example:{port}")[0] == 421
    finally:
        exporter.close()


def test_bound_to_a_chosen_interface_any_host_is_taken() -> None:
    pytest.importorskip("prometheus_client")
    from jsonlbatch.view import PrometheusExporter

    exporter = PrometheusExporter()
    # an address other than the loopback names: as an interface the user chose (who may reach
    # it is theirs to decide), yet still on this machine only
    port = exporter.start(0, "127.0.0.2")
    try:
        assert _ask(port, "/metrics", host="metrics.example", at="127.0.0.2")[0] == 200
        assert _ask(port, "/other", host="metrics.example", at="127.0.0.2")[0] == 404
    finally:
        exporter.close()

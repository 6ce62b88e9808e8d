"""Which `Host` header values the viewer and the metrics server answer.

Bound to loopback, a server answers only requests addressed to loopback: a web page elsewhere
that points its own name at 127.0.0.1 (DNS rebinding) sends its own name as `Host` and is
refused, so it cannot read the answers or the metrics. Bound to a chosen interface, any `Host`
is taken: the user decided who may reach it.
"""

from __future__ import annotations

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def allowed_hosts(host: str, port: int) -> tuple[str, ...]:
    """The `Host` values a browser or scraper sends for host:port; empty: any is taken."""
    if host in LOOPBACK:
        names = ["127.0.0.1", "localhost", "[::1]"]
        return (*(f"{name}:{port}" for name in names), *names)
    return ()

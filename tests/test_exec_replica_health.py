"""A replica that answers 500 to every generation while its `/health` says 200: its requests are
retried on the replica that answers (none ends a failure), and once set aside it comes back on
its probe's word only on trial, one request at a time, set aside again when that one fails.
Both replicas are real servers on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from batchutil import exec_cli, failures, read_results, serve_app, write_requests


@pytest.fixture
def broken_replica(request: pytest.FixtureRequest) -> Iterator[tuple[str, list[str]]]:
    """(base URL, what it was asked, in order: "health" or "post"): healthy to its probe,
    500 (or the test's `status` parameter) to every generation."""
    status = getattr(request, "param", 500)
    events: list[str] = []

    async def health(request: web.Request) -> web.Response:
        events.append("health")
        return web.Response(status=200)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "mock"}]})

    async def generate(request: web.Request) -> web.Response:
        await request.read()
        events.append("post")
        return web.json_response({"error": {"message": "CUDA error", "type": "x"}}, status=status)

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", generate)
    url, stop = serve_app(app)
    yield url, events
    stop()


@pytest.mark.parametrize(
    ("broken_replica", "route"), [(500, "prefix"), (429, "least-busy")], indirect=["broken_replica"]
)
def test_a_request_failed_on_one_replica_is_retried_on_another(
    tmp_path: Path, mock_server: Callable[..., str], broken_replica: Any, route: str
) -> None:
    bad, events = broken_replica
    good = mock_server()
    write_requests(tmp_path / "req.jsonl", 30)
    out = tmp_path / "out.jsonl"
    args = ("--url", bad, "--url", good, "--route", route, "--max-retries", "0", "-c", "4")
    done = exec_cli(tmp_path / "req.jsonl", out, *args)
    assert done.returncode == 0, done.stderr
    results = read_results(out)
    assert len(results) == 30 and not failures(results)
    assert "post" in events  # the broken replica was tried, and its failures went elsewhere


def test_a_replica_back_on_its_probes_word_gets_one_request_until_one_succeeds(
    tmp_path: Path, mock_server: Callable[..., str], broken_replica: Any
) -> None:
    bad, events = broken_replica
    good = mock_server(latency=0.2)  # 80 requests at -c 4: the run outlasts the set-aside (2 s)
    write_requests(tmp_path / "req.jsonl", 80)
    out = tmp_path / "out.jsonl"
    args = ("--url", bad, "--url", good, "--route", "least-busy", "-c", "4", "--backoff", "0.05")
    done = exec_cli(tmp_path / "req.jsonl", out, *args)
    assert done.returncode == 0, done.stderr
    assert not failures(read_results(out))
    assert "health" in events, "the broken replica was never set aside"
    after_first_probe = "".join("H" if e == "health" else "p" for e in events)
    after_first_probe = after_first_probe[after_first_probe.index("H") :]
    # between two probes (and after the last), the replica back on trial got at most one request
    assert all(len(run) <= 1 for run in after_first_probe.split("H")), after_first_probe

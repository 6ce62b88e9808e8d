"""`exec --batch-api` against Batch API servers that lie: their ids are data, never paths, and
an answer that is not the API's shape stops the run with a clear error instead of a poll forever.
Each server is a tiny real aiohttp app on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import orjson
import pytest
from aiohttp import web
from batchutil import exec_cli, serve_app, write_requests

from jsonlbatch.batchapi.client.safe_names import is_plain_id, safe_name

FAST = ("--batch-api", "--poll-interval", "0.05", "--max-retries", "0")


@pytest.fixture
def api_server() -> Iterator[Callable[..., str]]:
    """Factory: `url = api_server(handler)`, `handler(request) -> web.Response` answers every
    method and path; stopped at teardown."""
    stops: list[Callable[[], None]] = []

    def factory(handler: Callable[[web.Request], object]) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)  # type: ignore[arg-type]
        url, stop = serve_app(app)
        stops.append(stop)
        return url

    yield factory
    for stop in stops:
        stop()


def _batch(batch_id: str, status: str, **extra: object) -> dict:
    return {"object": "batch", "id": batch_id, "status": status, **extra}


def test_a_batch_id_that_is_a_path_never_chooses_where_exec_writes(tmp_path, api_server):
    victim = tmp_path / "victim.output.jsonl"
    victim.write_text("precious\n")
    evil_id = str(tmp_path / "victim")  # the download would go to <id>.output.jsonl

    async def handler(request: web.Request) -> web.Response:
        path = request.path
        if request.method == "POST" and path == "/v1/files":
            await request.read()
            return web.json_response({"object": "file", "id": "file-in", "status": "processed"})
        if request.method == "POST" and path == "/v1/batches":
            return web.json_response(_batch(evil_id, "validating"))
        if path.startswith("/v1/batches/"):
            return web.json_response(_batch(evil_id, "completed", output_file_id="file-out"))
        if path == "/v1/files/file-out/content":
            return web.Response(body=b'{"custom_id": "x", "response": null}\n')
        return web.json_response({"error": "no"}, status=404)

    url = api_server(handler)
    requests, out = tmp_path / "in.jsonl", tmp_path / "out" / "out.jsonl"
    write_requests(requests, 2)
    done = exec_cli(requests, out, "--url", url, *FAST, timeout=30)
    assert victim.read_text() == "precious\n", "the server's id chose a path"
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "not an id" in done.stderr, done.stderr


def test_safe_name_keeps_plain_ids_and_reduces_everything_else():
    assert safe_name("batch_abc-123.x") == "batch_abc-123.x"
    for bad in ("../x", "/etc/passwd", "..", ".", "a/b", "", "x" * 200, "a\x00b", "c:\\d", None):
        name = safe_name(bad)
        assert name.startswith("id-") and "/" not in name and len(name) <= 100, bad
        assert not is_plain_id(bad)
    assert safe_name("../x") != safe_name("../y")


def test_a_server_that_is_not_a_batch_api_is_stopped_not_polled_forever(tmp_path, api_server):
    async def handler(request: web.Request) -> web.Response:
        await request.read()  # every path answers a chat completion
        return web.json_response(
            {"id": "chatcmpl-x", "object": "chat.completion", "choices": [], "usage": {}}
        )

    url = api_server(handler)
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 2)
    done = exec_cli(requests, out, "--url", url, *FAST, timeout=30)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "not a Batch API file" in done.stderr and "chat.completion" in done.stderr


def test_a_batch_without_a_known_status_is_an_error(tmp_path, api_server):
    async def handler(request: web.Request) -> web.Response:
        await request.read()
        if request.path == "/v1/files":
            return web.json_response({"object": "file", "id": "file-in"})
        return web.json_response({"object": "batch", "id": "batch_1", "status": None})

    url = api_server(handler)
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 1)
    done = exec_cli(requests, out, "--url", url, *FAST, timeout=30)
    assert done.returncode != 0 and "not a batch status" in done.stderr, done.stderr
    state = orjson.loads(out.with_name("out.jsonl.batch-api.json").read_bytes())
    assert state["parts"][0]["batch_id"] is None  # nothing kept from the bad answer


def test_a_call_the_api_refuses_is_named_by_the_address_it_went_to(tmp_path, mock_server):
    """A URL that serves no Batch API (a live server's): the error names the address called,
    not the base joined to the path (before: `POST http://host/v1/v1/files: HTTP 404`)."""
    url = mock_server()
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 1)
    done = exec_cli(requests, out, "--url", url, *FAST)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    # the mock serves the Files API (uploads work) but no batches
    assert f"POST {url}/batches: HTTP 404" in done.stderr, done.stderr
    assert "/v1/v1/" not in done.stderr

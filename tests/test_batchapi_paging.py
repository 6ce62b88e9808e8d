"""Paging a provider's lists ends (batchapi/client/paging.py): a cursor that comes back, or a
page that says there is more and lists nothing, is a clear error after a few requests, not a
loop; a listing under way gives way to a stop at once."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator

import aiohttp
import pytest
from aiohttp import web
from batchutil import serve_app

from jsonlbatch.batchapi.client.anthropic_api import AnthropicBatchApi
from jsonlbatch.batchapi.client.batch_api import BatchApi
from jsonlbatch.batchapi.client.gemini_api import GeminiBatchApi
from jsonlbatch.batchapi.client.paging import PagingError, Stopped, unless_stopped
from jsonlbatch.exec.route.endpoints import parse_endpoint

pytestmark = pytest.mark.timeout(60, method="thread")

NOW = time.time()


def _batch(i: int) -> dict:
    return {"id": f"batch_{i}", "object": "batch", "created_at": int(NOW) + 100, "metadata": {},
            "status": "completed", "filename": f"f{i}", "endpoint": "/v1/chat/completions",
            "input_file_id": "file_1", "request_counts": {"total": 1, "completed": 1,
                                                          "failed": 0}}  # fmt: skip


def _message_batch(i: int) -> dict:
    return {"id": f"msgbatch_{i}", "type": "message_batch", "processing_status": "ended",
            "request_counts": {"succeeded": 1, "errored": 0, "canceled": 0, "expired": 0,
                               "processing": 0},
            "created_at": "2099-01-01T00:00:00Z"}  # fmt: skip


@pytest.fixture
def looping() -> Iterator[tuple[str, Counter[str], Callable[[str], None]]]:
    """A provider whose every list says there is more, with the same cursor each time (or, in
    mode "empty", with nothing listed)."""
    calls: Counter[str] = Counter()
    mode = {"now": "repeat"}

    async def openai_list(request: web.Request) -> web.Response:
        calls[request.path] += 1
        data = [] if mode["now"] == "empty" else [_batch(calls[request.path])]
        return web.json_response({"object": "list", "data": data, "has_more": True,
                                  "last_id": "cursor-1"})  # fmt: skip

    async def anthropic_list(request: web.Request) -> web.Response:
        calls[request.path] += 1
        data = [] if mode["now"] == "empty" else [_message_batch(calls[request.path])]
        return web.json_response({"data": data, "has_more": True, "last_id": "msgbatch_0"})

    async def gemini_list(request: web.Request) -> web.Response:
        calls[request.path] += 1
        return web.json_response({"operations": [], "nextPageToken": "same-token"})

    app = web.Application()
    app.router.add_get("/v1/batches", openai_list)
    app.router.add_get("/v1/files", openai_list)
    app.router.add_get("/v1/messages/batches", anthropic_list)
    app.router.add_get("/v1beta/batches", gemini_list)
    url, stop = serve_app(app)
    yield url, calls, lambda m: mode.update(now=m)
    stop()


async def _find(kind: type[BatchApi], url: str, what: str = "batch") -> None:
    async with aiohttp.ClientSession() as session:
        api = kind(parse_endpoint(url), session, max_retries=0)
        if what == "file":
            await api.find_file("wanted.jsonl")
        else:
            await api.find_batch({"jsonlbatch_part": "1"}, NOW, count=7)


@pytest.mark.parametrize(
    ("kind", "base", "what", "path"),
    [
        (BatchApi, "/v1", "batch", "/v1/batches"),
        (BatchApi, "/v1", "file", "/v1/files"),
        (AnthropicBatchApi, "/v1", "batch", "/v1/messages/batches"),
        (GeminiBatchApi, "/v1beta", "batch", "/v1beta/batches"),
    ],
)
def test_a_cursor_that_comes_back_ends_the_listing_with_a_clear_error(
    looping, kind, base, what, path
) -> None:
    url, calls, _ = looping
    with pytest.raises(PagingError, match="again; the provider's paging would loop for ever"):
        asyncio.run(_find(kind, url.removesuffix("/v1") + base, what))
    assert calls[path] == 2  # the first cursor, and the same one again


@pytest.mark.parametrize(
    ("kind", "path"), [(BatchApi, "/v1/batches"), (AnthropicBatchApi, "/v1/messages/batches")]
)
def test_a_page_that_lists_nothing_but_says_there_is_more_is_an_error(looping, kind, path) -> None:
    url, calls, set_mode = looping
    set_mode("empty")
    with pytest.raises(PagingError, match="says there is more but lists nothing"):
        asyncio.run(_find(kind, url))
    assert calls[path] == 1


def test_a_listing_under_way_gives_way_to_a_stop_at_once() -> None:
    async def endless() -> None:
        while True:  # a provider that pages slowly for ever
            await asyncio.sleep(0.05)

    async def scenario() -> float:
        stopping = asyncio.Event()
        asyncio.get_running_loop().call_later(0.2, stopping.set)
        start = time.monotonic()
        with pytest.raises(Stopped):
            await unless_stopped(endless(), stopping)
        return time.monotonic() - start

    assert asyncio.run(scenario()) < 5.0

    async def finished() -> int:
        return await unless_stopped(asyncio.sleep(0, result=7), asyncio.Event())

    assert asyncio.run(finished()) == 7


@pytest.mark.slow
def test_exec_batch_api_looking_for_a_lost_batch_ends_on_a_looping_list_and_on_sigterm(
    tmp_path, mock_server
) -> None:
    """The re-run after a crash around a create lists the provider's batches to find the one it
    may have made. A provider whose list repeats its cursor ends the run with a clear error (it
    made 109,610 list requests in 40 s before); one that pages slowly for ever with new cursors
    gives way to SIGTERM at once."""
    import subprocess

    import orjson
    from batchapiutil import BatchServer
    from batchutil import exec_cli, start_exec, write_requests

    fast = ("--batch-api", "--poll-interval", "0.1")
    server = BatchServer(tmp_path / "state", mock_server(latency=0.5)).start()
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 4)
    state_path = out.with_name(out.name + ".batch-api.json")
    try:
        proc = start_exec(requests, out, "--url", server.url, *fast)
        deadline = time.monotonic() + 60
        while not (state_path.exists() and any(
            p.get("batch_id") for p in orjson.loads(state_path.read_bytes())["parts"]
        )):  # fmt: skip
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.kill()
        proc.wait()
    finally:
        server.kill()
    state = orjson.loads(state_path.read_bytes())
    state["parts"][0]["batch_id"] = None  # as if the crash came before the id was saved
    assert state["parts"][0]["creating_since"]
    state_path.write_bytes(orjson.dumps(state))

    calls: Counter[str] = Counter()
    mode = {"slow": False}

    async def batches(request: web.Request) -> web.Response:
        calls["list"] += 1
        if mode["slow"]:
            await asyncio.sleep(0.2)
        cursor = f"cursor-{calls['list']}" if mode["slow"] else "cursor-1"
        return web.json_response({"object": "list", "data": [_batch(calls["list"])],
                                  "has_more": True, "last_id": cursor})  # fmt: skip

    app = web.Application()
    app.router.add_get("/v1/batches", batches)
    url, stop = serve_app(app)
    try:
        done = exec_cli(requests, out, "--url", url, *fast)
        assert done.returncode == 1, done.stderr
        assert "gives the cursor 'cursor-1' again" in done.stderr
        assert "Traceback" not in done.stderr and calls["list"] == 2
        mode["slow"] = True
        proc = start_exec(requests, out, "--url", url, *fast)
        deadline = time.monotonic() + 60
        while calls["list"] < 8:  # paging, with new cursors each time
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        assert time.monotonic() - sent < 5.0  # bounded, not a speed target: it ignored it before
        assert proc.returncode == 130, proc.stderr.read() if proc.stderr else ""
    finally:
        stop()

"""A provider's results file is untrusted data, for all three providers: a line that is not JSON,
a JSON array, an id (`custom_id`, Gemini's `key`) that is a list or an object, each is counted
and said, the run goes on, and the requests those lines were for end as failures that
`--retry-failed` sends again. A real `serve --batch-api` answers behind a real proxy on
127.0.0.1 that spoils the results file on its way to exec."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from batchapiutil import BatchServer
from batchutil import exec_cli, read_results, serve_app

FAST = ("--batch-api", "--poll-interval", "0.1")
MODEL = "claude-haiku-4-5"
#: provider -> (its results download's path, its id field, request endpoint)
PROVIDERS = {
    "openai": (r"^/v1/files/[^/]+/content$", "custom_id", "/v1/chat/completions"),
    "anthropic": (r"^/v1/messages/batches/[^/]+/results$", "custom_id", "/v1/messages"),
    "gemini": (r"^/download/", "key", "/v1/chat/completions"),
}
_HOP = {"host", "content-length", "transfer-encoding", "content-encoding", "connection"}


def _spoiled(body: bytes, field: str) -> bytes:
    """The results with the first two lines' ids made a list and an object, and two lines that
    answer nothing (not JSON; a JSON array) put first."""
    lines = [orjson.loads(x) for x in body.splitlines() if x.strip()]
    lines[0][field] = [lines[0][field]]
    lines[1][field] = {"id": lines[1][field]}
    return b"[1, 2]\nnot json {\n" + b"".join(orjson.dumps(x) + b"\n" for x in lines)


def _proxy(
    upstream: str,
    pattern: str,
    field: str,
    switch: dict[str, bool],
    change: Callable[[bytes], bytes] | None = None,
) -> tuple[str, Any]:
    """A forwarding proxy to `upstream` (a server's root) that spoils a results download
    (`change`, by default `_spoiled`) while `switch["on"]`."""

    async def handler(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with (
            aiohttp.ClientSession(auto_decompress=False) as session,
            session.request(
                request.method,
                upstream + request.path_qs,
                headers=headers,
                data=await request.read(),
                allow_redirects=False,
            ) as resp,
        ):
            body = await resp.read()
            kept = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP}
        if switch["on"] and resp.status == 200 and re.search(pattern, request.path):
            body = change(body) if change else _spoiled(body, field)
        return web.Response(status=resp.status, body=body, headers=kept)

    app = web.Application(client_max_size=1 << 26)
    app.router.add_route("*", "/{tail:.*}", handler)
    return serve_app(app)


def _requests(path: Path, endpoint: str, n: int) -> set[str]:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 16}
    lines = [
        {
            "custom_id": f"row-{i}",
            "method": "POST",
            "url": endpoint,
            "body": {**body, "messages": [{"role": "user", "content": f"question {i}"}]},
        }
        for i in range(n)
    ]
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return {x["custom_id"] for x in lines}


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_bad_results_lines_are_counted_and_their_requests_retried(
    tmp_path: Path, mock_server: Any, provider: str
) -> None:
    pattern, field, endpoint = PROVIDERS[provider]
    server = BatchServer(tmp_path / "state", mock_server(served_models=(MODEL,))).start()
    spoil = {"on": True}
    url, stop = _proxy(server.url.removesuffix("/v1"), pattern, field, spoil)
    if provider == "gemini":
        url = url.removesuffix("/v1") + "/v1beta"
    try:
        requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        ids = _requests(requests, endpoint, 5)
        args = ("--url", url, *FAST, "--batch-provider", provider)
        first = exec_cli(requests, out, *args, timeout=60)
        assert first.returncode == 3, first.stderr  # failures written, no traceback
        assert "Traceback" not in first.stderr
        assert "4 results lines could not be read" in first.stderr, first.stderr
        assert f"`{field}` is a list" in first.stderr and "not JSON" in first.stderr
        results = read_results(out)
        assert set(results) == ids
        failed = {k for k, v in results.items() if v.get("error")}
        assert len(failed) == 2, results
        assert all(results[k]["error"]["code"] == "missing_result" for k in failed)
        assert "could not be read" in results[failed.pop()]["error"]["message"]
        spoil["on"] = False
        again = exec_cli(requests, out, *args, "--retry-failed", timeout=60)
        assert again.returncode == 0, again.stderr
        results = read_results(out)
        assert set(results) == ids and not any(v.get("error") for v in results.values())
    finally:
        stop()
        server.kill()


def test_the_guard_reads_lines_across_chunks_and_never_holds_an_overlong_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jsonlbatch.batchapi.client import result_merge as merge

    monkeypatch.setattr(merge, "MAX_RESULT_LINE", 1000)
    good = b'{"custom_id": "a", "response": {"status_code": 200, "body": {}}}'
    data = good + b"\n" + b"y" * 5000 + b"\n\n" + good.replace(b'"a"', b'"b"') + b"\n" + good
    for size in (1, 7, 300, len(data)):  # every way the stream may be cut
        guard = merge.ResultsGuard()
        out = b"".join(guard.feed(data[i : i + size]) for i in range(0, len(data), size))
        lines = [orjson.loads(x) for x in (out + guard.end()).splitlines()]
        assert [x["custom_id"] for x in lines] == ["a", None, "b", "a"], size
        assert lines[1]["unreadable"] == "line 2: longer than 1000 bytes"
        assert guard._held <= 1000 + size  # never more than the cap and a chunk


def test_a_batch_whose_counts_and_errors_are_garbage_still_ends_in_failure_lines(
    tmp_path: Path,
) -> None:
    """The batch object is the provider's data too: `request_counts` values that are no numbers
    and `errors` that are no list of objects (one echoing the key) end as failure lines."""
    key = "sk-batch-Hq4Zr8Tn2Wv6Yp1Lc7"

    async def handler(request: web.Request) -> web.Response:
        await request.read()
        batch = {"object": "batch", "id": "batch_x", "status": "failed",
                 "request_counts": {"completed": "lots", "failed": [1], "total": {"a": 1}},
                 "errors": {"data": ["boom", {"line": [1], "message": f"Bearer {key}"},
                                     {"message": {"deep": "x" * 100_000}}]}}  # fmt: skip
        if request.method == "POST" and request.path == "/v1/files":
            return web.json_response({"object": "file", "id": "file-in", "status": "processed"})
        if request.path.startswith("/v1/batches"):
            return web.json_response(batch)
        return web.json_response({"error": {"message": "no"}}, status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    url, stop = serve_app(app)
    try:
        requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        ids = _requests(requests, "/v1/chat/completions", 2)
        args = ("--url", url, *FAST, "--max-retries", "0", "--api-key", key)
        done = exec_cli(requests, out, *args, timeout=60)
        assert done.returncode == 3, done.stderr
        assert "Traceback" not in done.stderr
        results = read_results(out)
        assert set(results) == ids
        message = results["row-0"]["error"]["message"]
        assert results["row-0"]["error"]["code"] == "batch_failed" and "boom" in message
        assert key[8:20] not in out.read_text() and len(message) < 5000
    finally:
        stop()


@pytest.mark.parametrize(
    "job", [{"name": "batches/x", "metadata": ["state"]}, {"name": ["x"]}, [1], "job"]
)
def test_a_gemini_job_of_the_wrong_shape_is_a_clear_error(job: Any) -> None:
    from jsonlbatch.batchapi.client.batch_api import RemoteError
    from jsonlbatch.batchapi.client.gemini_api import GeminiBatchApi
    from jsonlbatch.exec.route.endpoints import parse_endpoint

    api = GeminiBatchApi(parse_endpoint("http://127.0.0.1:9/v1beta"), None)  # type: ignore[arg-type]
    with pytest.raises(RemoteError, match="not a Gemini batch job"):
        api._job(job, "GET v1beta/batches/x")

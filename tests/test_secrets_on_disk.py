"""Every file exec writes goes through the output's redaction, not only the output: the re-ask
journal (which stays after a kill -9) and a Batch API run's results. Real servers on 127.0.0.1
that echo the API key back; the real CLI in subprocesses."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from batchapiutil import BatchServer
from batchutil import exec_cli, odd_server, read_results, start_exec
from contractutil import SCHEMA

from jsonlbatch.answer_contract.schema_forms import with_schema
from jsonlbatch.batch_format.records import CHAT_URL
from jsonlbatch.exec.hooks.contract_check import journal_path

KEY = "sk-disk-Hq4Zr8Tn2Wv6Yp1Lc7"


def _hidden(data: bytes) -> bool:
    """No six characters of KEY in `data` (not even a cut-off head)."""
    return not any(KEY[i : i + 6].encode() in data for i in range(len(KEY) - 5))


def _chat(content: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "mock",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
    }


def test_the_reask_journal_masks_an_echoed_key_and_stays_masked_after_kill_9(tmp_path):
    asked: list[int] = []
    done: list[bool] = []

    async def echo_then_hang(request: web.Request) -> web.Response:
        await request.read()
        asked.append(1)
        while len(asked) > 1 and not done:  # the re-ask: held while the journal is on disk
            await asyncio.sleep(0.05)
        said = f"not JSON; you sent {request.headers.get('Authorization')}"
        return web.json_response(_chat(said))

    url, stop = odd_server(echo_then_hang)
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    body = with_schema(CHAT_URL, {"model": "mock", "messages": [{"role": "user", "content": "x"}]},
                       SCHEMA)  # fmt: skip
    line = {"custom_id": "r0", "method": "POST", "url": CHAT_URL, "body": body}
    requests.write_bytes(orjson.dumps(line) + b"\n")
    journal = Path(journal_path(str(out)))
    proc = start_exec(requests, out, "--url", url, "--api-key", KEY, "--reask", "2", "-q")
    try:
        deadline = time.monotonic() + 60
        while not (journal.exists() and journal.read_bytes().endswith(b"\n")):
            assert proc.poll() is None and time.monotonic() < deadline, "no journal written"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        done.append(True)
        stop()
    kept = journal.read_bytes()
    assert b"you sent" in kept and b"***" in kept, kept  # the answer is kept, masked
    assert _hidden(kept), kept


def test_batch_api_results_echoing_the_key_are_masked_on_disk(tmp_path, mock_server):
    from test_batchapi_results_lines import _proxy, _requests

    server = BatchServer(tmp_path / "state", mock_server(served_models=("claude-haiku-4-5",)))
    server.start()
    url, stop = _proxy(
        server.url.removesuffix("/v1"),
        r"^/v1/files/[^/]+/content$",
        "custom_id",
        {"on": True},
        lambda body: body.replace(b'"model"', f'"echo":"Bearer {KEY}","model"'.encode()),
    )
    try:
        requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        ids = _requests(requests, "/v1/chat/completions", 3)
        args = ("--url", url, "--batch-api", "--poll-interval", "0.1", "--api-key", KEY)
        done = exec_cli(requests, out, *args, "--batch-provider", "openai", timeout=60)
        assert done.returncode == 0, done.stderr
        assert set(read_results(out)) == ids
        assert b"Bearer ***" in out.read_bytes()  # the echo arrived, masked
        for path in tmp_path.rglob("*"):
            if path.is_file() and "state" not in path.parts:  # the server's own files aside
                assert _hidden(path.read_bytes()), path
    finally:
        stop()
        server.kill()

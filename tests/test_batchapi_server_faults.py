"""`serve --batch-api` under faults: a database another process locks for a while, a kill -9 in
the middle of an upload, values that do not fit. Real server processes, the real `openai` SDK."""

from __future__ import annotations

import io
import socket
import sqlite3
import threading
import time

import openai
import orjson
import pytest
from batchapiutil import BatchServer, wait_batch
from batchutil import chat_body, cli


def _lines(count: int) -> bytes:
    return b"".join(
        orjson.dumps(
            {
                "custom_id": f"q-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": chat_body(i),
            }
        )
        + b"\n"
        for i in range(count)
    )


def _create(client: openai.OpenAI, data: bytes, **extra) -> openai.types.Batch:
    file_id = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch").id
    window = extra.pop("completion_window", "24h")
    return client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window=window, **extra
    )


def test_out_of_range_values_are_a_400_naming_the_field(tmp_path, mock_server):
    server = BatchServer(tmp_path / "state", mock_server(), process=True).start()  # its log
    client = server.client()
    with pytest.raises(openai.BadRequestError) as caught:
        _create(client, _lines(1), completion_window="99999999999999999999d")
    assert "completion_window" in str(caught.value)
    file_id = client.files.create(file=("in.jsonl", io.BytesIO(_lines(1))), purpose="batch").id
    with pytest.raises(openai.BadRequestError) as caught:
        client.batches.create(
            input_file_id=file_id,
            endpoint=["/v1/chat/completions"],  # type: ignore[arg-type]
            completion_window="24h",
        )
    assert "endpoint" in str(caught.value)
    import urllib.error
    import urllib.request

    broken = urllib.request.Request(
        server.url + "/files",
        data=b"--x\r\n",
        headers={"Content-Type": "multipart/form-data; boundary=x"},
    )
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(broken, timeout=30)
    assert http.value.code == 400 and b"multipart" in http.value.read()
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(server.url + "/batches/" + "a" * 9000, timeout=30)
    assert http.value.code == 400
    server.kill()
    log = server.proc.stderr.read()  # type: ignore[union-attr]
    assert "Traceback" not in log and "bad request from a client" in log, log


@pytest.mark.slow
def test_a_database_locked_for_a_while_is_waited_out(tmp_path, mock_server):
    """Another process holds `BEGIN EXCLUSIVE` for longer than SQLite's default 5 s wait while
    a batch runs and a file is uploaded: both go through once it lets go."""
    server = BatchServer(
        tmp_path / "state", mock_server(latency=0.05), "--batch-concurrency", "1"
    ).start()
    client = server.client()
    batch = _create(client, _lines(20))
    wait_batch(client, batch.id, until=lambda b: b.request_counts.completed >= 2)
    other = sqlite3.connect(tmp_path / "state" / "batches.sqlite3", isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    uploaded: list[object] = []
    upload_client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    upload = threading.Thread(
        target=lambda: uploaded.append(
            upload_client.files.create(file=("late.jsonl", io.BytesIO(_lines(2))), purpose="batch")
        )
    )
    upload.start()
    time.sleep(5.5)  # past SQLite's default busy timeout
    other.execute("COMMIT")
    other.close()
    upload.join(60)
    assert uploaded and uploaded[0].filename == "late.jsonl", "the upload failed"  # type: ignore[attr-defined]
    done = wait_batch(client, batch.id, timeout=60)
    assert done.status == "completed" and done.request_counts.completed == 20
    # every file on disk has its row and every row its bytes
    on_disk = {p.name for p in (tmp_path / "state" / "files").iterdir()}
    listed = {f.id for f in client.files.list()}
    assert listed <= on_disk and on_disk - listed <= {done.output_file_id}


@pytest.mark.slow
def test_kill_during_an_upload_leaves_no_temp_file_and_one_server_per_directory(
    tmp_path, mock_server
):
    server = BatchServer(tmp_path / "state", mock_server(), process=True).start()
    files = tmp_path / "state" / "files"
    port = int(server.url.rsplit(":", 1)[1].split("/")[0])
    boundary = "xyzzy"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n'
        "Content-Type: application/jsonl\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            b"POST /v1/files HTTP/1.1\r\nHost: x\r\n"
            + f"Content-Type: multipart/form-data; boundary={boundary}\r\n".encode()
            + b"Content-Length: 100000000\r\n\r\n"
            + head
            + b"x" * (3 << 20)  # the body goes on: the server writes it to a temp file
        )
        deadline = time.monotonic() + 20
        while not list(files.glob("*.upload")):
            assert time.monotonic() < deadline, "no temp file seen"
            time.sleep(0.05)
        server.kill()
    assert list(files.glob("*.upload"))
    server.start()
    assert not list(files.glob("*.upload")), "a restart left the killed upload's temp file"
    assert server.client().files.list().data == []
    # one server per directory: a second one could remove the first one's upload under way
    args = ("--batch-api", "--upstream", server.upstream, "--batch-dir", str(files.parent))
    second = cli("serve", *args, "--batch-port", "0", timeout=60)
    assert second.returncode != 0 and "in use by another" in second.stderr, second.stderr


def test_client_credentials_are_not_passed_to_the_upstream(tmp_path):
    from aiohttp import web
    from batchutil import odd_server

    seen: list[dict] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append({k.lower(): v for k, v in request.headers.items()})
        return web.json_response({"id": "c", "choices": [], "object": "chat.completion"})

    upstream, stop = odd_server(handler)
    try:
        server = BatchServer(  # a process: the option's way from the command line
            tmp_path / "state", upstream, "--upstream-api-key", "sk-up", process=True
        ).start()
        import urllib.request

        request = urllib.request.Request(
            server.url + "/chat/completions",
            data=b'{"model": "mock", "messages": []}',
            headers={
                "Content-Type": "application/json",
                "x-api-key": "client-secret-1",
                "Cookie": "session=client-secret-2",
                "x-goog-api-key": "client-secret-3",
                "X-Trace": "kept",
            },
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            assert resp.status == 200
    finally:
        stop()
    [headers] = seen
    assert headers["x-trace"] == "kept" and headers["authorization"] == "Bearer sk-up"
    assert not any("client-secret" in v for v in headers.values()), headers


def test_the_runner_logs_a_failure_and_goes_on(tmp_path, monkeypatch, caplog):
    """Any failure in the runner's loop (here the database raising twice) is one log line and
    a restart from the stored state, never a silent end of the runner task."""
    import asyncio
    import logging

    from jsonlbatch.batchapi.server import batch_runner as runner_module
    from jsonlbatch.batchapi.server.batch_runner import BatchRunner, RunnerOptions
    from jsonlbatch.batchapi.server.batch_store import Store

    monkeypatch.setattr(runner_module, "_RETRY_BACKEND", 0.01)
    store = Store(tmp_path / "state")
    calls: list[str] = []
    real = store.batches_where

    def flaky(condition: str):
        calls.append(condition)
        if len(calls) <= 2:
            raise sqlite3.OperationalError("database is locked")
        return real(condition)

    monkeypatch.setattr(store, "batches_where", flaky)

    async def scenario() -> bool:
        runner = BatchRunner(store, RunnerOptions(urls=["http://127.0.0.1:9/v1"]))
        task = asyncio.ensure_future(runner.run_forever())
        for _ in range(500):  # bounded
            runner.wake.set()
            await asyncio.sleep(0.01)
            if len(calls) > 6 or task.done():
                break
        alive = not task.done()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return alive

    with caplog.at_level(logging.ERROR, logger="jsonlbatch.batchapi"):
        assert asyncio.run(scenario()), "the runner task ended"
    store.close()
    assert len(calls) > 6 and "batch runner failed (OperationalError" in caplog.text

"""`serve --batch-api` with the real `openai` SDK as its client, over 127.0.0.1."""

from __future__ import annotations

import io
import signal
import time

import openai
import orjson
import pytest
from batchapiutil import BatchServer, jsonl_lines, wait_batch
from batchutil import chat_body

from jsonlbatch.mock import reply_text


def _requests(count: int, prefix: str = "q") -> list[dict]:
    return [
        {
            "custom_id": f"{prefix}-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": chat_body(i),
        }
        for i in range(count)
    ]


def _upload(client: openai.OpenAI, lines: list[dict], name: str = "in.jsonl") -> str:
    data = b"".join(orjson.dumps(x) + b"\n" for x in lines)
    return client.files.create(file=(name, io.BytesIO(data)), purpose="batch").id


def _create(client: openai.OpenAI, lines: list[dict], **extra) -> openai.types.Batch:
    return client.batches.create(
        input_file_id=_upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
        **extra,
    )


def _check_answers(text: str, requests: list[dict]) -> dict[str, dict]:
    """Every line answers its own request (the mock's reply depends only on the request)."""
    by_id = {r["custom_id"]: r for r in requests}
    seen = {}
    for line in jsonl_lines(text):
        cid = line["custom_id"]
        assert cid not in seen, f"{cid} twice"
        seen[cid] = line
        assert line["error"] is None and line["response"]["status_code"] == 200
        content = line["response"]["body"]["choices"][0]["message"]["content"]
        assert content == reply_text(by_id[cid]["body"], 0)
    return seen


def test_sdk_files_and_batches_round_trip(tmp_path, mock_server):
    server = BatchServer(tmp_path / "state", mock_server()).start()
    client = server.client()
    requests = _requests(12)
    file_id = _upload(client, requests)

    info = client.files.retrieve(file_id)
    assert (info.purpose, info.filename, info.object) == ("batch", "in.jsonl", "file")
    assert file_id in [f.id for f in client.files.list(purpose="batch")]

    batch = client.batches.create(
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"run": "t1"},
    )
    assert batch.status == "validating" and batch.metadata == {"run": "t1"}
    done = wait_batch(client, batch.id)
    assert done.status == "completed", done
    assert done.request_counts.model_dump() == {"total": 12, "completed": 12, "failed": 0}
    assert done.error_file_id is None
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    answered = _check_answers(client.files.content(done.output_file_id).text, requests)
    assert set(answered) == {r["custom_id"] for r in requests}

    # the live endpoints keep working on the same URL
    reply = client.chat.completions.create(**chat_body(99))
    assert reply.choices[0].message.content == reply_text(chat_body(99), 0)

    # a file can be deleted; a finished batch cannot be cancelled
    assert client.files.delete(file_id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(file_id)
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_sdk_list_pages_with_after_and_limit(tmp_path, mock_server):
    client = BatchServer(tmp_path / "state", mock_server()).start().client()
    file_id = _upload(client, _requests(1))
    made = [
        client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        ).id
        for _ in range(5)
    ]
    first = client.batches.list(limit=2)
    assert [b.id for b in first.data] == made[::-1][:2]  # newest first
    assert first.has_more and first.last_id == made[3]
    second = client.batches.list(limit=2, after=first.last_id)
    assert [b.id for b in second.data] == [made[2], made[1]]
    assert [b.id for b in client.batches.list(limit=2)] == made[::-1]  # the SDK pages on `after`
    for batch_id in made:
        assert wait_batch(client, batch_id).status == "completed"


def test_sdk_cancel_splits_output_and_error_files(tmp_path, mock_server):
    upstream = mock_server(latency=0.1)
    client = (
        BatchServer(  # a process: --batch-concurrency's way from the command line
            tmp_path / "state", upstream, "--batch-concurrency", "2", process=True
        )
        .start()
        .client()
    )
    requests = _requests(40)
    batch = _create(client, requests)
    wait_batch(client, batch.id, until=lambda b: b.request_counts.completed >= 4)
    assert client.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    done = wait_batch(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    counts = done.request_counts
    assert counts.total == 40 and counts.completed >= 4 and counts.completed + counts.failed == 40
    answered = _check_answers(client.files.content(done.output_file_id).text, requests)
    errors = jsonl_lines(client.files.content(done.error_file_id).text)
    assert len(answered) == counts.completed and len(errors) == counts.failed
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert not set(answered) & {e["custom_id"] for e in errors}


def test_bad_input_fails_the_batch_naming_the_line(tmp_path, mock_server):
    client = BatchServer(tmp_path / "state", mock_server()).start().client()
    lines = _requests(3)
    del lines[1]["body"]["messages"]
    lines[2]["url"] = "/v1/embeddings"
    batch = _create(client, lines)
    done = wait_batch(client, batch.id)
    assert done.status == "failed" and done.failed_at
    assert [(e.line, e.param) for e in done.errors.data] == [
        (2, "body.messages"),
        (3, "body.input"),
    ]
    # well-formed lines for another endpoint than the batch's are refused as OpenAI does
    other = _requests(2)
    other[1] = {**other[1], "url": "/v1/embeddings", "body": {"model": "mock", "input": "x"}}
    batch = _create(client, other)
    done = wait_batch(client, batch.id)
    assert [(e.code, e.line) for e in done.errors.data] == [("mismatched_endpoint", 2)]
    with pytest.raises(openai.BadRequestError):
        client.batches.create(
            input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h"
        )


def test_api_key_guards_the_front(tmp_path, mock_server):
    server = BatchServer(  # a process: the option's way from the command line is tested too
        tmp_path / "state", mock_server(), "--server-api-key", "sk-front", process=True
    ).start()
    with pytest.raises(openai.AuthenticationError):
        server.client("wrong").batches.list()
    assert server.client("sk-front").batches.list().data == []


@pytest.mark.slow
def test_server_killed_mid_batch_resumes_without_resending(tmp_path, mock_process):
    mock = mock_process("--latency", "0.1")
    server = BatchServer(
        tmp_path / "state", mock.url, "--batch-concurrency", "2", process=True
    ).start()
    client = server.client()
    requests = _requests(20)
    batch = _create(client, requests)
    wait_batch(client, batch.id, until=lambda b: b.request_counts.completed >= 4)
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    time.sleep(0.3)
    client = server.start().client()
    done = wait_batch(client, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 20
    assert len(_check_answers(client.files.content(done.output_file_id).text, requests)) == 20
    import urllib.request

    with urllib.request.urlopen(mock.url.replace("/v1", "/mock/stats")) as resp:
        sent = orjson.loads(resp.read())["requests"]["/v1/chat/completions"]
    assert 20 <= sent <= 22, f"{sent} requests for 20: the done ones were sent again"


@pytest.mark.slow
def test_serve_batch_api_launches_its_backend(tmp_path):
    """`serve --batch-api --backend mock`: the printed URL is the front; batches and live
    requests both reach the launched backend, which goes down with the front."""
    from batchutil import start_cli
    from conftest import free_port

    proc = start_cli(
        "serve",
        "--batch-api",
        "--backend",
        "mock",
        "--batch-dir",
        str(tmp_path / "state"),
        "--server-log-dir",
        str(tmp_path),
        "--port",  # the backend's: other runs on this machine may hold 8000 at bind time
        str(free_port()),
    )
    url = proc.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), proc.stderr.read()
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
    requests = _requests(3)
    batch = _create(client, requests)
    done = wait_batch(client, batch.id)
    assert done.status == "completed"
    _check_answers(client.files.content(done.output_file_id).text, requests)
    assert [m.id for m in client.models.list()] == ["mock"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_azure_urls_and_endpoint_names():
    """Azure's dated API: /openai/files?api-version=..., endpoints without /v1, api-key header."""
    from jsonlbatch.batchapi.client.batch_api import api_path
    from jsonlbatch.exec.route.endpoints import auth_headers, parse_endpoint

    dated = parse_endpoint("https://res.openai.azure.com/openai?api-version=2024-10-21")
    assert dated.url_for("/v1/batches") == (
        "https://res.openai.azure.com/openai/batches?api-version=2024-10-21"
    )
    assert api_path(dated, "/v1/chat/completions") == "/chat/completions"
    assert auth_headers(dated, "k")["api-key"] == "k"
    v1 = parse_endpoint("https://res.openai.azure.com/openai/v1")
    assert api_path(v1, "/v1/chat/completions") == "/v1/chat/completions"
    assert api_path(parse_endpoint("https://api.openai.com/v1"), "/v1/embeddings") == (
        "/v1/embeddings"
    )

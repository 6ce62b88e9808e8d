"""Gemini's batch mode as `serve --batch-api` serves it, judged by the official `google-genai`
SDK as the client: inline and file jobs, the resumable upload, the download, listing, cancel,
delete, expiry, a full queue, on both API versions (`v1`, today's default, and `v1beta`)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from batchapiutil import BatchServer

genai = pytest.importorskip("google.genai", reason="pip install google-genai (the test extra)")
from google.genai import types  # noqa: E402

MODEL = "gemini-2.5-flash"
DONE = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED"}


@pytest.fixture
def server(tmp_path: Path, mock_server: Any) -> Iterator[BatchServer]:
    upstream = mock_server(latency=0.02, served_models=(MODEL,))
    front = BatchServer(tmp_path / "batches", upstream, "--server-api-key", "g-key").start()
    yield front
    front.kill()


def _client(server: BatchServer, version: str = "v1") -> Any:
    options = types.HttpOptions(base_url=server.url.removesuffix("/v1"), api_version=version)
    return genai.Client(api_key="g-key", http_options=options)


def _wait(client: Any, name: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.batches.get(name=name)
        if job.state.name in DONE:
            return job
        time.sleep(0.1)
    raise AssertionError(f"{name} still {job.state}")


def _inline(n: int) -> list[dict[str, Any]]:
    return [
        {
            "contents": [{"role": "user", "parts": [{"text": f"question {i}"}]}],
            "config": {"temperature": 0.5, "max_output_tokens": 32},
        }
        for i in range(n)
    ]


@pytest.mark.parametrize("version", ["v1", "v1beta"])
def test_an_inline_job_answers_in_order(server: BatchServer, version: str) -> None:
    client = _client(server, version)
    job = client.batches.create(model=MODEL, src=_inline(4), config={"display_name": "inline-4"})
    assert job.name.startswith("batches/") and job.display_name == "inline-4"
    done = _wait(client, job.name)
    assert done.state.name == "JOB_STATE_SUCCEEDED"
    responses = done.dest.inlined_responses
    assert len(responses) == 4
    for item in responses:
        assert item.error is None
        assert item.response.text and item.response.usage_metadata.prompt_token_count > 0
    names = [j.name for j in client.batches.list(config={"page_size": 1})]
    assert job.name in names
    client.batches.delete(name=job.name)
    with pytest.raises(genai.errors.ClientError):
        client.batches.get(name=job.name)


def test_a_file_job_uploads_and_downloads(server: BatchServer, tmp_path: Path) -> None:
    client = _client(server)
    source = tmp_path / "requests.jsonl"
    with source.open("w") as fh:
        for i in range(6):
            request = {"contents": [{"parts": [{"text": f"q{i}"}], "role": "user"}],
                       "generationConfig": {"maxOutputTokens": 16}}  # fmt: skip
            fh.write(json.dumps({"key": f"row-{i}", "request": request}) + "\n")
    uploaded = client.files.upload(
        file=str(source), config={"display_name": "six", "mime_type": "jsonl"}
    )
    assert uploaded.name.startswith("files/")
    job = client.batches.create(model=MODEL, src=uploaded.name)
    done = _wait(client, job.name)
    assert done.state.name == "JOB_STATE_SUCCEEDED" and done.dest.file_name
    lines = [json.loads(x) for x in client.files.download(file=done.dest.file_name).splitlines()]
    assert sorted(x["key"] for x in lines) == [f"row-{i}" for i in range(6)]
    assert all(x["response"]["candidates"][0]["content"]["parts"][0]["text"] for x in lines)


def test_cancel_expiry_and_a_full_queue(tmp_path: Path, mock_server: Any) -> None:
    upstream = mock_server(latency=0.3, served_models=(MODEL,))
    front = BatchServer(tmp_path / "b", upstream, "--batch-concurrency", "1",
                        "--batch-expiry", "1.5", "--batch-max-queued", "30").start()  # fmt: skip
    try:
        client = _client(front)
        expiring = client.batches.create(model=MODEL, src=_inline(20))
        with pytest.raises(genai.errors.ClientError, match=r"RESOURCE_EXHAUSTED|exhausted"):
            client.batches.create(model=MODEL, src=_inline(20))  # 40 > 30 queued
        assert _wait(client, expiring.name).state.name == "JOB_STATE_EXPIRED"
        cancelled = client.batches.create(model=MODEL, src=_inline(20))
        client.batches.cancel(name=cancelled.name)
        assert _wait(client, cancelled.name).state.name == "JOB_STATE_CANCELLED"
    finally:
        front.kill()

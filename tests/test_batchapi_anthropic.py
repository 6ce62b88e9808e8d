"""Anthropic's Message Batches API as `serve --batch-api` serves it, judged by the official
`anthropic` SDK as the client: every call the SDK makes for batches, both authentication styles,
results of every type, and the refusals a real API gives."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from batchapiutil import BatchServer

anthropic = pytest.importorskip("anthropic", reason="pip install anthropic (the test extra)")


@pytest.fixture
def server(tmp_path: Path, mock_server: Any) -> Iterator[BatchServer]:
    upstream = mock_server(latency=0.02, served_models=("claude-haiku-4-5",))
    front = BatchServer(tmp_path / "batches", upstream, "--server-api-key", "sk-front-key").start()
    yield front
    front.kill()


def _client(server: BatchServer, **kwargs: Any) -> Any:
    root = server.url.removesuffix("/v1")
    return anthropic.Anthropic(base_url=root, api_key="sk-front-key", max_retries=0, **kwargs)


def _requests(n: int) -> list[dict[str, Any]]:
    return [
        {
            "custom_id": f"q-{i:03d}",
            "params": {
                "model": "claude-haiku-4-5",
                "max_tokens": 32,
                "messages": [{"role": "user", "content": f"question {i}"}],
            },
        }
        for i in range(n)
    ]


def _wait(client: Any, batch_id: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
        time.sleep(0.1)
    raise AssertionError(f"{batch_id} still {batch.processing_status}")


def test_the_sdk_creates_polls_lists_and_reads_results(server: BatchServer) -> None:
    client = _client(server)
    batch = client.messages.batches.create(requests=_requests(5))
    assert batch.id.startswith("msgbatch_") and batch.type == "message_batch"
    assert batch.processing_status == "in_progress"
    assert batch.request_counts.processing == 5 and batch.results_url is None

    ended = _wait(client, batch.id)
    assert ended.request_counts.succeeded == 5 and ended.request_counts.errored == 0
    assert ended.results_url and ended.ended_at is not None

    results = list(client.messages.batches.results(batch.id))
    assert sorted(r.custom_id for r in results) == [f"q-{i:03d}" for i in range(5)]
    for result in results:
        assert result.result.type == "succeeded"
        message = result.result.message
        assert message.type == "message" and message.content[0].type == "text"
        assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0

    listed = [b.id for b in client.messages.batches.list(limit=1)]  # pages of one
    assert batch.id in listed
    deleted = client.messages.batches.delete(batch.id)
    assert deleted.id == batch.id and deleted.type == "message_batch_deleted"


def test_both_ways_to_authenticate_and_a_wrong_key(server: BatchServer) -> None:
    # Today's SDK sends `Authorization: Bearer` with anthropic-version 2026-10-21; older
    # clients sent `x-api-key` with 2023-06-01. The front takes both.
    for headers in (
        {"x-api-key": "sk-front-key", "anthropic-version": "2023-06-01"},
        {"Authorization": "Bearer sk-front-key", "anthropic-version": "2026-10-21"},
    ):
        request = urllib.request.Request(server.url + "/messages/batches", headers=headers)
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200 and b'"data"' in response.read()
    wrong = anthropic.Anthropic(
        base_url=server.url.removesuffix("/v1"), api_key="nope", max_retries=0
    )
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.batches.list()


def test_refusals_are_anthropic_errors(server: BatchServer) -> None:
    client = _client(server)
    bad_id = _requests(1)
    bad_id[0]["custom_id"] = "django__django-11099|3"  # '|' is not allowed
    with pytest.raises(anthropic.BadRequestError, match="custom_id"):
        client.messages.batches.create(requests=bad_id)
    twice = _requests(2)
    twice[1]["custom_id"] = twice[0]["custom_id"]
    with pytest.raises(anthropic.BadRequestError, match="unique"):
        client.messages.batches.create(requests=twice)
    streamed = _requests(1)
    streamed[0]["params"]["stream"] = True
    with pytest.raises(anthropic.BadRequestError, match="stream"):
        client.messages.batches.create(requests=streamed)
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve("msgbatch_nope")


def test_cancel_and_expiry_give_their_result_types(tmp_path: Path, mock_server: Any) -> None:
    upstream = mock_server(latency=0.3, served_models=("claude-haiku-4-5",))
    front = BatchServer(  # a process: --batch-expiry's way from the command line
        tmp_path / "b", upstream, "--batch-concurrency", "1", "--batch-expiry", "1.5", process=True
    ).start()
    try:
        client = anthropic.Anthropic(
            base_url=front.url.removesuffix("/v1"), api_key="x", max_retries=0
        )
        expiring = client.messages.batches.create(requests=_requests(20))
        ended = _wait(client, expiring.id)
        counts = ended.request_counts
        assert counts.expired > 0 and counts.succeeded + counts.expired + counts.errored == 20
        kinds = {r.result.type for r in client.messages.batches.results(expiring.id)}
        assert "expired" in kinds

        cancelled = client.messages.batches.create(requests=_requests(20))
        assert client.messages.batches.cancel(cancelled.id).processing_status in (
            "canceling",
            "ended",
        )
        ended = _wait(client, cancelled.id)
        assert ended.request_counts.canceled > 0
        assert ended.cancel_initiated_at is not None
    finally:
        front.kill()


def test_a_full_queue_is_a_429(tmp_path: Path, mock_server: Any) -> None:
    upstream = mock_server(latency=0.5, served_models=("claude-haiku-4-5",))
    front = BatchServer(  # a process: the option's way from the command line
        tmp_path / "b", upstream, "--batch-max-queued", "5", process=True
    ).start()
    try:
        client = anthropic.Anthropic(
            base_url=front.url.removesuffix("/v1"), api_key="x", max_retries=0
        )
        client.messages.batches.create(requests=_requests(4))
        with pytest.raises(anthropic.RateLimitError, match="queued"):
            client.messages.batches.create(requests=_requests(4))
    finally:
        front.kill()

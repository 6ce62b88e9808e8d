"""`exec --batch-api` against Anthropic's and Gemini's batch APIs (as `serve --batch-api`
serves them in front of the mock): the provider chosen and said, ids mapped and back, Gemini's
translation and its refusals before anything is submitted, a full queue waited out, a crash
around a create that never makes a second batch, an expiry then --retry-failed."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from batchapiutil import BatchServer
from batchutil import exec_cli, read_results, start_exec

FAST = ("--batch-api", "--poll-interval", "0.1")
CLAUDE, GEMINI = "claude-haiku-4-5", "gemini-2.5-flash"


def _messages_lines(path: Path, n: int, *, start: int = 0) -> list[dict[str, Any]]:
    lines = [
        {
            "custom_id": f"django__django-{11000 + i}|{i % 3}",  # '|': not allowed by Anthropic
            "method": "POST",
            "url": "/v1/messages",
            "body": {
                "model": CLAUDE,
                "max_tokens": 16,
                "messages": [{"role": "user", "content": f"fix bug {i}"}],
            },
        }
        for i in range(start, start + n)
    ]
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return lines


def _chat_lines(path: Path, n: int, **extra: Any) -> list[dict[str, Any]]:
    lines = [
        {
            "custom_id": f"row-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": GEMINI,
                "max_tokens": 16,
                "temperature": 0.2,
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": f"question {i}"},
                ],
                **extra,
            },
        }
        for i in range(n)
    ]
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return lines


def _get(url: str) -> Any:
    request = urllib.request.Request(url, headers={"x-api-key": "k", "x-goog-api-key": "k"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _anthropic_batches(server: BatchServer) -> list[dict[str, Any]]:
    return _get(server.url + "/messages/batches?limit=1000")["data"]


@pytest.fixture
def claude(tmp_path: Path, mock_server: Any) -> BatchServer:
    server = BatchServer(tmp_path / "state", mock_server(served_models=(CLAUDE,))).start()
    yield server
    server.kill()


def test_anthropic_ids_are_mapped_and_back(tmp_path: Path, claude: BatchServer) -> None:
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = _messages_lines(requests, 12)
    done = exec_cli(requests, out, "--url", claude.url, *FAST, "--batch-max-requests", "5")
    assert done.returncode == 0, done.stderr
    assert "anthropic batch API" in done.stderr  # the plan says where it goes
    results = read_results(out)
    assert set(results) == {x["custom_id"] for x in lines}  # the file's own ids
    for line in results.values():
        body = line["response"]["body"]
        assert body["type"] == "message" and body["content"][0]["text"]
        assert line["metrics"]["batch_id"].startswith("msgbatch_")
    assert sorted(b["request_counts"]["succeeded"] for b in _anthropic_batches(claude)) == [2, 5, 5]
    again = exec_cli(requests, out, "--url", claude.url, *FAST)
    assert again.returncode == 0 and "nothing to submit" in again.stderr
    assert len(_anthropic_batches(claude)) == 3


def test_a_file_mixing_endpoints_is_refused_with_counts(
    tmp_path: Path, claude: BatchServer
) -> None:
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _messages_lines(requests, 3)
    _chat_lines(tmp_path / "chat.jsonl", 2)
    requests.write_bytes(requests.read_bytes() + (tmp_path / "chat.jsonl").read_bytes())
    done = exec_cli(requests, out, "--url", claude.url, *FAST)
    assert done.returncode == 2, done.stderr
    assert "3 /v1/messages" in done.stderr and "2 /v1/chat/completions" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()
    refused = exec_cli(requests, out, "--url", claude.url, *FAST, "--batch-provider", "gemini")
    assert refused.returncode == 2 and "takes /v1/chat/completions lines" in refused.stderr
    assert _anthropic_batches(claude) == []


def test_part_limits_over_the_providers_are_refused_before_anything_is_sent(
    tmp_path: Path, claude: BatchServer
) -> None:
    """`--batch-max-requests`/`--batch-max-bytes` may make parts smaller, never larger than the
    provider takes: a part of 100,001 requests would be refused by Anthropic after the upload
    (before, the user's value was used as it was)."""
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _messages_lines(requests, 3)
    for flag, value, said in (("--batch-max-requests", "100001", "100,000 requests"),
                              ("--batch-max-bytes", "300000000", "256,000,000 bytes")):  # fmt: skip
        done = exec_cli(requests, out, "--url", claude.url, *FAST, flag, value)
        assert done.returncode == 2, done.stderr
        assert f"{flag} {int(value):,} is over the anthropic batch API's limit of {said}" in (
            done.stderr
        )
        assert "Traceback" not in done.stderr and not out.exists()
    assert _anthropic_batches(claude) == []
    assert exec_cli(requests, out, "--url", claude.url, *FAST, "--batch-max-requests",
                    "100000").returncode == 0  # fmt: skip


def test_gemini_translates_and_answers_as_chat(tmp_path: Path, mock_server: Any) -> None:
    server = BatchServer(tmp_path / "state", mock_server(served_models=(GEMINI,))).start()
    try:
        requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        lines = _chat_lines(requests, 7)
        url = server.url.removesuffix("/v1") + "/v1beta"
        done = exec_cli(requests, out, "--url", url, *FAST, "--batch-provider", "gemini")
        assert done.returncode == 0, done.stderr
        results = read_results(out)
        assert set(results) == {x["custom_id"] for x in lines}
        for line in results.values():
            body = line["response"]["body"]
            assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"]
            assert body["usage"]["prompt_tokens"] > 0
            assert line["metrics"]["batch_id"].startswith("batches/")
    finally:
        server.kill()


def test_gemini_refuses_what_it_cannot_translate_before_submitting(
    tmp_path: Path, mock_server: Any
) -> None:
    server = BatchServer(tmp_path / "state", mock_server(served_models=(GEMINI,))).start()
    try:
        requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        _chat_lines(requests, 3, tools=[{"type": "function", "function": {"name": "f"}}])
        done = exec_cli(requests, out, "--url", server.url, *FAST, "--batch-provider", "gemini")
        assert done.returncode == 1, done.stderr
        assert "in.jsonl:1: body.tools" in done.stderr and "nothing was submitted" in done.stderr
        assert _get(server.url.removesuffix("/v1") + "/v1beta/batches")["operations"] == []
    finally:
        server.kill()


@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
def test_a_full_queue_is_waited_out(tmp_path: Path, mock_server: Any, provider: str) -> None:
    model = {"openai": "mock", "anthropic": CLAUDE, "gemini": GEMINI}[provider]
    server = BatchServer(tmp_path / "state", mock_server(latency=0.05, served_models=(model,)),
                         "--batch-max-queued", "4").start()  # fmt: skip
    try:
        requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        if provider == "anthropic":
            lines = _messages_lines(requests, 8)
        else:
            lines = _chat_lines(requests, 8)
            if provider == "openai":
                for x in lines:
                    x["body"]["model"] = "mock"
                requests.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
        done = exec_cli(requests, out, "--url", server.url, *FAST, "--batch-max-requests", "4",
                        "--batch-provider", provider)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "wait" in done.stderr and "queue" in done.stderr  # the second part waited
        assert set(read_results(out)) == {x["custom_id"] for x in lines}
        assert all("error" not in x or x["error"] is None for x in read_results(out).values())
    finally:
        server.kill()


@pytest.mark.slow
def test_a_crash_around_an_anthropic_create_never_makes_a_second_batch(
    tmp_path: Path, mock_server: Any
) -> None:
    server = BatchServer(tmp_path / "state", mock_server(latency=0.2, served_models=(CLAUDE,)),
                         "--batch-concurrency", "1").start()  # fmt: skip
    try:
        requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        lines = _messages_lines(requests, 6)
        run = start_exec(requests, out, "--url", server.url, *FAST)
        state = out.with_name(out.name + ".batch-api.json")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _anthropic_batches(server):
            time.sleep(0.02)
        run.send_signal(signal.SIGKILL)
        run.wait()
        # As if the crash came between the create and saving its id: forget the id.
        data = orjson.loads(state.read_bytes())
        part = data["parts"][0]
        if part["batch_id"] is not None:
            part["batch_id"], part["status"] = None, None
            part["creating_since"] = part["creating_since"] or time.time() - 5
        state.write_bytes(orjson.dumps(data))
        done = exec_cli(requests, out, "--url", server.url, *FAST)
        assert done.returncode == 0, done.stderr
        assert "not creating it again" in done.stderr
        assert len(_anthropic_batches(server)) == 1
        assert set(read_results(out)) == {x["custom_id"] for x in lines}
    finally:
        server.kill()


def test_an_expired_part_then_retry_failed_submits_only_those(
    tmp_path: Path, mock_server: Any
) -> None:
    server = BatchServer(tmp_path / "state", mock_server(latency=0.3, served_models=(CLAUDE,)),
                         "--batch-concurrency", "1", "--batch-expiry", "1.2").start()  # fmt: skip
    try:
        requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        lines = _messages_lines(requests, 10)
        first = exec_cli(requests, out, "--url", server.url, *FAST)
        assert first.returncode == 3, first.stderr
        results = read_results(out)
        expired = {
            k for k, v in results.items() if (v.get("error") or {}).get("code") == "batch_expired"
        }
        assert expired and len(results) == 10
        server.kill()
        server = BatchServer(tmp_path / "state2", mock_server(served_models=(CLAUDE,))).start()
        again = exec_cli(requests, out, "--url", server.url, *FAST, "--retry-failed")
        assert again.returncode == 0, again.stderr
        batches = _anthropic_batches(server)
        assert len(batches) == 1 and batches[0]["request_counts"]["succeeded"] == len(expired)
        assert set(read_results(out)) == {x["custom_id"] for x in lines}
    finally:
        server.kill()


@pytest.mark.slow
def test_batches_status_and_cancel_speak_anthropic(tmp_path: Path, mock_server: Any) -> None:
    from batchutil import cli

    server = BatchServer(tmp_path / "state", mock_server(latency=0.5, served_models=(CLAUDE,)),
                         "--batch-concurrency", "1").start()  # fmt: skip
    try:
        requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        _messages_lines(requests, 20)
        run = start_exec(requests, out, "--url", server.url, *FAST)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _anthropic_batches(server):
            time.sleep(0.05)
        run.send_signal(signal.SIGINT)  # stops the watching, not the batch
        assert run.wait(60) == 130
        shown = cli("batches", "status", str(out))
        assert shown.returncode == 0 and "msgbatch_" in shown.stdout, shown.stderr
        cancelled = cli("batches", "cancel", str(out))
        assert cancelled.returncode == 0, cancelled.stderr
        deadline = time.monotonic() + 60
        while (
            time.monotonic() < deadline
            and _anthropic_batches(server)[0]["processing_status"] != "ended"
        ):
            time.sleep(0.1)
        assert "cancelled" in cli("batches", "status", str(out)).stdout
        done = exec_cli(requests, out, "--url", server.url, *FAST)  # collects what ran
        assert done.returncode == 3
        codes = {(x.get("error") or {}).get("code") for x in read_results(out).values()}
        assert "batch_cancelled" in codes and len(read_results(out)) == 20
    finally:
        server.kill()


def test_max_cost_holds_back_parts_and_the_summary_says_the_cost(
    tmp_path: Path, claude: BatchServer
) -> None:
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = _messages_lines(requests, 8)
    args = ("--url", claude.url, *FAST, "--batch-max-requests", "4")
    # claude-haiku-4-5 at the table's $1 / $5 per million, half for a batch: a part of four
    # 16-token answers may cost about $0.0002, so $0.0003 takes one part, not two.
    first = exec_cli(requests, out, *args, "--max-cost", "0.0003")
    assert first.returncode == 4, first.stderr
    assert "--max-cost" in first.stderr and "as billed" in first.stderr
    assert len(read_results(out)) == 4 and len(_anthropic_batches(claude)) == 1
    rest = exec_cli(requests, out, *args, "--max-cost", "1")
    assert rest.returncode == 0, rest.stderr
    assert set(read_results(out)) == {x["custom_id"] for x in lines}
    assert len(_anthropic_batches(claude)) == 2
    import re

    billed = re.search(r"\$([0-9.]+) as billed", rest.stderr)
    assert billed and 0 < float(billed.group(1)) < 0.0003


def test_one_request_file_moves_between_providers(tmp_path: Path, mock_server: Any) -> None:
    from batchutil import cli

    upstream = mock_server(served_models=("mock", CLAUDE, GEMINI))
    server = BatchServer(tmp_path / "state", upstream).start()
    try:
        requests = tmp_path / "in.jsonl"
        lines = _chat_lines(requests, 5)  # chat completions, max_tokens and a system prompt
        outputs = []
        for provider, model, url in (
            ("openai", "mock", server.url),
            ("anthropic", CLAUDE, server.url),
            ("gemini", GEMINI, server.url.removesuffix("/v1") + "/v1beta"),
        ):
            out = tmp_path / f"{provider}.jsonl"
            done = exec_cli(requests, out, "--url", url, *FAST, "--batch-provider", provider,
                            "--model", model)  # fmt: skip
            assert done.returncode == 0, (provider, done.stderr)
            assert set(read_results(out)) == {x["custom_id"] for x in lines}
            outputs.append(str(out))
        anthropic = next(iter(read_results(tmp_path / "anthropic.jsonl").values()))
        assert anthropic["response"]["body"]["type"] == "message"  # answered as Messages
        shown = cli("report", *outputs)
        assert shown.returncode == 0 and "5" in shown.stdout, shown.stderr
    finally:
        server.kill()


@pytest.mark.slow
def test_a_crash_around_a_gemini_create_finds_the_job_by_its_name(
    tmp_path: Path, mock_server: Any
) -> None:
    server = BatchServer(tmp_path / "state", mock_server(latency=0.2, served_models=(GEMINI,)),
                         "--batch-concurrency", "1").start()  # fmt: skip
    jobs_url = server.url.removesuffix("/v1") + "/v1beta/batches"
    try:
        requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        lines = _chat_lines(requests, 6)
        run = start_exec(requests, out, "--url", server.url, *FAST, "--batch-provider", "gemini")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _get(jobs_url).get("operations"):
            time.sleep(0.02)
        run.send_signal(signal.SIGKILL)  # kill -9 while it watches
        run.wait()
        state = out.with_name(out.name + ".batch-api.json")
        data = orjson.loads(state.read_bytes())
        part = data["parts"][0]
        part["batch_id"], part["status"] = None, None  # as if killed before the id was saved
        part["creating_since"] = part["creating_since"] or time.time() - 5
        state.write_bytes(orjson.dumps(data))
        done = exec_cli(requests, out, "--url", server.url, *FAST, "--batch-provider", "gemini")
        assert done.returncode == 0, done.stderr
        assert "not creating it again" in done.stderr
        assert len(_get(jobs_url)["operations"]) == 1
        assert set(read_results(out)) == {x["custom_id"] for x in lines}
    finally:
        server.kill()

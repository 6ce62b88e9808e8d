"""Files that move between tools, checked against material jsonlbatch's authors did not write.

- vLLM's `run-batch` output lines, transcribed from vllm-project/vllm
  `vllm/entrypoints/openai/run_batch.py` at 0056ae7b2144abbc7b4916a43491c154567e0b76
  (`make_error_request_output`, `run_request`, `create_request_task`): a bare message string in
  `error` with status 400 and `body` null for an unsupported URL, a model that does not support
  the endpoint and stream mode; the server's `ErrorResponse` object in `error` with its status
  for an error answer; `request_id` `vllm-batch-<uuid>` and line id `vllm-<uuid>` always.
- OpenAI's line schema: `components.schemas.BatchRequestOutput` of OpenAI's OpenAPI spec
  (openai/openai-openapi `openapi.yaml`; commit not pinned: the same fields and types as the
  generated clients of it show), transcribed below as JSON Schema.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import jsonschema
import orjson
from aiohttp import web
from batchutil import cli, exec_cli, odd_server, read_results, write_requests

#: `BatchRequestOutput`, "the per-line object of the batch output and error files".
OPENAI_BATCH_REQUEST_OUTPUT = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "custom_id": {"type": "string"},
        "response": {
            "type": ["object", "null"],
            "properties": {
                "status_code": {"type": "integer"},
                "request_id": {"type": "string"},
                "body": {"type": "object"},
            },
        },
        "error": {
            "type": ["object", "null"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}

_CHAT = {"id": "chatcmpl-9f2", "object": "chat.completion", "created": 1763748000,
         "model": "tiny", "choices": [{"index": 0, "message": {"role": "assistant",
         "content": "The answer is 4", "reasoning_content": None, "tool_calls": []},
         "logprobs": None, "finish_reason": "stop", "stop_reason": None}],
         "usage": {"prompt_tokens": 12, "total_tokens": 19, "completion_tokens": 7,
                   "prompt_tokens_details": None}, "prompt_logprobs": None}  # fmt: skip

#: What `vllm run-batch` writes for vLLM's own test input (tests/entrypoints/openai/
#: test_run_batch.py INPUT_BATCH: two good requests, a model that does not exist, `/bad_url`,
#: `"stream": "True"`), plus an endpoint the model does not support.
VLLM_RUN_BATCH_LINES = [
    {"id": "vllm-5d0c", "custom_id": "request-1",
     "response": {"status_code": 200, "request_id": "vllm-batch-1a2b", "body": _CHAT},
     "error": None},
    {"id": "vllm-77e1", "custom_id": "request-3",
     "response": {"status_code": 404, "request_id": "vllm-batch-3c4d", "body": None},
     "error": {"error": {"message": "The model `NonExistModel` does not exist.",
                         "type": "NotFoundError", "param": "model", "code": 404}}},
    {"id": "vllm-a0f3", "custom_id": "request-4",
     "response": {"status_code": 400, "request_id": "vllm-batch-5e6f", "body": None},
     "error": "URL /bad_url was used. Supported endpoints: /v1/chat/completions, "
              "/v1/embeddings, /score, /rerank."},
    {"id": "vllm-c19b", "custom_id": "request-5",
     "response": {"status_code": 400, "request_id": "vllm-batch-7a8b", "body": None},
     "error": "Request must not be sent in stream mode"},
    {"id": "vllm-d2e4", "custom_id": "request-6",
     "response": {"status_code": 400, "request_id": "vllm-batch-9c0d", "body": None},
     "error": "The model does not support Embeddings API"},
]  # fmt: skip


def _write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return path


def test_exec_resumes_over_vllm_run_batch_output(tmp_path: Path, mock_server: Any) -> None:
    """`exec -o` a file `vllm run-batch` wrote: its answers are kept, its failures count as
    failures (sent again with --retry-failed), and only what has no line is sent."""
    out = _write(tmp_path / "vllm-out.jsonl", VLLM_RUN_BATCH_LINES)
    requests = tmp_path / "in.jsonl"
    ids = [line["custom_id"] for line in VLLM_RUN_BATCH_LINES] + ["request-7"]
    _write(requests, [{"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "mock", "messages": [{"role": "user", "content": cid}]}}
                      for cid in ids])  # fmt: skip
    url = mock_server()
    resumed = exec_cli(requests, out, "--url", url)
    assert resumed.returncode == 3, resumed.stderr  # vLLM's four failures still count
    assert "resuming: 5 of 6 requests already have" in resumed.stderr, resumed.stderr
    retried = exec_cli(requests, out, "--url", url, "--retry-failed")
    assert retried.returncode == 0, retried.stderr
    assert "retrying 4 failed requests" in retried.stderr
    assert sorted(read_results(out)) == sorted(ids)


def test_vllm_run_batch_output_is_read_by_validate_report_post_and_export(tmp_path: Path) -> None:
    out = _write(tmp_path / "vllm-out.jsonl", VLLM_RUN_BATCH_LINES)
    checked = cli("validate", str(out))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    report = cli("report", str(out))
    assert report.returncode == 0, report.stderr
    assert "must be an object" not in report.stdout + report.stderr
    voted = cli("post", "votes", str(out), "-o", str(tmp_path / "votes.jsonl"), "--no-split")
    assert voted.returncode == 0, voted.stderr
    votes = {v["id"]: v for v in map(orjson.loads, (tmp_path / "votes.jsonl").read_bytes()
                                     .splitlines())}  # fmt: skip
    assert votes["request-1"]["samples"] == 1 and votes["request-4"]["invalid"] == 1
    exported = cli("export", str(out), "-o", str(tmp_path / "rows.csv"))
    assert exported.returncode == 0, exported.stderr
    rows = (tmp_path / "rows.csv").read_text().splitlines()
    assert len(rows) == 1 + len(VLLM_RUN_BATCH_LINES)
    assert any("stream mode" in row for row in rows), rows


def test_a_line_without_response_or_error_is_still_refused(tmp_path: Path) -> None:
    out = _write(tmp_path / "out.jsonl", [{"custom_id": "a", "response": None, "error": ""}])
    checked = cli("validate", str(out))
    assert checked.returncode == 1
    assert "a line without a response must carry an error" in checked.stdout


async def _scripted(request: web.Request) -> web.StreamResponse:
    """One answer per request, chosen by the request's question; never an `x-request-id`, as
    vLLM and SGLang send none by default."""
    body = await request.json()
    question = body["messages"][0]["content"]
    number = int(question.split()[-1])
    if number == 0:  # an answer whose body has no `id` either
        answer = {key: value for key, value in _CHAT.items() if key != "id"}
        return web.json_response(answer)
    if number == 1:
        return web.Response(status=400, text="<html><body>Bad Gateway</body></html>",
                            content_type="text/html")  # fmt: skip
    if number == 2:
        return web.Response(status=404)  # empty body
    if number == 3:
        return web.json_response(["not", "an", "object"], status=422)
    if number == 4:
        return web.json_response({"error": {"message": "bad", "type": "BadRequestError",
                                            "param": None, "code": 400}}, status=400)  # fmt: skip
    if number == 5:
        return web.json_response({})  # 200 without an answer: invalid_response
    if number == 7:  # an answer that breaks the request's schema: schema_invalid
        return web.json_response(_CHAT)
    if number == 8:  # the connection dropped: connection_error
        assert request.transport is not None
        request.transport.close()
        return web.Response()
    await asyncio.sleep(4)  # 6: no answer in time (--timeout 1): request_timeout
    return web.json_response(_CHAT)


def test_every_line_kind_exec_writes_fits_openai_line_schema(tmp_path: Path) -> None:
    url, stop = odd_server(_scripted)
    try:
        requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        lines = write_requests(requests, 9)
        lines[7]["body"]["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "n", "schema": {"type": "object", "required": ["n"],
                                    "properties": {"n": {"type": "integer"}}}}}  # fmt: skip
        _write(requests, lines)
        done = exec_cli(requests, out, "--url", url, "--max-retries", "0", "--timeout", "1",
                        "--backoff", "0")  # fmt: skip
    finally:
        stop()
    assert done.returncode == 3, done.stderr
    lines = read_results(out)
    assert len(lines) == 9
    for cid, line in lines.items():
        jsonschema.validate(line, OPENAI_BATCH_REQUEST_OUTPUT)  # raises naming the field
        if line["response"] is not None:
            assert line["response"]["request_id"], cid
    ok = lines["req-0"]["response"]
    assert ok["status_code"] == 200 and ok["request_id"].startswith("req_")
    html = lines["req-1"]["response"]["body"]["error"]
    assert html["message"] == "<html><body>Bad Gateway</body></html>"
    assert lines["req-2"]["response"]["body"]["error"]["type"] == "empty_body"
    assert lines["req-3"]["response"]["body"]["error"]["message"] == '["not","an","object"]'
    assert lines["req-4"]["response"]["body"]["error"]["message"] == "bad"
    assert lines["req-5"]["response"] is None
    assert lines["req-5"]["error"]["code"] == "invalid_response"
    assert lines["req-6"]["response"] is None
    assert lines["req-6"]["error"]["code"] == "request_timeout"
    assert lines["req-7"]["error"]["code"] == "schema_invalid"
    assert lines["req-7"]["response"]["status_code"] == 200
    assert lines["req-8"]["response"] is None
    assert lines["req-8"]["error"]["code"] == "connection_error"
    # what exec wrote, every kind of line, reads back as its own format
    checked = cli("validate", str(out))
    assert checked.returncode == 0, checked.stdout


#: vLLM's rerank batch input (tests/entrypoints/openai/test_run_batch.py INPUT_RERANK_BATCH at
#: 09cdc7d1f08fe9c4f9c1443341c6ed83bffae6a5): the same request to `/rerank`, `/v1/rerank` and
#: `/v2/rerank`. vLLM's file repeats the custom_id `request-2`; the third is renamed here,
#: since a custom_id must be unique (OpenAI's rule, which jsonlbatch keeps).
_RERANK_BODY = {"model": "BAAI/bge-reranker-v2-m3", "query": "What is the capital of France?",
                "documents": ["The capital of Brazil is Brasilia.",
                              "The capital of France is Paris."]}  # fmt: skip
VLLM_RERANK_REQUESTS = [
    {"custom_id": cid, "method": "POST", "url": url, "body": _RERANK_BODY}
    for cid, url in (("request-1", "/rerank"), ("request-2", "/v1/rerank"),
                     ("request-3", "/v2/rerank"))
]  # fmt: skip


def test_vllm_rerank_lines_run_and_v2_is_not_joined_under_v1(tmp_path: Path) -> None:
    seen: list[str] = []

    async def rerank(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.json_response({"id": "rerank-1", "model": "BAAI/bge-reranker-v2-m3",
                                  "usage": {"total_tokens": 20},
                                  "results": [{"index": 1, "relevance_score": 0.99}]})  # fmt: skip

    requests, out = _write(tmp_path / "in.jsonl", VLLM_RERANK_REQUESTS), tmp_path / "out.jsonl"
    checked = cli("validate", str(requests))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    url, stop = odd_server(rerank, "/v1/rerank", "/v2/rerank")
    try:
        done = exec_cli(requests, out, "--url", url, "--max-retries", "0", "--model", "auto")
    finally:
        stop()
    assert done.returncode == 0, done.stderr
    assert sorted(seen) == ["/v1/rerank", "/v1/rerank", "/v2/rerank"]
    lines = read_results(out)
    assert all(line["response"]["status_code"] == 200 for line in lines.values())

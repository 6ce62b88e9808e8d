"""Helpers of the post-processing tests: response lines in the shapes real servers write,
and the CLI run as `batchutil.cli` runs it."""

from __future__ import annotations

import os
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import orjson
from batchutil import cli

ENV = {k: v for k, v in os.environ.items() if "KEY" not in k and "TOKEN" not in k}


def chat_line(
    custom_id: str,
    *contents: str,
    model: str = "Qwen/Qwen3-8B",
    finish: str = "stop",
    reasoning: str | None = None,
    reasoning_key: str = "reasoning",
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A successful jsonlbatch/vLLM response line with one choice per content."""
    choices = []
    for i, text in enumerate(contents or ("",)):
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if reasoning is not None:
            message[reasoning_key] = reasoning
        if tool_calls is not None:
            message["tool_calls"] = tool_calls
        choices.append({"index": i, "message": message, "finish_reason": finish, "logprobs": None})
    body = {
        "id": f"chatcmpl-{custom_id}",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": choices,
        "usage": {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30},
    }
    return {
        "id": f"batch_req_{abs(hash(custom_id)) % 10**8:08d}",
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": "r", "body": body},
        "error": None,
        "metrics": {"latency_s": 0.5},
    }


def vllm_error_line(custom_id: str, message: str = "maximum context length is 4096") -> dict:
    """`vllm run-batch`: the error in the top-level `error`, body null."""
    return {
        "id": "vllm-1",
        "custom_id": custom_id,
        "response": {"status_code": 400, "request_id": "vllm-batch-1", "body": None},
        "error": {"object": "error", "message": message, "type": "BadRequestError", "code": 400},
    }


def openai_error_line(custom_id: str, status: int = 500, message: str = "server error") -> dict:
    """OpenAI Batch API: the error JSON in response.body with its status code, `error` null."""
    return {
        "id": "batch_req_1",
        "custom_id": custom_id,
        "response": {
            "status_code": status,
            "request_id": "req_1",
            "body": {"error": {"message": message, "type": "server_error"}},
        },
        "error": None,
    }


def expired_line(custom_id: str) -> dict:
    """A non-HTTP failure: no response at all."""
    return {
        "id": "batch_req_2",
        "custom_id": custom_id,
        "response": None,
        "error": {"code": "batch_expired", "message": "This request could not be executed"},
    }


def write_jsonl(path: Path, lines: list[dict]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines() if x.strip()]


def post(*args: Any, cwd: Path | None = None, env: dict | None = None) -> CompletedProcess:
    """`jsonlbatch post ...`, run as `batchutil.cli` runs the CLI (in this process, seen as a
    subprocess would be seen), with this module's `ENV` unless `env` is given."""
    return cli("post", *map(str, args), cwd=cwd, env=env or ENV)

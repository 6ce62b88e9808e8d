"""Response lines as `jsonlbatch exec` writes them, built in code for the report tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson


def ok_line(
    custom_id: str,
    *,
    start: float,
    latency: float,
    prompt: int = 10,
    completion: int = 20,
    finish: str | list[str] = "stop",
    model: str = "mock",
    endpoint: str = "http://127.0.0.1:8000/v1",
    attempts: int = 1,
    ttft: float | None = None,
    itl: float | None = None,
    chunks: int | None = None,
    reasoning: int | None = None,
) -> dict[str, Any]:
    """A successful chat.completion line; `ttft` makes it a streamed one (TPOT as exec
    computes it, from the metrics contract)."""
    reasons = [finish] if isinstance(finish, str) else finish
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    metrics: dict[str, Any] = {
        "attempts": attempts,
        "endpoint": endpoint,
        "start_time": start,
        "latency_s": latency,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
    }
    if reasoning is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
        metrics["reasoning_tokens"] = reasoning
    if ttft is not None:
        metrics["ttft_s"] = ttft
        if completion > 1:
            metrics["tpot_s"] = (latency - ttft) / (completion - 1)
        if itl is not None:
            gaps = {"itl_mean_s": itl, "itl_p50_s": itl, "itl_p90_s": itl, "itl_p99_s": itl}
            metrics.update(gaps, itl_max_s=itl, chunks=chunks or completion)
    choices = [
        {
            "index": i,
            "message": {"role": "assistant", "content": f"answer {custom_id} {i}"},
            "finish_reason": reason,
            "logprobs": None,
        }
        for i, reason in enumerate(reasons)
    ]
    body = {
        "id": f"chatcmpl-{custom_id}",
        "object": "chat.completion",
        "created": int(start),
        "model": model,
        "choices": choices,
        "usage": usage,
    }
    return {
        "id": f"batch_req_{custom_id}",
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": body["id"], "body": body},
        "error": None,
        "metrics": metrics,
    }


def failed_line(
    custom_id: str,
    *,
    start: float,
    latency: float,
    status: int | None = 500,
    attempts: int = 9,
    endpoint: str = "http://127.0.0.1:8000/v1",
) -> dict[str, Any]:
    """A failed line: an HTTP error with its body, or (status None) a timeout."""
    metrics = {
        "attempts": attempts,
        "endpoint": endpoint,
        "start_time": start,
        "latency_s": latency,
    }
    if status is None:
        error = {"code": "request_timeout", "message": "no response within 1s"}
        return {
            "id": "batch_req_x",
            "custom_id": custom_id,
            "response": None,
            "error": error,
            "metrics": metrics,
        }
    body = {"error": {"message": "boom", "type": "InternalServerError", "code": status}}
    return {
        "id": f"batch_req_{custom_id}",
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": None, "body": body},
        "error": {"code": f"http_{status}", "message": "boom"},
        "metrics": metrics,
    }


def write_lines(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return path


def streamed_run(path: Path, n: int = 50, *, slow_every: int = 0, model: str = "mock") -> Path:
    """`n` streamed requests, 0.1 s apart, with known TTFT/TPOT; every `slow_every`-th one slow
    (1 s TTFT) and truncated, and one failure."""
    lines: list[dict[str, Any]] = []
    for i in range(n):
        slow = slow_every and i % slow_every == 0
        ttft = 1.0 if slow else 0.1
        lines.append(
            ok_line(
                f"req-{i}",
                start=1_763_748_000.0 + 0.1 * i,
                latency=ttft + 0.02 * 49,
                completion=50,
                ttft=ttft,
                itl=0.02,
                finish="length" if slow else "stop",
                model=model,
                endpoint=f"http://127.0.0.1:{8000 + i % 2}/v1",
            )
        )
    lines.append(failed_line("req-failed", start=1_763_748_000.0, latency=0.5))
    return write_lines(path, lines)

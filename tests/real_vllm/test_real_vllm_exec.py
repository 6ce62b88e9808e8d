"""`exec` against a real vLLM: launched by exec itself, and against the session's shared server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from real_vllm import vllmtier
from real_vllm.vllmtier import SERVED, read_lines, run_cli, serve_flags, write_chat_requests


def _ok_bodies(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for line in lines:
        assert line["error"] is None, line
        assert line["response"]["status_code"] == 200, line
        out[line["custom_id"]] = line["response"]["body"]
    return out


def _shape(value: Any) -> Any:
    """Keys and value types, recursively (lists by their first item): a body's shape."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__


def _covered(small: Any, big: Any, where: str = "body") -> list[str]:
    """Where `small` has a key or type that `big` lacks (null in `big` matches anything)."""
    if big == "NoneType":
        return []
    if isinstance(small, dict):
        if not isinstance(big, dict):
            return [f"{where}: object vs {big}"]
        return [
            p
            for k, v in small.items()
            for p in (_covered(v, big[k], f"{where}.{k}") if k in big else [f"{where}.{k}"])
        ]
    if isinstance(small, list):
        if not isinstance(big, list):
            return [f"{where}: list vs {big}"]
        return _covered(small[0], big[0], f"{where}[0]") if small and big else []
    return [] if small in (big, "NoneType") else [f"{where}: {small} vs {big}"]


def test_exec_serve_vllm_replicas_stream_with_model_auto_and_n(
    vllm_setup: dict[str, Any], vllm_env: dict[str, str], shared_server: Any, tmp_path: Path
) -> None:
    """Two replicas on the CPU (one start's worth of time on 2 cores: they load side by side).
    No GPU here: --gpus names two "devices" so that each replica gets its own group (and a
    CUDA_VISIBLE_DEVICES, which the CPU build ignores)."""
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_chat_requests(requests, 24, model="whatever-the-file-says", n=2)
    replicas = ["--dp-size", "2", "--dp-mode", "replicas", "--gpus", "0,1", "-c", "8"]
    done = run_cli("exec", str(requests), "-o", str(out), "--model", "auto", "--stream",
                   *replicas, *serve_flags(vllm_setup), env=vllm_env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "ready after" in done.stderr and "starting server 1: vllm serve" in done.stderr
    lines = read_lines(out)
    assert sorted(line["custom_id"] for line in lines) == sorted(ids)
    streamed = _ok_bodies(lines)
    for line in lines:
        body, metrics = line["response"]["body"], line["metrics"]
        assert body["model"] == SERVED  # --model auto asked the server
        assert [c["index"] for c in body["choices"]] == [0, 1]
        # random weights may end a choice at once (EOS first): no content delta, recorded as
        # null, as the reassembly writes an empty content (see streaming.ChoiceState.text)
        assert all(isinstance(c["message"]["content"], str | None) for c in body["choices"])
        usage = body["usage"]
        assert usage["completion_tokens"] > 0
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert 0 < metrics["ttft_s"] <= metrics["latency_s"], metrics
        assert metrics["chunks"] >= 2 and metrics["completion_tokens"] == usage["completion_tokens"]
    served = []
    for i in range(2):
        log = (tmp_path / f"out.jsonl.server-{i}.log").read_text(errors="replace")
        assert "EngineCore" in log
        served.append(log.count('"POST /v1/chat/completions HTTP/1.1" 200'))
    assert all(n > 0 for n in served) and sum(served) == len(ids), served

    # The same requests unstreamed, on the shared server: the streamed bodies have their shape.
    plain_out = tmp_path / "plain.jsonl"
    done = run_cli(
        "exec",
        str(requests),
        "-o",
        str(plain_out),
        "--url",
        shared_server.url,
        "--model",
        "auto",
        env=vllm_env,
    )
    assert done.returncode == 0, done.stderr
    plain = _ok_bodies(read_lines(plain_out))
    for cid, body in streamed.items():
        assert body["object"] == plain[cid]["object"] == "chat.completion"
        assert _covered(_shape(body), _shape(plain[cid])) == [], (body, plain[cid])
        for key in ("id", "created", "model", "choices", "usage", "system_fingerprint"):
            assert key in body, key
        assert body["system_fingerprint"].startswith("vllm-")


def test_gen_vllm_body_fields_reach_the_chat_template(
    shared_server: Any, vllm_env: dict[str, str], tmp_path: Path
) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_bytes(b"".join(orjson.dumps({"q": f"what is {i} + 2?"}) + b"\n" for i in range(4)))
    variants = {
        "plain": [],
        "no-think": ["--no-think"],
        "kwargs": [
            "--param",
            'chat_template_kwargs={"enable_thinking": false}',
            "--param",
            "skip_special_tokens=false",
            "--param",
            "top_k=5",
            "--param",
            "repetition_penalty=1.05",
            "--param",
            "min_tokens=2",
        ],
    }
    prompts = {}
    for name, flags in variants.items():
        requests, out = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.out.jsonl"
        made = run_cli(
            "gen",
            "-d",
            str(data),
            "--prompt",
            "{{ q }}",
            "--model",
            SERVED,
            "--max-tokens",
            "8",
            *flags,
            "-o",
            str(requests),
            env=vllm_env,
        )
        assert made.returncode == 0, made.stderr
        sent = read_lines(requests)[0]["body"]
        if name != "plain":
            assert sent["chat_template_kwargs"] == {"enable_thinking": False}
        done = run_cli(
            "exec", str(requests), "-o", str(out), "--url", shared_server.url, env=vllm_env
        )
        assert done.returncode == 0, done.stderr
        bodies = _ok_bodies(read_lines(out))
        assert len(bodies) == 4
        prompts[name] = sorted(b["usage"]["prompt_tokens"] for b in bodies.values())
    # The tiny model's template opens an empty <think></think> when enable_thinking is false:
    # more prompt tokens prove the kwargs reached the real template.
    assert all(t > p for t, p in zip(prompts["no-think"], prompts["plain"], strict=True))
    assert prompts["kwargs"] == prompts["no-think"]


def test_a_request_the_server_refuses_is_one_failed_line(
    shared_server: Any, vllm_env: dict[str, str], tmp_path: Path
) -> None:
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_chat_requests(requests, 3, max_tokens=vllmtier.MAX_MODEL_LEN * 4)
    done = run_cli("exec", str(requests), "-o", str(out), "--url", shared_server.url, env=vllm_env)
    assert done.returncode == 3, done.stderr  # some failed: no retries of a 400
    lines = read_lines(out)
    assert len(lines) == 3
    for line in lines:
        assert line["response"]["status_code"] == 400
        assert (
            "max_tokens" in line["error"]["message"] or "max_tokens" in orjson.dumps(line).decode()
        )

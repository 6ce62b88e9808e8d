"""A fleet of two models on the real CPU vLLM (the tiny model under two served names, two
servers) and a mixed request file: each answer comes from the model its request names."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from real_vllm.vllmtier import MAX_MODEL_LEN, SERVER_ARGS, read_lines, run_cli


def test_exec_fleet_of_two_vllm_models_routes_a_mixed_file(
    vllm_setup: dict[str, Any], vllm_env: dict[str, str], tmp_path: Path
) -> None:
    fleet = tmp_path / "fleet.yaml"
    entry = (
        "  - {{backend: vllm, model_path: {model}, served_model_name: {name}, gpus: [{gpu}],"
        " context_length: {len}, server_args: {args}, concurrency: 4}}\n"
    )
    args = orjson.dumps(list(SERVER_ARGS)).decode()
    fleet.write_text(
        "cache_dir: caches\nmodels:\n"
        + "".join(
            entry.format(model=vllm_setup["model"], name=n, gpu=g, len=MAX_MODEL_LEN, args=args)
            for n, g in (("tiny-a", 0), ("tiny-b", 1))
        )
    )
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    asked = {}
    with open(requests, "wb") as f:
        for i in range(16):
            model = ("tiny-a", "tiny-b")[i % 2]
            asked[f"r{i}"] = model
            body = {"model": model, "max_tokens": 8,
                    "messages": [{"role": "user", "content": f"question {i}"}]}  # fmt: skip
            f.write(orjson.dumps({"custom_id": f"r{i}", "method": "POST",
                                  "url": "/v1/chat/completions", "body": body}) + b"\n")  # fmt: skip
    done = run_cli("exec", str(requests), "-o", str(out), "--fleet", str(fleet), env=vllm_env,
                   timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "every model serves: tiny-a 1; tiny-b 1" in done.stderr
    lines = read_lines(out)
    assert sorted(line["custom_id"] for line in lines) == sorted(asked)
    for line in lines:
        assert line["error"] is None, line
        assert line["response"]["body"]["model"] == asked[line["custom_id"]]
    endpoints = Counter((asked[x["custom_id"]], x["metrics"]["endpoint"]) for x in lines)
    assert len(endpoints) == 2 and set(endpoints.values()) == {8}  # one server per model
    caches = sorted(p.name for p in (tmp_path / "caches").iterdir())
    assert caches == ["tiny-a", "tiny-b"]  # each instance's own VLLM_CACHE_ROOT, used

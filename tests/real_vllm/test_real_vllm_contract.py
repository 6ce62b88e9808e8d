"""The answer contract against a real vLLM: its structured-output backend makes the tiny
random-weights model answer schema-valid JSON, and exec checks every answer on arrival.

The server is launched by exec itself with xgrammar and `disable_any_whitespace`: with the
default grammar a random-weights model pads the JSON with whitespace until `max_tokens` (seen:
every answer cut short at 64 tokens), which tests the weights, not the contract."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from jsonlbatch.answer_contract.contract import check_choice, compile_schema
from real_vllm.vllmtier import SERVED, read_lines, run_cli, serve_flags

#: Short by construction (an enum and a boolean), so a constrained answer ends well within
#: max_tokens whatever the random weights prefer.
SCHEMA = {
    "type": "object",
    "properties": {"label": {"type": "string", "enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
    "required": ["label", "sure"],
    "additionalProperties": False,
}
BACKENDS = ("xgrammar", "llguidance", "outlines_core", "lmformatenforcer")


def _backends(setup: dict[str, Any]) -> list[str]:
    """The structured-output backends the CPU build's environment can import."""
    code = "import importlib.util as u, sys; print(' '.join(m for m in sys.argv[1:] if u.find_spec(m)))"
    found = subprocess.run([setup["python"], "-c", code, *BACKENDS], capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    return found.stdout.split()


def _request(i: int, form: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": SERVED,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": f"Is {i} even? Answer in JSON."}],
    }
    if form == "response_format":
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "answer", "schema": SCHEMA}}  # fmt: skip
    elif form == "structured_outputs":  # vLLM's own extra body
        body["structured_outputs"] = {"json": SCHEMA}
    else:  # removed in vLLM 0.32: ignored with HTTP 200, answered unconstrained
        body["guided_json"] = SCHEMA
    return {
        "custom_id": f"{form}-{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": body,
    }


def test_structured_output_backend_answers_hold_the_schema(
    vllm_setup: dict[str, Any], vllm_env: dict[str, str], tmp_path: Path
) -> None:
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = [_request(i, form) for form in ("response_format", "structured_outputs", "guided_json")
             for i in range(4)]  # fmt: skip
    requests.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    backends = _backends(vllm_setup)
    flags = []
    if "xgrammar" in backends:  # vLLM's dotted form of a config flag: no JSON to quote
        flags = ["--server-arg=--structured-outputs-config.backend=xgrammar",
                 "--server-arg=--structured-outputs-config.disable_any_whitespace=true"]  # fmt: skip
    done = run_cli("exec", str(requests), "-o", str(out), "-q", *serve_flags(vllm_setup, *flags),
                   env=vllm_env)  # fmt: skip
    assert done.returncode in (0, 3), done.stderr
    contract = compile_schema(SCHEMA)
    results = {x["custom_id"]: x for x in read_lines(out)}
    assert results.keys() == {x["custom_id"] for x in lines}
    for cid, line in results.items():
        record = line["metrics"]["contract"]  # every answer was checked, constrained or not
        text = line["response"]["body"]["choices"][0]["message"]["content"] or ""
        assert record["choices"][0] == check_choice(contract, text).as_json(), cid
        assert (line["error"] is None) == record["valid"], cid
    if not backends:
        pytest.skip("this vLLM build has no structured-output backend (xgrammar, llguidance, "
                    "outlines, lm-format-enforcer): only the unconstrained path ran")  # fmt: skip
    constrained = [r for cid, r in results.items() if not cid.startswith("guided_json")]
    bad = {r["custom_id"]: r["metrics"]["contract"]["choices"][0] for r in constrained
           if not r["metrics"]["contract"]["valid"]}  # fmt: skip
    assert not bad, f"backends {backends}; answers that broke the schema: {bad}"

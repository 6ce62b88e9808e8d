"""`vllm run-batch` output is a jsonlbatch response file: validate, report, post and exec read it."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import orjson

from real_vllm import vllmtier
from real_vllm.vllmtier import SERVED, read_lines, run_cli, write_chat_requests


def run_batch(setup: dict[str, Any], env: dict[str, str], requests: Path, out: Path) -> None:
    """`vllm run-batch` on the tiny model, as the issue's users run it on a GPU."""
    argv = [setup["vllm"], "run-batch", "-i", str(requests), "-o", str(out),
            "--model", setup["model"], "--served-model-name", SERVED,
            "--max-model-len", str(vllmtier.MAX_MODEL_LEN), *vllmtier.SERVER_ARGS]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=400,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]


def test_run_batch_output_is_read_by_validate_report_post_and_exec(
    vllm_setup: dict[str, Any], vllm_env: dict[str, str], shared_server: Any, tmp_path: Path
) -> None:
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_chat_requests(requests, 16, max_tokens=12, n=2)
    first_half = tmp_path / "half.jsonl"
    lines = requests.read_bytes().splitlines(keepends=True)
    # One request the server refuses (too many tokens): run-batch writes an error line for it.
    refused = orjson.loads(lines[0])
    refused["body"]["max_tokens"] = vllmtier.MAX_MODEL_LEN * 4
    first_half.write_bytes(orjson.dumps(refused) + b"\n" + b"".join(lines[1:8]))
    run_batch(vllm_setup, vllm_env, first_half, out)

    written = read_lines(out)
    assert [line["custom_id"] for line in written] == ids[:8]  # in input order
    assert written[0]["response"]["body"] is None and written[0]["error"] is not None, written[0]
    assert all(line["response"]["status_code"] == 200 for line in written[1:])

    checked = run_cli("validate", str(out), env=vllm_env)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    report = run_cli("report", str(out), env=vllm_env)
    assert report.returncode == 0, report.stderr
    assert "7 ok" in report.stdout or "7" in report.stdout, report.stdout

    votes = tmp_path / "votes.jsonl"
    voted = run_cli("post", "votes", str(out), "-o", str(votes), "--no-split", "--extract",
                    "full", "--use-truncated", env=vllm_env)  # fmt: skip
    assert voted.returncode == 0, voted.stderr
    groups = {line["id"]: line for line in read_lines(votes)}
    assert sorted(groups) == sorted(ids[:8])
    assert groups["req-0"]["invalid"] == 1  # the refused request: no answer to vote on
    assert all(groups[cid]["samples"] == 2 for cid in ids[1:8])  # both of n=2 choices read

    # exec takes run-batch's file as its own output: it sends only what has no result yet.
    resumed = run_cli("exec", str(requests), "-o", str(out), "--url", shared_server.url,
                      env=vllm_env)  # fmt: skip
    assert resumed.returncode == 3, resumed.stderr  # run-batch's failed line still counts
    assert "resuming: 8 of 16 requests already have" in resumed.stderr, resumed.stderr
    final = read_lines(out)
    assert sorted(line["custom_id"] for line in final) == sorted(ids)
    # --retry-failed sends the refused one again, as the request file has it now (fixable).
    retried = run_cli(
        "exec",
        str(requests),
        "-o",
        str(out),
        "--url",
        shared_server.url,
        "--retry-failed",
        env=vllm_env,
    )
    assert retried.returncode == 0, retried.stderr
    assert "retrying 1 failed requests" in retried.stderr
    final = read_lines(out)
    assert sorted(line["custom_id"] for line in final) == sorted(ids)
    assert all(line["error"] is None for line in final)

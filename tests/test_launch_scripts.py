"""The Agentless drop-in scripts run that workflow's commands unchanged."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from batchutil import content, odd_server, read_results, write_requests
from conftest import free_port
from standins.harness import ROOT, Standins, standin_session

from jsonlbatch.file_io.output_guard import OutputLock

SCRIPTS = ROOT / "scripts"
pytestmark = pytest.mark.timeout(120, method="thread")


@pytest.fixture(autouse=True)
def standins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Standins]:
    yield from standin_session(monkeypatch, tmp_path)


def script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / name), *args], capture_output=True, text=True, timeout=90
    )


def test_process_batch_requests_takes_the_endpoint_url_and_resumes(
    standins: Standins, mock_server: Callable[..., str]
) -> None:
    url = mock_server(served_models=("/ckpt/served",))
    requests, output = standins.tmp / "req.jsonl", standins.tmp / "resp.jsonl"
    write_requests(requests, 20, model="deepseek-ai/DeepSeek-V3")  # as Agentless writes them
    args = ("--input_file", str(requests), "--output_file", str(output))
    endpoint = f"{url}/chat/completions"  # the workflow passes the endpoint itself
    done = script("process_batch_requests.py", *args, "--url", endpoint, "--concurrency", "4")
    assert done.returncode == 0, done.stderr
    results = read_results(output)
    assert len(results) == 20 and content(results["req-0"])
    assert results["req-0"]["response"]["body"]["model"] == "/ckpt/served"
    again = script("process_batch_requests.py", *args, "--url", url)
    assert again.returncode == 0 and "all 20 requests have a result" in again.stderr


def agentless_process_batch(path: Path) -> dict[str, str]:
    """Step 3 of the Agentless batch workflow (`repair.py --process_batch`), as issue 38 quotes
    its reader: each line's `res["response"]["body"]["choices"][0]["message"]["content"]`, with
    only KeyError and IndexError caught (a TypeError, from `"response": null`, stops it)."""
    out = {}
    for raw in path.read_text().splitlines():
        res = json.loads(raw)
        try:
            out[res["custom_id"]] = res["response"]["body"]["choices"][0]["message"]["content"]
        except (KeyError, IndexError):
            out[res["custom_id"]] = ""
    return out


def test_process_batch_requests_output_survives_the_agentless_reader(standins: Standins) -> None:
    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        number = int(body["messages"][0]["content"].split()[-1])
        if number == 3 and slow:
            await asyncio.sleep(3)  # past --timeout 1: request_timeout, no response
        if number == 4 and slow:
            return web.Response(status=400, text="bad request")
        message = {"role": "assistant", "content": f"answer {number}"}
        return web.json_response({"id": f"c{number}", "object": "chat.completion", "created": 1,
                                  "model": "mock", "choices": [{"index": 0, "message": message,
                                  "finish_reason": "stop"}]})  # fmt: skip

    requests, output = standins.tmp / "req.jsonl", standins.tmp / "responses.jsonl"
    errors = standins.tmp / "responses.errors.jsonl"
    write_requests(requests, 8)
    args = ("--input_file", str(requests), "--output_file", str(output), "--timeout", "1",
            "--max_retries", "0")  # fmt: skip

    def run() -> subprocess.CompletedProcess:
        url, stop = odd_server(chat)  # a fresh server per run: the timed-out handler waits
        try:
            return script("process_batch_requests.py", *args, "--url", f"{url}/chat/completions")
        finally:
            stop()

    slow = True
    done = run()
    assert done.returncode == 3, done.stderr
    assert "2 failed requests are in" in done.stderr, done.stderr
    read = agentless_process_batch(output)  # raised TypeError on the timed-out line before
    assert sorted(read) == [f"req-{i}" for i in range(8) if i not in (3, 4)]
    failed = read_results(errors)
    assert failed["req-3"]["response"] is None
    assert failed["req-3"]["error"]["code"] == "request_timeout"
    assert failed["req-4"]["response"]["status_code"] == 400
    slow = False  # the same command again sends the failed requests again
    again = run()
    assert again.returncode == 0, again.stderr
    read = agentless_process_batch(output)
    assert read == {f"req-{i}": f"answer {i}" for i in range(8)}
    assert errors.read_bytes() == b""  # no failure left to list


def test_process_batch_requests_leaves_an_output_another_run_writes(standins: Standins) -> None:
    """The failures are moved only by the run that holds the output: a second command on the
    same output is refused and must not rewrite the file under the first."""
    requests, output = standins.tmp / "req.jsonl", standins.tmp / "responses.jsonl"
    write_requests(requests, 1)
    failed = {"id": "batch_req_1", "custom_id": "req-0", "response": None,
              "error": {"code": "request_timeout", "message": "no response within 1s"}}  # fmt: skip
    output.write_bytes(json.dumps(failed).encode() + b"\n")
    before = output.read_bytes()
    lock = OutputLock(output)
    lock.acquire()
    try:
        done = script("process_batch_requests.py", "--input_file", str(requests),
                      "--output_file", str(output), "--url", "http://127.0.0.1:9/v1")  # fmt: skip
    finally:
        lock.release()
    assert done.returncode == 1 and "being written by another jsonlbatch run" in done.stderr
    assert output.read_bytes() == before
    assert not (standins.tmp / "responses.errors.jsonl").exists()
    for same in (output, requests):  # an error file that is an input would destroy it
        done = script("process_batch_requests.py", "--input_file", str(requests),
                      "--output_file", str(output), "--error_file", str(same),
                      "--url", "http://127.0.0.1:9/v1")  # fmt: skip
        assert done.returncode == 2 and "is also an input" in done.stderr, done.stderr
        assert output.read_bytes() == before


def test_process_batch_requests_reports_errors_without_a_traceback(standins: Standins) -> None:
    done = script("process_batch_requests.py", "--output_file", "o.jsonl")
    assert done.returncode == 2 and "--input_file" in done.stderr
    (standins.tmp / "bad.jsonl").write_text('{"custom_id": "a"}\n')
    done = script("process_batch_requests.py", "--input_file", "bad.jsonl", "--output_file", "o")
    assert done.returncode == 1 and "Error:" in done.stderr and "bad.jsonl:1" in done.stderr
    assert "Traceback" not in done.stderr


def test_serve_and_process_launches_sglang_with_the_workflows_flags(standins: Standins) -> None:
    requests, output = standins.tmp / "req.jsonl", standins.tmp / "out" / "resp.jsonl"
    output.parent.mkdir()
    write_requests(requests, 30, model="deepseek-ai/DeepSeek-V3")
    port = free_port()
    done = script(
        "serve_and_process_batch_requests.py",
        "--input_file", str(requests), "--output_file", str(output),
        "--url", f"http://127.0.0.1:{port}/v1/chat/completions",
        "--concurrency", "8", "--timeout", "3600",
        "--serve", "--tp-size", "1", "--dp-size", "2", "--model-path", "/ckpt/m",
        "--reasoning-parser", "deepseek-r1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(read_results(output)) == 30
    (record,) = standins.records()
    argv = record["argv"]
    assert argv[0].endswith("sglang/launch_server.py")
    assert argv[1:] == [
        "--model-path", "/ckpt/m", "--host", "127.0.0.1", "--port", str(port),
        "--tp-size", "1", "--dp-size", "2", "--reasoning-parser", "deepseek-r1",
    ]  # fmt: skip
    assert (output.parent / "resp.jsonl.server.log").exists()


def test_serve_and_process_without_serve_rejects_server_flags(standins: Standins) -> None:
    done = script(
        "serve_and_process_batch_requests.py",
        "--input_file", "r.jsonl", "--output_file", "o.jsonl", "--tp-size", "2",
    )  # fmt: skip
    assert done.returncode == 2 and "server flags need --serve" in done.stderr
    assert standins.records() == []


def test_the_slurm_example_shards_and_merges(standins: Standins) -> None:
    requests = standins.tmp / "req.jsonl"
    write_requests(requests, 40, model="/ckpt/m")
    slurm = ROOT / "examples" / "slurm"
    base = {
        "REQUESTS": str(requests),
        "OUT": str(standins.tmp / "out"),
        "MODEL": "/ckpt/m",
        "TP": "1",
        "DP": "2",
        "CUDA_VISIBLE_DEVICES": "0,1",  # what SLURM sets for the job's GPUs
        "SLURM_ARRAY_TASK_COUNT": "2",
    }
    for k in ("0", "1"):
        env = standins.env() | base | {"SLURM_ARRAY_TASK_ID": k}
        done = subprocess.run(
            ["bash", str(slurm / "run_shards.sbatch")], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
    done = subprocess.run(
        ["bash", str(slurm / "merge.sbatch")],
        env=standins.env() | base,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert len(read_results(standins.tmp / "out" / "responses.jsonl")) == 40
    pinned = sorted(r["env"]["CUDA_VISIBLE_DEVICES"] for r in standins.records())
    assert pinned == ["0", "0", "1", "1"]  # two replicas per task, one GPU each


def test_the_slurm_submit_script_passes_absolute_paths(tmp_path: Path) -> None:
    """`REQUESTS=requests.jsonl ./submit.sh` means the file where the user stands, though the
    jobs start in the script's folder: a stand-in sbatch records what the jobs would get."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "sbatch.txt"
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(f'#!/bin/bash\necho "$REQUESTS $OUT $*" >> {record}\necho 7\n')
    sbatch.chmod(0o755)
    (tmp_path / "requests.jsonl").write_text("")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "REQUESTS": "requests.jsonl"}
    env.pop("OUT", None)
    submit = ROOT / "examples" / "slurm" / "submit.sh"
    done = subprocess.run(
        ["bash", str(submit), "2"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    calls = record.read_text().splitlines()
    assert len(calls) == 2
    for call in calls:
        assert call.startswith(f"{tmp_path}/requests.jsonl {tmp_path}/out ")
    missing = subprocess.run(
        ["bash", str(submit)], cwd=tmp_path, env={**env, "REQUESTS": "nope.jsonl"},
        capture_output=True, text=True,
    )  # fmt: skip
    assert missing.returncode == 2 and "no request file" in missing.stderr

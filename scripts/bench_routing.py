#!/usr/bin/env python3
"""Routing policies side by side over 4 replicas of the GPU-model mock.

Each policy runs `jsonlbatch exec --route POLICY` against 4 fresh mock replicas (cold caches)
started with `--gpu-model`, on two workloads:

- A: TASKS tasks x SAMPLES samples; each task's prompt (a few thousand tokens) is shared by its
  samples, as `gen --samples` writes them;
- B: B_TASKS x SAMPLES requests of the same prompt lengths, no two sharing a prefix (fewer
  than A by default: every prompt is prefilled in full, so B is the slow half).

Throughput is requests over the run's window (first request sent to last answer, from the
response lines' metrics); the prefix cache hit rate comes from the replicas' own `/metrics`, as
exec records it in `<output>.servers.json`. Targets (issue 16): on A, prefix >= 1.5x least-busy
with a hit rate >= 85%; on B, prefix within 3% of least-busy.

    python scripts/bench_routing.py                  # 400 x 8, ~1-2 min on 2 cores
    python scripts/bench_routing.py --tasks 100 --json
    python scripts/bench_routing.py --order interleaved   # samples far apart in the file

The model's parameters (docs/mock.md) describe an 8B model on one 80 GB GPU; `--time-scale`
runs it that many times faster so the benchmark stays short.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from jsonlbatch.records import request_line

REPLICAS = 4
VOCABULARY = [f"{a}{b}" for a in "bcdfghklmnprstvz" for b in ("a", "e", "i", "o", "u", "ar", "en")]


def prompt(rng: random.Random, tokens: int) -> str:
    return " ".join(rng.choices(VOCABULARY, k=tokens))


def write_workload(
    path: Path, tasks: int, samples: int, shared: bool, order: str, seed: int = 0
) -> None:
    """A request file: `tasks` x `samples` chat requests of 2,000-4,000 prompt tokens."""
    rng = random.Random(seed)
    lengths = [rng.randint(2000, 4000) for _ in range(tasks)]
    prompts = [prompt(rng, n) for n in lengths] if shared else None
    lines = []
    for t in range(tasks):
        for s in range(samples):
            text = prompts[t] if prompts else prompt(rng, lengths[t])
            body = {
                "model": "mock",
                "messages": [{"role": "user", "content": text}],
                "max_tokens": 256,
                "temperature": 0.8,
                "seed": s,
            }
            lines.append((t, s, request_line(f"t{t}|s{s}", body)))
    if order == "interleaved":  # every task's first sample, then every second one, ...
        lines.sort(key=lambda item: (item[1], item[0]))
    with path.open("wb") as f:
        f.writelines(line for _, _, line in lines)


def start_replicas(args: argparse.Namespace) -> tuple[list[subprocess.Popen], list[str]]:
    cmd = [
        sys.executable, "-m", "jsonlbatch.mock", "--port", "0", "--gpu-model",
        "--default-max-tokens", str(args.output_tokens),
        "--gpu-time-scale", str(args.time_scale),
    ]  # fmt: skip
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
        for _ in range(REPLICAS)
    ]
    urls = []
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "ready on" not in line:
            stop(procs)
            raise SystemExit(f"mock replica did not start: {line!r}")
        urls.append(line.split("ready on", 1)[1].strip())
    return procs, urls


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_policy(args: argparse.Namespace, requests: Path, output: Path, policy: str) -> dict:
    procs, urls = start_replicas(args)
    try:
        output.unlink(missing_ok=True)
        Path(str(output) + ".servers.json").unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "jsonlbatch", "exec", str(requests), "-o", str(output),
               "-c", str(args.concurrency), "--route", policy, "-q"]  # fmt: skip
        for url in urls:
            cmd += ["--url", url]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"exec --route {policy} failed:\n{proc.stderr}")
    finally:
        stop(procs)
    first, last, lines = float("inf"), 0.0, 0
    with output.open("rb") as f:
        for raw in f:
            metrics = orjson.loads(raw)["metrics"]
            first = min(first, metrics["start_time"])
            last = max(last, metrics["start_time"] + metrics["latency_s"])
            lines += 1
    servers = json.loads(Path(str(output) + ".servers.json").read_text())["runs"][-1]
    queries = sum(e["prefix_cache_queries"] for e in servers["endpoints"])
    hits = sum(e["prefix_cache_hits"] for e in servers["endpoints"])
    return {
        "requests": lines,
        "seconds": last - first,
        "req_per_s": lines / (last - first),
        "hit_rate": hits / queries if queries else 0.0,
        "spread": [e["requests"] for e in servers["endpoints"]],
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tasks", type=int, default=400)
    ap.add_argument("--b-tasks", type=int, default=100, help="workload B's tasks")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=512, help="4 replicas x max batch 128")
    ap.add_argument("--output-tokens", type=int, default=128, help="answer length in tokens")
    ap.add_argument("--time-scale", type=float, default=4.0, help="model speed-up")
    ap.add_argument("--order", choices=("grouped", "interleaved"), default="grouped",
                    help="workload A's file order: samples together (as gen writes them) or "
                    "round by round")  # fmt: skip
    ap.add_argument("--json", action="store_true", help="one JSON line of figures at the end")
    args = ap.parse_args()

    runs = [
        ("A", args.tasks, True, ("prefix", "least-busy", "round-robin")),
        ("B", args.b_tasks, False, ("prefix", "least-busy")),
    ]
    results: dict[str, dict[str, dict]] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-routing-") as tmp:
        for name, tasks, shared, policies in runs:
            requests = Path(tmp) / f"{name}.jsonl"
            write_workload(requests, tasks, args.samples, shared, args.order)
            results[name] = {}
            for policy in policies:
                out = Path(tmp) / f"{name}-{policy}.jsonl"
                figures = run_policy(args, requests, out, policy)
                results[name][policy] = figures
                print(
                    f"{name} {policy:<12} {figures['req_per_s']:8.1f} req/s  "
                    f"hit rate {figures['hit_rate']:6.1%}  {figures['seconds']:6.2f} s  "
                    f"per replica {figures['spread']}",
                    file=sys.stderr,
                    flush=True,
                )
    a, b = results["A"], results["B"]
    summary = {
        "routing_a_prefix_vs_least_busy": a["prefix"]["req_per_s"] / a["least-busy"]["req_per_s"],
        "routing_a_prefix_hit_rate": a["prefix"]["hit_rate"],
        "routing_a_least_busy_hit_rate": a["least-busy"]["hit_rate"],
        "routing_b_prefix_vs_least_busy": b["prefix"]["req_per_s"] / b["least-busy"]["req_per_s"],
    }
    print(f"\nA: {args.tasks} x {args.samples}, B: {args.b_tasks} x {args.samples}, "
          f"{REPLICAS} replicas, "
          f"c={args.concurrency}, time scale {args.time_scale:g}, order {args.order}, "
          f"{time.monotonic() - started:.0f} s in all")  # fmt: skip
    print("| workload | policy | req/s (modelled GPU time) | prefix cache hit rate |")
    print("|---|---|---|---|")
    for name, by_policy in results.items():
        for policy, f in by_policy.items():
            modelled = f["req_per_s"] / args.time_scale
            print(f"| {name} | {policy} | {modelled:.1f} | {f['hit_rate']:.1%} |")
    print(f"A: prefix / least-busy = {summary['routing_a_prefix_vs_least_busy']:.2f}x "
          f"(target >= 1.5), prefix hit rate {summary['routing_a_prefix_hit_rate']:.1%} "
          "(target >= 85%)")  # fmt: skip
    print(f"B: prefix / least-busy = {summary['routing_b_prefix_vs_least_busy']:.3f} "
          "(target within 3%)")  # fmt: skip
    if args.json:
        print(json.dumps(summary | {"results": results}))


if __name__ == "__main__":
    main()

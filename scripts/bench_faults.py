#!/usr/bin/env python3
"""A self-hosted server that fails some requests: how long `jsonlbatch exec` takes to finish.

The mock answers 10% of requests with a 500, 5% with a 429 that carries no rate-limit headers
and no Retry-After (a gateway's queue limit, a busy replica), closes 5% of connections without
an answer and never answers 2% (a hang, cut by `--timeout 3`). `exec --concurrency 64 --timeout
3 --max-retries 8` sends 2,000 small chat requests through it. The figure is the whole
command's time; every request must end with exactly one line.

    python scripts/bench_faults.py                  # 3 runs, the median
    python scripts/bench_faults.py --runs 1 --stray-429 0.2
    python scripts/bench_faults.py --source /tmp/old  # an older checkout's exec (its jsonlbatch/)

The mock (this checkout's) is pinned to one core and exec to the other, as in bench_exec.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_exec import exec_command, free_port, median, pin, start_server, write_requests


def start_mock(port: int, stray_429: float, seed: int) -> subprocess.Popen:
    return start_server(port, "--seed", str(seed), "--fail-rate", "0.1",
                        "--rate-limit-rate", str(stray_429), "--retry-after", "none",
                        "--drop-rate", "0.05", "--hang-rate", "0.02")  # fmt: skip


def one_run(requests: Path, out: Path, args: argparse.Namespace, seed: int) -> dict:
    port = free_port()
    mock = start_mock(port, args.stray_429, seed)
    url = f"http://127.0.0.1:{port}/v1"
    env = dict(os.environ)
    if args.source:
        env["PYTHONPATH"] = os.pathsep.join([args.source, env.get("PYTHONPATH", "")])
    try:
        out.unlink(missing_ok=True)
        extra = ["--timeout", "3", "--max-retries", "8", "-q", *args.extra]
        cmd = exec_command(requests, out, url, 64, *extra)
        started = time.perf_counter()
        # Run from the data folder: `python -m` puts the working folder first on sys.path.
        proc = subprocess.run(cmd, preexec_fn=lambda: pin(0), capture_output=True, text=True,
                              env=env, timeout=args.give_up, cwd=out.parent)  # fmt: skip
        seconds = time.perf_counter() - started
        with urllib.request.urlopen(url.removesuffix("/v1") + "/mock/stats", timeout=10) as r:
            stats = json.loads(r.read())
    except subprocess.TimeoutExpired:
        seconds, proc, stats = float("inf"), None, {}
    finally:
        mock.terminate()
        mock.wait(timeout=10)
    lines = out.read_bytes().splitlines() if out.exists() else []
    ids = [json.loads(line)["custom_id"] for line in lines]
    failed = sum(1 for line in lines if json.loads(line).get("error"))
    return {
        "seconds": round(seconds, 2),
        "lines": len(lines),
        "unique": len(set(ids)),
        "failed_lines": failed,
        "exit": None if proc is None else proc.returncode,
        "attempts": stats.get("requests", {}).get("/v1/chat/completions"),
        "answered_429": stats.get("responses", {}).get("429"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--stray-429", type=float, default=0.05, help="share answered 429")
    ap.add_argument("--source", help="put this folder first on PYTHONPATH for exec")
    ap.add_argument("--give-up", type=float, default=300.0, help="seconds before a run is cut")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("extra", nargs="*", help="more exec options, after --")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        requests = Path(tmp) / "req.jsonl"
        write_requests(requests, args.requests)
        for run in range(args.runs):
            figures = one_run(requests, Path(tmp) / "out.jsonl", args, seed=run)
            results.append(figures)
            if not args.json:
                print(f"run {run}: {figures}", flush=True)
    summary = {
        "median_s": median([r["seconds"] for r in results]),
        "load": os.getloadavg()[0],
        "runs": results,
    }
    print(json.dumps(summary) if args.json else f"median {summary['median_s']} s, "
          f"load average {summary['load']:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()

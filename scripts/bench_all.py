#!/usr/bin/env python3
"""Every jsonlbatch benchmark, one table: exec throughput, SSE parsing, memory and resume.

    python scripts/bench_all.py                    # full size (about 10 minutes on 2 cores)
    python scripts/bench_all.py --quick            # smaller inputs, for a first look

Each figure comes from the script that measures it (run them alone for details):
bench_exec.py, bench_sse.py, bench_memory.py, bench_failed.py. Targets are the issues' own.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# (figure, label, target, higher is better)
ROWS = [
    ("aiohttp_req_per_s", "bare aiohttp loop, req/s (c=256, instant mock)", None, True),
    ("jsonlbatch_req_per_s", "jsonlbatch exec, req/s (whole command)", None, True),
    ("openai_req_per_s", "openai.AsyncOpenAI + semaphore, req/s", None, True),
    ("exec_vs_aiohttp", "exec / bare aiohttp", 0.60, True),
    ("exec_vs_openai", "exec / OpenAI SDK", 5.0, True),
    ("sse_jsonlbatch_chunks_per_s", "SSE path, chunks/s", 80_000, True),
    ("sse_bare_chunks_per_s", "bare aiohttp SSE line loop, chunks/s", None, True),
    ("stream_ratio", "exec --stream / exec, req/s", 0.70, True),
    ("memory_peak_rss_mb", "peak RSS of a big run, MB", 200, False),
    ("memory_req_per_s", "big run, req/s", None, True),
    ("resume_first_line_s", "resume over all-done output: first new line, s", 5.0, False),
    ("failed_resume_rss_mb", "resume over all-failed output: peak RSS, MB", 150, False),
    ("failed_retry_rss_mb", "--retry-failed over all-failed output: peak RSS, MB", 150, False),
]


def run(script: str, *args: str) -> dict:
    cmd = [sys.executable, str(HERE / script), *args, "--json"]
    print("running", " ".join(cmd[1:]), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE)
    if proc.returncode != 0:
        raise SystemExit(f"{script} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="smaller inputs and fewer runs")
    args = ap.parse_args()
    quick = args.quick
    figures: dict = {}
    figures |= run(
        "bench_exec.py",
        *(["--requests", "5000", "--openai-requests", "1000", "--runs", "1"] if quick else []),
    )
    figures |= run("bench_sse.py", *(["--runs", "1"] if quick else []))
    figures |= run("bench_memory.py", "--requests", "100000" if quick else "1000000")
    figures |= run("bench_failed.py", "--requests", "100000" if quick else "1000000")
    print("| figure | value | target |\n|---|---|---|")
    for key, label, target, higher in ROWS:
        if key not in figures:
            continue
        value = figures[key]
        shown = f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
        goal = "" if target is None else f"{'>=' if higher else '<='} {target:,}"
        if target is not None:
            goal += " (met)" if (value >= target if higher else value <= target) else " (NOT met)"
        print(f"| {label} | {shown} | {goal} |")
    if "memory_requests" in figures:
        print(f"\n(memory and resume figures for {figures['memory_requests']:,} requests)")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Memory on a big input, and how fast a big resume starts sending.

1. Runs `jsonlbatch exec` over N requests (default 1,000,000) against the instant built-in mock
   and reports the exec process's peak RSS (target: under 200 MB).
2. Appends 1,000 new requests to that input and runs the same command again: the output already
   holds N done lines, so this measures the resume scan. Reports the seconds from start until the
   first new line is written (target: within 5 s) and the peak RSS of that run.

    python scripts/bench_memory.py                  # 1,000,000 requests (several minutes)
    python scripts/bench_memory.py --requests 200000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from bench_exec import exec_command, free_port, pin, start_server

from jsonlbatch.batch_format.records import request_line


def write_requests(path: Path, start: int, n: int, mode: str = "wb") -> None:
    with path.open(mode) as f:
        chunk = []
        for i in range(start, start + n):
            body = {
                "model": "mock",
                "messages": [{"role": "user", "content": f"Question {i}?"}],
                "max_tokens": 8,
            }
            chunk.append(request_line(f"id-{i:08d}", body))
            if len(chunk) == 10_000:
                f.write(b"".join(chunk))
                chunk.clear()
        f.write(b"".join(chunk))


def run_exec(
    requests: Path, output: Path, url: str, watch_growth: bool
) -> tuple[float, float, float]:
    """Returns (peak RSS of the exec process in MB, wall seconds, seconds until the output grew)."""
    before = output.stat().st_size if output.exists() else 0
    cmd = exec_command(requests, output, url, 256, "--quiet")
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, preexec_fn=lambda: pin(0))
    first_write = float("nan")
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if watch_growth and first_write != first_write and output.stat().st_size > before:
            first_write = time.perf_counter() - start
        time.sleep(0.005)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"exec failed with status {proc.returncode}")
    return usage.ru_maxrss / 1024, wall, first_write


def parse_args(doc: str | None) -> argparse.Namespace:
    """`--requests N` (a million by default) and `--json`: the options of the big-file benches."""
    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--json", action="store_true", help="print one JSON object of the figures")
    return ap.parse_args()


def main() -> None:
    args = parse_args(__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        req, out = Path(tmp) / "req.jsonl", Path(tmp) / "out.jsonl"
        write_requests(req, 0, args.requests)
        port = free_port()
        server = start_server(port)
        url = f"http://127.0.0.1:{port}/v1"
        try:
            rss, wall, _ = run_exec(req, out, url, watch_growth=False)
            write_requests(req, args.requests, 1_000, mode="ab")
            rss2, wall2, first = run_exec(req, out, url, watch_growth=True)
        finally:
            server.terminate()
            server.wait(timeout=10)
    figures = {
        "memory_requests": args.requests,
        "memory_peak_rss_mb": rss,
        "memory_run_s": wall,
        "memory_req_per_s": args.requests / wall,
        "resume_first_line_s": first,
        "resume_peak_rss_mb": rss2,
    }
    if args.json:
        print(json.dumps(figures))
        return
    print(
        f"run of {args.requests:,} requests: peak RSS {rss:.0f} MB, {wall:.0f} s "
        f"({args.requests / wall:,.0f} req/s)"
    )
    print(
        f"resume with {args.requests:,} done lines: first new line after {first:.2f} s, "
        f"run {wall2:.2f} s, peak RSS {rss2:.0f} MB"
    )


if __name__ == "__main__":
    main()

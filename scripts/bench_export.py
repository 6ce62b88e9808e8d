#!/usr/bin/env python3
"""`jsonlbatch export` on a big response file: rows per second and peak memory.

Writes N response lines (default 1,000,000; answers of --answer-bytes characters, in the shape
exec writes them), then times `jsonlbatch export` to Parquet as a child process and reads its
peak RSS. Memory should not depend on N (row groups of 8,192 rows).

    python scripts/bench_export.py                     # 1,000,000 rows (a few minutes)
    python scripts/bench_export.py --rows 200000 --answer-bytes 2000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson


def response_line(custom_id: str, answer: str) -> bytes:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "mock",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": answer},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 40, "total_tokens": 52},
    }
    line = {
        "id": "batch_req_1",
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": "r", "body": body},
        "error": None,
        "metrics": {"attempts": 1, "latency_s": 0.25, "ttft_s": 0.05},
    }
    return orjson.dumps(line) + b"\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--answer-bytes", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "responses.jsonl"
        with path.open("wb") as fh:
            answer = "x" * args.answer_bytes
            for start in range(0, args.rows, 10_000):
                stop = min(args.rows, start + 10_000)
                fh.write(b"".join(response_line(f"q{i}|0", answer) for i in range(start, stop)))
        out = Path(tmp) / "results.parquet"
        code = (
            "import resource, sys, time\n"
            "from jsonlbatch.post.export import export\n"
            "t = time.perf_counter()\n"
            f"s = export({str(path)!r}, {str(out)!r})\n"
            "print(s.rows, time.perf_counter() - t,"
            " resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)\n"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if done.returncode:
            sys.exit(done.stderr)
        rows, seconds, peak = done.stdout.split()
        figures = {
            "rows": int(rows),
            "input_mb": round(os.path.getsize(path) / 1e6, 1),
            "seconds": round(float(seconds), 1),
            "rows_per_s": round(int(rows) / float(seconds)),
            "peak_rss_mb": int(peak),
            "parquet_mb": round(os.path.getsize(out) / 1e6, 1),
        }
    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key:>12}: {value}")


if __name__ == "__main__":
    main()

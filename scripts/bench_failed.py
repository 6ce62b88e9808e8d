#!/usr/bin/env python3
"""Memory of a resume over a million failed lines, without and with --retry-failed.

Writes N requests and an output in which every one of them failed (as a run against a dead
server leaves it), then prepares `exec` on them in a fresh process (the scans, the model count,
the list of ids to re-send: everything before the first request goes out) and reports that
process's peak RSS. Target (issue 11): under 150 MB for 1,000,000 failed lines.

    python scripts/bench_failed.py                  # 1,000,000 lines
    python scripts/bench_failed.py --requests 200000
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_memory import parse_args, write_requests

from jsonlbatch.batch_format.records import Result

_PREPARE = """
import resource, sys, time
from jsonlbatch.exec.job import ExecOptions, Job
started = time.perf_counter()
job = Job(sys.argv[1], sys.argv[2], ExecOptions(retry_failed=sys.argv[3] == "1", quiet=True))
scan = job.prepare()
job.close()
print(len(scan.pending), time.perf_counter() - started,
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def write_failures(path: Path, n: int) -> None:
    error = {"code": "connection_error", "message": "cannot connect"}
    with path.open("wb") as f:
        chunk = []
        for i in range(n):
            chunk.append(
                Result(f"id-{i:08d}", None, error=error, metrics={"attempts": 9}).to_line()
            )
            if len(chunk) == 10_000:
                f.write(b"".join(chunk))
                chunk.clear()
        f.write(b"".join(chunk))


def prepare(req: Path, out: Path, retry: bool) -> tuple[int, float, float]:
    proc = subprocess.run(
        [sys.executable, "-c", _PREPARE, str(req), str(out), "1" if retry else "0"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    pending, seconds, rss = proc.stdout.split()
    return int(pending), float(seconds), float(rss)


def main() -> None:
    args = parse_args(__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        req, out = Path(tmp) / "req.jsonl", Path(tmp) / "out.jsonl"
        write_requests(req, 0, args.requests)
        write_failures(out, args.requests)
        _, resume_s, resume_rss = prepare(req, out, retry=False)
        pending, retry_s, retry_rss = prepare(req, out, retry=True)
    assert pending == args.requests, pending
    figures = {
        "failed_requests": args.requests,
        "failed_resume_rss_mb": resume_rss,
        "failed_resume_s": resume_s,
        "failed_retry_rss_mb": retry_rss,
        "failed_retry_s": retry_s,
    }
    if args.json:
        print(json.dumps(figures))
        return
    print(
        f"{args.requests:,} failed lines: resume prepared in {resume_s:.1f} s, peak RSS "
        f"{resume_rss:.0f} MB; --retry-failed prepared in {retry_s:.1f} s, peak RSS "
        f"{retry_rss:.0f} MB"
    )


if __name__ == "__main__":
    main()

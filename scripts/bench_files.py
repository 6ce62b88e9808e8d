#!/usr/bin/env python3
"""Hosted code interpreter runs on the mock (issue 47): uploads and collection's cost.

N tasks (default 1,000) to `/v1/responses` with a `code_interpreter` tool, all naming the same
3 reference files as `file://PATH`; the mock's interpreter writes 2 files per task. The same
file is run twice at `-c 64` into fresh outputs: without `--files-dir` (the uploads still
happen) and with it (each answer's container listed and its 2 files downloaded before the line
is written). Both runs share one answer cache folder in `--cache-mode write` (answers stored,
none served), where the uploads' ids are remembered too, so the second run reuses the first's
uploads. Reported: the mock's upload count over both runs (goal: 3 in all), each run's wall
time, and collection's added share (goal: under 10%). `--latency` is the mock's answer time (a
real interpreter answer takes seconds).

    python scripts/bench_files.py                       # 1,000 tasks, 0.5 s answers
    python scripts/bench_files.py --tasks 200 --latency 0.2
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from bench_exec import exec_command, free_port, start_server


def write_tasks(folder: Path, tasks: int) -> Path:
    refs = []
    for i in range(3):
        path = folder / f"reference_{i}.csv"
        path.write_bytes(b"id,value\n" + b"".join(b"%d,%d\n" % (k, k * i) for k in range(5000)))
        refs.append(f"file://{path}")
    requests = folder / "tasks.jsonl"
    with requests.open("w") as f:
        for i in range(tasks):
            tool = {"type": "code_interpreter", "container": {"type": "auto", "file_ids": refs}}
            body = {"model": "mock", "input": f"Task {i}: build the report", "tools": [tool]}
            line = {"custom_id": f"task-{i}", "method": "POST", "url": "/v1/responses",
                    "body": body}  # fmt: skip
            f.write(json.dumps(line) + "\n")
    return requests


def uploads(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/mock/stats") as resp:
        return json.load(resp)["requests"].get("/v1/files", 0)


def timed(command: list[str]) -> tuple[float, float]:
    """Wall seconds of `command`, and the CPU seconds (user + system) it used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return time.perf_counter() - start, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=0.5)
    parser.add_argument("-c", "--concurrency", type=int, default=64)
    args = parser.parse_args()
    port = free_port()
    server = start_server(port, "--latency", str(args.latency))
    url = f"http://127.0.0.1:{port}/v1"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            requests = write_tasks(folder, args.tasks)
            cache = ("--cache", str(folder / "cache"), "--cache-mode", "write")
            plain = exec_command(requests, folder / "plain.jsonl", url, args.concurrency, "-q",
                                 *cache)  # fmt: skip
            first = uploads(port)
            base, base_cpu = timed(plain)
            plain_uploads = uploads(port) - first
            files = exec_command(requests, folder / "files.jsonl", url, args.concurrency, "-q",
                                 *cache, "--files-dir", str(folder / "files"))  # fmt: skip
            with_files, files_cpu = timed(files)
            collected = sum(1 for p in (folder / "files").rglob("*") if p.is_file())
            total_uploads = uploads(port) - first
    finally:
        server.terminate()
        server.wait()
    print(f"tasks {args.tasks}, -c {args.concurrency}, mock latency {args.latency} s")
    print(f"uploads: {plain_uploads} in the first run, {total_uploads} over both runs")
    print(f"without --files-dir: {base:.2f} s wall, {base_cpu:.2f} s client CPU")
    print(f"with --files-dir:    {with_files:.2f} s wall, {files_cpu:.2f} s client CPU "
          f"({collected} files collected)")  # fmt: skip
    print(f"collection's client CPU: {1000 * (files_cpu - base_cpu) / args.tasks:.2f} ms a task")
    print(f"collection adds {100 * (with_files - base) / base:+.1f}% wall time")


if __name__ == "__main__":
    main()

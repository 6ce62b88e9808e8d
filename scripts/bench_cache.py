#!/usr/bin/env python3
"""The answer cache at scale (issue 29).

1. **All hits**: N requests (default 1,000,000) whose answers are all in a cache, re-run into a
   new output with `exec --cache`, against a plain resume of the same file (an output that
   already holds every answer). Wall time and peak RSS of each (goal: the cache run within
   1.5x of the resume, under 200 MB), and the mock's request counter (must stay 0).
2. **Half hits**: M requests (default 100,000), half of them answered earlier through the cache
   by a run over every other line; the full file is then run into a new output: the mock must
   count exactly the misses.

The cache of part 1 is filled through the library (`Cache.put`, the same code a run uses to
store), not through the mock, and the done output for the plain resume is written directly:
sending a million requests first would only measure the mock. Each `exec` runs in its own
process pinned to one core, the mock on the other; peak RSS comes from the kernel (`wait4`).

    python scripts/bench_cache.py                       # 1,000,000 + 100,000 (disk: ~5 GB)
    python scripts/bench_cache.py --hits 200000 --half 20000
    python scripts/bench_cache.py --keep DIR            # keep the files (in DIR) afterwards
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import orjson
from bench_exec import exec_command, free_port, pin, start_server

from jsonlbatch.batch_format.records import Result, fingerprint, request_line
from jsonlbatch.cache import Cache, body_digest

CHAT = "/v1/chat/completions"


def body_of(i: int) -> dict:
    return {
        "model": "mock",
        "messages": [{"role": "user", "content": f"Question {i}: what is the answer?"}],
        "max_tokens": 8,
        "temperature": 0.7,
    }


def answer_of(i: int) -> bytes:
    return (
        b'{"id":"chatcmpl-%08d","object":"chat.completion","created":1764000000,"model":"mock",'
        b'"choices":[{"index":0,"message":{"role":"assistant","content":"mock-%08x words of '
        b'an answer"},"finish_reason":"length"}],"usage":{"prompt_tokens":12,'
        b'"completion_tokens":8,"total_tokens":20}}' % (i, i * 2654435761 % 2**32)
    )


def write_all(folder: Path, n: int) -> tuple[Path, Path]:
    """The request file, a complete output for it, and a cache holding every answer."""
    req, done = folder / "req.jsonl", folder / "done.jsonl"
    cache = Cache(folder / "cache")
    with req.open("wb") as fr, done.open("wb") as fd:
        for i in range(n):
            body = body_of(i)
            raw = request_line(f"id-{i:08d}", body)
            fr.write(raw)
            answer = answer_of(i)
            meta = {"url": CHAT, "model": "mock", "status": 200,
                    "usage": {"prompt_tokens": 12, "completion_tokens": 8}}  # fmt: skip
            cache.put(body_digest(CHAT, body), 0, False, answer, meta)
            result = Result(f"id-{i:08d}", 200, orjson.Fragment(answer), f"chatcmpl-{i:08d}")
            result.metrics = {"prompt_tokens": 12, "completion_tokens": 8}
            result.metrics["fingerprint"] = fingerprint(raw.rstrip(b"\n"), CHAT, body)
            fd.write(result.to_line())
    cache.close()
    return req, done


def mock_count(url: str) -> int:
    with urllib.request.urlopen(url.replace("/v1", "/mock/stats"), timeout=10) as resp:
        stats = json.loads(resp.read())
    return stats["requests"].get(CHAT, 0)


def run(cmd: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MB, stderr) of one exec process pinned to core 0."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, preexec_fn=lambda: pin(0), stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"exec failed ({code}): {err[-2000:]}")
    return wall, usage.ru_maxrss / 1024, err


def lines_in(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def part_all_hits(folder: Path, n: int, url: str) -> dict:
    t0 = time.perf_counter()
    req, done = write_all(folder, n)
    fill_s = time.perf_counter() - t0
    cache = folder / "cache"
    before = mock_count(url)
    resume_s, resume_mb, _ = run(exec_command(req, done, url, 256, "--quiet"))
    new = folder / "new.jsonl"
    cached_s, cached_mb, _ = run(exec_command(req, new, url, 256, "--quiet", "--cache", str(cache)))
    sent = mock_count(url) - before
    hits = 0
    with new.open("rb") as f:
        for line in f:
            hits += b'"cache":"hit"' in line
    return {
        "hits_requests": n,
        "hits_fill_s": round(fill_s, 1),
        "resume_s": round(resume_s, 2),
        "resume_peak_rss_mb": round(resume_mb),
        "cache_rerun_s": round(cached_s, 2),
        "cache_rerun_peak_rss_mb": round(cached_mb),
        "cache_rerun_vs_resume": round(cached_s / resume_s, 2),
        "cache_rerun_lines": lines_in(new),
        "cache_rerun_hits": hits,
        "cache_rerun_sent": sent,
    }


def part_half_hits(folder: Path, n: int, url: str) -> dict:
    req, half = folder / "half-req.jsonl", folder / "half-odd.jsonl"
    with req.open("wb") as fr, half.open("wb") as fh:
        for i in range(n):
            line = request_line(f"h-{i:08d}", {**body_of(i), "temperature": 0.3})
            fr.write(line)
            if i % 2:
                fh.write(line)
    cache = folder / "half-cache"
    extra = ("--quiet", "--cache", str(cache))
    first = mock_count(url)
    warm_s, _, _ = run(exec_command(half, folder / "half-odd-out.jsonl", url, 256, *extra))
    middle = mock_count(url)
    out = folder / "half-out.jsonl"
    run_s, run_mb, _ = run(exec_command(req, out, url, 256, *extra))
    last = mock_count(url)
    hits = sum(b'"cache":"hit"' in line for line in out.open("rb"))
    return {
        "half_requests": n,
        "half_warm_run_s": round(warm_s, 2),
        "half_warm_sent": middle - first,
        "half_run_s": round(run_s, 2),
        "half_run_peak_rss_mb": round(run_mb),
        "half_run_sent": last - middle,
        "half_run_hits": hits,
        "half_run_lines": lines_in(out),
        "half_exactly_the_misses": last - middle == n - n // 2 and hits == n // 2,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--hits", type=int, default=1_000_000, help="requests of part 1 (0: skip)")
    ap.add_argument("--half", type=int, default=100_000, help="requests of part 2 (0: skip)")
    ap.add_argument("--keep", help="work in this folder and keep it (default: a temporary one)")
    ap.add_argument("--json", action="store_true", help="print one JSON object of the figures")
    args = ap.parse_args()
    folder = Path(args.keep or tempfile.mkdtemp(prefix="bench_cache."))
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = start_server(port)
    url = f"http://127.0.0.1:{port}/v1"
    figures: dict = {"load_average": os.getloadavg()[0]}
    try:
        if args.hits:
            figures.update(part_all_hits(folder, args.hits, url))
        if args.half:
            figures.update(part_half_hits(folder, args.half, url))
    finally:
        server.terminate()
        server.wait(timeout=10)
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    figures["load_average_after"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(figures))
        return
    for key, value in figures.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()

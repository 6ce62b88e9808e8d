#!/usr/bin/env python3
"""Pacing against a provider's limits: learned limits versus `--rate-limits off`, side by side.

The mock enforces a requests-per-minute and a tokens-per-minute limit the way OpenAI does (a
continuously refilled bucket holding one second of the rate; a request is charged its prompt
plus its `max_tokens` on arrival; a refused request gets a 429 with `Retry-After` and costs
nothing) and sends the `x-ratelimit-*` headers. `jsonlbatch exec` runs against it twice per
scenario: learning the limits from the headers (the default), and with `--rate-limits off`
(then only its reaction to 429s paces it).

    python scripts/bench_ratelimit.py                 # both scenarios, ~30 s of work each
    python scripts/bench_ratelimit.py --seconds 10    # quicker

Per run: the achieved rate as a share of the binding limit (steady state: over the middle 80%
of the requests by start time), and the share of attempts answered 429. Target: >= 90% of the limit with
<= 1% of attempts answered 429.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_exec import exec_command, free_port, pin, start_server

from jsonlbatch.batch_format.records import request_line

PROMPT_WORDS = 40  # the mock counts a token per word
MAX_TOKENS = 60


def write_requests(path: Path, n: int) -> None:
    words = " ".join(["word"] * (PROMPT_WORDS - 2))
    with path.open("wb") as f:
        for i in range(n):
            body = {
                "model": "mock",
                "messages": [{"role": "user", "content": f"question {i} {words}"}],
                "max_tokens": MAX_TOKENS,
            }
            f.write(request_line(f"r{i}", body))


def start_mock(port: int, rpm: float, tpm: float):
    return start_server(port, "--rpm", str(rpm), "--tpm", str(tpm), "--latency", "0.05",
                        "--default-max-tokens", str(MAX_TOKENS))  # fmt: skip


def mock_stats(url: str) -> dict:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/mock/stats", timeout=10) as resp:
        return json.loads(resp.read())


def run(requests: Path, out: Path, rpm: float, tpm: float, learn: bool, concurrency: int) -> dict:
    import subprocess

    port = free_port()
    mock = start_mock(port, rpm, tpm)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        out.unlink(missing_ok=True)
        extra = ["--max-retries", "100", "-q"] + ([] if learn else ["--rate-limits", "off"])
        cmd = exec_command(requests, out, url, concurrency, *extra)
        proc = subprocess.run(cmd, preexec_fn=lambda: pin(0), capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr)
        stats = mock_stats(url)
    finally:
        mock.terminate()
        mock.wait(timeout=10)
    lines = [orjson.loads(raw) for raw in out.read_bytes().splitlines()]
    starts = [line["metrics"]["start_time"] for line in lines]
    ends = [m["start_time"] + m["latency_s"] for m in (line["metrics"] for line in lines)]
    span = max(ends) - min(starts)
    per_request = PROMPT_WORDS + MAX_TOKENS
    limit_rps = min(rpm / 60, tpm / 60 / per_request)
    # Steady state: the middle 80% of the requests by start time, so neither the first
    # second's full bucket nor the last stragglers count.
    ordered = sorted(starts)
    low, high = ordered[len(ordered) // 10], ordered[len(ordered) * 9 // 10]
    steady = (len(ordered) * 9 // 10 - len(ordered) // 10) / (high - low)
    ok = stats["requests"].get("/v1/chat/completions", 0)
    limited = stats["responses"].get("429", 0)
    return {
        "learned": learn,
        "requests": len(lines),
        "seconds": round(span, 2),
        "req_per_s": round(len(lines) / span, 1),
        "limit_req_per_s": round(limit_rps, 1),
        "steady_req_per_s": round(steady, 1),
        "share_of_limit": round(steady / limit_rps, 3),
        "attempts": ok,
        "answered_429": limited,
        "share_429": round(limited / ok, 4) if ok else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=30.0, help="work per run, at the limit")
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    per_request = PROMPT_WORDS + MAX_TOKENS
    scenarios = {
        # requests/min binds: 100 req/s, tokens allow 150
        "rpm-bound": (6000.0, 6000.0 * 1.5 * per_request),
        # tokens/min binds: 300,000 tpm at 100 tokens a request is 50 req/s, requests allow 100
        "tpm-bound": (6000.0, 300_000.0),
    }
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (rpm, tpm) in scenarios.items():
            limit_rps = min(rpm / 60, tpm / 60 / per_request)
            n = int(limit_rps * args.seconds)
            requests = Path(tmp) / f"{name}.jsonl"
            write_requests(requests, n)
            for learn in (True, False):
                started = time.monotonic()
                figures = run(requests, Path(tmp) / "out.jsonl", rpm, tpm, learn, args.concurrency)
                figures |= {"scenario": name, "rpm": rpm, "tpm": tpm,
                            "wall_s": round(time.monotonic() - started, 1)}  # fmt: skip
                results.append(figures)
                if not args.json:
                    print(
                        f"{name:>9} {'learned' if learn else 'off':>7}: "
                        f"{figures['req_per_s']:6.1f} req/s of {figures['limit_req_per_s']:.0f} "
                        f"(steady {figures['steady_req_per_s']:.1f}: "
                        f"{figures['share_of_limit']:.1%} of the limit), "
                        f"{figures['answered_429']} of {figures['attempts']} attempts answered "
                        f"429 ({figures['share_429']:.2%})",
                        flush=True,
                    )
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()

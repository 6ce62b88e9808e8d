#!/usr/bin/env python3
"""A self-hosted server that fails some requests: how long `jsonlbatch exec` takes to finish.

The mock answers 10% of requests with a 500, 5% with a 429 that carries no rate-limit headers
and no Retry-After (a gateway's queue limit, a busy replica), closes 5% of connections without
an answer and never answers 2% (a hang, cut by `--timeout 3`). `exec --concurrency 64 --timeout
3 --max-retries 8` sends 2,000 small chat requests through it. The figure is the whole
command's time; every request must end with exactly one line.

`--retry-after 1` puts `Retry-After: 1` on those 429s (a busy replica behind a proxy that says
when to come back: issue 39). `--wide` is issue 39's side-by-side workload: 20,000 requests at
`-c 256` against a fixed-latency server (50 ms) that answers 5% with a 500 and 5% with a 429
(`Retry-After: 1` unless `--retry-after` says otherwise), nothing dropped or hung.
`--client openai` times the loop most users write with the OpenAI SDK instead (AsyncOpenAI with
its own retries, `max_retries` as exec's, and a semaphore) on the same server.

    python scripts/bench_faults.py                  # 3 runs, the median
    python scripts/bench_faults.py --runs 1 --stray-429 0.2
    python scripts/bench_faults.py --retry-after 1 -- --rate-limits off
    python scripts/bench_faults.py --wide --runs 1 --client openai
    python scripts/bench_faults.py --source /tmp/old  # an older checkout's exec (its jsonlbatch/)

The mock (this checkout's) is pinned to one core and the client to the other, as in
bench_exec.py.
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


def start_mock(port: int, args: argparse.Namespace, seed: int) -> subprocess.Popen:
    faults = ["--fail-rate", "0.1", "--drop-rate", "0.05", "--hang-rate", "0.02"]
    if args.wide:
        faults = ["--fail-rate", "0.05", "--latency", "0.05"]
    return start_server(port, "--seed", str(seed), "--rate-limit-rate", str(args.stray_429),
                        "--retry-after", args.retry_after, *faults)  # fmt: skip


async def openai_loop(url: str, path: Path, out: Path, concurrency: int, retries: int) -> None:
    """The OpenAI SDK with its own retries (it honours `Retry-After` and `retry-after-ms`) and
    a semaphore, one task per line; a request that still fails gets an error line."""
    import asyncio

    import openai
    import orjson

    client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=retries, timeout=60)
    sem = asyncio.Semaphore(concurrency)
    lines: list[bytes] = []

    async def one(raw: bytes) -> None:
        line = orjson.loads(raw)
        try:
            async with sem:
                resp = await client.chat.completions.create(**line["body"])
            lines.append(orjson.dumps({"custom_id": line["custom_id"], "body": resp.model_dump()}))
        except openai.APIError as exc:
            lines.append(orjson.dumps({"custom_id": line["custom_id"], "error": str(exc)}))

    await asyncio.gather(*(one(raw) for raw in path.read_bytes().splitlines()))
    await client.close()
    out.write_bytes(b"\n".join(lines) + b"\n")


def client_command(requests: Path, out: Path, url: str, args: argparse.Namespace) -> list[str]:
    concurrency = 256 if args.wide else 64
    if args.client == "openai":
        return [sys.executable, __file__, "--run-openai", str(requests), str(out), url,
                str(concurrency)]  # fmt: skip
    extra = ["--max-retries", "8", "-q", *args.extra]
    if not args.wide:
        extra[:0] = ["--timeout", "3"]
    return exec_command(requests, out, url, concurrency, *extra)


def one_run(requests: Path, out: Path, args: argparse.Namespace, seed: int) -> dict:
    port = free_port()
    mock = start_mock(port, args, seed)
    url = f"http://127.0.0.1:{port}/v1"
    env = dict(os.environ)
    if args.source:
        env["PYTHONPATH"] = os.pathsep.join([args.source, env.get("PYTHONPATH", "")])
    try:
        out.unlink(missing_ok=True)
        cmd = client_command(requests, out, url, args)
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
    ap.add_argument("--requests", type=int, help="default 2,000 (--wide: 20,000)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--stray-429", type=float, default=0.05, help="share answered 429")
    ap.add_argument("--retry-after", help="Retry-After on those 429s: seconds or 'none' "
                    "(default none; --wide: 1)")  # fmt: skip
    ap.add_argument("--wide", action="store_true", help="the 20,000-request workload")
    ap.add_argument("--client", choices=("exec", "openai"), default="exec")
    ap.add_argument("--run-openai", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--source", help="put this folder first on PYTHONPATH for exec")
    ap.add_argument("--give-up", type=float, default=300.0, help="seconds before a run is cut")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("extra", nargs="*", help="more exec options, after --")
    args = ap.parse_args()
    if args.run_openai:
        from jsonlbatch.exec.job import run_coroutine

        requests, out, url, concurrency = args.run_openai
        run_coroutine(openai_loop(url, Path(requests), Path(out), int(concurrency), 8))
        return
    if args.requests is None:
        args.requests = 20_000 if args.wide else 2000
    if args.retry_after is None:
        args.retry_after = "1" if args.wide else "none"
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

#!/usr/bin/env python3
"""Client throughput, side by side: a bare aiohttp loop, `jsonlbatch exec`, and the OpenAI SDK.

The server is the built-in mock in instant mode, pinned to one core; each client runs in its own
process pinned to the other (on a machine with at least two cores), so the figures measure the
client. Every client sends the same request file at the same concurrency.

    python scripts/bench_exec.py                      # 20,000 requests at concurrency 256
    python scripts/bench_exec.py --requests 50000 --concurrency 256 --openai-requests 3000
    python scripts/bench_exec.py --requests 6000 --openai-requests 0 --baseline ../old-checkout

Runs alternate between the clients (aiohttp, exec, [baseline exec], openai, then again), so a
machine whose load changes meanwhile weighs on all of them alike. `--baseline DIR` also times
`jsonlbatch exec` from another checkout of the repository (a before/after comparison).

Prints requests/s per client and the ratios the executor issue sets targets for:
jsonlbatch / bare aiohttp (>= 0.6) and jsonlbatch / OpenAI SDK (>= 5).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from jsonlbatch.batch_format.records import request_line

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pin(core: int) -> None:
    if hasattr(os, "sched_setaffinity") and os.cpu_count() and os.cpu_count() > 1:
        os.sched_setaffinity(0, {core})


def write_requests(path: Path, n: int) -> None:
    with path.open("wb") as f:
        for i in range(n):
            body = {
                "model": "mock",
                "messages": [
                    {"role": "system", "content": "You are a careful assistant. " * 8},
                    {"role": "user", "content": f"Question {i}: " + "what is the answer? " * 20},
                ],
                "max_tokens": 16,
                "temperature": 0.7,
            }
            f.write(request_line(f"r{i}", body))


def exec_command(
    requests: str | Path, output: str | Path, url: str, concurrency: int, *extra: str
) -> list[str]:
    """The `jsonlbatch exec` command line that sends `requests` to `url`, writing `output`."""
    return [
        sys.executable,
        "-m",
        "jsonlbatch",
        "exec",
        str(requests),
        "-o",
        str(output),
        "--url",
        url,
        "-c",
        str(concurrency),
        *extra,
    ]


def timed_exec(
    requests: str | Path,
    output: str | Path,
    url: str,
    concurrency: int,
    *extra: str,
    tree: str | Path | None = None,
) -> dict:
    """Run `jsonlbatch exec` afresh (any old output removed) pinned to core 0, timed as a whole
    command (start-up, input scan, progress bar, output writes): {"requests", "seconds"}.
    `tree`: run the package of that checkout instead (`python -m` looks in its folder first)."""
    output = Path(output)
    output.unlink(missing_ok=True)
    cmd = exec_command(requests, output, url, concurrency, *extra)
    start = time.perf_counter()
    proc = subprocess.run(
        cmd, preexec_fn=lambda: pin(0), capture_output=True, text=True, cwd=tree or None
    )
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    with output.open("rb") as f:
        lines = sum(1 for _ in f)
    return {"requests": lines, "seconds": seconds}


def compile_package(*trees: str | Path | None) -> None:
    """Byte-compile each tree's `jsonlbatch/`, as installing a wheel does. Where
    PYTHONDONTWRITEBYTECODE is set (this machine's sessions set it) and a checkout has no
    `__pycache__`, every exec would compile its ~80 modules again at start-up (about 0.6 G
    instructions under callgrind; the bare loop's aiohttp comes compiled from pip), which is
    not what a user's run costs. compileall writes the files whatever that variable says."""
    for tree in trees:
        if tree is not None:
            compileall.compile_dir(Path(tree) / "jsonlbatch", quiet=1)


def median(values: list[float]) -> float:
    """The middle value (the upper middle one of an even count)."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def start_server(port: int, *flags: str) -> subprocess.Popen:
    """The mock (with `flags`, e.g. "--rpm", "600") pinned to core 1; returns once it is ready."""
    cmd = [
        sys.executable,
        "-m",
        "jsonlbatch.mock",
        "--port",
        str(port),
        "--served-model-name",
        "mock",
        *flags,
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, text=True, preexec_fn=lambda: pin(1), start_new_session=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "ready" not in line:
        proc.kill()
        raise SystemExit(f"mock server did not start: {line!r}")
    return proc


# -- the clients, each run as `python bench_exec.py --client NAME ...` in its own process --------


async def bare_aiohttp(url: str, path: Path, concurrency: int) -> int:
    """The floor of client cost: read lines, POST pre-encoded bytes, read the body, discard."""
    import asyncio

    import aiohttp

    lines = path.read_bytes().splitlines()
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    for raw in lines:
        queue.put_nowait(orjson.dumps(orjson.loads(raw)["body"]))
    for _ in range(concurrency):
        queue.put_nowait(None)
    done = 0
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal done
            while (payload := await queue.get()) is not None:
                async with session.post(
                    url + "/chat/completions", data=payload, headers=headers
                ) as r:
                    await r.read()
                done += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done


async def openai_sdk(url: str, path: Path, concurrency: int) -> int:
    """What most users write first: AsyncOpenAI + a semaphore, one task per line."""
    import asyncio

    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url, api_key="none", max_retries=0)
    sem = asyncio.Semaphore(concurrency)
    out = []

    async def one(raw: bytes) -> None:
        line = orjson.loads(raw)
        async with sem:
            resp = await client.chat.completions.create(**line["body"])
        out.append(orjson.dumps({"custom_id": line["custom_id"], "body": resp.model_dump()}))

    await asyncio.gather(*(one(raw) for raw in path.read_bytes().splitlines()))
    await client.close()
    return len(out)


def run_client(name: str, url: str, path: Path, concurrency: int) -> None:
    pin(0)
    from jsonlbatch.exec.job import run_coroutine

    fn = {"aiohttp": bare_aiohttp, "openai": openai_sdk}[name]
    start = time.perf_counter()
    n = run_coroutine(fn(url, path, concurrency))
    print(json.dumps({"requests": n, "seconds": time.perf_counter() - start}))


def children_cpu() -> float:
    """CPU seconds (user + system) of the child processes that ended so far."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(
    name: str, url: str, path: Path, concurrency: int, out: Path, baseline: str | None = None
) -> dict:
    """{"requests", "seconds" (wall), "cpu" (the client process's CPU seconds, start-up
    included: on a loaded machine a steadier measure of client cost than wall time)}."""
    before = children_cpu()
    result = _measure(name, url, path, concurrency, out, baseline)
    return result | {"cpu": children_cpu() - before}


def _measure(
    name: str, url: str, path: Path, concurrency: int, out: Path, baseline: str | None = None
) -> dict:
    if name == "jsonlbatch":
        return timed_exec(path, out, url, concurrency)
    if name == "baseline":
        return timed_exec(path, out, url, concurrency, tree=baseline)
    cmd = [
        sys.executable,
        __file__,
        "--client",
        name,
        "--url",
        url,
        "--input",
        str(path),
        "--concurrency",
        str(concurrency),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--openai-requests", type=int, default=3_000, help="the SDK is slow: fewer")
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3, help="median of this many runs per client")
    ap.add_argument("--json", action="store_true", help="print one JSON object of the figures")
    ap.add_argument("--baseline", help="another checkout whose `jsonlbatch exec` is timed too")
    ap.add_argument("--client", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        run_client(args.client, args.url, Path(args.input), args.concurrency)
        return
    compile_package(HERE.parent, args.baseline)
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        big, small = tmpdir / "req.jsonl", tmpdir / "req_small.jsonl"
        write_requests(big, args.requests)
        write_requests(small, args.openai_requests)
        port = free_port()
        server = start_server(port)
        url = f"http://127.0.0.1:{port}/v1"
        rates: dict[str, float] = {}
        clients = [("aiohttp", big), ("jsonlbatch", big)]
        clients += [("baseline", big)] if args.baseline else []
        clients += [("openai", small)] if args.openai_requests else []
        seen: dict[str, list[float]] = {name: [] for name, _ in clients}
        cpu: dict[str, list[float]] = {name: [] for name, _ in clients}
        try:
            for _ in range(args.runs):  # alternating: load changes weigh on every client alike
                for name, path in clients:
                    r = measure(
                        name, url, path, args.concurrency, tmpdir / "out.jsonl", args.baseline
                    )
                    seen[name].append(r["requests"] / r["seconds"])
                    cpu[name].append(r["requests"] / r["cpu"])
            for name, runs in seen.items():
                rates[name] = median(runs)
                if args.json:
                    continue
                shown = ", ".join(f"{r:.0f}" for r in runs)
                print(f"{name:>10}: {rates[name]:8.0f} req/s  (runs in order: {shown})")
            for name in ("jsonlbatch", "baseline"):
                if name in seen and not args.json:  # robust to load that drifts between rounds
                    pairs = [r / a for r, a in zip(seen[name], seen["aiohttp"], strict=True)]
                    shown = ", ".join(f"{r:.2f}" for r in pairs)
                    print(f"{name:>10} / aiohttp, run by run: median {median(pairs):.2f} ({shown})")
            if not args.json:
                print("requests per CPU-second of the client process (start-up included):")
                for name, runs in cpu.items():
                    ratio = median(runs) / median(cpu["aiohttp"])
                    shown = ", ".join(f"{r:.0f}" for r in runs)
                    print(f"{name:>10}: {median(runs):8.0f}  {ratio:.2f}x aiohttp  ({shown})")
        finally:
            server.terminate()
            server.wait(timeout=10)
    if args.json:
        ratios = {"exec_vs_aiohttp": rates["jsonlbatch"] / rates["aiohttp"]}
        if "openai" in rates:
            ratios["exec_vs_openai"] = rates["jsonlbatch"] / rates["openai"]
        if "baseline" in rates:
            ratios["baseline_vs_aiohttp"] = rates["baseline"] / rates["aiohttp"]
        print(json.dumps({f"{k}_req_per_s": v for k, v in rates.items()} | ratios))
        return
    print(
        f"jsonlbatch / bare aiohttp = {rates['jsonlbatch'] / rates['aiohttp']:.2f}  (target >= 0.60)"
    )
    if "baseline" in rates:
        print(f"baseline   / bare aiohttp = {rates['baseline'] / rates['aiohttp']:.2f}")
    if "openai" in rates:
        print(
            f"jsonlbatch / openai SDK   = {rates['jsonlbatch'] / rates['openai']:.1f}x "
            "(target >= 5x)"
        )
    print(
        "(jsonlbatch is timed as a whole command: start-up, input scan, progress bar, output writes)"
    )


if __name__ == "__main__":
    main()

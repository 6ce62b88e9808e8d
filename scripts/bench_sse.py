#!/usr/bin/env python3
"""Streaming cost on the client, two ways.

1. SSE parsing rate (chunks/s): a raw SSE server on one core answers every POST with the same
   precomputed vLLM-shaped stream as fast as it can; on the other core a client reads
   `--streams` such streams at `--concurrency`:
   - `bare`: `async for line in resp.content` + `orjson.loads` per data line, keeping nothing
     (the baseline the issue quotes: about 120,000 chunks/s on one core);
   - `jsonlbatch`: `jsonlbatch.exec.send.body_caps.read_stream` on `iter_any()` reads, which also rebuilds
     the body and times every chunk (target >= 80,000 chunks/s).
2. `jsonlbatch exec --stream` vs `jsonlbatch exec` requests/s against the instant built-in
   mock with short outputs (16 tokens), each timed as a whole command (target >= 70%).

    python scripts/bench_sse.py                     # both parts
    python scripts/bench_sse.py --part sse --streams 1024 --events 500
    python scripts/bench_sse.py --part exec --requests 20000 --json

Server and client are pinned to different cores (on a machine with two or more). The clients
run in turns, `--runs` times each; printed are the median rates, the client's CPU time per chunk
or request (steadier than rates on a shared machine), and the median of the run-by-run ratios.
`--json` prints the figures as one object, for `bench_all.py`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from bench_exec import free_port, median, pin, start_server, timed_exec, write_requests

SSE_TARGET = 80_000
STREAM_RATIO_TARGET = 0.70


def sse_payload(events: int) -> bytes:
    """One chat stream as vLLM sends it: role, `events` one-word content chunks, finish, usage."""
    head = {"id": "chatcmpl-" + "0" * 32, "object": "chat.completion.chunk", "created": 1,
            "model": "Qwen/Qwen3-8B"}  # fmt: skip

    def chunk(delta: dict, finish: str | None = None, **extra: object) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return b"data: " + orjson.dumps({**head, "choices": [choice], **extra}) + b"\n\n"

    parts = [chunk({"role": "assistant", "content": ""})]
    parts += [chunk({"content": f" word{i}"}) for i in range(events)]
    parts.append(chunk({}, "length"))
    usage = {"prompt_tokens": 50, "completion_tokens": events, "total_tokens": 50 + events}
    parts.append(b"data: " + orjson.dumps({**head, "choices": [], "usage": usage}) + b"\n\n")
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def serve_sse(port: int, events: int) -> None:
    """The raw SSE server: one precomputed stream per POST, no parsing of the request."""
    import asyncio

    from aiohttp import web

    from jsonlbatch.exec.job import run_coroutine

    payload = sse_payload(events)

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(payload)
        await resp.write_eof()
        return resp

    async def run() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        print("ready", flush=True)
        await asyncio.Event().wait()  # until terminated

    pin(1)
    run_coroutine(run())


async def read_streams(url: str, client: str, streams: int, concurrency: int) -> int:
    """Read `streams` streams; the number of content chunks parsed."""
    import asyncio

    import aiohttp

    from jsonlbatch.exec.send.body_caps import read_stream

    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                         "stream": True, "stream_options": {"include_usage": True}})  # fmt: skip
    headers = {"Content-Type": "application/json"}
    left = streams
    total = 0

    async def bare(resp: aiohttp.ClientResponse) -> int:
        count = 0
        async for line in resp.content:
            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                orjson.loads(line[6:])
                count += 1
        return count - 3  # role, finish and usage chunks carry no content

    async def ours(resp: aiohttp.ClientResponse) -> int:
        reader = await read_stream(resp.content.iter_any())
        reader.body()
        reader.metrics(0.0, 1.0)
        return reader.chunks

    read = bare if client == "bare" else ours
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, read_bufsize=1 << 20) as session:

        async def worker() -> None:
            nonlocal left, total
            while left > 0:
                left -= 1
                async with session.post(url, data=body, headers=headers) as resp:
                    total += await read(resp)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return total


def run_sse_client(client: str, url: str, streams: int, concurrency: int) -> None:
    pin(0)
    from jsonlbatch.exec.job import run_coroutine

    start = time.perf_counter()
    chunks = run_coroutine(read_streams(url, client, streams, concurrency))
    seconds = time.perf_counter() - start
    print(json.dumps({"chunks": chunks, "seconds": seconds, "cpu": cpu_seconds("self")}))


def interleaved(
    server: subprocess.Popen,
    commands: dict[str, list[str]],
    key: str,
    runs: int,
    unit: str,
    quiet: bool,
) -> dict[str, list[float]]:
    """Rates of each client command against `server` (stopped at the end), run in turns
    (A B A B ...) so that load from elsewhere on the machine falls on all alike."""
    rates: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}  # CPU us per unit
    try:
        for _ in range(runs):
            for name, command in commands.items():
                proc = subprocess.run(command, capture_output=True, text=True)
                if proc.returncode != 0:
                    raise SystemExit(proc.stderr)
                result = json.loads(proc.stdout.strip().splitlines()[-1])
                rates[name].append(result[key] / result["seconds"])
                cpu[name].append(result["cpu"] / result[key] * 1e6)
    finally:
        server.terminate()
        server.wait(timeout=10)
    if not quiet:
        for name, values in rates.items():
            shown = ", ".join(f"{r:.0f}" for r in values)
            print(f"  {name:>16}: {median(values):9.0f} {unit}  (runs: {shown}); "
                  f"client CPU {median(cpu[name]):.2f} us per {key[:-1]}")  # fmt: skip
    return rates


def figures(rates: dict[str, list[float]], base: str, other: str, names: tuple[str, ...]) -> dict:
    """Median rates of `base` and `other` and the median of their run-by-run ratios
    (other / base), under the three `names`."""
    ratios = [a / b for a, b in zip(rates[other], rates[base], strict=True)]
    return dict(
        zip(names, (median(rates[base]), median(rates[other]), median(ratios)), strict=True)
    )


def bench_sse(args: argparse.Namespace) -> dict[str, float]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve-sse", str(port), "--events", str(args.events)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert server.stdout is not None
    if "ready" not in server.stdout.readline():
        server.kill()
        raise SystemExit("the SSE server did not start")
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    commands = {
        f"SSE {client}": [sys.executable, __file__, "--sse-client", client, "--url", url,
                          "--streams", str(args.streams), "--concurrency", str(args.concurrency)]
        for client in ("bare", "jsonlbatch")
    }  # fmt: skip
    rates = interleaved(server, commands, "chunks", args.runs, "chunks/s", args.json)
    names = ("sse_bare_chunks_per_s", "sse_jsonlbatch_chunks_per_s", "sse_ratio")
    return figures(rates, "SSE bare", "SSE jsonlbatch", names)


def bench_exec_stream(args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        requests, output = Path(tmp) / "req.jsonl", Path(tmp) / "out.jsonl"
        write_requests(requests, args.requests)
        port = free_port()
        server = start_server(port)
        url = f"http://127.0.0.1:{port}/v1"
        base = [sys.executable, __file__, "--exec-client", "--url", url, "--input",
                str(requests), "--output", str(output), "--concurrency", str(args.concurrency)]  # fmt: skip
        commands = {"exec": base, "exec --stream": [*base, "--stream"]}
        rates = interleaved(server, commands, "requests", args.runs, "req/s", args.json)
    names = ("exec_plain_requests_per_s", "exec_stream_requests_per_s", "stream_ratio")
    return figures(rates, "exec", "exec --stream", names)


def run_exec_client(args: argparse.Namespace) -> None:
    """`jsonlbatch exec` as a whole command (start-up, scan, progress bar, writes), pinned."""
    extra = ["--stream"] if args.stream else []
    result = timed_exec(args.input, args.output, args.url, args.concurrency, *extra)
    print(json.dumps({**result, "cpu": cpu_seconds("children")}))


def cpu_seconds(who: str) -> float:
    """CPU time (user + system) of this process or of its finished children."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF if who == "self" else resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--part", choices=("sse", "exec", "all"), default="all")
    ap.add_argument("--streams", type=int, default=1024, help="SSE part: streams read")
    ap.add_argument("--events", type=int, default=500, help="SSE part: content chunks per stream")
    ap.add_argument("--requests", type=int, default=20_000, help="exec part: requests sent")
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3, help="runs per client, in turns")
    ap.add_argument("--json", action="store_true", help="print one JSON object of the figures")
    ap.add_argument("--serve-sse", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--sse-client", help=argparse.SUPPRESS)
    ap.add_argument("--exec-client", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--stream", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    ap.add_argument("--output", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_sse:
        serve_sse(args.serve_sse, args.events)
        return
    if args.sse_client:
        run_sse_client(args.sse_client, args.url, args.streams, args.concurrency)
        return
    if args.exec_client:
        run_exec_client(args)
        return
    results: dict[str, float] = {}
    if args.part in ("sse", "all"):
        results.update(bench_sse(args))
    if args.part in ("exec", "all"):
        results.update(bench_exec_stream(args))
    if args.json:
        print(json.dumps(results))
        return
    if "sse_ratio" in results:
        ours = results["sse_jsonlbatch_chunks_per_s"]
        verdict = "ok" if ours >= SSE_TARGET else "BELOW TARGET"
        print(f"jsonlbatch SSE path: {ours:.0f} chunks/s (target >= {SSE_TARGET}: {verdict}); "
              f"{results['sse_ratio']:.2f}x the bare line loop (median of run-by-run ratios)")  # fmt: skip
    if "stream_ratio" in results:
        stream_ratio = results["stream_ratio"]
        verdict = "ok" if stream_ratio >= STREAM_RATIO_TARGET else "BELOW TARGET"
        print(f"exec --stream / exec = {stream_ratio:.2f} (target >= {STREAM_RATIO_TARGET:.2f}: "
              f"{verdict}; median of run-by-run ratios)")  # fmt: skip


if __name__ == "__main__":
    main()

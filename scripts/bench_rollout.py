"""Benchmark `jsonlbatch rollout` (issue 43): no barrier, client CPU, memory, per-turn overhead.

    python scripts/bench_rollout.py barrier --conversations 600 --latency 0.05 --slow 1.0
    python scripts/bench_rollout.py cpu --conversations 2000 --turns 3
    python scripts/bench_rollout.py overhead --turns 20000

`barrier`: conversations of 1-9 turns (drawn from each conversation's id), 5% of calls slow,
against a scripted server in its own process; the wall time against the longest conversation's
own path (the sum of its calls' latencies) and against what a per-turn barrier needs (each turn
waits for the slowest conversation still going: the sum over turns of the slowest call).

`cpu`: N conversations of exactly T turns (a tool call each turn but the last), on the same
server answering at once; the client's CPU seconds and peak RSS for `jsonlbatch.rollout` and
for an asyncio + openai SDK agent loop doing the same (one task per conversation under a
semaphore, the same tool), each in a fresh process.

`overhead`: what the driver adds per turn besides the call: a tool dispatched (a sync tool, in
a worker thread; an async one) and its result journaled (one append), p50 and p90.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}  # fmt: skip


def _draw(*parts: Any) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "big")


def plan(task: str, turn: int, latency: float, slow: float) -> tuple[int, float]:
    """(turns of the conversation, this call's latency): the server's script, also used to
    compute the paths the benchmark compares against."""
    fixed = task.startswith("turns=")
    turns = int(task.split("=")[1].split()[0]) if fixed else 1 + _draw(task) % 9
    delay = slow if _draw(task, turn) % 100 < 5 else latency
    return turns, delay


# -- the scripted server ------------------------------------------------------------------


def serve(port: int, latency: float, slow: float) -> None:
    from aiohttp import web

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def chat(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        messages = body["messages"]
        task = next(m["content"] for m in messages if m["role"] == "user")
        done = sum(m["role"] == "assistant" for m in messages)
        turns, delay = plan(task, done + 1, latency, slow)
        if delay:
            await asyncio.sleep(delay)
        if done + 1 < turns:
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": f"call_{done}", "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"q": f"k{done}"})}}]}  # fmt: skip
            finish = "tool_calls"
        else:
            message, finish = {"role": "assistant", "content": "done"}, "stop"
        return web.Response(content_type="application/json", body=orjson.dumps({
            "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }))  # fmt: skip

    app = web.Application(client_max_size=64 << 20)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=port, print=lambda *a: print("ready", flush=True))


class Server:
    def __init__(self, latency: float, slow: float) -> None:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "serve", "--port", str(self.port), "--latency",
             str(latency), "--slow", str(slow)], stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        self.proc.stdout.readline()
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def write_tasks(path: Path, n: int, turns: int | None) -> None:
    with path.open("w") as f:
        for i in range(n):
            task = f"turns={turns} #{i}" if turns else f"task {i}"
            body = {"model": "m", "max_tokens": 8, "tools": [TOOL],
                    "messages": [{"role": "user", "content": task}]}  # fmt: skip
            f.write(json.dumps({"custom_id": f"c{i}", "method": "POST",
                                "url": "/v1/chat/completions", "body": body}) + "\n")  # fmt: skip


TOOLS_PY = "def lookup(q):\n    return {'q': q, 'found': True}\n"


# -- barrier ------------------------------------------------------------------------------


def bench_barrier(args: argparse.Namespace) -> None:
    server = Server(args.latency, args.slow)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            write_tasks(work / "tasks.jsonl", args.conversations, None)
            (work / "tools.py").write_text(TOOLS_PY)
            import jsonlbatch

            start = time.perf_counter()
            summary = jsonlbatch.rollout(work / "tasks.jsonl", work / "conv.jsonl",
                                         tools=work / "tools.py", urls=[server.url],
                                         concurrency=args.conversations, quiet=True)  # fmt: skip
            wall = time.perf_counter() - start
    finally:
        server.close()
    paths, barrier_turns = [], {}
    for i in range(args.conversations):
        task = f"task {i}"
        turns, _ = plan(task, 1, args.latency, args.slow)
        delays = [plan(task, t, args.latency, args.slow)[1] for t in range(1, turns + 1)]
        paths.append(sum(delays))
        for t, d in enumerate(delays):
            barrier_turns[t] = max(barrier_turns.get(t, 0.0), d)
    longest, barrier = max(paths), sum(barrier_turns.values())
    print(f"{args.conversations} conversations, {summary.turns} turns, "
          f"{summary.tool_calls} tool calls; latency {args.latency}s, 5% at {args.slow}s")  # fmt: skip
    print(f"wall {wall:.2f}s; longest conversation's own path {longest:.2f}s "
          f"(wall - path = {wall - longest:.2f}s); a per-turn barrier needs {barrier:.2f}s "
          f"({barrier / longest:.1f}x the path)")  # fmt: skip


# -- client CPU ---------------------------------------------------------------------------


def _usage() -> tuple[float, float]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024


def client_rollout(url: str, tasks: str, out: str, tools: str, concurrency: int) -> None:
    import jsonlbatch

    cpu0, _ = _usage()
    start = time.perf_counter()
    summary = jsonlbatch.rollout(tasks, out, tools=tools, urls=[url], concurrency=concurrency,
                                 quiet=True, handle_signals=False)  # fmt: skip
    wall = time.perf_counter() - start
    cpu, rss = _usage()
    print(json.dumps({"cpu_s": cpu - cpu0, "wall_s": wall, "peak_rss_mb": rss,
                      "turns": summary.turns}))  # fmt: skip


def client_sdk(url: str, tasks: str, concurrency: int) -> None:
    import openai

    cpu0, _ = _usage()

    def lookup(q: str) -> dict[str, Any]:
        return {"q": q, "found": True}

    async def main() -> int:
        client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=2)
        gate = asyncio.Semaphore(concurrency)
        turns = 0

        async def converse(line: dict[str, Any]) -> None:
            nonlocal turns
            body = line["body"]
            messages = list(body["messages"])
            async with gate:
                while True:
                    answer = await client.chat.completions.create(
                        model=body["model"], messages=messages, tools=body["tools"],
                        max_tokens=body["max_tokens"],
                    )  # fmt: skip
                    turns += 1
                    message = answer.choices[0].message
                    messages.append(message.model_dump(exclude_none=True))
                    if not message.tool_calls:
                        return
                    for call in message.tool_calls:
                        result = await asyncio.to_thread(
                            lookup, **json.loads(call.function.arguments)
                        )
                        messages.append({"role": "tool", "tool_call_id": call.id,
                                         "content": json.dumps(result)})  # fmt: skip

        with open(tasks) as f:
            lines = [json.loads(line) for line in f]
        await asyncio.gather(*(converse(line) for line in lines))
        await client.close()
        return turns

    start = time.perf_counter()
    turns = asyncio.run(main())
    wall = time.perf_counter() - start
    cpu, rss = _usage()
    print(json.dumps({"cpu_s": cpu - cpu0, "wall_s": wall, "peak_rss_mb": rss, "turns": turns}))


def bench_cpu(args: argparse.Namespace) -> None:
    server = Server(0.0, 0.0)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            tasks, tools = work / "tasks.jsonl", work / "tools.py"
            write_tasks(tasks, args.conversations, args.turns)
            tools.write_text(TOOLS_PY)
            runs = {
                "jsonlbatch rollout": ["client-rollout", str(tasks), str(work / "conv.jsonl"),
                                       str(tools)],
                "asyncio + openai SDK": ["client-sdk", str(tasks)],
            }  # fmt: skip
            for name, extra in runs.items():
                done = subprocess.run(
                    [sys.executable, __file__, *extra[:1], "--url", server.url, "-c",
                     str(args.concurrency), *extra[1:]],
                    capture_output=True, text=True, check=False,
                )  # fmt: skip
                if done.returncode:
                    raise SystemExit(done.stderr)
                figures = json.loads(done.stdout.strip().splitlines()[-1])
                print(f"{name:22} {args.conversations} x {args.turns} turns: client CPU "
                      f"{figures['cpu_s']:.2f}s, wall {figures['wall_s']:.2f}s, peak RSS "
                      f"{figures['peak_rss_mb']:.0f} MB ({figures['turns']} turns)")  # fmt: skip
    finally:
        server.close()


# -- per-turn overhead --------------------------------------------------------------------


def bench_overhead(args: argparse.Namespace) -> None:
    from jsonlbatch.rollouts.journal import Journal
    from jsonlbatch.rollouts.tools import call_tool, load_tools

    def lookup(q: str) -> dict[str, Any]:
        return {"q": q, "found": True}

    async def alookup(q: str) -> dict[str, Any]:
        return {"q": q, "found": True}

    box = load_tools({"lookup": lookup, "alookup": alookup})

    async def run(name: str) -> list[float]:
        times = []
        with tempfile.TemporaryDirectory() as tmp:
            journal = Journal(os.path.join(tmp, "c.jsonl"), os.path.join(tmp, "c.tools.jsonl"))
            for i in range(args.turns):
                start = time.perf_counter()
                outcome = await call_tool(box, name, '{"q": "k1"}', 300.0)
                journal.tool({"custom_id": f"c{i}", "turn": 1, "i": 1, "name": name,
                              "call_id": "call_0", "content": outcome.content,
                              "error": outcome.error, "asks": 0})  # fmt: skip
                times.append(time.perf_counter() - start)
            journal.close()
        return times

    for name, what in (("lookup", "sync tool (worker thread)"), ("alookup", "async tool")):
        times = asyncio.run(run(name))
        q = statistics.quantiles(times, n=10)
        print(f"{what:26} dispatch + journal: p50 {statistics.median(times) * 1e6:.0f} us, "
              f"p90 {q[8] * 1e6:.0f} us over {len(times)} turns")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("barrier")
    p.add_argument("--conversations", type=int, default=600)
    p.add_argument("--latency", type=float, default=0.05)
    p.add_argument("--slow", type=float, default=1.0)
    p = sub.add_parser("cpu")
    p.add_argument("--conversations", type=int, default=10_000)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("-c", "--concurrency", type=int, default=256)
    p = sub.add_parser("overhead")
    p.add_argument("--turns", type=int, default=20_000)
    p = sub.add_parser("serve")
    p.add_argument("--port", type=int)
    p.add_argument("--latency", type=float)
    p.add_argument("--slow", type=float)
    for name in ("client-rollout", "client-sdk"):
        p = sub.add_parser(name)
        p.add_argument("--url")
        p.add_argument("-c", type=int)
        p.add_argument("paths", nargs="+")
    args = parser.parse_args()
    if args.what == "barrier":
        bench_barrier(args)
    elif args.what == "cpu":
        bench_cpu(args)
    elif args.what == "overhead":
        bench_overhead(args)
    elif args.what == "serve":
        serve(args.port, args.latency, args.slow)
    elif args.what == "client-rollout":
        client_rollout(args.url, args.paths[0], args.paths[1], args.paths[2], args.c)
    else:
        client_sdk(args.url, args.paths[0], args.c)


if __name__ == "__main__":
    main()

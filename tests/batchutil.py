"""Helpers shared by the executor tests: write request files, read results, run the CLI."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from jsonlbatch.records import is_failure

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
ENV.pop("OPENAI_API_KEY", None)
ENV.pop("JSONLBATCH_CACHE", None)  # a user's answer cache must not answer the tests
ENV.pop("JSONLBATCH_CONFIG", None)  # nor a settings file change what they run


def chat_body(i: int, model: str = "mock", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": f"question {i}"}], **extra}


def write_requests(path: Path, count: int, model: str = "mock", **extra: Any) -> list[dict]:
    lines = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": chat_body(i, model, **extra),
        }
        for i in range(count)
    ]
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return lines


def read_results(path: Path) -> dict[str, dict]:
    """custom_id -> response line; asserts every line is whole JSON and no id repeats."""
    out: dict[str, dict] = {}
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), "output must end with a whole line"
    for number, raw in enumerate(data.splitlines(), 1):
        obj = orjson.loads(raw)
        cid = obj["custom_id"]
        assert cid not in out, f"{cid} duplicated at line {number}"
        out[cid] = obj
    return out


def content(line: dict, index: int = 0) -> str:
    return line["response"]["body"]["choices"][index]["message"]["content"]


def failures(results: dict[str, dict]) -> dict[str, dict]:
    return {k: v for k, v in results.items() if is_failure(v)}


def cli(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "jsonlbatch", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or ENV,
    )


_started: list[subprocess.Popen] = []


def start_cli(*args: str, env: dict | None = None) -> subprocess.Popen:
    """Start the CLI in the background; `kill_started` (run after every test) reaps it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "jsonlbatch", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or ENV,
    )
    _started.append(proc)
    return proc


def kill_started() -> None:
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def exec_cli(
    requests: Path, output: Path, *args: str, **kwargs: Any
) -> subprocess.CompletedProcess:
    """`jsonlbatch exec REQUESTS -o OUTPUT ARGS...`, waited for."""
    return cli("exec", str(requests), "-o", str(output), *args, **kwargs)


def start_exec(requests: Path, output: Path, *args: str) -> subprocess.Popen:
    """`jsonlbatch exec REQUESTS -o OUTPUT ARGS...`, in the background."""
    return start_cli("exec", str(requests), "-o", str(output), *args)


def odd_server(
    handler: Callable[..., Awaitable[Any]], *paths: str
) -> tuple[str, Callable[[], None]]:
    """A tiny real server on 127.0.0.1 for answers the mock does not give: `handler` answers
    POSTs to `paths` (default: chat completions); `/v1/models` lists `mock`. Returns (base URL
    ending in /v1, stop)."""
    from aiohttp import web

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "mock"}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    for path in paths or ("/v1/chat/completions",):
        app.router.add_post(path, handler)
    return serve_app(app)


def serve_app(app: Any) -> tuple[str, Callable[[], None]]:
    """An aiohttp application on 127.0.0.1 in a thread: (base URL ending in /v1, stop)."""
    import asyncio
    import threading

    from aiohttp import web

    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def stop() -> None:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)

    return f"http://127.0.0.1:{port}/v1", stop


def kill_at_random(
    args: Sequence[str],
    *,
    rounds: int,
    seed: int,
    wait: tuple[float, float],
    after_kill: Callable[[], object] = lambda: None,
) -> int:
    """Start the CLI with `args` and SIGKILL it after a random wait, `rounds` times at most
    (bounded; it stops early once a run finishes by itself). Returns the number of kills."""
    rng = random.Random(seed)
    kills = 0
    for _ in range(rounds):
        proc = start_cli(*args)
        time.sleep(rng.uniform(*wait))
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        kills += 1
        after_kill()
    return kills

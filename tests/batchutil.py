"""Helpers shared by the executor tests: write request files, read results, run the CLI."""

from __future__ import annotations

import asyncio
import inspect
import os
import random
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from jsonlbatch.batch_format.records import is_failure

# COLUMNS: a wide "terminal" where stderr is not one, as tqdm reads it, so that the progress
# bar's postfix (ok=, ttft_p50=, per_endpoint=, paced:) is not cut to a width some tqdm
# versions guess; tests read those fields.
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "400"}
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


def cli(
    *args: str,
    timeout: float = 120,
    env: dict | None = None,
    cwd: Path | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess:
    """`jsonlbatch ARGS...` run in this process (click's test runner), shown as a subprocess
    would show it: its exit status, its stdout, and its stderr, where an exception that escaped
    the CLI is printed as Python prints it (so "no traceback" is still checked). During the call
    the environment is exactly `env` (default `ENV`), the working directory `cwd`, and stdin
    reads `input`.

    A Python start costs a second or more on a busy 2-core machine, and the suite ran 346 of
    them; what a test checks (files, lines, messages, exit codes) does not need one. A test of
    what only a process shows (a signal, a kill, its environment at start-up, what it imports)
    uses `cli_process`. Inside a running event loop (an async test) the CLI, which runs its
    own loop, goes to a subprocess too, as does a call whose `env` changes how Python starts
    (`PYTHONPATH` to a stand-in module, `PYTHONHASHSEED`). `timeout` bounds only a subprocess
    (pytest-timeout bounds the test)."""
    env = env or ENV
    if _starts_python_differently(env) or _in_event_loop():
        return cli_process(*args, timeout=timeout, env=env, cwd=cwd, input=input)
    from jsonlbatch.cli import main

    saved, here = dict(os.environ), os.getcwd()
    _set_environ(env)
    try:
        if cwd is not None:
            os.chdir(cwd)
        result = click_runner().invoke(main, list(args), input=input, prog_name=PROG)
    finally:
        os.chdir(here)
        _set_environ(saved)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        assert result.exc_info is not None
        stderr += "".join(traceback.format_exception(*result.exc_info))
    return subprocess.CompletedProcess([PROG, *args], result.exit_code, result.stdout, stderr)


def click_runner() -> Any:
    """Click's test runner, keeping stderr apart from stdout. Click 8.2 always does; 8.1 (the
    floor pyproject.toml allows, which CI's lowest-versions job runs) mixes them unless told
    `mix_stderr=False`, an argument 8.2 no longer takes."""
    from click.testing import CliRunner

    if "mix_stderr" in inspect.signature(CliRunner).parameters:
        return CliRunner(mix_stderr=False)
    return CliRunner()


def _set_environ(env: dict) -> None:
    """Make `os.environ` equal `env`, key by key: a server thread of the test reading it
    meanwhile never sees it empty."""
    for name in [k for k in os.environ if k not in env]:
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def _starts_python_differently(env: dict) -> bool:
    """`env` sets a `PYTHON*` variable otherwise than this process has it: only a new
    interpreter reads those."""
    names = {k for k in [*env, *os.environ] if k.startswith("PYTHON") and k != "PYTHONUNBUFFERED"}
    return any(env.get(name) != os.environ.get(name) for name in names)


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


#: How click names the program in usage lines when it is started as `python -m jsonlbatch`.
PROG = "python -m jsonlbatch"


def cli_process(
    *args: str,
    timeout: float = 120,
    env: dict | None = None,
    cwd: Path | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess:
    """`python -m jsonlbatch ARGS...` as a real subprocess, waited for."""
    return subprocess.run(
        [sys.executable, "-m", "jsonlbatch", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or ENV,
        cwd=cwd,
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
        # 30 s: aiohttp 3.10 lets a handler that is still writing finish before cleanup ends
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
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

"""What the stand-in servers share: the life of a server process around the built-in mock.

vLLM and SGLang cannot run without GPUs, so the tests launch these instead: they parse the real
flags (and reject unknown ones as argparse does), then behave as the environment tells them:

  STANDIN_RECORD=PATH       append one JSON line per start: argv, pid, process group, env;
                            and {"pid", "lost_port"} when that start could not bind its port
  STANDIN_READY_DELAY=S     "load the model" for S seconds before binding the port
  STANDIN_WARMUP=S          answer /health 503 for S seconds after binding
  STANDIN_LATENCY=S         answer each request after S seconds
  STANDIN_CRASH_AT_START=T  print T to stderr and exit 1 before binding (e.g. an OOM message)
  STANDIN_CRASH_AFTER=N     die (exit 1, no cleanup) when generation request N+1 arrives
  STANDIN_CRASH_MARKER=PATH with CRASH_AFTER: crash only while PATH does not exist (creates it),
                            so a restarted server serves
  STANDIN_GRANDCHILD=1      spawn a sleeping worker process ("stubborn": it ignores SIGTERM)
  STANDIN_IGNORE_SIGTERM=1  the server itself ignores SIGTERM
  STANDIN_PORT_TAKEN=PATH   while PATH does not exist (creates it): another process takes the
                            port just before this server binds it, as on a busy machine between
                            the launcher's pick and the bind, so the bind fails
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence

import orjson
from aiohttp import web

from jsonlbatch.mock import MockConfig, create_app

_SLEEPER = "import signal, time\n{ignore}\ntime.sleep(600)"


def run(
    config: MockConfig,
    host: str,
    port: int,
    *,
    banner: Sequence[str] = (),
    ready_line: str = "",
) -> int:
    """Serve `config` like a real server process would; returns the exit status."""
    env = os.environ
    grandchild = _spawn_grandchild(env.get("STANDIN_GRANDCHILD", ""))
    _record(env.get("STANDIN_RECORD"), grandchild)
    for line in banner:
        print(line, flush=True)
    crash = env.get("STANDIN_CRASH_AT_START")
    if crash:
        print(crash, file=sys.stderr, flush=True)
        return 1
    if env.get("STANDIN_IGNORE_SIGTERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    warmup, latency = (float(env.get(f"STANDIN_{k}", "0")) for k in ("WARMUP", "LATENCY"))
    app = create_app(dataclasses.replace(config, warmup=warmup, latency=latency))
    crash_after = env.get("STANDIN_CRASH_AFTER")
    marker = env.get("STANDIN_CRASH_MARKER")
    if crash_after and not (marker and os.path.exists(marker)):
        app.middlewares.append(_crash_after(int(crash_after), marker))
    delay = float(env.get("STANDIN_READY_DELAY", "0"))
    _take_port_first(env.get("STANDIN_PORT_TAKEN"), host, port)
    try:
        # As vLLM does: bind the port at once (SO_REUSEADDR), listen only once "loaded", so
        # the port refuses connections meanwhile yet is taken.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:  # the launcher moves it (serve/ports.py)
            _append(env.get("STANDIN_RECORD"), {"pid": os.getpid(), "lost_port": port})
        print(f"ERROR: [Errno {exc.errno}] error while attempting to bind on address "
              f"({host!r}, {port}): {exc.strerror}", file=sys.stderr, flush=True)  # fmt: skip
        return 1
    with sock:
        asyncio.run(_serve(app, sock, delay, ready_line))
    return 0


async def _serve(app: web.Application, sock: socket.socket, delay: float, ready: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    if not os.environ.get("STANDIN_IGNORE_SIGTERM"):
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    if delay > 0:
        try:
            await asyncio.wait_for(stop.wait(), delay)
            return
        except asyncio.TimeoutError:
            pass
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    host, port = sock.getsockname()[:2]
    try:
        await web.SockSite(runner, sock).start()
        print(
            f"INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)", flush=True
        )
        if ready:
            print(ready, flush=True)
        await stop.wait()
        print("INFO:     Shutting down", flush=True)
    finally:
        await runner.cleanup()


def _crash_after(limit: int, marker: str | None) -> object:
    seen = 0

    @web.middleware
    async def middleware(request: web.Request, handler: object) -> web.StreamResponse:
        nonlocal seen
        if request.method == "POST":
            seen += 1
            if seen > limit:
                if marker:
                    open(marker, "w").close()
                print("RuntimeError: CUDA error: an illegal memory access was encountered",
                      file=sys.stderr, flush=True)  # fmt: skip
                os._exit(1)
        return await handler(request)  # type: ignore[operator]

    return middleware


def _take_port_first(marker: str | None, host: str, port: int) -> None:
    """A squatter in this server's process group (so it goes with it) listens on the port."""
    if not marker or os.path.exists(marker):
        return
    open(marker, "w").close()
    code = ("import socket, sys, time\n"
            "s = socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET)\n"
            "s.bind((sys.argv[1], int(sys.argv[2]))); s.listen()\n"
            "print('bound', flush=True); time.sleep(600)")  # fmt: skip
    squatter = subprocess.Popen([sys.executable, "-S", "-c", code, host, str(port)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)  # fmt: skip
    assert squatter.stdout is not None and squatter.stdout.readline() == b"bound\n"


def _spawn_grandchild(kind: str) -> int | None:
    if not kind:
        return None
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN)" if kind == "stubborn" else ""
    code = _SLEEPER.format(ignore=ignore)
    worker = subprocess.Popen([sys.executable, "-S", "-c", code], stdin=subprocess.DEVNULL)
    return worker.pid


def _record(path: str | None, grandchild: int | None) -> None:
    if not path:
        return
    keys = ("CUDA_VISIBLE_DEVICES", "VLLM_API_KEY", "JSONLBATCH_MOCK_API_KEY", "VLLM_CACHE_ROOT",
            "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")  # fmt: skip
    entry = {
        "argv": sys.argv,
        "pid": os.getpid(),
        "pgid": os.getpgrp(),
        "env": {k: os.environ[k] for k in keys if k in os.environ},
        "grandchild": grandchild,
    }
    _append(path, entry)


def _append(path: str | None, entry: dict[str, object]) -> None:
    if path:
        with open(path, "ab") as f:
            f.write(orjson.dumps(entry) + b"\n")

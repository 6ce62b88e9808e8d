"""A built-in OpenAI-compatible mock server: the quick-start backend and the test suite's.

It answers like vLLM (same shapes, same error bodies), deterministically (`reply_text`
recomputes any reply), fast, and with seeded faults on demand. Run it in-process with `start`
(async) or `BackgroundMock` (sync, in a thread), or as a process with `serve` /
`python -m jsonlbatch.mock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from jsonlbatch.errors import UsageError
from jsonlbatch.mock.app import create_app, stats_of
from jsonlbatch.mock.content import prompt_tokens, reasoning_text, reply_text
from jsonlbatch.mock.mock_config import MockConfig, MockStats

__all__ = [
    "BackgroundMock",
    "MockConfig",
    "MockServer",
    "MockStats",
    "create_app",
    "prompt_tokens",
    "reasoning_text",
    "reply_text",
    "serve",
    "start",
]

# In-flight requests get this long to finish on shutdown; a mock must stop promptly.
_SHUTDOWN_TIMEOUT = 0.5


@dataclass
class MockServer:
    """A running mock: its base URL (ending in /v1), port and live counters."""

    url: str
    host: str
    port: int
    stats: MockStats
    _runner: web.AppRunner

    async def close(self) -> None:
        await self._runner.cleanup()


async def start(config: MockConfig, host: str = "127.0.0.1", port: int = 0) -> MockServer:
    """Start a mock on the running loop; port 0 picks a free one."""
    app = create_app(config)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=_SHUTDOWN_TIMEOUT)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound = runner.addresses[0][1]
    shown = f"[{host}]" if ":" in host else host
    return MockServer(f"http://{shown}:{bound}/v1", host, bound, stats_of(app), runner)


def serve(
    config: MockConfig,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    ready_message: bool = True,
    startup_delay: float = 0.0,
) -> None:
    """Run a mock until SIGINT/SIGTERM, then stop cleanly.

    `startup_delay` waits before binding the port, so clients see a cold start (connection
    refused) as they do with a real server loading a model. Once listening, one line
    "mock server ready on URL" goes to stdout: launchers wait for it.
    """
    _run(_serve(config, host, port, ready_message, startup_delay))


async def _serve(
    config: MockConfig, host: str, port: int, ready_message: bool, startup_delay: float
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # not on Windows, nor outside the main thread: Ctrl-C then ends the loop instead
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    if startup_delay > 0:
        if ready_message:  # to stderr: stdout carries only the ready line
            print(
                f"mock server starts listening in {startup_delay:g} s", file=sys.stderr, flush=True
            )
        try:
            await asyncio.wait_for(stop.wait(), startup_delay)
            return  # stopped before it ever listened
        except asyncio.TimeoutError:
            pass
    server = await start(config, host, port)
    try:
        if ready_message:
            print(f"mock server ready on {server.url}", flush=True)
        await stop.wait()
    finally:
        await server.close()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _run(main: Coroutine[Any, Any, None]) -> None:
    loop = _new_loop()
    try:
        loop.run_until_complete(main)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


class BackgroundMock:
    """A mock on its own event loop in a daemon thread, for synchronous code (tests, notebooks,
    a client benchmark in the same process)::

        with BackgroundMock(MockConfig(latency=0.1)) as mock:
            run_client(mock.url)
    """

    def __init__(self, config: MockConfig, host: str = "127.0.0.1", port: int = 0) -> None:
        self._loop = _new_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="jsonlbatch-mock", daemon=True
        )
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(start(config, host, port), self._loop)
        try:
            self.server = future.result()
        except BaseException:
            self._stop_loop()
            raise

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def stats(self) -> MockStats:
        return self.server.stats

    def close(self) -> None:
        """Stop the server and its thread. Safe to call twice."""
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self.server.close(), self._loop).result()
        self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> BackgroundMock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

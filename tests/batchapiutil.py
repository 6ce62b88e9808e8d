"""Helpers for the Batch API tests: a `serve --batch-api` front (in-process, or a process) and
waiting on batches."""

from __future__ import annotations

import select
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchutil import start_cli
from openai import OpenAI

if TYPE_CHECKING:
    from jsonlbatch.batchapi.server.batch_server import BatchServerOptions

TERMINAL = {"completed", "failed", "expired", "cancelled"}


#: `serve --batch-api` options an in-process front understands: option -> (field, type).
_FRONT_OPTIONS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "--batch-concurrency": ("concurrency", int),
    "--batch-expiry": ("expiry", float),
    "--batch-max-queued": ("max_queued", int),
    "--server-api-key": ("api_key", str),
    "--upstream-api-key": ("upstream_api_key", str),
}


class BatchServer:
    """`jsonlbatch serve --batch-api --upstream URL` on a state directory: by default the same
    front (`create_app`) on a thread of this process, which starts in milliseconds where a
    Python process takes seconds on a busy machine; with `process=True` (for a SIGKILL, or the
    server's own log) a real `serve --batch-api` process. `kill` stops it (SIGKILL for a
    process) and `start` again resumes from the same directory."""

    def __init__(self, directory: Path, upstream: str, *args: str, process: bool = False) -> None:
        self.directory = directory
        self.upstream = upstream
        self.args = args
        self.process = process
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self._stop: Callable[[], None] | None = None

    def start(self, port: int = 0) -> BatchServer:
        if port == 0 and self.url:
            port = int(self.url.rsplit(":", 1)[1].split("/")[0])  # same URL after a restart
        if not self.process:
            self.url, self._stop = _front_in_a_thread(self._options(port))
            return self
        self.proc = start_cli(
            "serve",
            "--batch-api",
            "--upstream",
            self.upstream,
            "--batch-dir",
            str(self.directory),
            "--batch-port",
            str(port),
            *self.args,
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited: {self.proc.stderr.read()}")  # type: ignore[union-attr]
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
            if ready:
                self.url = self.proc.stdout.readline().strip()
                assert self.url.startswith("http://127.0.0.1:"), self.url
                return self
        raise AssertionError("serve --batch-api printed no URL within 30 s")

    def kill(self) -> None:
        if self._stop is not None:
            self._stop()
            self._stop = None
            return
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def _options(self, port: int) -> BatchServerOptions:
        """The front `serve --batch-api --upstream URL ARGS` would run (its defaults)."""
        from jsonlbatch.batchapi.server.batch_runner import RunnerOptions
        from jsonlbatch.batchapi.server.batch_server import BatchServerOptions
        from jsonlbatch.redact import register_secret

        given: dict[str, Any] = {}
        args = list(self.args)
        while args:
            name, value = args.pop(0), args.pop(0)
            field, kind = _FRONT_OPTIONS[name]  # another option: give process=True
            given[field] = kind(value)
        upstream_key = given.pop("upstream_api_key", None)
        for secret in (given.get("api_key"), upstream_key):
            register_secret(secret)
        runner = RunnerOptions(
            urls=[self.upstream], api_key=upstream_key, concurrency=given.pop("concurrency", 256)
        )
        return BatchServerOptions(str(self.directory), runner, port=port, **given)

    def client(self, api_key: str = "unused") -> OpenAI:
        return OpenAI(base_url=self.url, api_key=api_key, max_retries=0)


def wait_batch(client: OpenAI, batch_id: str, timeout: float = 60, until: Any = None) -> Any:
    """Poll until the batch ends (or `until(batch)` is true); return the last object."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if until(batch) if until else batch.status in TERMINAL:
            return batch
        time.sleep(0.1)
    raise AssertionError(f"batch {batch_id} still {batch.status} after {timeout} s")


def jsonl_lines(text: str) -> list[dict]:
    import orjson

    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def _front_in_a_thread(options: BatchServerOptions) -> tuple[str, Callable[[], None]]:
    """The batch front on its own event loop in a daemon thread: (base URL, stop)."""
    import asyncio
    import threading

    from aiohttp import web

    from jsonlbatch.batchapi.server.batch_server import create_app

    loop = asyncio.new_event_loop()
    runner = web.AppRunner(create_app(options), access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, options.host, options.port)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def stop() -> None:
        if loop.is_closed():  # stopped by `kill` already
            return
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()

    _running.append(stop)
    return f"http://{options.host}:{port}/v1", stop


#: Stops of the fronts still running, for `stop_fronts` after each test.
_running: list[Callable[[], None]] = []


def stop_fronts() -> None:
    """Stop every in-process front a test left running (as `kill_started` reaps processes)."""
    while _running:
        _running.pop()()

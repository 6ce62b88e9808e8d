"""Look at a run: a local, read-only web page over response files (`jsonlbatch view`).

    from jsonlbatch.view import serve_viewer
    serve_viewer(["responses.jsonl"], requests=["requests.jsonl"])   # blocks; Ctrl-C stops

The files are indexed, not loaded (`index.LineIndex`: offsets and a few numbers per line), so
a million lines open in seconds and memory stays small; a file still being written is followed.
`exec --view` runs the same server inside the run (`start_viewer`), with the run's live state.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import webbrowser
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from aiohttp import web

from jsonlbatch.errors import UsageError
from jsonlbatch.pricing.cost import Price
from jsonlbatch.view.hosts import allowed_hosts
from jsonlbatch.view.index import LineIndex
from jsonlbatch.view.live import LiveState, PrometheusExporter
from jsonlbatch.view.query import Query, Searcher
from jsonlbatch.view.server import LiveSource, Viewer


@dataclass
class RunningViewer:
    url: str
    runner: web.AppRunner
    viewer: Viewer


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def start_viewer(
    paths: Sequence[str],
    *,
    requests: Sequence[str] = (),
    host: str = "127.0.0.1",
    port: int = 0,
    price: Price | None = None,
    live: LiveSource | None = None,
) -> RunningViewer:
    """Start the viewer in the running event loop; `port=0` picks a free port."""
    viewer = Viewer(paths, requests=requests, price=price, live=live)
    runner = web.AppRunner(viewer.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise UsageError(
            f"the viewer cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from None
    bound = runner.addresses[0][1] if runner.addresses else port
    viewer.allowed_hosts = allowed_hosts(host, bound)  # known once the port is
    return RunningViewer(f"http://{_url_host(host)}:{bound}/", runner, viewer)


@contextlib.asynccontextmanager
async def viewing(paths: Sequence[str], **kwargs: object) -> AsyncIterator[RunningViewer]:
    """`start_viewer` as an async context manager: the server stops at the end."""
    running = await start_viewer(paths, **kwargs)  # type: ignore[arg-type]
    try:
        yield running
    finally:
        await running.runner.cleanup()


class BackgroundViewer:
    """The viewer on a thread of its own, with its own event loop: how `exec --view` shows a
    run while the run's loop does nothing but send. `close()` stops it."""

    def __init__(
        self,
        paths: Sequence[str],
        *,
        requests: Sequence[str] = (),
        host: str = "127.0.0.1",
        port: int = 0,
        price: Price | None = None,
        live: LiveState | None = None,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.url = ""

        async def main() -> None:
            self._stop = asyncio.Event()
            try:
                running = await start_viewer(
                    paths, requests=requests, host=host, port=port, price=price, live=live
                )
            except BaseException as exc:
                self._error = exc
                self._ready.set()
                return
            self.url = running.url
            watcher = asyncio.create_task(live.watch_servers()) if live is not None else None
            self._ready.set()
            try:
                await self._stop.wait()
            finally:
                if watcher is not None:
                    watcher.cancel()
                await running.runner.cleanup()

        self._thread = threading.Thread(
            target=self._loop.run_until_complete,
            args=(main(),),
            name="jsonlbatch-view",
            daemon=True,
        )
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    def close(self) -> None:
        if self._thread.is_alive() and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout=10)


def serve_viewer(
    paths: Sequence[str],
    *,
    requests: Sequence[str] = (),
    host: str = "127.0.0.1",
    port: int = 0,
    price: Price | None = None,
    open_browser: bool = False,
    announce: bool = True,
) -> None:
    """Serve the viewer until interrupted (Ctrl-C or SIGTERM)."""

    async def main() -> None:
        async with viewing(paths, requests=requests, host=host, port=port, price=price) as running:
            if announce:
                print(
                    f"jsonlbatch view: {running.url}  (Ctrl-C to stop)", file=sys.stderr, flush=True
                )
            if open_browser:
                webbrowser.open(running.url)
            await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())


__all__ = [
    "BackgroundViewer",
    "LineIndex",
    "LiveSource",
    "LiveState",
    "PrometheusExporter",
    "Query",
    "RunningViewer",
    "Searcher",
    "Viewer",
    "serve_viewer",
    "start_viewer",
    "viewing",
]

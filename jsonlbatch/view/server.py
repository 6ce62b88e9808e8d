"""The viewer's web server: a read-only aiohttp app over indexed response files.

It binds 127.0.0.1 unless told otherwise, answers only GET, refuses requests whose `Host` is not
the address it serves (so a web page elsewhere cannot reach it through DNS rebinding), and sends
a Content-Security-Policy that allows no inline script: the page's only code is the package's
own `static/app.js`, and model answers are inserted as text, never as HTML.

Indexing runs as a background task in steps, so the first page of a million-line file is served
while the rest is still being indexed, and a file that grows (a live `exec`) is followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import stat
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import orjson
from aiohttp import web

from jsonlbatch.batch_format.call_ids import conversation_of, turn_of
from jsonlbatch.errors import JsonlbatchError, UsageError
from jsonlbatch.pricing.cost import Price
from jsonlbatch.redact import redact
from jsonlbatch.view.detail import describe
from jsonlbatch.view.index import OVERSIZED, LineIndex, open_regular
from jsonlbatch.view.media import image_bytes, media_at
from jsonlbatch.view.query import Query, Searcher
from jsonlbatch.view.thread import conversation_lines

#: Seconds between looks at a file that is fully indexed (a live run appends to it).
FOLLOW_EVERY = 0.5
_RATE_WINDOW = 30.0
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-src 'self'; base-uri 'none'; form-action 'none'"
)
#: The report page is the report's own self-contained HTML: inline CSS, no script at all.
_REPORT_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
_STATIC = {"app.js": "text/javascript", "style.css": "text/css", "index.html": "text/html"}

#: A callable an `exec` run hands the viewer: what the run is doing now (in flight per endpoint,
#: concurrency, pacing), merged into `/api/live`.
LiveSource = Callable[[], dict[str, Any]]


@dataclass
class ViewFile:
    """One file shown: its index, its search, and how fast lines arrived lately."""

    path: str
    label: str
    index: LineIndex
    searcher: Searcher
    arrivals: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=256))

    def rate(self) -> float:
        """Lines per second over the last half minute (0 when nothing arrived)."""
        now = time.monotonic()
        recent = [(t, n) for t, n in self.arrivals if now - t <= _RATE_WINDOW]
        if not recent:
            return 0.0
        span = max(now - recent[0][0], 1.0)
        return sum(n for _, n in recent) / span


def _labels(paths: Sequence[str]) -> list[str]:
    names = [os.path.basename(p) for p in paths]
    if len(set(names)) == len(names):
        return names
    return [os.path.relpath(p) for p in paths]


class Viewer:
    """Response files (and optionally their requests) indexed and served as a web page."""

    def __init__(
        self,
        paths: Sequence[str],
        *,
        requests: Sequence[str] = (),
        price: Price | None = None,
        live: LiveSource | None = None,
    ) -> None:
        if not paths:
            raise UsageError("give at least one response file")
        for path in [*paths, *requests]:
            _check_file(path)
        for path in paths:
            if _holds_requests(path):
                raise UsageError(
                    f"{path} holds requests, not responses: view reads what `jsonlbatch exec` "
                    f"wrote (give the requests with --requests {path})"
                )
        self.requests = [LineIndex(p) for p in requests]
        self.files = []
        for path, label in zip(paths, _labels(paths), strict=True):
            index = LineIndex(path, price=price)
            self.files.append(ViewFile(path, label, index, Searcher(index, self.requests)))
        self.price = price
        self.live = live
        #: `Host` header values accepted (empty: any); set once the port is bound.
        self.allowed_hosts: tuple[str, ...] = ()
        self._task: asyncio.Task[None] | None = None

    # -- indexing ---------------------------------------------------------------------------

    def _requests_of(self, custom_id: str) -> list[tuple[int, int, bytes]]:
        """(request file number, row, line) of each request line with this custom_id."""
        found = []
        for number, index in enumerate(self.requests):
            found += [(number, row, index.read(row)) for row in index.find(custom_id)]
        return found

    def index_step(self) -> bool:
        """Index one step of every file; True when every file is caught up."""
        caught_up = True
        for vf in self.files:
            was_done = vf.index.done
            added = vf.index.refresh()
            if added and was_done:  # lines a run appended, not the first pass over the file
                vf.arrivals.append((time.monotonic(), added))
            caught_up = caught_up and vf.index.done
        for index in self.requests:
            index.refresh()
            caught_up = caught_up and index.done
        return caught_up

    async def _follow(self) -> None:
        while True:
            caught_up = self.index_step()
            if caught_up:  # idle: get the custom_id lookups ready for comparisons
                for index in [vf.index for vf in self.files] + self.requests:
                    index.prepare_lookup()
            await asyncio.sleep(FOLLOW_EVERY if caught_up else 0)

    # -- the app ----------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_guard(self)])
        app.router.add_get("/", self._page)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/api/files", self._files)
        app.router.add_get("/api/rows", self._rows)
        app.router.add_get("/api/line", self._line)
        app.router.add_get("/api/compare", self._compare)
        app.router.add_get("/api/media", self._media)
        app.router.add_get("/api/live", self._live)
        app.router.add_get("/report", self._report)
        app.router.add_get("/favicon.ico", _no_icon)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, app: web.Application) -> None:
        self._task = asyncio.create_task(self._follow())

    async def _stop(self, app: web.Application) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _file(self, request: web.Request) -> ViewFile:
        text = request.query.get("file", "0") or "0"
        if not text.isdigit() or int(text) >= len(self.files):
            raise UsageError(f"file: a number from 0 to {len(self.files) - 1}")
        return self.files[int(text)]

    async def _page(self, request: web.Request) -> web.StreamResponse:
        return _static_response("index.html")

    async def _static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in _STATIC:
            raise web.HTTPNotFound()
        return _static_response(name)

    async def _files(self, request: web.Request) -> web.Response:
        return _json({"files": [self._file_info(vf) for vf in self.files],
                      "requests": bool(self.requests), "price": self.price is not None})  # fmt: skip

    def _file_info(self, vf: ViewFile) -> dict[str, Any]:
        index = vf.index
        return {
            "label": vf.label,
            "path": redact(vf.path),
            "lines": len(index),
            "bytes_indexed": index.size,
            "bytes": index.file_size,
            "done": index.done,
        }

    async def _rows(self, request: web.Request) -> web.Response:
        vf = self._file(request)
        query = Query.from_params(request.query)
        total, rows = vf.searcher.page(query)
        index = vf.index
        out = []
        for row, raw in index.read_many(rows):
            out.append(self._row(index, row, raw))
        return _json({
            "file": self._file_info(vf),
            "total": total,
            "page": query.page,
            "size": query.size,
            "rows": out,
            "facets": vf.searcher.facets(),
        })  # fmt: skip

    def _row(self, index: LineIndex, row: int, raw: bytes) -> dict[str, Any]:
        try:
            obj = orjson.loads(raw)
            cid = obj.get("custom_id") if isinstance(obj, dict) else None
        except orjson.JSONDecodeError:
            cid = None

        def num(column: Any) -> float | None:
            value = column[row]
            return None if value != value else round(float(value), 6)

        flags = index.flags[row]
        return {
            "row": row,
            "line": row + 1,
            "custom_id": redact(cid) if isinstance(cid, str) else None,
            "ok": bool(flags & 1),
            "unreadable": bool(flags & 8),
            "oversized": bool(flags & OVERSIZED),
            "truncated": bool(flags & 2),
            "cached": bool(flags & 4),
            "status": index.status[row] or None,
            "error": index.errors.names[index.error[row]] or None,
            "finish": index.finishes.names[index.finish[row]] or None,
            "model": index.models.names[index.model[row]] or None,
            "prompt_tokens": num(index.prompt),
            "completion_tokens": num(index.completion),
            "latency": num(index.latency),
            "ttft": num(index.ttft),
            "cost": num(index.cost),
            "verdict": ("", "valid", "invalid")[index.verdict[row]] or None,
        }

    async def _line(self, request: web.Request) -> web.Response:
        vf = self._file(request)
        text = request.query.get("row", "")
        if not text.isdigit() or int(text) >= len(vf.index):
            raise UsageError(f"row: a number from 0 to {len(vf.index) - 1}")
        row = int(text)
        out = self._describe(vf.index.read(row), row)
        cid = out.get("custom_id")
        out["conversation"] = conversation_lines(vf.index, cid) if isinstance(cid, str) else []
        if vf.index.flags[row] & OVERSIZED:
            out["problem"] = (
                f"a line of {vf.index.lengths[row]:,} bytes, longer than any response "
                f"({vf.index.max_line:,}): only its first bytes are shown"
            )
        return _json(out)

    def _describe(self, raw: bytes, row: int) -> dict[str, Any]:
        request_raw = link = None
        try:
            cid = orjson.loads(raw).get("custom_id")
        except (orjson.JSONDecodeError, AttributeError):
            cid = None
        place = turn_of(cid) if isinstance(cid, str) else None
        if isinstance(cid, str):
            found = self._requests_of(cid)
            conversation = conversation_of(cid)
            if not found and place == (1, False) and conversation is not None:
                found = self._requests_of(conversation)  # a rollout's first turn is its line
            if found:
                number, at, request_raw = found[0]
                link = functools.partial(media_url, number, at)
        out = describe(raw, request_raw, line=row + 1, link=link)
        if request_raw is None and place is not None and place != (1, False):
            out["prompt_note"] = _LATER_TURN_PROMPT
        out["row"] = row
        return out

    async def _media(self, request: web.Request) -> web.Response:
        """The bytes of one image of a request line, read again from the file by offset."""
        numbers = {}
        for name, top in (("req", len(self.requests)), ("row", None), ("message", None),
                          ("part", None)):  # fmt: skip
            text = request.query.get(name, "")
            if not text.isdigit() or (top is not None and int(text) >= top):
                raise UsageError(f"{name}: a whole number" + (f" below {top}" if top else ""))
            numbers[name] = int(text)
        index = self.requests[numbers["req"]]
        if numbers["row"] >= len(index):
            raise UsageError(f"row: a number from 0 to {len(index) - 1}")
        data, mime = await asyncio.to_thread(
            read_image, index, numbers["row"], numbers["message"], numbers["part"]
        )
        return web.Response(body=data, content_type=mime, headers={
            "Content-Security-Policy": "default-src 'none'", "Cache-Control": "private, max-age=3600"})  # fmt: skip

    async def _compare(self, request: web.Request) -> web.Response:
        cid = request.query.get("id", "")
        if not cid:
            raise UsageError("id: the custom_id to compare")
        panes = []
        for number, vf in enumerate(self.files):
            rows = vf.index.find(cid)
            pane: dict[str, Any] = {"file": number, "label": vf.label, "found": bool(rows)}
            if rows:
                pane.update(self._describe(vf.index.read(rows[-1]), rows[-1]))
            panes.append(pane)
        return _json({"custom_id": redact(cid), "panes": panes})

    async def _live(self, request: web.Request) -> web.Response:
        files = []
        for vf in self.files:
            index = vf.index
            facets = vf.searcher.facets()
            tokens = sum(v for v in index.completion if v == v)
            cost = sum(v for v in index.cost if v == v)
            per_endpoint = {
                index.endpoints.names[k]: v for k, v in _counts(index.endpoint).items() if k
            }
            files.append({**self._file_info(vf), "status": facets["status"],
                          "failures": facets["error"], "output_tokens": tokens,
                          "cost": cost if self.price is not None or cost else None,
                          "lines_per_s": round(vf.rate(), 3),
                          "per_endpoint": per_endpoint})  # fmt: skip
        run = None
        if self.live is not None:
            try:
                run = self.live()
            except Exception as exc:  # the run's own state: never take the page down
                run = {"problem": redact(str(exc))}
        return _json({"files": files, "run": run})

    async def _report(self, request: web.Request) -> web.Response:
        from jsonlbatch.report import build_report, render

        paths = [vf.path for vf in self.files]
        labels = [vf.label for vf in self.files]
        try:
            report = await asyncio.to_thread(build_report, paths, labels=labels, price=self.price)
            html = await asyncio.to_thread(render, report, "html")
        except JsonlbatchError as exc:
            html = f"<p>No report: {_escape(redact(str(exc)))}</p>"
        return web.Response(text=html, content_type="text/html",
                            headers={"Content-Security-Policy": _REPORT_CSP})  # fmt: skip


#: Shown for a calls file's later turn or ask: the calls file keeps answers, not prompts.
_LATER_TURN_PROMPT = (
    "Prompt not stored: a rollout's calls file keeps each call's answer, not what was sent. "
    "A later turn's prompt is the conversation up to it (the `messages` of its line in the "
    "conversations file, conv.jsonl); an ask's body is its tool's own."
)


def media_url(requests: int, row: int, message: int, part: int) -> str:
    """Where the page reads image `part` of message `message` of a request line."""
    return f"/api/media?req={requests}&row={row}&message={message}&part={part}"


def read_image(index: LineIndex, row: int, message: int, part: int) -> tuple[bytes, str]:
    """One image of request line `row`: that line read by its offset, that part decoded."""
    if index.flags[row] & OVERSIZED:
        raise UsageError(f"row: a line of {index.lengths[row]:,} bytes, too long to read back")
    try:
        body = orjson.loads(index.read(row)).get("body")
    except (orjson.JSONDecodeError, AttributeError):
        raise UsageError(f"row: line {row + 1} of the requests is not a request line") from None
    return image_bytes(media_at(body, message, part))


def _check_file(path: str) -> None:
    """Refuse what is no JSONL file: a directory, a FIFO (reading it blocks), a device
    (`/dev/zero` never ends). A file not there yet is followed once a run creates it."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if stat.S_ISDIR(mode):
        raise UsageError(f"{path}: a directory, not a JSONL file")
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
        raise UsageError(f"{path}: {kind}, not a regular file; view reads JSONL files")


def _holds_requests(path: str) -> bool:
    """Whether the file's first line is a request line (a user's mix-up of the two files):
    the first lines' first MiB is enough to tell, and all that is read."""
    fh = open_regular(path)
    if fh is None:
        return False
    with fh:
        head = fh.read(1 << 20)
    first = next((line for line in head.split(b"\n") if line.strip()), b"")
    try:
        obj = orjson.loads(first) if first else None
    except orjson.JSONDecodeError:
        return False
    return isinstance(obj, dict) and "body" in obj and "url" in obj and "response" not in obj


async def _no_icon(request: web.Request) -> web.Response:
    return web.Response(status=204)


def _counts(column: Any) -> dict[int, int]:
    return dict(Counter(column))


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _static_response(name: str) -> web.Response:
    body = resources.files("jsonlbatch.view").joinpath("static").joinpath(name).read_bytes()
    return web.Response(body=body, content_type=_STATIC[name],
                        headers={"Content-Security-Policy": _CSP, "Cache-Control": "no-cache"})  # fmt: skip


def _guard(viewer: Viewer) -> Any:
    """Middleware: GET only, a known Host, and a JSON error instead of a traceback."""

    @web.middleware
    async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            return _json({"error": "the viewer is read-only"}, status=405)
        allowed = viewer.allowed_hosts
        if allowed and request.host not in allowed:
            return _json({"error": f"unexpected Host {request.host[:80]!r}"}, status=421)
        try:
            response = await handler(request)
        except UsageError as exc:
            return _json({"error": redact(str(exc))}, status=400)
        except JsonlbatchError as exc:
            return _json({"error": redact(str(exc))}, status=500)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        return response

    return guard

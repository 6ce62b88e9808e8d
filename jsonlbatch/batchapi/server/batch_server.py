"""`serve --batch-api`: OpenAI's `/v1/files` and `/v1/batches` in front of any backend.

Every other path (`/v1/chat/completions`, `/v1/models`, `/health`, ...) is passed through to
the backend unchanged, streams included, so one URL serves both live and batch traffic. Batches
run in `batch_runner.BatchRunner`; objects live in `batch_store.Store`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import os
import signal
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from jsonlbatch.batch_format.records import KNOWN_URLS
from jsonlbatch.batchapi.formats.batch_objects import new_id, now, window_seconds
from jsonlbatch.batchapi.server.anthropic_routes import AnthropicBatches
from jsonlbatch.batchapi.server.batch_intake import new_batch, queued_requests
from jsonlbatch.batchapi.server.batch_runner import BatchRunner, RunnerOptions
from jsonlbatch.batchapi.server.batch_store import Store, StoreError
from jsonlbatch.batchapi.server.gemini_routes import GeminiBatches, is_gemini
from jsonlbatch.batchapi.server.json_api import ApiError, json_response
from jsonlbatch.errors import UsageError
from jsonlbatch.exec.route.endpoints import parse_endpoint
from jsonlbatch.redact import redact

_FILE_PURPOSES = ("batch", "batch_output", "assistants", "fine-tune", "vision", "user_data")
_HOP_HEADERS = frozenset(
    {
        "host",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "content-encoding",
        "upgrade",
    }
)
#: A client's credentials are for this front, never for the backend (which gets only
#: `--upstream-api-key`): an Anthropic-style key, a Google key or a session cookie sent here
#: must not reach a server someone else may run.
_CREDENTIALS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "api-key",
        "x-api-key",
        "x-goog-api-key",
        "cookie",
    }
)
_CHUNK = 1 << 20
log = logging.getLogger("jsonlbatch.batchapi")


@dataclass
class BatchServerOptions:
    """A batch front: where its state lives, where it listens, and the backend behind it."""

    directory: str
    runner: RunnerOptions
    host: str = "127.0.0.1"
    port: int = 0
    api_key: str | None = field(default=None, repr=False)  # clients must send it
    #: Seconds before an Anthropic or Gemini batch expires (None: theirs, 24 h and 48 h).
    expiry: float | None = None
    #: Requests that may wait in unfinished batches; a batch beyond is refused as the
    #: provider does (OpenAI: the batch fails with `token_limit_exceeded`; Anthropic and
    #: Gemini: HTTP 429). None: no limit.
    max_queued: int | None = None


_Error = ApiError
_json = json_response


class _Api:
    def __init__(self, options: BatchServerOptions, store: Store, runner: BatchRunner) -> None:
        self.options = options
        self.store = store
        self.runner = runner
        #: Gemini shares `/v1/batches` and `/v1/files/...` with OpenAI: its calls go there.
        self.gemini = GeminiBatches(
            store, runner, expiry=options.expiry, max_queued=options.max_queued
        )
        self.session: aiohttp.ClientSession | None = None
        self.upstreams = itertools.cycle([parse_endpoint(u) for u in options.runner.urls])

    # -- files ---------------------------------------------------------------------------------

    async def upload(self, request: web.Request) -> web.Response:
        if not request.content_type.startswith("multipart/"):
            raise _Error(400, "upload a file as multipart/form-data with 'file' and 'purpose'")
        reader = await request.multipart()
        purpose, filename, size, tmp = None, None, 0, None
        try:
            try:
                while (part := await reader.next()) is not None:
                    if not isinstance(part, aiohttp.BodyPartReader):
                        continue
                    if part.name == "purpose":
                        purpose = (await part.text()).strip()
                    elif part.name == "file":
                        filename = part.filename or "upload.jsonl"
                        fd, tmp = tempfile.mkstemp(dir=self.store.files_dir, suffix=".upload")
                        with os.fdopen(fd, "wb") as f:
                            while chunk := await part.read_chunk(_CHUNK):
                                f.write(chunk)
                                size += len(chunk)
                            f.flush()
                            os.fsync(f.fileno())
            # aiohttp's multipart parser; in 3.10 and 3.11 a body that ends early fails one of its
            # asserts ("Reading after EOF"), in newer ones it is a ValueError.
            except (ValueError, RuntimeError, LookupError, AssertionError) as exc:
                raise _Error(400, f"the multipart body is malformed: {str(exc)[:200]}") from None
            if tmp is None:
                raise _Error(400, "missing the 'file' part", "file")
            if purpose not in _FILE_PURPOSES:
                raise _Error(
                    400, f"'purpose' must be one of {', '.join(_FILE_PURPOSES)}", "purpose"
                )
            obj: dict[str, Any] = {
                "id": new_id("file-"),
                "object": "file",
                "bytes": size,
                "created_at": now(),
                "filename": os.path.basename(filename or "upload.jsonl"),
                "purpose": purpose,
                "status": "processed",
                "expires_at": None,
                "status_details": None,
            }
            final = self.store.file_path(obj["id"])
            os.replace(tmp, final)
            tmp = None
            try:
                self.store.put_file(obj)
            except BaseException:  # no bytes without a row: the client uploads again
                final.unlink(missing_ok=True)
                raise
        finally:
            if tmp is not None:
                os.unlink(tmp)
        return _json(obj)

    async def list_files(self, request: web.Request) -> web.Response:
        limit = _limit(request, default=10000, most=10000)
        order = request.query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise _Error(400, "'order' must be asc or desc", "order")
        data, more = self.store.list_files(
            purpose=request.query.get("purpose"),
            after=request.query.get("after"),
            limit=limit,
            ascending=order == "asc",
        )
        return _json(_page(data, more))

    def _file(self, request: web.Request) -> dict[str, Any]:
        return _found(self.store.get_file, "File", request.match_info["file_id"])

    async def get_file(self, request: web.Request) -> web.StreamResponse:
        if ":" in request.match_info["file_id"] or is_gemini(request):
            return await self.gemini.file(request)
        return _json(self._file(request))

    async def file_content(self, request: web.Request) -> web.StreamResponse:
        obj = self._file(request)
        return web.FileResponse(
            self.store.file_path(obj["id"]), headers={"Content-Type": "application/octet-stream"}
        )

    async def delete_file(self, request: web.Request) -> web.Response:
        obj = self._file(request)
        self.store.delete_file(obj["id"])
        if not self.store.file_in_use(obj["id"]):  # else the runner removes it when done
            with contextlib.suppress(FileNotFoundError):
                self.store.file_path(obj["id"]).unlink()
        return _json({"id": obj["id"], "object": "file", "deleted": True})

    # -- batches -------------------------------------------------------------------------------

    async def create_batch(self, request: web.Request) -> web.Response:
        try:
            body = await request.json(loads=orjson.loads)
        except ValueError:
            raise _Error(400, "the body must be a JSON object") from None
        if not isinstance(body, dict):
            raise _Error(400, "the body must be a JSON object")
        file_id = body.get("input_file_id")
        source = self.store.get_file(file_id) if isinstance(file_id, str) else None
        if source is None or not isinstance(file_id, str):
            raise _Error(400, f"input_file_id {file_id!r} is not a file here", "input_file_id")
        if source["purpose"] != "batch":
            raise _Error(
                400, "the input file must have been uploaded with purpose 'batch'", "input_file_id"
            )
        endpoint = body.get("endpoint")
        if not isinstance(endpoint, str) or endpoint not in KNOWN_URLS:
            raise _Error(
                400, f"endpoint must be one of {', '.join(sorted(KNOWN_URLS))}", "endpoint"
            )
        window = body.get("completion_window", "24h")
        try:
            seconds = window_seconds(window)
        except UsageError as exc:
            raise _Error(400, f"completion_window: {exc}", "completion_window") from None
        metadata = body.get("metadata")
        if metadata is not None and not (
            isinstance(metadata, dict)
            and len(metadata) <= 16
            and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
        ):
            raise _Error(400, "metadata must map at most 16 strings to strings", "metadata")
        queued = self._over_queue_limit(file_id)
        batch = new_batch(
            self.store,
            self.runner,
            input_file_id=file_id,
            endpoint=endpoint,
            window=window,
            seconds=seconds,
            metadata=metadata,
        )
        if queued is not None:  # as OpenAI does: the batch is made, and fails at once
            message = (
                f"Enqueued token limit reached: {queued} requests are already queued and the "
                f"limit is {self.options.max_queued}. Try again once earlier batches complete."
            )
            error = {
                "code": "token_limit_exceeded",
                "message": message,
                "param": None,
                "line": None,
            }
            batch.update(
                status="failed", failed_at=now(), errors={"object": "list", "data": [error]}
            )
            self.store.put_batch(batch)
        return _json(batch)

    def _over_queue_limit(self, file_id: str) -> int | None:
        """The requests already queued, when this file's would pass `max_queued`."""
        limit = self.options.max_queued
        if limit is None:
            return None
        with open(self.store.file_path(file_id), "rb") as f:
            lines = sum(1 for line in f if line.strip())
        queued = queued_requests(self.store)
        return queued if queued + lines > limit else None

    def _batch(self, request: web.Request) -> dict[str, Any]:
        return _found(self.store.get_batch, "Batch", request.match_info["batch_id"])

    async def get_batch(self, request: web.Request) -> web.Response:
        found = self.store.get_batch(request.match_info["batch_id"])
        if is_gemini(request) or (found is not None and found.get("provider") == "gemini"):
            return await self.gemini.retrieve(request)
        return _json(self._batch(request))

    async def list_batches(self, request: web.Request) -> web.Response:
        if is_gemini(request):
            return await self.gemini.list(request)
        data, more = self.store.list_batches(
            after=request.query.get("after"), limit=_limit(request, default=20, most=100)
        )
        return _json(_page(data, more))

    async def cancel_batch(self, request: web.Request) -> web.Response:
        batch = self._batch(request)
        if batch["status"] in ("validating", "in_progress"):
            batch.update(status="cancelling", cancelling_at=now())
            self.store.put_batch(batch)
            self.runner.wake.set()
        elif batch["status"] not in ("cancelling", "cancelled"):
            raise _Error(409, f"Cannot cancel a batch with status '{batch['status']}'.")
        return _json(batch)

    # -- everything else goes to the backend ---------------------------------------------------

    async def proxy(self, request: web.Request) -> web.StreamResponse:
        endpoint = next(self.upstreams)
        target = endpoint.root_url(request.path)
        if request.query_string:
            target += "?" + request.query_string
        dropped = _HOP_HEADERS | _CREDENTIALS
        headers = {k: v for k, v in request.headers.items() if k.lower() not in dropped}
        if self.options.runner.api_key:
            headers["Authorization"] = f"Bearer {self.options.runner.api_key}"
        assert self.session is not None
        try:
            async with self.session.request(
                request.method,
                target,
                headers=headers,
                data=request.content if request.body_exists else None,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
            ) as upstream:
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for key, value in upstream.headers.items():
                    if key.lower() not in _HOP_HEADERS:
                        response.headers[key] = value
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as exc:
            raise _Error(502, f"the backend did not answer: {exc.__class__.__name__}") from None


def _found(get: Callable[[str], dict[str, Any] | None], kind: str, key: str) -> dict[str, Any]:
    obj = get(key)
    if obj is None:
        raise _Error(404, f"No such {kind} object: {key}", "id")
    return obj


def _limit(request: web.Request, *, default: int, most: int) -> int:
    raw = request.query.get("limit")
    try:
        value = int(raw) if raw is not None else default
    except ValueError:
        raise _Error(400, "'limit' must be an integer", "limit") from None
    if not 1 <= value <= most:
        raise _Error(400, f"'limit' must be between 1 and {most}", "limit")
    return value


def _page(data: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }


_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Paths that need the front's key when it has one (every API it serves, not `/health`).
_GUARDED = ("/v1/", "/v1beta/", "/upload/", "/download/")


def _given_key(request: web.Request) -> str:
    """The key a client sent, however its SDK sends it: OpenAI's and Anthropic's current
    `Authorization: Bearer`, Azure's `api-key`, Anthropic's older `x-api-key`, Gemini's
    `x-goog-api-key` (or `?key=`)."""
    headers = request.headers
    bearer = headers.get("Authorization", "")
    if bearer.startswith("Bearer "):
        return bearer.removeprefix("Bearer ").strip()
    for name in ("api-key", "x-api-key", "x-goog-api-key"):
        if headers.get(name):
            return headers[name]
    return request.query.get("key", "")


def create_app(options: BatchServerOptions) -> web.Application:
    """The batch front as an aiohttp application (its runner starts with the app)."""
    store = Store(options.directory)
    runner = BatchRunner(store, options.runner)
    api = _Api(options, store, runner)
    key = options.api_key.encode() if options.api_key else None

    @web.middleware
    async def guard(request: web.Request, handler: _Handler) -> web.StreamResponse:
        # An upload URL's chunks come without the key, as Google's do: the random upload_id,
        # handed out by a keyed `start`, is what lets them in.
        chunk = request.path.startswith("/upload/") and "upload_id" in request.query
        guarded = key is not None and request.path.startswith(_GUARDED) and not chunk
        if guarded and not hmac.compare_digest(_given_key(request).encode(), key or b""):
            return _json({"error": "Unauthorized"}, 401)
        try:
            return await handler(request)
        except ApiError as exc:
            return exc.response()
        except StoreError as exc:  # locked past the busy timeout: a passing failure
            log.error("%s %s: %s", request.method, request.path, exc)
            error = {"message": str(exc), "type": "server_error", "param": None, "code": None}
            return web.Response(
                body=orjson.dumps({"error": error}),
                status=503,
                content_type="application/json",
                headers={"Retry-After": "5"},
            )
        except (web.HTTPException, asyncio.CancelledError):
            raise
        except Exception as exc:  # a bug of ours: one log line, a JSON 500, no traceback out
            log.error("%s %s: %s: %s", request.method, request.path, type(exc).__name__, exc)
            error = {"message": "internal error", "type": "server_error", "param": None}
            return _json({"error": {**error, "code": None}}, 500)

    app = web.Application(middlewares=[guard], client_max_size=1 << 30)
    add = app.router
    add.add_post("/v1/files", api.upload)
    add.add_get("/v1/files", api.list_files)
    add.add_get("/v1/files/{file_id}", api.get_file)
    add.add_delete("/v1/files/{file_id}", api.delete_file)
    add.add_get("/v1/files/{file_id}/content", api.file_content)
    add.add_post("/v1/batches", api.create_batch)
    add.add_get("/v1/batches", api.list_batches)
    add.add_get("/v1/batches/{batch_id}", api.get_batch)
    add.add_post("/v1/batches/{batch_id}/cancel", api.cancel_batch)
    AnthropicBatches(
        store,
        runner,
        expiry=options.expiry,
        max_queued=options.max_queued,
    ).add_routes(app)
    api.gemini.add_routes(app)
    add.add_route("*", "/{tail:.*}", api.proxy)

    async def lifecycle(app: web.Application) -> Any:
        api.session = aiohttp.ClientSession(trust_env=False, auto_decompress=False)
        task = asyncio.ensure_future(runner.run_forever())
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.session.close()
        store.close()

    app.cleanup_ctx.append(lifecycle)
    return app


class _OneLineBadRequests(logging.Filter):
    """aiohttp logs a request it cannot parse (a 9 KB URL, a broken header) with a traceback:
    a client's mistake is one masked line in the server's log, and the client gets its 400."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg, record.args = "bad request from a client: %s", (redact(str(exc), 200),)
            record.exc_info = record.exc_text = None
        return True


async def serve_batch_api(
    options: BatchServerOptions,
    *,
    on_ready: Callable[[str], None],
    check: Callable[[], None] | None = None,
) -> None:
    """Run the front until SIGINT/SIGTERM; `check` is called every second (a launcher's
    watchdog, which raises when its backend died for good)."""
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _OneLineBadRequests) for f in server_log.filters):
        server_log.addFilter(_OneLineBadRequests())
    runner = web.AppRunner(create_app(options), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, options.host, options.port)
        try:
            await site.start()
        except OSError as exc:
            raise UsageError(
                f"cannot listen on {options.host}:{options.port}: {exc.strerror or exc}"
            ) from None
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        host = f"[{options.host}]" if ":" in options.host else options.host
        on_ready(f"http://{host}:{port}/v1")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            while not stop.is_set():
                if check is not None:
                    check()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=1.0)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
    finally:
        await runner.cleanup()

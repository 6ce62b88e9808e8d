"""In-process pieces for unit tests of the send path: a scripted server and a bare `Sender`.

`ScriptedServer` is the fake transport's other end: a real aiohttp server on 127.0.0.1 running
in the test's own event loop (no thread, no subprocess), answering each POST with the next
`Reply` of its script. A unit test of `Sender`, `EndpointPool` or `admit` then sees real HTTP
(statuses, headers, cut connections) at the cost of a coroutine, and can say exactly which
answer comes when, which the mock's random fault rates cannot.

`sender(...)` builds a `Sender` the way a run does (`build_pools`, a `Meter`, an `EventBus`),
without the input scan, the output file or the workers: what `send` returns is what a worker
would hand to the recorder.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from jsonlbatch.batch_format.records import Request
from jsonlbatch.exec.exec_options import ExecOptions
from jsonlbatch.exec.hooks.check_hook import AnswerCheck, as_check
from jsonlbatch.exec.output.events import EventBus, RateLimited, Retried, Sent
from jsonlbatch.exec.output.run_summary import RunSummary
from jsonlbatch.exec.route.model_pools import PoolSpec, build_pools, parse_endpoints
from jsonlbatch.exec.send.budget import Meter
from jsonlbatch.exec.send.pacing import Pacing
from jsonlbatch.exec.send.sender import Sender

CHAT_URL = "/v1/chat/completions"


def chat_answer(content: str = "hi", *, ident: str = "chatcmpl-1", **usage: int) -> dict:
    """An OpenAI chat completion body, usage as given (prompt_tokens=..., completion_tokens=...)."""
    return {
        "id": ident,
        "object": "chat.completion",
        "model": "mock",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": usage or {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


def request(custom_id: str = "r1", content: str = "question", **body: Any) -> Request:
    """A chat request as the input scan would hand it over."""
    full = {"model": "mock", "messages": [{"role": "user", "content": content}], **body}
    return Request(custom_id, CHAT_URL, full, line=1, fingerprint="f" * 16)


@dataclass
class Reply:
    """One scripted answer to a POST. `body`: a dict is sent as JSON, bytes as they are, None
    means a chat answer; `drop` closes the connection without any answer."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drop: bool = False


class ScriptedServer:
    """An OpenAI-shaped server in the running loop: POSTs are answered from `replies` in order
    (a chat answer once they run out), `GET /v1/models` lists `models` (None: a 404) with
    `models_status`, `GET /v1/models/NAME` finds the `named` ones, and `GET /health` answers
    the statuses of `health` in turn (200 once they run out). `port` 0: a free one."""

    def __init__(
        self,
        *replies: Reply,
        models: Sequence[str] | None = ("mock",),
        health: Sequence[int] = (),
        models_status: int = 200,
        named: Sequence[str] = (),
        port: int = 0,
    ) -> None:
        self.replies: deque[Reply] = deque(replies)
        self.models = models
        self.models_status = models_status
        self.named = tuple(named)  # served when asked by name, left out of the listing
        self.health: deque[int] = deque(health)
        self.posts: list[dict[str, Any]] = []  # bodies received, in order
        self.gets: list[str] = []  # paths of the GETs received, in order
        self._runner: web.AppRunner | None = None
        self.port = port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def add(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    async def start(self) -> ScriptedServer:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{name:.+}", self._model)
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/{path:.+}", self._post)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ScriptedServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _models(self, request: web.Request) -> web.StreamResponse:
        self.gets.append(request.path)
        if self.models is None:
            return web.json_response({"error": "no such route"}, status=404)
        listing = {"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]}
        return web.json_response(listing, status=self.models_status)

    async def _model(self, request: web.Request) -> web.StreamResponse:
        self.gets.append(request.path)
        name = request.match_info["name"]
        if name in self.named:
            return web.json_response({"id": name, "object": "model"})
        return web.json_response({"error": "not found"}, status=404)

    async def _health(self, request: web.Request) -> web.StreamResponse:
        self.gets.append(request.path)
        status = self.health.popleft() if self.health else 200
        return web.Response(status=status)

    async def _post(self, request: web.Request) -> web.StreamResponse:
        self.posts.append(orjson.loads(await request.read()))
        reply = self.replies.popleft() if self.replies else Reply()
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.drop:
            assert request.transport is not None
            request.transport.close()
            return web.Response()  # never reaches the client: its connection is gone
        body = reply.body if reply.body is not None else chat_answer()
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        return web.Response(
            body=raw, status=reply.status, content_type="application/json", headers=reply.headers
        )


@dataclass
class Sending:
    """A `Sender` and what it reports to: its summary and every event it emitted, in order."""

    sender: Sender
    summary: RunSummary
    events: list[Any]
    stopping: asyncio.Event

    async def send(self, req: Request) -> Any:
        return await self.sender.send(req)


@contextlib.asynccontextmanager
async def sender(
    urls: Sequence[str],
    *,
    check: AnswerCheck | None = None,
    watchdog: Callable[[], None] | None = None,
    **options: Any,
) -> AsyncIterator[Sending]:
    """A `Sender` over `urls` as a run builds it (one catch-all pool, fixed concurrency), with
    quick backoffs unless `options` say otherwise; its pools are closed on the way out."""
    options.setdefault("backoff_base", 0.01)
    options.setdefault("backoff_cap", 0.05)
    options.setdefault("ready_timeout", 5.0)
    options.setdefault("concurrency", 4)
    opts = ExecOptions(urls=tuple(urls), quiet=True, **options)
    specs = [PoolSpec()]
    by_url = parse_endpoints(specs, opts.urls, {})
    summary = RunSummary(output="out.jsonl")
    bus = EventBus()
    events: list[Any] = []
    bus.subscribe(events.append, Sent, Retried, RateLimited)
    stopping = asyncio.Event()
    async with aiohttp.ClientSession(trust_env=False) as session:
        pools = build_pools(session, specs=specs, urls=opts.urls, by_url=by_url, keys={},
                            opts=opts, controller=None, watchdog=watchdog)  # fmt: skip
        meter = Meter(Pacing.of(opts))
        made = Sender(
            opts=opts, session=session, pools=pools, meter=meter, stopping=stopping,
            summary=summary, bus=bus, check=as_check(check) if check is not None else None,
        )  # fmt: skip
        sending = Sending(sender=made, summary=summary, events=events, stopping=stopping)
        try:
            yield sending
        finally:
            await pools.close()

"""HTTP handlers of the mock OpenAI-compatible server.

Shapes, status codes and error bodies follow what vLLM sends today, so a client proven against
the mock behaves the same against a real server. Handlers stay lean (orjson, precomputed bytes,
no access log): an instant mock must never be the bottleneck of a client benchmark. Its
settings and counters are `mock_config.py`'s; what it refuses in a request body, and the error
bodies it refuses with, `request_checks.py`'s.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import orjson
from aiohttp import web

from jsonlbatch.mock import containers, content, hermes_calls, hosted
from jsonlbatch.mock.gpu import GpuEngine
from jsonlbatch.mock.limits import MockLimits, add_headers
from jsonlbatch.mock.mock_config import MockConfig, MockStats
from jsonlbatch.mock.request_checks import (
    CONTEXT_MSG,
    ERROR_TYPES,
    Refusal,
    check_chat,
    check_completion,
    check_embedding,
    error_body,
)

#: Where the mock server (`python -m jsonlbatch.mock`) reads its API key.
MOCK_API_KEY_ENV = "JSONLBATCH_MOCK_API_KEY"

_UNAUTHORIZED = orjson.dumps({"error": "Unauthorized"})
_DROP, _HANG, _LIMIT, _FAIL = "drop", "hang", 429, 500
_MAX_BODY = 256 << 20  # long prompts are legitimate; vLLM sets no cap either


_INJECTED_500 = error_body(
    500, "Internal server error (injected by jsonlbatch mock)", "InternalServerError"
)
_INJECTED_429 = error_body(
    429, "Rate limit exceeded (injected by jsonlbatch mock)", "RateLimitError"
)
_WARMING = error_body(503, "The server is warming up", "ServiceUnavailableError")
_STREAM_ERROR = b"data: " + orjson.dumps(
    {"error": {"message": "Stream interrupted (injected by jsonlbatch mock)",
               "type": "InternalServerError", "param": None, "code": 500}}
) + b"\n\n"  # fmt: skip


class _Mock:
    """The state behind one app: config, seeded generators, readiness and counters."""

    def __init__(self, config: MockConfig) -> None:
        self.config = config
        self.stats = MockStats()
        self.faults = random.Random(config.seed)
        self.jitter = random.Random(f"{config.seed}-jitter")
        self.has_faults = (
            config.fail_rate + config.rate_limit_rate + config.drop_rate + config.hang_rate > 0
        )
        self.stats.bodies = deque(maxlen=config.record_bodies)
        self.files = containers.FileStore(config.container_ttl)
        self.key = config.api_key.encode() if config.api_key else None
        self.served = frozenset(config.served_models)
        self.step_delay = 1.0 / config.tokens_per_second if config.tokens_per_second else 0.0
        self.gpu = GpuEngine(config.gpu, config.served_models[0]) if config.gpu else None
        self.limits = None
        if config.rpm or config.tpm:
            self.limits = MockLimits(config.rpm, config.tpm, burst=config.rate_limit_burst,
                                     style=config.rate_limit_headers,
                                     default_max_tokens=config.default_max_tokens)  # fmt: skip
        self.ready_at = float("inf")  # set when the app starts
        created = int(time.time())
        cards = [
            {"id": name, "object": "model", "created": created, "owned_by": "jsonlbatch-mock",
             "root": name, "max_model_len": config.max_model_len}
            for name in config.served_models
        ]  # fmt: skip
        self.models = orjson.dumps({"object": "list", "data": cards})
        self.version = orjson.dumps({"version": _version()})

    async def on_startup(self, app: web.Application) -> None:
        self.ready_at = time.monotonic() + self.config.warmup

    def respond(
        self, body: bytes, status: int = 200, headers: dict[str, str] | None = None
    ) -> web.Response:
        self.stats.responses[status] += 1
        return web.Response(
            body=body, status=status, headers=headers, content_type="application/json"
        )

    def warming(self) -> bool:
        return self.ready_at > time.monotonic()

    def authorized(self, request: web.Request) -> bool:
        if self.key is None:
            return True
        given = request.headers.get("Authorization", "")
        given = given[7:].strip() if given[:7].lower() == "bearer " else ""
        given = given or request.headers.get("api-key", "") or request.headers.get("x-api-key", "")
        return hmac.compare_digest(given.encode(), self.key)

    def delay(self) -> float:
        jitter = self.config.latency_jitter
        extra = self.jitter.uniform(-jitter, jitter) if jitter else 0.0
        return max(0.0, self.config.latency + extra)

    def draw_fault(self) -> str | int | None:
        if not self.has_faults:
            return None
        c, r = self.config, self.faults.random()
        for fault, rate in ((_DROP, c.drop_rate), (_LIMIT, c.rate_limit_rate),
                            (_FAIL, c.fail_rate), (_HANG, c.hang_rate)):  # fmt: skip
            if r < rate:
                return fault
            r -= rate
        return None

    def model_of(self, body: dict[str, Any]) -> str:
        model = body.get("model")
        if model is None:
            return self.config.served_models[0]
        if not isinstance(model, str) or not model:
            raise Refusal("model must be a non-empty string", param="model")
        if model not in self.served and not self.config.accept_any_model:
            raise Refusal(f"The model `{model}` does not exist.", 404, "model")
        return model

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        """Input tokens, refused as vLLM does when they cannot fit the context."""
        prompt = content.prompt_tokens(body)
        limit, budget = self.config.max_model_len, content.token_budget(body)
        if limit is None:
            return prompt
        if budget is None and prompt >= limit:
            raise Refusal(
                CONTEXT_MSG.format(limit=limit) + f"your request has {prompt} input tokens. "
                "Please reduce the length of the input messages."
            )
        if budget is not None and prompt + budget > limit:
            raise Refusal(
                CONTEXT_MSG.format(limit=limit) + f"you requested {prompt + budget} tokens "
                f"({prompt} in the messages, {budget} in the completion). "
                "Please reduce the length of the messages or completion."
            )
        return prompt

    # -- generation endpoints -----------------------------------------------------------------

    async def handle(self, request: web.Request, check: Callable[[dict[str, Any]], None],
                     answer: _Answer) -> web.StreamResponse:  # fmt: skip
        """What every generation endpoint shares: auth, readiness, validation, faults."""
        self.stats.requests[request.path] += 1
        if not self.authorized(request):
            return self.respond(_UNAUTHORIZED, 401)
        if self.warming():
            return self.respond(_WARMING, 503)
        try:
            try:
                body = orjson.loads(await request.read())
            except orjson.JSONDecodeError as exc:
                raise Refusal(f"JSON decode error: {exc}") from None
            if not isinstance(body, dict):
                raise Refusal("The request body must be a JSON object")
            check(body)
            model = self.model_of(body)
            prompt = self.prompt_tokens(body)
        except Refusal as exc:
            kind = ERROR_TYPES.get(exc.status, "BadRequestError")
            return self.respond(error_body(exc.status, str(exc), kind, exc.param), exc.status)
        if self.config.record_bodies:
            self.stats.bodies.append(body)
        refused = self.limits and self.limits.admit(request, body, prompt)
        if refused:
            return self.respond(refused[0], 429, refused[1])
        fault = self.draw_fault()
        if fault == _DROP:
            self.stats.dropped += 1
            if request.transport is not None:
                request.transport.abort()
            return web.Response()  # never sent: the connection is gone
        if fault == _HANG:  # a stuck request: nothing comes back until the client gives up
            self.stats.hung += 1
            while request.transport is not None and not request.transport.is_closing():
                await asyncio.sleep(0.2)
            return web.Response()  # never sent: the client has gone
        if fault == _LIMIT:
            after = self.config.retry_after
            return self.respond(
                _INJECTED_429, 429, None if after is None else {"Retry-After": f"{after:g}"}
            )
        if fault == _FAIL:
            return self.respond(_INJECTED_500, 500)
        return await answer(request, body, model, prompt)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self.handle(request, check_chat, self.answer_chat)

    def hosted_route(self, check: Callable[..., None], answer: Callable[..., Any]) -> Any:
        """A handler for one of `hosted.ROUTES` (Responses, Messages, Moderations)."""

        async def route(request: web.Request) -> web.StreamResponse:
            return await self.handle(
                request, lambda body: check(body, Refusal), lambda *args: answer(self, *args)
            )

        return route

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.handle(request, check_completion, self.answer_completion)

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self.handle(request, check_embedding, self.answer_embedding)

    async def answer_chat(
        self, request: web.Request, body: dict[str, Any], model: str, prompt: int
    ) -> web.StreamResponse:
        count, reasoning = body.get("n") or 1, self.config.reasoning
        return await self.answer_text(request, body, model, prompt, _CHAT, count, reasoning)

    async def answer_completion(
        self, request: web.Request, body: dict[str, Any], model: str, prompt: int
    ) -> web.StreamResponse:
        count = (body.get("n") or 1) * len(content.prompt_items(body["prompt"]))
        return await self.answer_text(request, body, model, prompt, _TEXT, count, False)

    async def answer_text(self, request: web.Request, body: dict[str, Any], model: str,
                          prompt: int, kind: _Kind, count: int,
                          reasoning: bool) -> web.StreamResponse:  # fmt: skip
        """A chat or completions answer of `count` choices, whole or streamed."""
        limit = self.config.default_max_tokens
        replies = [
            content.compose(
                body,
                i,
                default_max_tokens=limit,
                reasoning=reasoning,
                break_json=self.config.break_json,
                tool_rate=self.config.tool_rate,
            )
            for i in range(count)
        ]
        if self.config.tool_call_format == "hermes":
            replies = [hermes_calls.as_text(r) for r in replies]
        if body.get("stream"):
            events = [kind.events(r) for r in replies]
            return await self.stream(request, body, model, kind, replies, events, prompt)
        choices = [
            {"index": i, **kind.choice(r, reasoning), "logprobs": None,
             "finish_reason": r.finish_reason}
            for i, r in enumerate(replies)
        ]  # fmt: skip
        return await self.complete(request, kind, model, choices, replies, prompt, body)

    async def answer_embedding(
        self, request: web.Request, body: dict[str, Any], model: str, prompt: int
    ) -> web.StreamResponse:
        dims = body.get("dimensions") or content.EMBEDDING_DIM
        b64 = body.get("encoding_format") == "base64"
        data = []
        for i, item in enumerate(content.prompt_items(body["input"])):
            vector = content.embedding(model, item, dims)
            encoded = content.embedding_base64(vector) if b64 else vector
            data.append({"object": "embedding", "index": i, "embedding": encoded})
        wait = self.delay()
        if wait:
            await asyncio.sleep(wait)
        payload = {"id": "embd-" + os.urandom(16).hex(), "object": "list",
                   "created": int(time.time()), "model": model, "data": data,
                   "usage": {"prompt_tokens": prompt, "total_tokens": prompt}}  # fmt: skip
        return self.respond(orjson.dumps(payload))

    async def complete(self, request: web.Request, kind: _Kind, model: str,
                       choices: list[dict[str, Any]], replies: list[content.Reply],
                       prompt: int, body: dict[str, Any]) -> web.StreamResponse:  # fmt: skip
        """A whole answer, after the latency and the time its tokens take to generate."""
        steps = max(r.completion_tokens for r in replies)
        wait = self.delay() + steps * self.step_delay
        if wait:
            await asyncio.sleep(wait)
        if self.gpu is not None:
            await (await self.gpu.generate(body, steps, replies[0].finish_reason)).done
        rid = os.urandom(16).hex()
        usage = content.usage(prompt, replies)
        payload = {"id": kind.prefix + rid, "object": kind.object, "created": int(time.time()),
                   "model": model, "choices": choices, "usage": usage}  # fmt: skip
        headers = {"x-request-id": request.headers.get("X-Request-Id") or rid}
        return self.respond(orjson.dumps(payload), 200, headers)

    async def stream(self, request: web.Request, body: dict[str, Any], model: str, kind: _Kind,
                     replies: list[content.Reply], events: list[list[dict[str, Any]]],
                     prompt: int) -> web.StreamResponse:  # fmt: skip
        """An SSE answer: headers and a ping at once, then, after the latency, one token per
        choice per step; an injected stream error replaces the second half."""
        rid = os.urandom(16).hex()
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                   "x-request-id": request.headers.get("X-Request-Id") or rid}  # fmt: skip
        resp = web.StreamResponse(headers=headers)
        self.stats.responses[200] += 1
        await resp.prepare(request)
        await resp.write(b": ping\n\n")
        head = b'data: {"id":"%s%s","object":"%s","created":%d,"model":%s,"choices":' % (
            kind.prefix.encode(), rid.encode(), kind.chunk.encode(), int(time.time()),
            orjson.dumps(model),
        )  # fmt: skip
        steps = content.sse_steps(head, events)
        rate = self.config.stream_error_rate
        if rate and self.faults.random() < rate:
            self.stats.stream_errors += 1
            steps = [*steps[: max(1, len(steps) // 2)], _STREAM_ERROR]
        elif (body.get("stream_options") or {}).get("include_usage"):
            usage = orjson.dumps(content.usage(prompt, replies))
            steps.append(head + b'[],"usage":' + usage + b"}\n\n")
        steps.append(b"data: [DONE]\n\n")
        try:
            first = self.delay()
            if first:
                await asyncio.sleep(first)
            if self.gpu is not None:  # the first token once prefilled, the rest when done
                tokens = max(r.completion_tokens for r in replies)
                seq = await self.gpu.generate(body, tokens, replies[0].finish_reason)
                await seq.first
                await resp.write(steps[0])
                await seq.done
                await resp.write(b"".join(steps[1:]))
            elif not self.step_delay:
                await resp.write(b"".join(steps))
            else:
                for i, step in enumerate(steps):
                    if i:
                        await asyncio.sleep(self.step_delay)
                    await resp.write(step)
            await resp.write_eof()
        except ConnectionResetError:  # the client went away mid-stream: nothing to do
            pass
        return resp

    # -- the other endpoints ------------------------------------------------------------------

    async def models_list(self, request: web.Request) -> web.StreamResponse:
        self.stats.requests[request.path] += 1
        if not self.authorized(request):
            return self.respond(_UNAUTHORIZED, 401)
        return self.respond(self.models)

    async def model_card(self, request: web.Request) -> web.StreamResponse:
        """`GET /v1/models/{id}` (OpenAI's "retrieve model"): how a client learns that a mock
        started with `accept_any_model` serves a name its listing does not show."""
        self.stats.requests["/v1/models/{id}"] += 1
        if not self.authorized(request):
            return self.respond(_UNAUTHORIZED, 401)
        name = request.match_info["model"]
        if name not in self.served and not self.config.accept_any_model:
            missing = f"The model `{name}` does not exist."
            return self.respond(error_body(404, missing, "NotFoundError", "model"), 404)
        card = {"id": name, "object": "model", "owned_by": "jsonlbatch-mock", "root": name}
        return self.respond(orjson.dumps(card))

    async def health(self, request: web.Request) -> web.StreamResponse:
        self.stats.requests[request.path] += 1
        status = 503 if self.warming() else 200
        self.stats.responses[status] += 1
        return web.Response(status=status)

    async def version_info(self, request: web.Request) -> web.StreamResponse:
        return self.respond(self.version)

    async def stats_info(self, request: web.Request) -> web.StreamResponse:
        body = orjson.dumps(self.stats.as_dict())
        return web.Response(body=body, content_type="application/json")

    async def bodies_info(self, request: web.Request) -> web.StreamResponse:
        body = orjson.dumps(list(self.stats.bodies))
        return web.Response(body=body, content_type="application/json")


_Answer = Callable[[web.Request, dict[str, Any], str, int], Awaitable[web.StreamResponse]]
MOCK_KEY = web.AppKey("jsonlbatch_mock", _Mock)


def create_app(config: MockConfig) -> web.Application:
    """The mock as an aiohttp application, to run with any aiohttp runner or test client."""
    mock = _Mock(config)
    app = web.Application(client_max_size=_MAX_BODY)
    app[MOCK_KEY] = mock
    app.on_startup.append(mock.on_startup)
    if mock.limits is not None:
        app.on_response_prepare.append(add_headers)
    add = app.router
    add.add_post("/v1/chat/completions", mock.chat)
    add.add_post("/v1/completions", mock.completions)
    add.add_post("/v1/embeddings", mock.embeddings)
    for path, check, answer in hosted.ROUTES:
        add.add_post(path, mock.hosted_route(check, answer))
    for path in ("/openai/responses", "/openai/v1/responses"):  # Azure OpenAI's paths
        add.add_post(path, mock.hosted_route(hosted.check_responses, hosted.answer_responses))
    containers.add_routes(app, mock)
    add.add_get("/v1/models", mock.models_list)
    add.add_get("/v1/models/{model:.+}", mock.model_card)
    add.add_get("/health", mock.health)
    add.add_get("/ping", mock.health)
    add.add_get("/version", mock.version_info)
    add.add_get("/mock/stats", mock.stats_info)
    add.add_get("/mock/bodies", mock.bodies_info)
    if mock.gpu is not None:
        add.add_get("/metrics", mock.gpu.metrics)
        app.on_cleanup.append(mock.gpu.close)
    return app


def stats_of(app: web.Application) -> MockStats:
    """The live counters of an app made by `create_app`."""
    return app[MOCK_KEY].stats


@dataclass(frozen=True, slots=True)
class _Kind:
    """What differs between chat and text completions answers."""

    prefix: str  # of the response id
    object: str
    chunk: str  # object of streamed chunks
    choice: Callable[[content.Reply, bool], dict[str, Any]]  # a whole choice's payload
    events: Callable[[content.Reply], list[dict[str, Any]]]  # a streamed choice


_CHAT = _Kind(
    "chatcmpl-", "chat.completion", "chat.completion.chunk",
    lambda reply, reasoning: {"message": content.chat_message(reply, reasoning)},
    content.chat_events,
)  # fmt: skip
_TEXT = _Kind(
    "cmpl-", "text_completion", "text_completion",
    lambda reply, reasoning: {"text": "".join(reply.content)},
    content.text_events,
)  # fmt: skip


def _version() -> str:
    try:
        return metadata.version("jsonlbatch")
    except metadata.PackageNotFoundError:  # running from a bare source tree
        return "0+unknown"

"""What every API served by `serve --batch-api` shares: its error and its JSON answer.

The OpenAI routes answer errors in OpenAI's shape; the Anthropic and Gemini routes raise
`ApiError` with a `body` in their provider's shape, so each SDK reads the error it expects.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web


class ApiError(Exception):
    """An answer other than 2xx: `body` when the provider has its own error shape, else
    OpenAI's `{"error": {"message", "type", "param", "code"}}` is built from the rest."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        *,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.body, self.headers = body, headers

    def response(self) -> web.Response:
        body = self.body or {
            "error": {
                "message": self.message,
                "type": "invalid_request_error",
                "param": self.param,
                "code": None,
            }
        }
        return json_response(body, self.status, headers=self.headers)


def json_response(
    obj: Any, status: int = 200, *, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(obj), status=status, content_type="application/json", headers=headers
    )


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object; an `ApiError` 400 for anything else."""
    try:
        body = await request.json(loads=orjson.loads)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


def origin(request: web.Request) -> str:
    """`scheme://host[:port]` as the client asked it, for the URLs an answer points back to.
    Not `request.url.origin()`: aiohttp 3.10.0 (the floor) builds that URL with the port inside
    the host, which newer yarl refuses, so every such answer was a 500."""
    return f"{request.scheme}://{request.host}"

"""Provider-style rate limits for the mock: `--rpm`/`--tpm` enforced, with the headers that say so.

Each limit is a continuously refilled bucket holding `burst` seconds of its rate (OpenAI
enforces a per-minute limit over shorter windows, so a minute's worth is never sent at once). A
request is charged at arrival: one request, and its prompt tokens plus its output cap, as OpenAI
counts a request against a TPM limit (no refund for a shorter answer). A request that does not
fit is refused with a 429 and a `Retry-After` saying when it would fit; refused requests cost
nothing.

Every answer (and every 429) carries the header set of one provider family:

- `openai` (also Azure OpenAI): `x-ratelimit-limit-requests`, `x-ratelimit-remaining-requests`,
  `x-ratelimit-reset-requests` (a duration such as `1s`, `6m0s` or `250ms`), and the `-tokens`
  variants.
- `anthropic`: `anthropic-ratelimit-requests-limit`, `-remaining`, `-reset` (an RFC 3339 time)
  and the same for `tokens`.
"""

from __future__ import annotations

import datetime as _dt
import math
import time
from typing import Any

import orjson
from aiohttp import web

from jsonlbatch.errors import UsageError

HEADER_STYLES = ("openai", "anthropic")
#: Where an admitted request keeps its answer's headers (a typed key where aiohttp has them).
LIMIT_HEADERS_KEY: Any = (
    web.RequestKey("jsonlbatch_ratelimit_headers", dict)
    if hasattr(web, "RequestKey")
    else "jsonlbatch_ratelimit_headers"
)

_LIMITED = orjson.dumps(
    {
        "error": {
            "message": "Rate limit reached (enforced by jsonlbatch mock)",
            "type": "RateLimitError",
            "param": None,
            "code": 429,
        }
    }
)


def go_duration(seconds: float) -> str:
    """Seconds as OpenAI writes them: `250ms`, `1s`, `1.5s`, `6m0s`, `1h2m3s`."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{round(secs, 3):g}s"
    if hours or minutes:
        text = f"{int(minutes)}m" + text
    if hours:
        text = f"{int(hours)}h" + text
    return text


class _Bucket:
    __slots__ = ("capacity", "level", "limit", "rate", "stamp")

    def __init__(self, per_minute: float, burst: float) -> None:
        self.limit = per_minute
        self.rate = per_minute / 60.0
        self.capacity = max(1.0, self.rate * burst)
        self.level = self.capacity
        self.stamp = time.monotonic()

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def shortfall(self, amount: float) -> float:
        """Seconds until `amount` fits (0 if it fits now); more than the bucket holds never fits
        until the bucket is full."""
        need = min(amount, self.capacity)
        return max(0.0, (need - self.level) / self.rate)

    def reset_in(self) -> float:
        return (self.capacity - self.level) / self.rate


class MockLimits:
    """The limits of one mock app and its count of refusals."""

    def __init__(
        self,
        rpm: float | None,
        tpm: float | None,
        *,
        burst: float = 1.0,
        style: str = "openai",
        default_max_tokens: int = 16,
    ) -> None:
        if style not in HEADER_STYLES:
            raise UsageError(
                f"rate-limit header style must be one of {HEADER_STYLES}, got {style!r}"
            )
        if burst <= 0:
            raise UsageError(f"rate-limit burst must be positive, got {burst}")
        for name, value in (("rpm", rpm), ("tpm", tpm)):
            if value is not None and value <= 0:
                raise UsageError(f"{name} must be positive, got {value}")
        self.buckets: dict[str, _Bucket] = {}
        if rpm:
            self.buckets["requests"] = _Bucket(rpm, burst)
        if tpm:
            self.buckets["tokens"] = _Bucket(tpm, burst)
        self.style = style
        self.default_max_tokens = default_max_tokens
        self.refused = 0

    def tokens_of(self, body: dict[str, Any], prompt: int) -> int:
        """What a request is charged in tokens: its prompt plus its output cap, `n` times."""
        cap = body.get(
            "max_completion_tokens", body.get("max_tokens", body.get("max_output_tokens"))
        )
        if not isinstance(cap, int) or isinstance(cap, bool):
            cap = self.default_max_tokens
        n = body.get("n")
        return prompt + cap * (n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1)

    def admit(
        self, request: web.Request, body: dict[str, Any], prompt: int
    ) -> tuple[bytes, dict[str, str]] | None:
        """Charge the request, or return the 429 (body, headers) that refuses it. The headers
        for the answer are left on the request for `add_headers`."""
        now = time.monotonic()
        cost = {"requests": 1.0, "tokens": float(self.tokens_of(body, prompt))}
        wait = 0.0
        for kind, bucket in self.buckets.items():
            bucket.refill(now)
            wait = max(wait, bucket.shortfall(cost[kind]))
        if wait > 0:
            self.refused += 1
            headers = self.headers()
            headers["Retry-After"] = f"{math.ceil(wait * 1000) / 1000:g}"
            return _LIMITED, headers
        for kind, bucket in self.buckets.items():
            bucket.level -= cost[kind]
        request[LIMIT_HEADERS_KEY] = self.headers()
        return None

    def headers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        now_wall = time.time()
        for kind, bucket in self.buckets.items():
            limit = f"{bucket.limit:.0f}"
            remaining = f"{max(0, math.floor(bucket.level))}"
            if self.style == "openai":
                out[f"x-ratelimit-limit-{kind}"] = limit
                out[f"x-ratelimit-remaining-{kind}"] = remaining
                out[f"x-ratelimit-reset-{kind}"] = go_duration(bucket.reset_in())
            else:
                when = _dt.datetime.fromtimestamp(now_wall + bucket.reset_in(), _dt.timezone.utc)
                out[f"anthropic-ratelimit-{kind}-limit"] = limit
                out[f"anthropic-ratelimit-{kind}-remaining"] = remaining
                out[f"anthropic-ratelimit-{kind}-reset"] = when.isoformat(
                    timespec="seconds"
                ).replace("+00:00", "Z")
        return out


async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare` hook: an admitted request's answer carries the limit headers,
    whole or streamed."""
    headers = request.get(LIMIT_HEADERS_KEY)
    if headers:
        response.headers.update(headers)

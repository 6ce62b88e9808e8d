"""What providers' rate-limit headers say: which headers, their numbers and their reset times.

OpenAI's and Azure's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` and Anthropic's
`anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`,
read for `rate_limits.RateLimiter`, which decides what to do with them.
"""

from __future__ import annotations

import datetime as _dt
import email.utils
import math
import re
import time
from collections.abc import Mapping

from jsonlbatch.exec.send.retry import parse_retry_after

#: Kinds of limit, in the order a `rate_limits.Cost` lists them.
KINDS = ("requests", "tokens", "input_tokens", "output_tokens")

OPENAI_HEADERS: dict[str, tuple[str, ...]] = {
    kind: (
        f"x-ratelimit-limit-{kind}",
        f"x-ratelimit-remaining-{kind}",
        f"x-ratelimit-reset-{kind}",
    )
    for kind in ("requests", "tokens")
}
ANTHROPIC_HEADERS = {
    kind: tuple(f"anthropic-ratelimit-{kind.replace('_', '-')}-{part}"
                for part in ("limit", "remaining", "reset"))
    for kind in KINDS
}  # fmt: skip
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_reset(value: str | None, now: float | None = None) -> float | None:
    """Seconds until a limit resets: OpenAI's Go-style durations (`1s`, `6m0s`, `250ms`,
    `1h2m3.5s`), a bare number of seconds, or Anthropic's RFC 3339 time."""
    if not value:
        return None
    value = value.strip()
    if value.replace(".", "", 1).isdigit():
        return parse_retry_after(value, now)
    parts = _DURATION.findall(value)
    if parts and "".join(n + u for n, u in parts) == value:
        return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    try:
        when = _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.timezone.utc)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def header_number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def server_now(headers: Mapping[str, str]) -> float | None:
    """The answer's `Date` header as a timestamp: absolute reset times are measured against
    the server's own clock, so a server clock an hour ahead (or ours jumping back) does not make
    every reset look an hour away."""
    date = headers.get("date") or headers.get("Date")
    if not date:
        return None
    try:
        return email.utils.parsedate_to_datetime(date).timestamp()
    except (TypeError, ValueError, IndexError):
        return None

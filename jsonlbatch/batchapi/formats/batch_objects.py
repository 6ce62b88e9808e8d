"""What both sides agree on: the Batch API's statuses, windows, ids and line shapes.

The shapes follow the OpenAI Files and Batches API (and the `openai` SDK's models of them):
a batch moves validating -> in_progress -> finalizing -> completed, or ends failed, expired or
(through cancelling) cancelled; its results are split between an output file (2xx answers) and
an error file (everything else), matched to requests by `custom_id` only.
"""

from __future__ import annotations

import os
import re
import time
from datetime import datetime, timezone
from typing import Any

import orjson

from jsonlbatch.errors import UsageError

#: Statuses a batch never leaves.
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
#: Statuses of a batch that still holds (or may still produce) results.
ACTIVE = frozenset({"validating", "in_progress", "finalizing", "cancelling"})

#: What a request that got no answer is marked with, by how its batch ended.
MISSING_CODES = {
    "expired": ("batch_expired", "the batch expired before this request was processed"),
    "cancelled": ("batch_cancelled", "the batch was cancelled before this request was processed"),
    "failed": ("batch_failed", "the batch failed before this request was processed"),
    "completed": ("missing_result", "the batch completed without a result for this request"),
}

_WINDOW = re.compile(r"^\s*(\d{1,12}(?:\.\d{1,9})?)\s*([smhd])\s*$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: The longest completion window taken: a deadline must fit the API's 64-bit timestamps (a
#: window of 10^20 days overflowed them), and a year is beyond any batch's use.
MAX_WINDOW = 366 * 86400
#: A batch's completion window unless asked (the only one OpenAI takes), and the first wait
#: between status checks: written once, here, for `SubmitOptions` and the CLI's options.
DEFAULT_WINDOW = "24h"
DEFAULT_POLL_S = 10.0


def window_seconds(window: object) -> float:
    """`"24h"` -> 86400. OpenAI only takes `24h`; shorter ones (`90s`, `2m`) are for tests and
    for a local server whose results are useless after a deadline."""
    match = _WINDOW.match(window) if isinstance(window, str) else None
    if match is None or float(match.group(1)) <= 0:
        raise UsageError(f"completion window must look like 24h, 30m or 90s, got {window!r}")
    seconds = float(match.group(1)) * _UNIT[match.group(2)]
    if seconds > MAX_WINDOW:
        raise UsageError(f"completion window must be at most 366d, got {window!r}")
    return seconds


def new_id(prefix: str) -> str:
    """`file-<hex>`, `batch_<hex>`: OpenAI's prefixes, 24 random hex digits."""
    return prefix + os.urandom(12).hex()


def now() -> int:
    return int(time.time())


def failure_line(custom_id: str, code: str, message: str, **metrics: Any) -> bytes:
    """A response line for a request that got no answer (no `response`, an `error`)."""
    line: dict[str, Any] = {
        "id": new_id("batch_req_"),
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }
    if metrics:
        line["metrics"] = metrics
    return orjson.dumps(line) + b"\n"


def rfc3339(stamp: float | None) -> str | None:
    """Seconds since the epoch as the RFC 3339 time other providers' APIs use
    ("2026-11-25T10:00:00Z"); None (or 0: not set) gives None."""
    if not stamp:
        return None
    return datetime.fromtimestamp(stamp, timezone.utc).isoformat().replace("+00:00", "Z")


def epoch_of(text: Any) -> float:
    """An RFC 3339 time from another provider's API as seconds since the epoch (0 when it is
    missing or not a time)."""
    if not isinstance(text, str):
        return 0.0
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0

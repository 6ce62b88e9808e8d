"""Making a batch on the server side, whichever API asked for it.

The OpenAI routes, and the Anthropic and Gemini routes that translate their requests, all end
here: an input file of OpenAI Batch request lines in the store and a batch object that the
runner moves along. A provider's own routes keep their view of it (`provider` and the fields
they need) in the same stored object.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from jsonlbatch.batchapi.formats.batch_objects import new_id, now
from jsonlbatch.batchapi.server.batch_runner import BatchRunner
from jsonlbatch.batchapi.server.batch_store import Store


def store_file(
    store: Store,
    lines: Iterable[bytes],
    *,
    filename: str,
    purpose: str = "batch",
    file_id: str | None = None,
) -> dict[str, Any]:
    """Write `lines` as a file of the store (complete or absent) and record it."""
    fd, tmp = tempfile.mkstemp(dir=store.files_dir, suffix=".upload")
    size = 0
    try:
        with os.fdopen(fd, "wb") as f:
            for line in lines:
                f.write(line)
                size += len(line)
            f.flush()
            os.fsync(f.fileno())
        obj: dict[str, Any] = {
            "id": file_id or new_id("file-"),
            "object": "file",
            "bytes": size,
            "created_at": now(),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }
        final = store.file_path(obj["id"])
        os.replace(tmp, final)
        tmp = ""
        try:
            store.put_file(obj)
        except BaseException:
            final.unlink(missing_ok=True)
            raise
        return obj
    finally:
        if tmp:
            os.unlink(tmp)


def request_line(custom_id: str, url: str, body: Mapping[str, Any]) -> bytes:
    return (
        orjson.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}) + b"\n"
    )


def new_batch(
    store: Store,
    runner: BatchRunner,
    *,
    input_file_id: str,
    endpoint: str,
    window: str,
    seconds: float,
    metadata: Mapping[str, str] | None,
    batch_id: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Record a new batch (status `validating`) and wake the runner."""
    created = now()
    batch: dict[str, Any] = {
        "id": batch_id or new_id("batch_"),
        "object": "batch",
        "endpoint": endpoint,
        "errors": None,
        "input_file_id": input_file_id,
        "completion_window": window,
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": created,
        "in_progress_at": None,
        "expires_at": created + math.ceil(seconds),
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "metadata": dict(metadata) if metadata is not None else None,
        **(extra or {}),
    }
    store.put_batch(batch)
    runner.wake.set()
    return batch


def queued_requests(store: Store) -> int:
    """Requests in batches that have not ended (what a queue limit counts)."""
    total = 0
    for batch in store.batches_where("status IN ('validating', 'in_progress', 'finalizing')"):
        counts = batch.get("request_counts") or {}
        total += counts.get("total") or batch.get("queued", 0)
    return total


class ProviderFront:
    """What the Anthropic and Gemini routes share: the store and the runner, how long their
    batches live (`expiry`, seconds) and the queue limit (`max_queued` requests)."""

    default_expiry = 24 * 3600.0

    def __init__(
        self,
        store: Store,
        runner: BatchRunner,
        *,
        expiry: float | None = None,
        max_queued: int | None = None,
    ) -> None:
        self.store, self.runner = store, runner
        self.expiry = expiry or self.default_expiry
        self.max_queued = max_queued

    def make_batch(
        self,
        batch_id: str,
        lines: Iterable[bytes],
        endpoint: str,
        count: int,
        extra: Mapping[str, Any],
    ) -> dict[str, Any]:
        """Store a provider's translated requests as an input file and make the batch the
        runner executes, expiring after this front's `expiry`."""
        made = store_file(self.store, lines, filename=f"{batch_id}.input.jsonl")
        return new_batch(
            self.store,
            self.runner,
            input_file_id=made["id"],
            endpoint=endpoint,
            window=f"{self.expiry:g}s",
            seconds=self.expiry,
            metadata=None,
            batch_id=batch_id,
            extra={**extra, "queued": count},
        )

    def queue_full(self, count: int) -> bool:
        """Whether `count` more requests would pass the queue limit."""
        return self.max_queued is not None and queued_requests(self.store) + count > self.max_queued

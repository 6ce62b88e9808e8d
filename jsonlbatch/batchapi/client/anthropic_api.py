"""The submit side's adapter for Anthropic's Message Batches (a `BatchProvider`).

Anthropic takes requests inline, so "uploading" a part is remembering where its lines are, and
creating the batch sends them (`{"custom_id", "params"}`, the line's Messages body). A batch is
shown to `Submitter` in OpenAI's shape: `ended` is `completed`, and its results, read from the
batch's results URL, become OpenAI Batch output lines: `succeeded` a 200 with the message,
`errored` a failure with the API's error, `canceled` and `expired` failures with exec's codes,
so `--retry-failed` submits exactly those again.

Anthropic keeps no metadata on a batch: after a crash around a create, the batch made for a
part is looked for among batches created since, by its request count; when that does not
decide it, the run stops and says so rather than submitting a second batch.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from jsonlbatch.batch_format.records import json_object
from jsonlbatch.batchapi.client.batch_api import BatchApi, RemoteError, _quoted
from jsonlbatch.batchapi.client.paging import Pages
from jsonlbatch.batchapi.client.result_merge import ResultsGuard
from jsonlbatch.batchapi.client.safe_names import is_plain_id
from jsonlbatch.batchapi.formats.batch_objects import epoch_of, new_id
from jsonlbatch.file_io.jsonl import iter_lines
from jsonlbatch.redact import register_secret

#: The API version this client speaks (SDK 2.x); older servers also take 2023-06-01.
VERSION = "2026-10-21"
_STATUS = {"in_progress": "in_progress", "canceling": "cancelling", "ended": "completed"}
_UNRUN = {"canceled": ("batch_cancelled", "the batch was cancelled before this request ran"),
          "expired": ("batch_expired", "the batch expired before this request ran")}  # fmt: skip
_BASE = "/v1/messages/batches"


class AnthropicBatchApi(BatchApi):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        api_key = kwargs.get("api_key")
        user = dict(kwargs.get("headers") or {})
        super().__init__(*args, **kwargs)
        # What the current API expects of a client: a bearer key and the newest version.
        self.headers = {"Accept": "application/json", "anthropic-version": VERSION}
        if api_key:
            register_secret(api_key)
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.headers.update(user)
        self._local: dict[str, Path] = {}

    # -- "files": the part's lines stay here until the batch is made --------------------------

    async def upload(self, path: Path, filename: str) -> dict[str, Any]:
        file_id = "local-" + filename.removesuffix(".jsonl")
        self._local[file_id] = path
        return {"id": file_id, "object": "file", "filename": filename, "status": "processed"}

    async def find_file(self, filename: str) -> dict[str, Any] | None:
        return None  # nothing was sent: the part is "uploaded" again, locally

    # -- batches ---------------------------------------------------------------------------

    async def create_batch(
        self, file_id: str, endpoint: str, window: str, metadata: Mapping[str, str]
    ) -> dict[str, Any]:
        path = self._local.get(file_id)
        if path is None:
            raise RemoteError(f"the part behind {file_id} is gone; run the same command again")
        items = []
        for _, raw in iter_lines(path):
            line = orjson.loads(raw)
            items.append(b'{"custom_id":' + orjson.dumps(line["custom_id"]) + b',"params":'
                         + orjson.dumps(line["body"]) + b"}")  # fmt: skip
        body = b'{"requests":[' + b",".join(items) + b"]}"
        made = await self._call("POST", _BASE, body=body, quota=True,
                                headers={"Content-Type": "application/json"})  # fmt: skip
        return self._batch(made, "POST " + _BASE)

    async def retrieve(self, batch_id: str) -> dict[str, Any]:
        path = f"{_BASE}/{_quoted(batch_id)}"
        return self._batch(await self._call("GET", path), "GET " + path)

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        path = f"{_BASE}/{_quoted(batch_id)}/cancel"
        return self._batch(await self._call("POST", path), "POST " + path)

    def _batch(self, obj: Any, what: str) -> dict[str, Any]:
        """A `message_batch` in OpenAI's batch shape (after checking it is one)."""
        if not isinstance(obj, dict) or obj.get("type") != "message_batch":
            raise RemoteError(f"{what} on {self.endpoint.name}: the answer is not a message batch; "
                              f"is {self.endpoint.name} Anthropic's API?")  # fmt: skip
        status = _STATUS.get(obj.get("processing_status"))  # type: ignore[arg-type]
        if status is None or not is_plain_id(obj.get("id")):
            raise RemoteError(f"{what}: a message batch with an unknown status or id")
        counts = json_object(obj.get("request_counts"))
        number = {k: v if isinstance(v, int) else 0 for k, v in counts.items()}
        failed = number.get("errored", 0) + number.get("canceled", 0) + number.get("expired", 0)
        if status == "completed" and obj.get("cancel_initiated_at"):
            status = "cancelled"  # ended after a cancel: what ran is in its results all the same
        return {
            "id": obj["id"],
            "object": "batch",
            "status": status,
            "request_counts": {"total": sum(number.values()), "completed": number.get("succeeded", 0),
                               "failed": failed},
            "output_file_id": f"results-{obj['id']}" if obj.get("processing_status") == "ended" else None,
            "error_file_id": None,
            "created_at": epoch_of(obj.get("created_at")),
            "metadata": {},
        }  # fmt: skip

    async def find_batch(
        self, metadata: Mapping[str, str], since: float, count: int | None = None
    ) -> dict[str, Any] | None:
        """The batch made for a part before a crash: Anthropic shows no metadata, so the
        candidates are those created since with the part's request count."""
        wanted = -1 if count is None else count
        found = []
        after: str | None = None
        pages = Pages(f"GET {self.endpoint.name}{_BASE}")
        while True:
            query = {"limit": "100", **({"after_id": after} if after else {})}
            page = await self._call("GET", _BASE, query=query)
            data = page.get("data") if isinstance(page, dict) else None
            if not isinstance(data, list):
                raise RemoteError(f"GET {_BASE}: the answer is not a page of message batches")
            older = False
            for obj in data:
                batch = self._batch(obj, "GET " + _BASE)
                if batch["created_at"] < since:
                    older = True
                    break
                if batch["request_counts"]["total"] == wanted:
                    found.append(batch)
            if older or not page.get("has_more"):
                break
            after = pages.next(page.get("last_id"), len(data))
        if len(found) > 1:
            ids = ", ".join(b["id"] for b in found)
            raise RemoteError(
                f"a crash came while part {metadata.get('jsonlbatch_part')} was being created, and "
                f"{len(found)} batches made since then have its {wanted} requests ({ids}); "
                "Anthropic keeps no metadata to tell them apart, so nothing is submitted again. "
                "Cancel the ones that are not this run's, then run the same command again"
            )
        return found[0] if found else None

    async def download(self, file_id: str, dest: Path) -> None:
        """The batch's results as OpenAI Batch output lines (custom_ids as sent)."""
        batch_id = file_id.removeprefix("results-")
        guard = functools.partial(ResultsGuard, _line)
        await self._fetch(f"{_BASE}/{_quoted(batch_id)}/results", dest, guard=guard)


def _line(result: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic result line (an object with a string `custom_id`: `ResultsGuard` saw to
    that) as an OpenAI Batch output line."""
    cid = result["custom_id"]
    outcome = result.get("result")
    kind = outcome.get("type") if isinstance(outcome, dict) else None
    line: dict[str, Any] = {"id": new_id("batch_req_"), "custom_id": cid}
    if kind == "succeeded" and isinstance(outcome.get("message"), dict):  # type: ignore[union-attr]
        message = outcome["message"]  # type: ignore[index]
        return {**line, "response": {"status_code": 200, "request_id": message.get("id"), "body": message},
                "error": None}  # fmt: skip
    if kind in _UNRUN:
        code, text = _UNRUN[kind]
        return {**line, "response": None, "error": {"code": code, "message": text}}
    error = outcome.get("error") if isinstance(outcome, dict) else None
    inner = json_object(json_object(error).get("error"))
    etype = inner.get("type") or "api_error"
    status = 400 if etype == "invalid_request_error" else 500
    return {
        **line,
        "response": {"status_code": status, "body": {"type": "error", "error": inner}},
        "error": {
            "code": f"batch_{etype}",
            "message": inner.get("message") or "the request failed",
        },
    }

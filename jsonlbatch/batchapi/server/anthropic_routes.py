"""Anthropic's Message Batches API, served by `serve --batch-api` in front of any backend.

`POST /v1/messages/batches` takes requests inline (`custom_id` + `params`, a Messages body),
stores them as an input file of `/v1/messages` request lines and makes a batch the runner
executes like any other; `GET .../{id}` shows it as a `message_batch` (`processing_status`
in_progress | canceling | ended, request counts by result type once it ended), and
`GET .../{id}/results` streams one result line per request: `succeeded` with the message,
`errored`, `canceled` or `expired`. Both of Anthropic's ways to authenticate are accepted
(`x-api-key`, `Authorization: Bearer`), as is any `anthropic-version`.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Iterator
from typing import Any

import orjson
from aiohttp import web

from jsonlbatch.batch_format.records import MESSAGES_URL, json_object
from jsonlbatch.batchapi.formats.batch_objects import TERMINAL, new_id, now, rfc3339
from jsonlbatch.batchapi.server.batch_intake import ProviderFront, request_line
from jsonlbatch.batchapi.server.json_api import ApiError, json_body, json_response, origin
from jsonlbatch.file_io.jsonl import iter_lines

#: Anthropic's limits per batch and on custom_ids.
MAX_REQUESTS = 100_000
CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
#: Fields of a Messages body that a batch refuses.
_REFUSED = ("stream",)
DEFAULT_EXPIRY = 24 * 3600.0
#: Results of requests that never ran, by how the batch ended (the runner's failure codes).
_UNRUN = {"batch_expired": "expired", "batch_cancelled": "canceled"}


def error(status: int, kind: str, message: str) -> ApiError:
    """An error in Anthropic's shape."""
    body = {"type": "error", "error": {"type": kind, "message": message},
            "request_id": new_id("req_")}  # fmt: skip
    return ApiError(status, message, body=body)


class AnthropicBatches(ProviderFront):
    default_expiry = DEFAULT_EXPIRY

    def add_routes(self, app: web.Application) -> None:
        add = app.router
        add.add_post("/v1/messages/batches", self.create)
        add.add_get("/v1/messages/batches", self.list)
        add.add_get("/v1/messages/batches/{batch_id}", self.retrieve)
        add.add_post("/v1/messages/batches/{batch_id}/cancel", self.cancel)
        add.add_get("/v1/messages/batches/{batch_id}/results", self.results)
        add.add_delete("/v1/messages/batches/{batch_id}", self.delete)

    # -- create ----------------------------------------------------------------------------

    async def create(self, request: web.Request) -> web.Response:
        try:
            body = await json_body(request)
        except ApiError:
            raise error(400, "invalid_request_error", "the body must be a JSON object") from None
        requests = body.get("requests")
        if not isinstance(requests, list) or not requests:
            raise error(400, "invalid_request_error", "requests: a non-empty list is required")
        if len(requests) > MAX_REQUESTS:
            raise error(413, "request_too_large", f"at most {MAX_REQUESTS} requests per batch")
        seen: set[str] = set()
        for i, item in enumerate(requests):
            where = f"requests.{i}"
            if not isinstance(item, dict):
                raise error(400, "invalid_request_error", f"{where}: must be an object")
            cid, params = item.get("custom_id"), item.get("params")
            if not isinstance(cid, str) or not CUSTOM_ID.match(cid):
                raise error(400, "invalid_request_error",
                            f"{where}.custom_id: must match ^[a-zA-Z0-9_-]{{1,64}}$")  # fmt: skip
            if cid in seen:
                raise error(400, "invalid_request_error", f"{where}.custom_id: {cid} is not unique")
            seen.add(cid)
            if not isinstance(params, dict):
                raise error(400, "invalid_request_error", f"{where}.params: must be an object")
            for key in _REFUSED:
                if params.get(key):
                    raise error(
                        400,
                        "invalid_request_error",
                        f"{where}.params.{key}: not allowed in a batch",
                    )
            tokens = params.get("max_tokens")
            if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
                raise error(
                    400, "invalid_request_error", f"{where}.params.max_tokens: an integer >= 1"
                )
            if not isinstance(params.get("model"), str):
                raise error(400, "invalid_request_error", f"{where}.params.model: required")
        if self.queue_full(len(requests)):
            raise error(429, "rate_limit_error",
                        f"the number of queued batch requests would exceed {self.max_queued}; "
                        "wait for earlier batches to end")  # fmt: skip
        batch_id = new_id("msgbatch_")
        lines = (request_line(r["custom_id"], MESSAGES_URL, r["params"]) for r in requests)
        batch = self.make_batch(
            batch_id, lines, MESSAGES_URL, len(requests), {"provider": "anthropic"}
        )
        return json_response(self._view(batch, request))

    # -- reading ---------------------------------------------------------------------------

    def _batch(self, request: web.Request) -> dict[str, Any]:
        batch_id = request.match_info["batch_id"]
        batch = self.store.get_batch(batch_id)
        if batch is None or batch.get("provider") != "anthropic":
            raise error(404, "not_found_error", f"no message batch {batch_id}")
        return batch

    async def retrieve(self, request: web.Request) -> web.Response:
        return json_response(self._view(self._batch(request), request))

    async def list(self, request: web.Request) -> web.Response:
        text = request.query.get("limit", "20")
        if not text.isdigit() or not 1 <= int(text) <= 1000:
            raise error(400, "invalid_request_error", "limit: 1 to 1000")
        limit = int(text)
        after = request.query.get("after_id")
        mine = [b for b in self._all() if not b.get("deleted")]
        if after is not None:
            ids = [b["id"] for b in mine]
            mine = mine[ids.index(after) + 1 :] if after in ids else []
        page = mine[:limit]
        data = [self._view(b, request) for b in page]
        return json_response({
            "data": data,
            "has_more": len(mine) > limit,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        })  # fmt: skip

    def _all(self) -> builtins.list[dict[str, Any]]:  # `list` is a method of this class
        """This API's batches, newest first."""
        found = [b for b in self.store.batches_where("1 = 1") if b.get("provider") == "anthropic"]
        return sorted(found, key=lambda b: (b["created_at"], b["id"]), reverse=True)

    def _view(self, batch: dict[str, Any], request: web.Request) -> dict[str, Any]:
        status = batch["status"]
        ended = status in TERMINAL
        if ended:
            counts = batch.get("anthropic_counts") or self._count(batch)
        else:
            total = (batch.get("request_counts") or {}).get("total") or batch.get("queued", 0)
            counts = {
                "processing": total,
                "succeeded": 0,
                "errored": 0,
                "canceled": 0,
                "expired": 0,
            }
        ended_at = next(
            (
                batch.get(f"{s}_at")
                for s in ("completed", "failed", "expired", "cancelled")
                if batch.get(f"{s}_at")
            ),
            None,
        )
        return {
            "id": batch["id"],
            "type": "message_batch",
            "processing_status": "ended" if ended else ("canceling" if status == "cancelling" else "in_progress"),
            "request_counts": counts,
            "created_at": rfc3339(batch["created_at"]),
            "expires_at": rfc3339(batch["expires_at"]),
            "ended_at": rfc3339(ended_at) if ended else None,
            "cancel_initiated_at": rfc3339(batch.get("cancelling_at")),
            "archived_at": None,
            "results_url": f"{origin(request)}/v1/messages/batches/{batch['id']}/results" if ended else None,
        }  # fmt: skip

    def _count(self, batch: dict[str, Any]) -> dict[str, int]:
        """Counts by result type, once, when the batch ended (kept in the stored object)."""
        counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        for line in self._result_lines(batch):
            counts[orjson.loads(line)["result"]["type"]] += 1
        fresh = self.store.get_batch(batch["id"]) or batch
        fresh["anthropic_counts"] = counts
        self.store.put_batch(fresh)
        return counts

    def _result_lines(self, batch: dict[str, Any]) -> Iterator[bytes]:
        """One Anthropic result line per request, from the batch's output and error files."""
        for key in ("output_file_id", "error_file_id"):
            file_id = batch.get(key)
            if not file_id:
                continue
            for _, raw in iter_lines(self.store.file_path(file_id)):
                yield orjson.dumps(result_line(orjson.loads(raw))) + b"\n"

    async def results(self, request: web.Request) -> web.StreamResponse:
        batch = self._batch(request)
        if batch["status"] not in TERMINAL:
            raise error(
                400, "invalid_request_error", f"message batch {batch['id']} has not ended yet"
            )
        response = web.StreamResponse(headers={"Content-Type": "application/binary"})
        await response.prepare(request)
        for line in self._result_lines(batch):
            await response.write(line)
        await response.write_eof()
        return response

    # -- changing --------------------------------------------------------------------------

    async def cancel(self, request: web.Request) -> web.Response:
        batch = self._batch(request)
        if batch["status"] in ("validating", "in_progress", "finalizing"):
            batch.update(status="cancelling", cancelling_at=batch.get("cancelling_at") or now())
            self.store.put_batch(batch)
            self.runner.wake.set()
        return json_response(self._view(batch, request))

    async def delete(self, request: web.Request) -> web.Response:
        batch = self._batch(request)
        if batch["status"] not in TERMINAL:
            raise error(
                400,
                "invalid_request_error",
                "cancel the batch and wait for it to end before deleting it",
            )
        batch["deleted"] = True
        self.store.put_batch(batch)
        return json_response({"id": batch["id"], "type": "message_batch_deleted"})


def result_line(line: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI Batch output or error line as Anthropic's result line."""
    cid = line.get("custom_id")
    response = line.get("response") if isinstance(line.get("response"), dict) else None
    status = response.get("status_code") if response else None
    body = response.get("body") if response else None
    if isinstance(status, int) and 200 <= status < 300 and isinstance(body, dict):
        return {"custom_id": cid, "result": {"type": "succeeded", "message": body}}
    code = (line.get("error") or {}).get("code") if isinstance(line.get("error"), dict) else None
    if code in _UNRUN:
        return {"custom_id": cid, "result": {"type": _UNRUN[code]}}
    inner = json_object(json_object(body).get("error"))
    kind = inner.get("type") or (
        "invalid_request_error" if isinstance(status, int) and status < 500 else "api_error"
    )
    message = (
        inner.get("message") or (line.get("error") or {}).get("message") or "the request failed"
    )
    return {
        "custom_id": cid,
        "result": {"type": "errored", "error": {"type": "error", "error": {"type": kind, "message": message},
                                                "request_id": new_id("req_")}},
    }  # fmt: skip

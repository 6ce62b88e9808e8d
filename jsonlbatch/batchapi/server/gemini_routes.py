"""Gemini's batch mode, served by `serve --batch-api` in front of any OpenAI-compatible backend.

`POST /{v1,v1beta}/models/{model}:batchGenerateContent` takes requests inline or as an
uploaded JSONL file (`{"key", "request"}` lines, uploaded with Google's resumable protocol at
`/upload/{version}/files`); each `GenerateContentRequest` becomes a chat completion the runner
executes, and each answer a `GenerateContentResponse` again. A job is an operation whose
`metadata` holds `state` (`BATCH_STATE_*`), `batchStats` and, once it succeeded, `output`:
`inlinedResponses` in input order, or a `responsesFile` to download. Both API versions are
served, since google-genai moved from `v1beta` to `v1`; the key is `x-goog-api-key`.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from jsonlbatch.batch_format.records import CHAT_URL, json_object
from jsonlbatch.batchapi.formats.batch_objects import TERMINAL, new_id, now, rfc3339
from jsonlbatch.batchapi.formats.gemini_format import (
    chat_to_gemini_response,
    dumps_line,
    error_status,
    gemini_to_chat,
)
from jsonlbatch.batchapi.server.batch_intake import ProviderFront, request_line, store_file
from jsonlbatch.batchapi.server.json_api import ApiError, json_body, json_response, origin
from jsonlbatch.file_io.jsonl import iter_lines

DEFAULT_EXPIRY = 48 * 3600.0
VERSIONS = "v1|v1beta"
_STATES = {
    "validating": "BATCH_STATE_PENDING",
    "in_progress": "BATCH_STATE_RUNNING",
    "finalizing": "BATCH_STATE_RUNNING",
    "cancelling": "BATCH_STATE_RUNNING",
    "completed": "BATCH_STATE_SUCCEEDED",
    "failed": "BATCH_STATE_FAILED",
    "cancelled": "BATCH_STATE_CANCELLED",
    "expired": "BATCH_STATE_EXPIRED",
}


def error(status: int, message: str) -> ApiError:
    """An error in Google's shape."""
    return ApiError(status, message, body={"error": error_status(status, message)})


def is_gemini(request: web.Request) -> bool:
    """A call of google-genai (or of the REST API) where OpenAI's routes share a path."""
    return (
        "x-goog-api-key" in request.headers
        or "pageSize" in request.query
        or "pageToken" in request.query
    )


class GeminiBatches(ProviderFront):
    default_expiry = DEFAULT_EXPIRY

    def add_routes(self, app: web.Application) -> None:
        add = app.router
        v = "{version:" + VERSIONS + "}"
        add.add_post(f"/{v}/models/{{spec}}", self.create)
        add.add_post(f"/{v}/batches/{{spec}}", self.cancel)
        add.add_delete(f"/{v}/batches/{{spec}}", self.delete)
        add.add_post(f"/upload/{v}/files", self.upload)
        add.add_get(f"/{v}/files/{{spec}}", self.file)
        add.add_get(f"/download/{v}/files/{{spec}}", self.file)
        # GET /v1beta/batches[/{id}] only: /v1/batches is OpenAI's too, and its handlers hand
        # Gemini's calls here (`is_gemini`, and a stored batch's provider).
        add.add_get("/v1beta/batches", self.list)
        add.add_get("/v1beta/batches/{spec}", self.retrieve)

    # -- create ----------------------------------------------------------------------------

    async def create(self, request: web.Request) -> web.Response:
        model, _, action = request.match_info["spec"].partition(":")
        if action != "batchGenerateContent":
            raise error(404, f"no method {action or model!r} here (batchGenerateContent is served)")
        try:
            body = await json_body(request)
        except ApiError:
            raise error(400, "the body must be a JSON object") from None
        batch = body.get("batch")
        if not isinstance(batch, dict):
            raise error(400, "batch: required")
        source = batch.get("inputConfig") or batch.get("input_config") or {}
        name = batch.get("displayName") or batch.get("display_name") or ""
        if not isinstance(name, str):
            raise error(400, "batch.displayName: must be a string")
        inline = (
            (source.get("requests") or {}).get("requests") if isinstance(source, dict) else None
        )
        file_name = (
            source.get("fileName") or source.get("file_name") if isinstance(source, dict) else None
        )
        if isinstance(inline, list) and inline:
            lines, meta, count = self._inline(inline, model)
            mode = "inline"
        elif isinstance(file_name, str):
            lines, count = self._from_file(file_name, model)
            meta, mode = [], "file"
        else:
            raise error(400, "batch.inputConfig: give requests.requests or fileName")
        if self.queue_full(count):
            raise error(429, f"Resource has been exhausted: the batch queue holds at most "
                        f"{self.max_queued} requests; wait for earlier batches to end")  # fmt: skip
        batch_id = new_id("")
        info = {"displayName": name, "model": model, "mode": mode, "meta": meta}
        stored = self.make_batch(
            batch_id, lines, CHAT_URL, count, {"provider": "gemini", "gemini": info}
        )
        return json_response(self._view(stored))

    def _inline(self, items: list[Any], model: str) -> tuple[list[bytes], list[Any], int]:
        lines, meta = [], []
        for i, item in enumerate(items):
            req = item.get("request") if isinstance(item, dict) else None
            if not isinstance(req, dict):
                raise error(400, f"batch.inputConfig.requests.requests[{i}].request: required")
            lines.append(request_line(f"i{i:07d}", CHAT_URL, gemini_to_chat(req, model)))
            meta.append(item.get("metadata"))
        return lines, meta, len(lines)

    def _from_file(self, file_name: str, model: str) -> tuple[list[bytes], int]:
        file_id = file_name.removeprefix("files/")
        obj = self.store.get_file(file_id)
        if obj is None:
            raise error(404, f"{file_name} is not a file here")
        lines, keys = [], set()
        for number, raw in iter_lines(self.store.file_path(file_id)):
            try:
                item = orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise error(400, f"{file_name} line {number}: not JSON") from None
            key, req = (
                (item.get("key"), item.get("request")) if isinstance(item, dict) else (None, None)
            )
            if not isinstance(key, str) or not key or key in keys:
                raise error(
                    400, f"{file_name} line {number}: key must be a unique non-empty string"
                )
            if not isinstance(req, dict):
                raise error(400, f"{file_name} line {number}: request must be an object")
            keys.add(key)
            lines.append(request_line(key, CHAT_URL, gemini_to_chat(req, model)))
        if not lines:
            raise error(400, f"{file_name} has no requests")
        return lines, len(lines)

    # -- reading ---------------------------------------------------------------------------

    def _batch(self, spec: str) -> dict[str, Any]:
        batch_id = spec.removeprefix("batches/").partition(":")[0]
        batch = self.store.get_batch(batch_id)
        if batch is None or batch.get("provider") != "gemini" or batch.get("deleted"):
            raise error(404, f"batches/{batch_id} not found")
        return batch

    async def retrieve(self, request: web.Request) -> web.Response:
        spec = request.match_info.get("spec") or request.match_info["batch_id"]
        return json_response(self._view(self._batch(spec)))

    async def list(self, request: web.Request) -> web.Response:
        text = request.query.get("pageSize", "50")
        if not text.isdigit() or not 1 <= int(text) <= 1000:
            raise error(400, "pageSize: 1 to 1000")
        size = int(text)
        mine = [b for b in self.store.batches_where("1 = 1")
                if b.get("provider") == "gemini" and not b.get("deleted")]  # fmt: skip
        mine.sort(key=lambda b: (b["created_at"], b["id"]), reverse=True)
        token = request.query.get("pageToken")
        if token:
            ids = [b["id"] for b in mine]
            mine = mine[ids.index(token) + 1 :] if token in ids else []
        page = mine[:size]
        out: dict[str, Any] = {"operations": [self._view(b) for b in page]}
        if len(mine) > size:
            out["nextPageToken"] = page[-1]["id"]
        return json_response(out)

    def _view(self, batch: dict[str, Any]) -> dict[str, Any]:
        info = batch["gemini"]
        status = batch["status"]
        total = (batch.get("request_counts") or {}).get("total") or batch.get("queued", 0)
        counts = batch.get("request_counts") or {}
        done = status in TERMINAL
        ended = next((batch.get(f"{s}_at") for s in ("completed", "failed", "expired", "cancelled")
                      if batch.get(f"{s}_at")), None)  # fmt: skip
        metadata: dict[str, Any] = {
            "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch",
            "name": f"batches/{batch['id']}",
            "model": f"models/{info['model']}",
            "displayName": info["displayName"],
            "state": _STATES[status],
            "createTime": rfc3339(batch["created_at"]),
            "updateTime": rfc3339(ended or batch.get("in_progress_at") or batch["created_at"]),
            "batchStats": {
                "requestCount": str(total),
                "successfulRequestCount": str(counts.get("completed", 0)),
                "failedRequestCount": str(counts.get("failed", 0)),
                "pendingRequestCount": str(
                    max(total - counts.get("completed", 0) - counts.get("failed", 0), 0)
                ),
            },
        }
        if done:
            metadata["endTime"] = rfc3339(ended)
        if status in ("completed", "cancelled"):
            metadata["output"] = self._output(batch)
        return {"name": f"batches/{batch['id']}", "metadata": metadata, "done": done}

    def _responses(self, batch: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Each request's result, by custom_id: `{"response": ...}` or `{"error": ...}`."""
        out: dict[str, dict[str, Any]] = {}
        for key in ("output_file_id", "error_file_id"):
            file_id = batch.get(key)
            if not file_id:
                continue
            for _, raw in iter_lines(self.store.file_path(file_id)):
                line = orjson.loads(raw)
                response = json_object(line.get("response"))
                status, body = response.get("status_code"), response.get("body")
                if isinstance(status, int) and 200 <= status < 300 and isinstance(body, dict):
                    out[line["custom_id"]] = {"response": chat_to_gemini_response(body)}
                else:
                    message = (line.get("error") or {}).get("message") or "the request failed"
                    out[line["custom_id"]] = {"error": error_status(status, message)}
        return out

    def _output(self, batch: dict[str, Any]) -> dict[str, Any]:
        info = batch["gemini"]
        if info["mode"] == "inline":
            results = self._responses(batch)
            inlined = []
            for i, meta in enumerate(info["meta"]):
                item = dict(
                    results.get(f"i{i:07d}")
                    or {"error": error_status(499, "cancelled before it ran")}
                )
                if meta is not None:
                    item["metadata"] = meta
                inlined.append(item)
            return {"inlinedResponses": {"inlinedResponses": inlined}}
        file_id = info.get("responses_file")
        if file_id is None:  # written once, when first asked for
            results = self._responses(batch)
            lines = (dumps_line({"key": k, **v}) for k, v in results.items())
            file_id = f"{batch['id']}r"
            store_file(self.store, lines, filename=f"batch-{batch['id']}-results.jsonl",
                       purpose="batch_output", file_id=file_id)  # fmt: skip
            fresh = self.store.get_batch(batch["id"]) or batch
            fresh["gemini"]["responses_file"] = file_id
            self.store.put_batch(fresh)
        return {"responsesFile": f"files/{file_id}"}

    # -- changing --------------------------------------------------------------------------

    async def cancel(self, request: web.Request) -> web.Response:
        spec = request.match_info["spec"]
        if not spec.endswith(":cancel"):
            raise error(404, f"no method on batches/{spec}")
        batch = self._batch(spec)
        if batch["status"] in ("validating", "in_progress", "finalizing"):
            batch.update(status="cancelling", cancelling_at=now())
            self.store.put_batch(batch)
            self.runner.wake.set()
        return json_response({})

    async def delete(self, request: web.Request) -> web.Response:
        batch = self._batch(request.match_info["spec"])
        if batch["status"] not in TERMINAL:
            batch.update(status="cancelling", cancelling_at=now())
        batch["deleted"] = True
        self.store.put_batch(batch)
        self.runner.wake.set()
        return json_response({})

    # -- files -----------------------------------------------------------------------------

    async def upload(self, request: web.Request) -> web.Response:
        """Google's resumable upload: `start` gives an upload URL; chunks follow at their
        offsets, the last one with `finalize`."""
        command = request.headers.get("X-Goog-Upload-Command", "").replace(" ", "")
        upload_id = request.query.get("upload_id")
        if upload_id is None:
            if command != "start":
                raise error(400, "X-Goog-Upload-Command: start first")
            body = await request.json(loads=orjson.loads) if request.body_exists else {}
            display = ((body or {}).get("file") or {}).get("displayName") or "upload.jsonl"
            upload_id = new_id("")
            self._part(upload_id).write_bytes(b"")
            (self._part(upload_id).with_suffix(".name")).write_text(str(display))
            url = f"{origin(request)}/upload/{request.match_info['version']}/files?upload_id={upload_id}"
            return json_response(
                {}, headers={"x-goog-upload-url": url, "x-goog-upload-status": "active"}
            )
        part = self._part(upload_id)
        if not upload_id.isalnum() or not part.exists():
            raise error(404, "no such upload")
        offset = request.headers.get("X-Goog-Upload-Offset", "0")
        if not offset.isdigit() or int(offset) != part.stat().st_size:
            raise error(400, f"X-Goog-Upload-Offset {offset!r} is not where the upload stands")
        with open(part, "ab") as f:
            async for chunk in request.content.iter_chunked(1 << 20):
                f.write(chunk)
        if "finalize" not in command.split(","):
            return json_response({}, headers={"x-goog-upload-status": "active"})
        display = part.with_suffix(".name").read_text()
        made = store_file(self.store, _read_all(part), filename=display, file_id=upload_id)
        for path in (part, part.with_suffix(".name")):
            path.unlink(missing_ok=True)
        return json_response(
            {"file": self._file_view(made, request)}, headers={"x-goog-upload-status": "final"}
        )

    def _part(self, upload_id: str) -> Any:
        return self.store.work_dir / f"{upload_id}.gupload"

    def _file_view(self, obj: dict[str, Any], request: web.Request) -> dict[str, Any]:
        version = request.match_info.get("version") or request.path.split("/")[1]
        return {
            "name": f"files/{obj['id']}",
            "displayName": obj["filename"],
            "mimeType": "application/jsonl",
            "sizeBytes": str(obj["bytes"]),
            "createTime": rfc3339(obj["created_at"]),
            "updateTime": rfc3339(obj["created_at"]),
            "expirationTime": rfc3339(obj["created_at"] + 48 * 3600),
            "uri": f"{origin(request)}/{version}/files/{obj['id']}",
            "state": "ACTIVE",
            "source": "GENERATED" if obj["purpose"] == "batch_output" else "UPLOADED",
        }

    async def file(self, request: web.Request) -> web.StreamResponse:
        spec = request.match_info.get("spec") or request.match_info["file_id"]
        file_id, _, action = spec.partition(":")
        obj = self.store.get_file(file_id)
        if obj is None:
            raise error(404, f"files/{file_id} not found")
        if action == "download" or request.path.startswith("/download/"):
            return web.FileResponse(self.store.file_path(file_id),
                                    headers={"Content-Type": "application/octet-stream"})  # fmt: skip
        return json_response(self._file_view(obj, request))


def _read_all(path: Any) -> Any:
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            yield chunk

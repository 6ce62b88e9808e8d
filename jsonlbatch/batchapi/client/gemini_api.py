"""The submit side's adapter for Gemini's batch mode (a `BatchProvider`).

A part of chat-completion lines is translated to Gemini's JSONL (`{"key", "request"}`, each
body through `chat_to_gemini`, checked line by line before anything was submitted), uploaded
with Google's resumable protocol, and made a job by `models/{model}:batchGenerateContent` with a
display name that marks the run and part, which is how a job made before a crash is found
again. A job is shown to `Submitter` in OpenAI's shape (`BATCH_STATE_*` and the SDK's
`JOB_STATE_*` both read); its results file comes back as OpenAI Batch output lines whose bodies
are `chat.completion`s, so every later stage reads them as any other. The API version is the
URL's (`.../v1beta` or `.../v1`); `v1beta` when the URL names none.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from jsonlbatch.batch_format.records import json_object
from jsonlbatch.batchapi.client.batch_api import BatchApi, RemoteError
from jsonlbatch.batchapi.client.paging import Pages
from jsonlbatch.batchapi.client.result_merge import ResultsGuard
from jsonlbatch.batchapi.formats.batch_objects import epoch_of, new_id
from jsonlbatch.batchapi.formats.gemini_format import chat_to_gemini, gemini_to_chat_response
from jsonlbatch.file_io.jsonl import iter_lines, rewrite_atomically
from jsonlbatch.redact import register_secret

_STATES = {
    "PENDING": "validating",
    "QUEUED": "validating",
    "RUNNING": "in_progress",
    "CANCELLING": "cancelling",
    "SUCCEEDED": "completed",
    "PARTIALLY_SUCCEEDED": "completed",
    "FAILED": "failed",
    "CANCELLED": "cancelled",
    "EXPIRED": "expired",
}


def display_name(metadata: Mapping[str, str]) -> str:
    return f"jsonlbatch-{metadata.get('jsonlbatch_run')}-part{metadata.get('jsonlbatch_part')}"


class GeminiBatchApi(BatchApi):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        api_key = kwargs.get("api_key")
        user = dict(kwargs.get("headers") or {})
        super().__init__(*args, **kwargs)
        self.headers = {"Accept": "application/json"}
        if api_key:
            register_secret(api_key)
            self.headers["x-goog-api-key"] = api_key
        self.headers.update(user)
        path = urllib.parse.urlsplit(self.endpoint.base).path.strip("/")
        self.version = path.split("/")[-1] if path.split("/")[-1] in ("v1", "v1beta") else "v1beta"

    def _at(self, path: str) -> str:
        return self.endpoint.root_url(f"/{path}")

    # -- files -----------------------------------------------------------------------------

    async def upload(self, path: Path, filename: str) -> dict[str, Any]:
        """The part in Gemini's JSONL, uploaded resumably. The file id names the part's model
        too (`MODEL/files/ID`): a job is made per model, and the part file is all that says it."""
        translated = path.with_suffix(".gemini.jsonl")
        model = ""

        def lines() -> Any:
            nonlocal model
            for _, raw in iter_lines(path):
                line = orjson.loads(raw)
                model = model or line["body"].get("model") or ""
                yield (
                    orjson.dumps(
                        {"key": line["custom_id"], "request": chat_to_gemini(line["body"])[0]}
                    )
                    + b"\n"
                )

        rewrite_atomically(translated, lines())
        size = translated.stat().st_size
        replies: dict[str, str] = {}
        start = f"upload/{self.version}/files"
        await self._call("POST", "/" + start, url=self._at(start), replies=replies,
                         json={"file": {"displayName": filename}},
                         headers={"X-Goog-Upload-Protocol": "resumable", "X-Goog-Upload-Command": "start",
                                  "X-Goog-Upload-Header-Content-Length": str(size),
                                  "X-Goog-Upload-Header-Content-Type": "application/jsonl"})  # fmt: skip
        target = replies.get("x-goog-upload-url")
        if not target:
            raise RemoteError(
                f"POST {start}: no upload URL came back; is {self.endpoint.name} Gemini's API?"
            )
        done = await self._call("POST", "/" + start, url=target, body=translated,
                                headers={"X-Goog-Upload-Command": "upload, finalize",
                                         "X-Goog-Upload-Offset": "0", "Content-Length": str(size)})  # fmt: skip
        translated.unlink(missing_ok=True)
        name = (done or {}).get("file", {}).get("name") if isinstance(done, dict) else None
        if not isinstance(name, str) or not name.startswith("files/"):
            raise RemoteError(f"POST {start}: the upload did not answer with a file name")
        return {
            "id": f"{model}/{name}",
            "object": "file",
            "filename": filename,
            "status": "processed",
        }

    async def find_file(self, filename: str) -> dict[str, Any] | None:
        return None  # an upload cut short is made again: files are not billed, batches are

    async def download(self, file_id: str, dest: Path) -> None:
        model, _, name = file_id.partition("/files/")
        path = f"download/{self.version}/files/{name}:download"
        await self._fetch(
            "/" + path,
            dest,
            url=self._at(path) + "?alt=media",
            guard=lambda: ResultsGuard(lambda item: _line(item, model), id_field="key"),
        )

    # -- jobs ------------------------------------------------------------------------------

    async def create_batch(
        self, file_id: str, endpoint: str, window: str, metadata: Mapping[str, str]
    ) -> dict[str, Any]:
        model, _, name = file_id.partition("/files/")
        path = f"{self.version}/models/{urllib.parse.quote(model, safe='')}:batchGenerateContent"
        body = {
            "batch": {
                "displayName": display_name(metadata),
                "inputConfig": {"fileName": f"files/{name}"},
            }
        }
        made = await self._call("POST", "/" + path, url=self._at(path), json=body, quota=True)
        return self._job(made, "POST " + path)

    async def retrieve(self, batch_id: str) -> dict[str, Any]:
        path = f"{self.version}/{batch_id}"
        return self._job(await self._call("GET", "/" + path, url=self._at(path)), "GET " + path)

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        path = f"{self.version}/{batch_id}:cancel"
        await self._call("POST", "/" + path, url=self._at(path), json={})
        return await self.retrieve(batch_id)

    async def find_batch(
        self, metadata: Mapping[str, str], since: float, count: int | None = None
    ) -> dict[str, Any] | None:
        wanted = display_name(metadata)
        token = ""
        pages = Pages(f"GET {self.endpoint.name}/{self.version}/batches")
        while True:
            path = f"{self.version}/batches"
            url = (
                self._at(path)
                + "?"
                + urllib.parse.urlencode(
                    {"pageSize": "100", **({"pageToken": token} if token else {})}
                )
            )
            page = await self._call("GET", "/" + path, url=url)
            jobs = page.get("operations", []) if isinstance(page, dict) else None
            if not isinstance(jobs, list):
                raise RemoteError(f"GET {path}: the answer is not a page of batch jobs")
            for job in jobs:
                meta = job.get("metadata") if isinstance(job, dict) else None
                if isinstance(meta, dict) and meta.get("displayName") == wanted:
                    return self._job(job, "GET " + path)
            token = page.get("nextPageToken") or ""
            if not token:
                return None
            # Google's lists may give an empty page with a token to go on: the token is progress
            token = pages.next(token, len(jobs), empty_ok=True)

    def _job(self, obj: Any, what: str) -> dict[str, Any]:
        """A Gemini batch job (an operation) in OpenAI's batch shape."""
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        name = obj.get("name") if isinstance(obj, dict) else None
        state = str(json_object(meta).get("state") or "")
        status = _STATES.get(state.removeprefix("BATCH_STATE_").removeprefix("JOB_STATE_"))
        if (
            not isinstance(meta, dict)
            or not isinstance(name, str)
            or not name.startswith("batches/")
            or status is None
        ):
            raise RemoteError(f"{what} on {self.endpoint.name}: the answer is not a Gemini batch job; "
                              f"is {self.endpoint.name} Gemini's API?")  # fmt: skip
        stats = json_object(meta.get("batchStats"))
        model = str(meta.get("model") or "").removeprefix("models/")
        output = json_object(meta.get("output"))
        responses = output.get("responsesFile")
        return {
            "id": name,
            "object": "batch",
            "status": status,
            "request_counts": {"total": _int(stats.get("requestCount")),
                               "completed": _int(stats.get("successfulRequestCount")),
                               "failed": _int(stats.get("failedRequestCount"))},
            "output_file_id": f"{model}/{responses}" if isinstance(responses, str) else None,
            "error_file_id": None,
            "created_at": epoch_of(meta.get("createTime")),
            "metadata": {},
        }  # fmt: skip


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _line(item: dict[str, Any], model: str) -> dict[str, Any]:
    """A line of a job's results file (an object with a string `key`: `ResultsGuard` saw
    to that) as an OpenAI Batch output line."""
    line: dict[str, Any] = {"id": new_id("batch_req_"), "custom_id": item["key"]}
    response = item.get("response")
    if isinstance(response, dict):
        body = gemini_to_chat_response(response, model)
        return {**line, "response": {"status_code": 200, "body": body}, "error": None}
    error = json_object(item.get("error"))
    code = error.get("code") if isinstance(error.get("code"), int) else 500
    return {
        **line,
        "response": {"status_code": code, "body": {"error": error}},
        "error": {
            "code": f"http_{code}",
            "message": str(error.get("message") or "the request failed"),
        },
    }

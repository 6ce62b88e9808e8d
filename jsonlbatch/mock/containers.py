"""The mock's Files API, Containers files API and a deterministic hosted code interpreter.

OpenAI's Responses API runs a `code_interpreter` tool in a sandbox container: the request's
`tools[].container` is `{"type": "auto", "file_ids": [...]}` (files uploaded through the Files
API, copied into a new container) or a container's id; the answer holds a
`code_interpreter_call` item naming the container, and the message's text cites what the code
wrote with `container_file_citation` annotations. The files themselves are listed with
`GET /v1/containers/{id}/files` (each with its `source`: `user` for an input, `assistant` for
what the model wrote) and read with `.../files/{file_id}/content`. Azure OpenAI serves the same
under `/openai/...` with an `api-version` query parameter; the mock serves both.

What the mock's interpreter "writes" is derived from the prompt and the attached files' bytes
(`deliverables`), so a test can recompute every byte. Directives in the prompt's text ask for
the awkward cases a real service produces (`mock:files=N`, `mock:bytes=N`, `mock:name=NAME`,
`mock:stall`, `mock:foreign-citation`, `mock:uncited`, `mock:no-files`); `MockConfig.uncited_file`
adds one uncited file to every answer and `MockConfig.container_ttl` expires containers that
many seconds after their last use (OpenAI's: 20 minutes).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from aiohttp import BodyPartReader, web

#: How many files and bytes the mock keeps at most (a test's uploads, never a disk's worth).
_MAX_STORED_FILES = 10_000
_MAX_UPLOAD = 256 << 20
_DIRECTIVE = re.compile(r"mock:([a-z-]+)(?:=(\S+))?")
_LIST_PAGE = 100  # the listing's default and largest page, as OpenAI's `limit`


class _Mock(Protocol):
    """What these handlers use of the mock server (`app._Mock` is one)."""

    files: FileStore

    @property
    def stats(self) -> _Counted: ...

    def authorized(self, request: web.Request) -> bool: ...

    def respond(
        self, body: bytes, status: int = 200, headers: dict[str, str] | None = None
    ) -> web.Response: ...


class _Counted(Protocol):
    requests: Counter[str]  # by path


@dataclass
class StoredFile:
    id: str
    filename: str
    data: bytes
    purpose: str
    created_at: int

    def card(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": len(self.data),
                "created_at": self.created_at, "filename": self.filename,
                "purpose": self.purpose, "status": "processed"}  # fmt: skip


@dataclass
class ContainerFile:
    id: str
    path: str
    data: bytes
    source: str  # "user" (an input) or "assistant" (written by the model)
    claimed: int | None = None  # a size the listing says instead of len(data) (mock:bytes)


@dataclass
class Container:
    id: str
    files: dict[str, ContainerFile] = field(default_factory=dict)
    last_used: float = field(default_factory=time.monotonic)
    stall: bool = False  # its downloads never finish (mock:stall)


class FileStore:
    """The uploaded files and the containers of one mock app."""

    def __init__(self, container_ttl: float | None = None) -> None:
        self.ttl = container_ttl
        self.uploads: dict[str, StoredFile] = {}
        self.containers: dict[str, Container] = {}
        self.uploaded = 0  # uploads received (a test counts them)
        self.downloads = 0  # container file contents served

    def container(self, cid: str) -> Container | None:
        found = self.containers.get(cid)
        if found is None:
            return None
        if self.ttl is not None and time.monotonic() - found.last_used > self.ttl:
            del self.containers[cid]  # expired: gone, as OpenAI's are
            return None
        found.last_used = time.monotonic()
        return found


def _error(mock: _Mock, status: int, message: str) -> web.Response:
    kind = {404: "not_found", 400: "invalid_request_error"}.get(status, "error")
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return mock.respond(orjson.dumps(body), status)


def _azure_refusal(mock: _Mock, request: web.Request) -> web.Response | None:
    """Azure's dated paths (`/openai/...`) require `api-version`, as Azure does (400 without
    it); its v1 API (`/openai/v1/...`) takes none."""
    dated = request.path.startswith("/openai/") and not request.path.startswith("/openai/v1/")
    if dated and not request.query.get("api-version"):
        return _error(mock, 400, "Missing required query parameter: api-version")
    return None


def _guarded(mock: _Mock, handler: Any) -> Any:
    async def route(request: web.Request) -> web.StreamResponse:
        resource = request.match_info.route.resource
        mock.stats.requests[resource.canonical if resource else request.path] += 1  # by route
        if not mock.authorized(request):
            return mock.respond(b'{"error": "Unauthorized"}', 401)
        return _azure_refusal(mock, request) or await handler(mock, request)

    return route


async def upload(mock: _Mock, request: web.Request) -> web.StreamResponse:
    """`POST /v1/files` (multipart: `file`, `purpose`)."""
    if not request.content_type.startswith("multipart/"):
        return _error(mock, 400, "expected a multipart/form-data body with `file` and `purpose`")
    store = mock.files
    reader = await request.multipart()
    name, data, purpose = None, None, None
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            continue  # a nested multipart: not what the Files API takes
        if part.name == "file":
            name = part.filename or "upload"
            data = bytes(await part.read())
            if len(data) > _MAX_UPLOAD:
                return _error(mock, 400, "file too large")
        elif part.name == "purpose":
            purpose = (await part.text()).strip()
    if data is None or not purpose:
        return _error(mock, 400, "both `file` and `purpose` are required")
    if len(store.uploads) >= _MAX_STORED_FILES:
        return _error(mock, 400, "the mock holds too many files")
    fid = "file-" + os.urandom(12).hex()
    store.uploads[fid] = StoredFile(fid, name or "upload", data, purpose, int(time.time()))
    store.uploaded += 1
    return mock.respond(orjson.dumps(store.uploads[fid].card()))


async def file_card(mock: _Mock, request: web.Request) -> web.StreamResponse:
    """`GET /v1/files/{file_id}`."""
    found = mock.files.uploads.get(request.match_info["file_id"])
    if found is None:
        return _error(mock, 404, f"No such File object: {request.match_info['file_id']}")
    return mock.respond(orjson.dumps(found.card()))


async def file_content(mock: _Mock, request: web.Request) -> web.StreamResponse:
    """`GET /v1/files/{file_id}/content`."""
    found = mock.files.uploads.get(request.match_info["file_id"])
    if found is None:
        return _error(mock, 404, f"No such File object: {request.match_info['file_id']}")
    return web.Response(body=found.data, content_type="application/octet-stream")


def _container_of(mock: _Mock, request: web.Request) -> Container | web.Response:
    cid = request.match_info["container_id"]
    found = mock.files.container(cid)
    if found is None:
        return _error(mock, 404, f"Container {cid} not found or expired")
    return found


async def container_files(mock: _Mock, request: web.Request) -> web.StreamResponse:
    """`GET /v1/containers/{id}/files`, paged with `after` and `limit` as OpenAI's lists are."""
    found = _container_of(mock, request)
    if isinstance(found, web.Response):
        return found
    try:
        limit = max(1, min(_LIST_PAGE, int(request.query.get("limit", _LIST_PAGE))))
    except ValueError:
        return _error(mock, 400, "limit must be an integer")
    ids = list(found.files)
    after = request.query.get("after")
    start = ids.index(after) + 1 if after in found.files else 0
    page = ids[start : start + limit]
    data = [
        {"id": f.id, "object": "container.file", "container_id": found.id,
         "created_at": int(time.time()), "bytes": f.claimed or len(f.data), "path": f.path,
         "source": f.source}
        for f in (found.files[i] for i in page)
    ]  # fmt: skip
    more = start + limit < len(ids)
    body = {"object": "list", "data": data, "first_id": page[0] if page else None,
            "last_id": page[-1] if page else None, "has_more": more}  # fmt: skip
    return mock.respond(orjson.dumps(body))


async def container_file_content(mock: _Mock, request: web.Request) -> web.StreamResponse:
    """`GET /v1/containers/{id}/files/{file_id}/content`: the bytes (a stalled container sends
    half of them, then nothing, until the client gives up)."""
    found = _container_of(mock, request)
    if isinstance(found, web.Response):
        return found
    item = found.files.get(request.match_info["file_id"])
    if item is None:
        return _error(mock, 404, f"File {request.match_info['file_id']} not found")
    mock.files.downloads += 1
    if not found.stall and item.claimed is None:
        return web.Response(body=item.data, content_type="application/octet-stream")
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    if item.claimed is not None:
        resp.content_length = item.claimed
    await resp.prepare(request)
    await resp.write(item.data[: max(1, len(item.data) // 2)])
    while request.transport is not None and not request.transport.is_closing():
        await asyncio.sleep(0.2)  # never finished: the client's timeout ends it
    return resp


# -- the interpreter ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Written:
    """A file the interpreter writes: its name, bytes, and whether the answer cites it."""

    name: str
    data: bytes
    cited: bool = True
    claimed: int | None = None


def directives(prompt: str) -> dict[str, str]:
    """The `mock:key[=value]` words of a prompt."""
    return {m.group(1): m.group(2) or "" for m in _DIRECTIVE.finditer(prompt)}


def deliverables(
    prompt: str, inputs: list[tuple[str, bytes]], uncited: bool = False
) -> list[Written]:
    """What the interpreter writes for `prompt` with `inputs` (name, bytes) in its container:
    `mock:files=N` files (2 by default), each a text naming the prompt's and every input's
    SHA-256, so a test recomputes it; `mock:name=NAME` names the first; `mock:uncited` (or
    `uncited`) adds one file the answer does not cite."""
    said = directives(prompt)
    if "no-files" in said:
        return []
    count = int(said["files"]) if said.get("files", "").isdigit() else 2
    digest = hashlib.sha256(prompt.encode()).hexdigest()
    lines = [f"prompt {digest}"] + [
        f"input {name} {hashlib.sha256(data).hexdigest()} {len(data)}" for name, data in inputs
    ]
    claimed = int(said["bytes"]) if said.get("bytes", "").isdigit() else None
    out = []
    for k in range(count):
        name = f"deliverable_{k + 1}.txt"
        if k == 0 and said.get("name"):
            name = said["name"].replace("%00", "\0")
        data = ("\n".join([f"file {k + 1} of {count}", *lines]) + "\n").encode()
        out.append(Written(name, data, cited=k < 50, claimed=claimed if k == 0 else None))
    if uncited or "uncited" in said:
        out.append(Written("notes.txt", f"uncited notes {digest}\n".encode(), cited=False))
    return out


def wants_interpreter(body: dict[str, Any]) -> dict[str, Any] | None:
    """The request's code interpreter tool, if it has one."""
    for tool in body.get("tools") or ():
        if isinstance(tool, dict) and tool.get("type") == "code_interpreter":
            return tool
    return None


def run_interpreter(
    store: FileStore, tool: dict[str, Any], prompt: str, text: str, uncited: bool
) -> tuple[list[dict[str, Any]], str, list[dict[str, Any]]] | str:
    """The output items before the message, the message's text and its annotations; or why the
    request is refused (a file id the store does not hold, a container that is gone)."""
    spec = tool.get("container")
    if isinstance(spec, str):
        container = store.container(spec)
        if container is None:
            return f"Container {spec} not found or expired"
    else:
        container = Container("cntr_" + os.urandom(12).hex())
        for fid in (spec or {}).get("file_ids") or ():
            upload = store.uploads.get(fid) if isinstance(fid, str) else None
            if upload is None:
                return f"No such File object: {fid}"
            container.files["cfile_" + os.urandom(12).hex()] = ContainerFile(
                "cfile_" + fid, "/mnt/data/" + upload.filename, upload.data, "user"
            )
        store.containers[container.id] = container
    inputs = [
        (f.path.rsplit("/", 1)[-1], f.data) for f in container.files.values() if f.source == "user"
    ]
    said = directives(prompt)
    container.stall = "stall" in said
    annotations, cites = [], []
    for item in deliverables(prompt, inputs, uncited):
        fid = "cfile_" + os.urandom(12).hex()
        container.files[fid] = ContainerFile(fid, "/mnt/data/" + item.name, item.data,
                                             "assistant", item.claimed)  # fmt: skip
        if item.cited:
            cites.append((fid, item.name))
    text = text + "\n\nFiles:" if cites else text
    for fid, name in cites:
        link = f" [{name}](sandbox:/mnt/data/{name})"
        start = len(text)
        text += link
        cid = "cntr_elsewhere" if "foreign-citation" in said else container.id
        annotations.append({"type": "container_file_citation", "container_id": cid,
                            "file_id": fid, "filename": name, "start_index": start,
                            "end_index": len(text)})  # fmt: skip
    call = {"type": "code_interpreter_call", "id": "ci_" + os.urandom(12).hex(),
            "status": "completed", "container_id": container.id,
            "code": f"# writes {len(cites)} file(s) to /mnt/data", "outputs": None}  # fmt: skip
    return [call], text, annotations


def add_routes(app: web.Application, mock: _Mock) -> None:
    """The Files and Containers files routes, under OpenAI's `/v1` and Azure's `/openai`."""
    routes = (
        ("POST", "/files", upload),
        ("GET", "/files/{file_id}", file_card),
        ("GET", "/files/{file_id}/content", file_content),
        ("GET", "/containers/{container_id}/files", container_files),
        ("GET", "/containers/{container_id}/files/{file_id}/content", container_file_content),
    )
    for prefix in ("/v1", "/openai", "/openai/v1"):
        for method, path, handler in routes:
            app.router.add_route(method, prefix + path, _guarded(mock, handler))

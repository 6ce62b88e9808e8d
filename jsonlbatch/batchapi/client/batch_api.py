"""A small client of a remote Files and Batches API: OpenAI, Azure OpenAI, or `serve --batch-api`.

Addressing and credentials are exec's (`Endpoint`): a base such as `https://api.openai.com/v1`,
or Azure's `https://NAME.openai.azure.com/openai?api-version=2024-10-21` whose key goes in an
`api-key` header. Calls that fail for a passing reason (connection refused, 429, 5xx) are tried
again with exec's backoff; anything else is the caller's problem, said in one clean error.
"""

from __future__ import annotations

import asyncio
import os
import re
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import orjson

from jsonlbatch.batchapi.client.paging import Pages
from jsonlbatch.batchapi.client.result_merge import ResultsGuard
from jsonlbatch.batchapi.client.safe_names import is_plain_id
from jsonlbatch.batchapi.formats.batch_objects import ACTIVE, TERMINAL
from jsonlbatch.errors import AuthenticationError, ServerError
from jsonlbatch.exec.route.endpoints import Endpoint, auth_headers, describe_exception
from jsonlbatch.exec.send.body_caps import read_body
from jsonlbatch.exec.send.retry import Backoff, parse_retry_after
from jsonlbatch.exec.send.streaming import StreamError
from jsonlbatch.redact import redact

_CHUNK = 1 << 20


def api_path(endpoint: Endpoint, url: str) -> str:
    """A request line's `url` as a Batch API wants it: Azure's dated API (a base without
    `/v1`, with `?api-version=`) names endpoints without the `/v1` prefix."""
    base = urllib.parse.urlsplit(endpoint.base).path.rstrip("/")
    if endpoint.azure and not base.endswith("/v1") and url.startswith("/v1/"):
        return url[3:]
    return url


class RemoteError(ServerError):
    """The Batch API refused a call (not a passing failure)."""


class QuotaExceeded(RemoteError):
    """The provider's queue is full (an enqueued-token limit, a quota): a reason to wait for
    earlier batches to end and submit then, never to fail the run."""


#: How a provider's 429 says that its batch queue or quota is full, not that calls come fast.
_QUOTA = re.compile(r"queue|quota|exhausted|enqueued|token_limit", re.IGNORECASE)


class BatchProvider(Protocol):
    """What `Submitter` and `manage` need of a provider's batch API: the provider adapter seam.

    `BatchApi` below speaks OpenAI's (and Azure's, and this package's own server's) dialect; an
    adapter for another provider's batch API maps these calls and OpenAI-shaped objects (a file
    `{"id", "filename", "status"}`, a batch `{"id", "status", "request_counts",
    "output_file_id", "error_file_id", "metadata", "created_at"}`) onto its own.
    """

    async def upload(self, path: Path, filename: str) -> dict[str, Any]: ...
    async def find_file(self, filename: str) -> dict[str, Any] | None: ...
    async def download(self, file_id: str, dest: Path) -> None:
        """A batch's results file to `dest` as OpenAI Batch output lines, streamed through
        `result_merge.ResultsGuard` (the one guard on the provider's lines)."""

    async def create_batch(
        self, file_id: str, endpoint: str, window: str, metadata: Mapping[str, str]
    ) -> dict[str, Any]: ...
    async def retrieve(self, batch_id: str) -> dict[str, Any]: ...
    async def cancel(self, batch_id: str) -> dict[str, Any]: ...
    async def find_batch(
        self, metadata: Mapping[str, str], since: float, count: int | None = None
    ) -> dict[str, Any] | None: ...


class BatchApi:
    """Files and batches of one remote API, over one aiohttp session (a `BatchProvider`)."""

    def __init__(
        self,
        endpoint: Endpoint,
        session: aiohttp.ClientSession,
        *,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        max_retries: int = 8,
        backoff: Backoff | None = None,
        timeout: float = 600.0,
    ) -> None:
        self.endpoint = endpoint
        self.session = session
        self.headers = auth_headers(endpoint, api_key, headers)
        self.headers.pop("Content-Type", None)  # set per call: JSON or multipart
        self.max_retries = max_retries
        self.backoff = backoff or Backoff()
        self.timeout = timeout

    def _named(self, path: str, url: str | None) -> str:
        """The address a call goes to, for its messages: as joined (no doubled `/v1`), without
        a query string (a signed download URL's signature stays out of them)."""
        return (url or self.endpoint.url_for(path)).partition("?")[0]

    def _url(self, path: str, query: Mapping[str, str] | None = None) -> str:
        url = self.endpoint.url_for(path)
        if query:
            url += ("&" if "?" in url else "?") + urllib.parse.urlencode(query)
        return url

    async def _call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        json: Any = None,
        upload: tuple[Path, str] | None = None,
        url: str | None = None,
        body: bytes | Path | None = None,
        headers: Mapping[str, str] | None = None,
        replies: dict[str, str] | None = None,
        quota: bool = False,
    ) -> Any:
        """One API call, tried again for passing failures. `url` replaces the base + `path`
        address; `body` sends bytes (or a file's content) with `headers`; `replies` receives
        the answer's headers; with `quota`, a 429 that speaks of a queue or quota raises
        `QuotaExceeded` at once instead of being tried again."""
        what = f"{method} {self._named(path, url)}"
        attempt = 0
        while True:
            attempt += 1
            retry_after = None
            sent = {**self.headers, **(headers or {})}
            data: Any = None
            if json is not None:
                sent["Content-Type"] = "application/json"
                data = orjson.dumps(json)
            elif isinstance(body, Path):
                data = body.open("rb")
            elif body is not None:
                data = body
            try:
                if upload is not None:
                    form = aiohttp.FormData()
                    form.add_field("purpose", "batch")
                    path_, filename = upload
                    handle = open(path_, "rb")  # noqa: SIM115 - aiohttp reads and closes it
                    form.add_field(
                        "file", handle, filename=filename, content_type="application/jsonl"
                    )
                    data = form
                async with self.session.request(
                    method,
                    url or self._url(path, query),
                    data=data,
                    headers=sent,
                    proxy=self.endpoint.proxy,
                    allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=self.timeout, sock_connect=30),
                ) as resp:
                    status = resp.status
                    retry_after = parse_retry_after(resp.headers.get("Retry-After"))
                    if replies is not None:
                        replies.update({k.lower(): v for k, v in resp.headers.items()})
                    raw = await read_body(resp.content.iter_any(), declared=resp.content_length)
            except StreamError as exc:  # an answer larger than any file or batch object
                raise RemoteError(redact(f"{what}: {exc}")) from None
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                problem = describe_exception(exc) if isinstance(exc, Exception) else str(exc)
            else:
                if 200 <= status < 300:
                    try:
                        return orjson.loads(raw) if raw else None
                    except orjson.JSONDecodeError:
                        problem = f"HTTP {status} with a body that is not JSON"
                elif status in (401, 403):
                    raise AuthenticationError(
                        f"{what}: the Batch API rejected the credentials (HTTP {status}); check "
                        "--api-key (or the provider's key variable)"
                    )
                elif quota and status == 429 and _QUOTA.search(_message(raw)):
                    raise QuotaExceeded(redact(f"{what}: {_message(raw)}"))
                elif status == 429 or status >= 500 or status == 408:
                    problem = f"HTTP {status}: {_message(raw)}"
                else:
                    raise RemoteError(redact(f"{what}: HTTP {status}: {_message(raw)}"))
            if attempt > self.max_retries:
                raise ServerError(redact(f"{what} failed {attempt} times; last: {problem}"))
            await asyncio.sleep(self.backoff.delay(attempt, retry_after))

    # -- files ---------------------------------------------------------------------------------

    async def upload(self, path: Path, filename: str) -> dict[str, Any]:
        made = await self._call("POST", "/v1/files", upload=(path, filename))
        return self._shaped(made, "file", "POST /v1/files")

    async def find_file(self, filename: str) -> dict[str, Any] | None:
        """A batch input file uploaded under `filename` (a crash may have hidden its id)."""
        async for obj in self._pages("/v1/files", {"purpose": "batch"}):
            found = isinstance(obj, dict) and obj.get("filename") == filename
            if found and obj.get("status") != "error":
                return self._shaped(obj, "file", "GET /v1/files")
        return None

    async def download(self, file_id: str, dest: Path) -> None:
        """A results file's lines to `dest` (streamed; complete or absent, never half there),
        each through `ResultsGuard`: the provider's lines are data."""
        await self._fetch(f"/v1/files/{_quoted(file_id)}/content", dest, guard=ResultsGuard)

    async def _fetch(
        self,
        path: str,
        dest: Path,
        url: str | None = None,
        guard: Callable[[], ResultsGuard] | None = None,
    ) -> None:
        """GET `path` (or `url`) into `dest`, streamed, complete or absent; through a fresh
        `guard()` per attempt when given (a results file)."""
        what = f"GET {self._named(path, url)}"
        tmp = dest.with_suffix(".part")
        for attempt in range(1, self.max_retries + 2):
            try:
                async with self.session.get(
                    url or self._url(path),
                    headers=self.headers,
                    proxy=self.endpoint.proxy,
                    allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=300),
                ) as resp:
                    if resp.status != 200:
                        raw = await resp.content.read(1 << 16)  # an error's message
                        if resp.status < 500 and resp.status != 429:
                            raise RemoteError(
                                redact(f"{what}: HTTP {resp.status}: {_message(raw)}")
                            )
                        raise aiohttp.ClientResponseError(
                            resp.request_info, (), status=resp.status, message=_message(raw)
                        )
                    with open(tmp, "wb") as f:
                        check = guard() if guard is not None else None
                        async for chunk in resp.content.iter_chunked(_CHUNK):
                            f.write(check.feed(chunk) if check is not None else chunk)
                        if check is not None:
                            f.write(check.end())
                        f.flush()
                        os.fsync(f.fileno())
                os.replace(tmp, dest)
                return
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                if attempt > self.max_retries:
                    raise ServerError(redact(f"{what}: {describe_exception(exc)}")) from None
                await asyncio.sleep(self.backoff.delay(attempt))

    # -- batches -------------------------------------------------------------------------------

    async def create_batch(
        self, file_id: str, endpoint: str, window: str, metadata: Mapping[str, str]
    ) -> dict[str, Any]:
        body = {
            "input_file_id": file_id,
            "endpoint": api_path(self.endpoint, endpoint),
            "completion_window": window,
            "metadata": dict(metadata),
        }
        made = await self._call("POST", "/v1/batches", json=body)
        return self._shaped(made, "batch", "POST /v1/batches")

    async def retrieve(self, batch_id: str) -> dict[str, Any]:
        path = f"/v1/batches/{_quoted(batch_id)}"
        return self._shaped(await self._call("GET", path), "batch", f"GET {path}")

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        path = f"/v1/batches/{_quoted(batch_id)}/cancel"
        return self._shaped(await self._call("POST", path), "batch", f"POST {path}")

    def _shaped(self, obj: Any, kind: str, what: str) -> dict[str, Any]:
        """`obj` when it has the shape of the API's `kind` object (`file`, `batch`): its
        `object`, a plain `id` (it goes into URLs and file names), a known `status` and plain
        result file ids. A server that is not a Batch API (one that answers every path with a
        chat completion) is stopped here, not polled forever."""
        problem = None
        if not isinstance(obj, dict):
            problem = "the answer is not a JSON object"
        elif obj.get("object") != kind:
            problem = f"its 'object' is {obj.get('object')!r}, not {kind!r}"
        elif not is_plain_id(obj.get("id")) or obj["id"] in (".", ".."):
            problem = f"its 'id' {obj.get('id')!r} is not an id"
        elif kind == "batch":
            status = obj.get("status")
            if status not in ACTIVE | TERMINAL:
                problem = f"its 'status' {status!r} is not a batch status"
            for key in ("output_file_id", "error_file_id", "input_file_id"):
                value = obj.get(key)
                if problem is None and value is not None and not is_plain_id(value):
                    problem = f"its {key!r} {value!r} is not an id"
            counts = obj.get("request_counts")
            if problem is None and counts is not None and not isinstance(counts, dict):
                problem = "its 'request_counts' is not an object"
        if problem is not None:
            raise RemoteError(
                redact(
                    f"{what} on {self.endpoint.name}: the answer is not a Batch API {kind} "
                    f"({problem[:300]}); is {self.endpoint.name} a Files and Batches API?"
                )
            )
        return obj

    async def find_batch(
        self, metadata: Mapping[str, str], since: float, count: int | None = None
    ) -> dict[str, Any] | None:
        """The batch carrying `metadata`, created after `since` (newest first, so the search
        stops at the first older one). `count` (the part's requests) is for providers that
        keep no metadata."""
        async for obj in self._pages("/v1/batches", {"limit": "100"}):
            if not isinstance(obj, dict):
                continue
            created = obj.get("created_at")
            if not isinstance(created, (int, float)) or created < since:
                return None
            found = obj.get("metadata") or {}
            if isinstance(found, dict) and all(found.get(k) == v for k, v in metadata.items()):
                return self._shaped(obj, "batch", "GET /v1/batches")
        return None

    async def _pages(self, path: str, query: dict[str, str]) -> AsyncIterator[dict[str, Any]]:
        after: str | None = None
        pages = Pages(f"GET {self.endpoint.name}{path}")
        while True:
            page = await self._call(
                "GET", path, query={**query, **({"after": after} if after else {})}
            )
            data = page.get("data") if isinstance(page, dict) else None
            if not isinstance(data, list):
                raise RemoteError(
                    f"GET {self.endpoint.name}{path}: the answer is not a list page; is "
                    f"{self.endpoint.name} a Files and Batches API?"
                )
            for obj in data:
                yield obj
            if not page.get("has_more"):
                return
            last = data[-1] if data else None
            after = page.get("last_id") or (last.get("id") if isinstance(last, dict) else None)
            after = pages.next(after, len(data))  # a cursor that comes back would page forever


def _quoted(remote_id: str) -> str:
    """An id as one URL path segment: `../files` cannot reach another path of the API."""
    return urllib.parse.quote(str(remote_id), safe="")


def _message(raw: bytes) -> str:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw[:300].decode("utf-8", "replace")
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            return str(error.get("message") or error)[:500]
        return str(error)[:500]
    return str(body)[:300]

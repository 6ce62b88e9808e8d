"""Reference files through the Files API: each distinct content uploaded once, its id reused.

A request read with `file://sha256:<hex>` where a file id goes (`prepare/file_refs.py`) is sent
with the id of that content's upload in its place. Uploads are made once per content and
server for the run (concurrent requests wait for the one upload), and remembered in a small
sidecar beside the output (`<output>.files.json`, and `uploads.json` in the `--cache` folder),
so a later run on the same output or cache reuses them: a remembered id is checked with
`GET /v1/files/{id}` once per run before it is used (a deleted or expired file is uploaded
again). The sidecar is rewritten atomically; a torn or hostile one is ignored, never trusted
for more than an id to check.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import stat
from collections.abc import Sequence
from typing import Any, BinaryIO

import aiohttp
import orjson

from jsonlbatch.batch_format.records import Request, Result
from jsonlbatch.errors import OutputError
from jsonlbatch.exec.prepare.file_refs import HASHED, SCHEME, FileRefs, file_slots
from jsonlbatch.exec.route.endpoints import Endpoint, describe_exception
from jsonlbatch.file_io.jsonl import rewrite_atomically

#: What the uploads are for (OpenAI: `user_data` serves code interpreter and `input_file`).
PURPOSE = "user_data"
_ID = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}"
)  # a file id a server gives, before it goes in a path


class UploadFailed(Exception):
    """A reference file could not be uploaded: the request's failure line says which."""


def sidecar_paths(output: str, cache: str | None) -> list[str]:
    """Where the uploads are remembered: beside the output, and in the answer cache's folder."""
    paths = [output + ".files.json"]
    if cache is not None:
        paths.append(os.path.join(cache, "uploads.json"))
    return paths


class Uploads:
    """The uploads of one run: content hash -> server -> file id."""

    def __init__(
        self, refs: FileRefs, sidecars: Sequence[str], session: aiohttp.ClientSession,
        timeout: float,
    ) -> None:  # fmt: skip
        self.refs = refs
        self.sidecars = list(sidecars)
        self.session = session
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.known: dict[str, dict[str, str]] = {}
        for path in self.sidecars:
            for sha, ids in _read_sidecar(path).items():
                self.known.setdefault(sha, {}).update(ids)
        self._pending: dict[tuple[str, str], asyncio.Future[str]] = {}
        self.uploaded = 0  # uploads this run made
        self.reused = 0  # remembered ids confirmed and used

    async def swap(self, req: Request, endpoint: Endpoint, headers: dict[str, str]) -> Request:
        """`req` with each hashed reference replaced by its file id on `endpoint` (uploaded
        if needed); raises `UploadFailed` naming the file."""
        slots = [s for s in file_slots(req.body) if str(s[1][s[2]]).startswith(SCHEME)]
        if not slots:
            return req
        for _, holder, key in slots:  # a path its scan read but the send could not: gone since
            value = holder[key]
            if not value.startswith(HASHED):
                found = self.refs.reference(value[len(SCHEME) :])
                raise UploadFailed(found if isinstance(found, str) else f"{value} changed")
        body = orjson.loads(orjson.dumps(req.body))  # the request as read stays as it is
        for _, holder, key in file_slots(body):
            value = holder[key]
            if isinstance(value, str) and value.startswith(HASHED):
                holder[key] = await self.file_id(value[len(HASHED) :], endpoint, headers)
        return Request(req.custom_id, req.url, body, req.line, fingerprint=req.fingerprint,
                       priority=req.priority)  # fmt: skip

    async def file_id(self, sha: str, endpoint: Endpoint, headers: dict[str, str]) -> str:
        """The id of `sha`'s upload on `endpoint`: one upload (or one check) per run."""
        key = (sha, endpoint.name)
        future = self._pending.get(key)
        if future is None:
            future = self._pending[key] = asyncio.ensure_future(
                self._obtain(sha, endpoint, headers)
            )
        try:
            return await asyncio.shield(future)
        except UploadFailed:
            if self._pending.get(key) is future:
                del self._pending[key]  # the next request tries again
            raise

    async def _obtain(self, sha: str, endpoint: Endpoint, headers: dict[str, str]) -> str:
        remembered = self.known.get(sha, {}).get(endpoint.name)
        if remembered is not None and await self._exists(remembered, endpoint, headers):
            self.reused += 1
            return remembered
        ref = self.refs.by_hash.get(sha)
        if ref is None:
            raise UploadFailed(f"no local file with sha256 {sha} was read in this run")
        fid = await self._upload(ref.path, ref.filename, ref.size, endpoint, headers)
        self.uploaded += 1
        self.known.setdefault(sha, {})[endpoint.name] = fid
        self._save()
        return fid

    async def _exists(self, fid: str, endpoint: Endpoint, headers: dict[str, str]) -> bool:
        try:
            async with self.session.get(
                endpoint.url_for(f"/v1/files/{fid}"), headers=_plain(headers),
                proxy=endpoint.proxy, timeout=self.timeout, allow_redirects=False,
            ) as resp:  # fmt: skip
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False

    async def _upload(
        self, path: str, filename: str, size: int, endpoint: Endpoint, headers: dict[str, str]
    ) -> str:
        shown = f"file://{path}"
        form = aiohttp.FormData()
        form.add_field("purpose", PURPOSE)
        try:
            with _open_as_read(path, size) as f:
                form.add_field("file", f, filename=filename,
                               content_type="application/octet-stream")  # fmt: skip
                async with self.session.post(
                    endpoint.url_for("/v1/files"), data=form, headers=_plain(headers),
                    proxy=endpoint.proxy, timeout=self.timeout, allow_redirects=False,
                ) as resp:  # fmt: skip
                    raw = await resp.read()
                    status = resp.status
        except OSError as exc:
            raise UploadFailed(f"cannot read {shown}: {exc.strerror or exc}") from None
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise UploadFailed(f"uploading {shown} failed: {describe_exception(exc)}") from None
        try:
            fid = orjson.loads(raw).get("id") if status == 200 else None
        except (orjson.JSONDecodeError, AttributeError):
            fid = None
        if not isinstance(fid, str) or not _ID.fullmatch(fid):
            raise UploadFailed(f"uploading {shown} failed: HTTP {status}, no file id")
        return fid

    def _save(self) -> None:
        data = orjson.dumps({"uploads": self.known}, option=orjson.OPT_SORT_KEYS)
        for path in self.sidecars:
            with contextlib.suppress(OutputError):  # an optimisation: else uploaded again
                rewrite_atomically(path, [data])


def upload_failure(req: Request, exc: UploadFailed) -> Result:
    """The failure line of a request whose reference file could not be uploaded."""
    error = {"code": "upload_failed", "message": f"{req.custom_id}: {exc}"}
    return Result(req.custom_id, None, None, None, error, {"attempts": 0})


def _open_as_read(path: str, size: int) -> BinaryIO:
    """The reference file at `path`, still the regular file of `size` bytes the scan hashed.
    Opened without blocking (a FIFO put there since would hold the event loop, and every
    request in flight, until a writer came), then checked on the open file itself."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UploadFailed(f"file://{path} is not a regular file any more")
        if st.st_size != size:
            raise UploadFailed(f"file://{path} changed since it was read ({size:,} bytes, now "
                               f"{st.st_size:,}): run again")  # fmt: skip
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _plain(headers: dict[str, str]) -> dict[str, str]:
    """The run's headers without its JSON content type (an upload is multipart)."""
    return {k: v for k, v in headers.items() if k.lower() != "content-type"}


def _read_sidecar(path: str) -> dict[str, dict[str, str]]:
    try:
        with open(path, "rb") as f:
            data: Any = orjson.loads(f.read(1 << 20))
    except (OSError, orjson.JSONDecodeError):
        return {}
    uploads = data.get("uploads") if isinstance(data, dict) else None
    found: dict[str, dict[str, str]] = {}
    for sha, ids in (uploads if isinstance(uploads, dict) else {}).items():
        if isinstance(sha, str) and isinstance(ids, dict):
            found[sha] = {
                k: v for k, v in ids.items()
                if isinstance(k, str) and isinstance(v, str) and _ID.fullmatch(v)
            }  # fmt: skip
    return found

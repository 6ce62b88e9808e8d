"""Generated files out: what a hosted code interpreter wrote, collected as each answer arrives.

A container expires (OpenAI: 20 minutes after its last use), so a later step cannot fetch what
the model wrote: `exec --files-dir DIR` does it before the answer's line is written. From a
Responses answer it takes every `container_file_citation` and every file the answer's
containers list with `source: assistant` (a file written to /mnt/data without a citation is
found only so), downloads each into `DIR/<custom_id>/<name>` and records them in the line's
`metrics.files` (name, bytes, sha256, container and file ids).

Exactly once: the files go to a staging folder under `DIR/.partial/` first, and that folder
replaces `DIR/<custom_id>/` in one rename before the line is written; a request resumed after a
kill -9 had no line, so its folder (if any) is replaced whole. Names are the server's data,
never paths (`safe_file_name`); sizes and counts are capped; a download that stalls times out.
What goes wrong is a failure of the request (its answer kept in the line, `--retry-failed` asks
again) naming the file, never a file written outside DIR.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from jsonlbatch.errors import OutputError
from jsonlbatch.exec.hooks.check_hook import AskAgain, Reject
from jsonlbatch.exec.route.endpoints import Endpoint, describe_exception
from jsonlbatch.exec.send.body_caps import read_body
from jsonlbatch.exec.send.streaming import StreamError

#: The most files one answer may leave, and the most listing entries read to find them.
MAX_FILES = 100
MAX_LISTED = 1000
MAX_FILE_BYTES = 512 << 20  # one file's cap (`--max-file-bytes`)
#: One listing page's most bytes (a page of 100 entries is some 20 KB): a larger one is hostile.
MAX_LISTING_BYTES = 8 << 20
_PAGE = 100
#: The most listing pages read: a server that answers `has_more` with empty pages and ever new
#: cursors would otherwise be asked forever (a real listing of 1,000 entries takes 10).
_MAX_PAGES = 100
_CHUNK = 1 << 16
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")  # a server's id, before it goes in a URL
_UNSAFE = re.compile(r"[^A-Za-z0-9._ ()+,=@-]")
FEEDBACK = (
    "Your answer did not produce a file. Write the deliverable file(s) to /mnt/data with the "
    "code interpreter and cite each one in your answer."
)


@dataclass(frozen=True, slots=True)
class Found:
    """A file to fetch: its container, id and the name the server gives it."""

    container_id: str
    file_id: str
    name: str
    listed_bytes: int | None = None


class FilesFailed(Exception):
    """Collection failed for a reason the failure line gives (`code`)."""

    def __init__(self, message: str, code: str = "files_failed") -> None:
        super().__init__(message)
        self.code = code


def safe_file_name(name: object) -> str:
    """A server's file name as one safe path component: its last part after any `/`, control
    characters and anything outside a small set replaced by `_`, never `.`/`..` or hidden, at
    most about 120 characters, its extension kept (a cut `.xlsx` would make the deliverable
    unopenable); a name that had to change keeps a short hash of the original, so two names
    never meet."""
    text = name if isinstance(name, str) else repr(name)
    base = text.replace("\\", "/").rsplit("/", 1)[-1]
    clean = _UNSAFE.sub("_", base).strip(" .")
    if clean == base and 0 < len(clean) <= 100:
        return clean
    tag = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    stem, dot, ext = clean.rpartition(".")
    if not dot or not stem or len(ext) > 12:
        stem, ext = clean, ""
    return f"{stem[:100] or 'file'}-{tag}" + (f".{ext}" if ext else "")


def found_in(body: Any) -> tuple[set[str], list[Found]]:
    """The containers a Responses answer used, and the files its text cites."""
    containers: set[str] = set()
    cited: list[Found] = []
    for item in body.get("output") or () if isinstance(body, dict) else ():
        if not isinstance(item, dict):
            continue
        if item.get("type") == "code_interpreter_call" and isinstance(
            item.get("container_id"), str
        ):
            containers.add(item["container_id"])
        for part in item.get("content") or () if item.get("type") == "message" else ():
            for note in part.get("annotations") or () if isinstance(part, dict) else ():
                if isinstance(note, dict) and note.get("type") == "container_file_citation":
                    cited.append(Found(str(note.get("container_id")), str(note.get("file_id")),
                                       str(note.get("filename") or note.get("file_id"))))  # fmt: skip
    return containers, cited


def staging_dir(root: str, output: str) -> str:
    """Where the run writing `output` stages its files under `root`: one folder per output (two
    runs of one output never run at once: its lock), so a run empties only its own."""
    tag = hashlib.sha256(os.path.realpath(output).encode()).hexdigest()[:16]
    return os.path.join(os.path.abspath(root), ".partial", tag)


def open_files_dir(root: str, output: str) -> None:
    """Make `--files-dir` and its staging folder, emptied of what a killed run left (never a
    finished folder); an `OutputError` naming the option when that cannot be done."""
    staging = staging_dir(root, output)
    try:
        os.makedirs(staging, exist_ok=True)
        for name in os.listdir(staging):
            shutil.rmtree(os.path.join(staging, name), ignore_errors=True)
    except OSError as exc:
        raise OutputError(f"--files-dir {root}: cannot use it: {exc.strerror}") from None


class Collector:
    """Collects each answer's files into `root` (`--files-dir`)."""

    def __init__(
        self, root: str, output: str, session: aiohttp.ClientSession, *, timeout: float,
        stall: float, max_bytes: int = MAX_FILE_BYTES, max_files: int = MAX_FILES,
    ) -> None:  # fmt: skip
        self.root = os.path.abspath(root)
        self.staging = staging_dir(root, output)
        self.session = session
        self.timeout = aiohttp.ClientTimeout(total=timeout, sock_read=stall)
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.collected = 0

    async def collect(
        self, custom_id: str, body: Any, endpoint: Endpoint, headers: dict[str, str]
    ) -> list[dict[str, Any]]:
        """Fetch the answer's files into `DIR/<custom_id>/`; what was written, one record per
        file. Raises `FilesFailed` naming the request and the file, leaving no folder for it
        (an earlier attempt's, which has no line, goes too)."""
        try:
            return await self._collect(custom_id, body, endpoint, headers)
        except FilesFailed:
            with contextlib.suppress(OSError):
                _remove(os.path.join(self.root, safe_file_name(custom_id)))
            raise

    async def _collect(
        self, custom_id: str, body: Any, endpoint: Endpoint, headers: dict[str, str]
    ) -> list[dict[str, Any]]:
        containers, cited = found_in(body)
        for item in cited:
            if item.container_id not in containers:
                raise FilesFailed(
                    f"{custom_id}: the answer cites {item.name!r} ({item.file_id}) in container "
                    f"{item.container_id!r}, which it did not use; nothing was fetched",
                    "foreign_citation",
                )
        wanted = {item.file_id: item for item in cited}
        for cid in sorted(containers):
            for item in await self._listing(custom_id, cid, endpoint, headers):
                wanted.setdefault(item.file_id, item)
        if len(wanted) > self.max_files:
            raise FilesFailed(
                f"{custom_id}: the answer left {len(wanted)}+ files, over the cap of "
                f"{self.max_files}; none was kept", "too_many_files",
            )  # fmt: skip
        target = os.path.join(self.root, safe_file_name(custom_id))
        stage = tempfile.mkdtemp(dir=self.staging)
        opened: list[int] = []  # the files' descriptors, kept for one fsync pass at the end
        try:
            records, used = [], set()
            for item in wanted.values():
                name = safe_file_name(item.name)
                stem, n = name, 1
                # two files of one name, or of names differing only in case (one file on a
                # case-insensitive disk: macOS, Windows): the second gets a number
                while name.casefold() in used:
                    n += 1
                    name = f"{n}-{stem}"
                used.add(name.casefold())
                path = os.path.join(stage, name)
                opened.append(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                record = await self._fetch(custom_id, item, opened[-1], endpoint, headers)
                path = f"{os.path.basename(target)}/{name}"  # under DIR
                records.append({"name": name, **record, "path": path})
            if records:  # on disk before the folder is in place (and long before its line)
                await asyncio.to_thread(_sync_folder, stage, opened)
            if records or os.path.lexists(target):
                _remove(target)  # an earlier attempt's, which has no line
                if records:
                    os.replace(stage, target)
        except OSError as exc:
            why = exc.strerror or str(exc)
            raise FilesFailed(f"{custom_id}: cannot write its files: {why}") from None
        finally:
            for fd in opened:
                os.close(fd)
            shutil.rmtree(stage, ignore_errors=True)
        self.collected += len(records)
        return records

    def _get(
        self, url: str, endpoint: Endpoint, headers: dict[str, str]
    ) -> contextlib.AbstractAsyncContextManager[aiohttp.ClientResponse]:
        """A GET of the container API, bounded in time, never redirected elsewhere."""
        return self.session.get(url, headers=headers, proxy=endpoint.proxy,
                                timeout=self.timeout, allow_redirects=False)  # fmt: skip

    async def _listing(
        self, custom_id: str, cid: str, endpoint: Endpoint, headers: dict[str, str]
    ) -> list[Found]:
        if not _ID.fullmatch(cid):
            raise FilesFailed(
                f"{custom_id}: the answer names a container {cid!r} that is not an id"
            )
        found: list[Found] = []
        after, seen, cursors = None, 0, set()
        for _ in range(_MAX_PAGES):
            query = f"?limit={_PAGE}" + (f"&after={after}" if after else "")
            url = endpoint.url_for(f"/v1/containers/{cid}/files")
            url = url.replace("?", query + "&", 1) if "?" in url else url + query
            try:
                async with self._get(url, endpoint, headers) as resp:
                    if resp.status != 200:
                        raise FilesFailed(
                            f"{custom_id}: listing container {cid} failed: HTTP {resp.status} "
                            "(expired?)", "container_gone" if resp.status == 404 else "files_failed",
                        )  # fmt: skip
                    raw = await read_body(
                        resp.content.iter_any(), MAX_LISTING_BYTES, resp.content_length
                    )
                page = orjson.loads(raw)
            except StreamError:
                raise FilesFailed(
                    f"{custom_id}: container {cid}'s listing page is over "
                    f"{MAX_LISTING_BYTES:,} bytes; none was kept", "too_many_files",
                ) from None  # fmt: skip
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                raise FilesFailed(f"{custom_id}: listing container {cid} failed: "
                                  f"{describe_exception(exc)}") from None  # fmt: skip
            data = page.get("data") if isinstance(page, dict) else None
            if not isinstance(data, list):
                raise FilesFailed(f"{custom_id}: container {cid}'s listing has no `data` list")
            for entry in data:
                seen += 1
                if isinstance(entry, dict) and entry.get("source") == "assistant":
                    size = entry.get("bytes")
                    found.append(Found(cid, str(entry.get("id")), str(entry.get("path") or entry.get("id")),
                                       size if type(size) is int else None))  # fmt: skip
            last = page.get("last_id")
            if not page.get("has_more") or not isinstance(last, str) or last in cursors:
                return found  # the end, or a cursor seen before (a loop: nothing new after it)
            if not _ID.fullmatch(last):  # a cursor that is not an id never goes in a URL
                raise FilesFailed(f"{custom_id}: container {cid}'s listing has a bad cursor")
            if seen >= MAX_LISTED or len(found) > self.max_files:
                raise FilesFailed(
                    f"{custom_id}: container {cid} lists more than {min(seen, MAX_LISTED)} "
                    f"files; over the cap of {self.max_files} files written; none was kept",
                    "too_many_files",
                )  # fmt: skip
            after = last
            cursors.add(last)
        raise FilesFailed(
            f"{custom_id}: container {cid}'s listing did not end after {_MAX_PAGES} pages "
            f"({seen} entries); none was kept", "too_many_files",
        )  # fmt: skip

    async def _fetch(
        self, custom_id: str, item: Found, fd: int, endpoint: Endpoint, headers: dict[str, str]
    ) -> dict[str, Any]:
        shown = f"{custom_id}: file {item.name!r} ({item.file_id})"
        if not _ID.fullmatch(item.file_id):
            raise FilesFailed(f"{shown}: not a file id")
        if item.listed_bytes is not None and item.listed_bytes > self.max_bytes:
            raise FilesFailed(f"{shown} is {item.listed_bytes:,} bytes, over the cap of "
                              f"{self.max_bytes:,} (--max-file-bytes)", "file_too_large")  # fmt: skip
        url = endpoint.url_for(f"/v1/containers/{item.container_id}/files/{item.file_id}/content")
        digest, size = hashlib.sha256(), 0
        try:
            async with self._get(url, endpoint, headers) as resp:
                if resp.status != 200:
                    raise FilesFailed(f"{shown}: download failed: HTTP {resp.status}")
                if (resp.content_length or 0) > self.max_bytes:
                    raise FilesFailed(f"{shown} is {resp.content_length:,} bytes, over the cap "
                                      f"of {self.max_bytes:,} (--max-file-bytes)",
                                      "file_too_large")  # fmt: skip
                async for chunk in resp.content.iter_chunked(_CHUNK):
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise FilesFailed(f"{shown} is over the cap of {self.max_bytes:,} "
                                          "bytes (--max-file-bytes)", "file_too_large")  # fmt: skip
                    digest.update(chunk)
                    view = memoryview(chunk)
                    while view:  # a regular file takes it whole; a short write goes on
                        view = view[os.write(fd, view) :]
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            why = (
                "stalled (timed out)"
                if isinstance(exc, asyncio.TimeoutError)
                else describe_exception(exc)
            )
            raise FilesFailed(f"{shown}: download {why}", "download_failed") from None
        except OSError as exc:
            raise FilesFailed(f"{shown}: cannot write it: {exc.strerror}", "files_failed") from None
        return {"bytes": size, "sha256": digest.hexdigest(),
                "container_id": item.container_id, "file_id": item.file_id}  # fmt: skip


def _remove(path: str) -> None:
    """Remove what is at `path` under DIR, never following a link planted there (a folder
    replaced by a link to elsewhere, a file where a folder was): the link goes, not its target."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _sync_folder(folder: str, opened: list[int]) -> None:
    """fsync the files written (`opened`), then their folder: off the event loop, one hop per
    answer (an fsync there would hold up every request in flight)."""
    for fd in opened:
        os.fsync(fd)
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def no_files_verdict(body: dict[str, Any], custom_id: str, asks_left: bool) -> Reject | AskAgain:
    """`--require-files`: an answer that left no file fails as `no_files`; with re-asks left,
    it is asked again with a short feedback turn (a user turn after its input saying why)."""
    reject = Reject(f"{custom_id}: the answer produced no file (--require-files)", "no_files",
                    keep=True)  # fmt: skip
    if not asks_left:
        return reject
    given = body.get("input")
    turns = [{"role": "user", "content": given}] if isinstance(given, str) else list(given or ())
    again = {**body, "input": [*turns, {"role": "user", "content": FEEDBACK}]}
    return AskAgain(again, reject.reason, otherwise=reject)

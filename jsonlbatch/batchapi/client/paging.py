"""Paging a provider's lists (batches, files, batch jobs) without looping for ever.

A listing follows the provider's cursor (`after`/`last_id`, Anthropic's `after_id`, Gemini's
`pageToken`) until it says there is no more. The cursor is the provider's data: one that comes
back (a broken gateway answered 109,610 list requests in 40 s with the same `last_id`), a page
that says there is more but lists nothing, a cursor missing where one is needed, or more pages
than any real account holds all end the listing with a `PagingError` that says so, instead of
a loop. A listing during a run is also abandoned at once when the run is told to stop
(`unless_stopped`), so SIGTERM is never kept waiting by a provider that pages slowly.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable
from typing import Any, TypeVar

from jsonlbatch.errors import ServerError

#: More pages than this is no real account's list (a million batches at 100 a page).
MAX_PAGES = 10_000

T = TypeVar("T")


class PagingError(ServerError):
    """A provider's list does not end: a cursor came back, or a page made no progress."""


class Stopped(Exception):
    """The run was told to stop while a listing was under way (nothing was changed)."""


class Pages:
    """The cursors of one listing, checked as they come (`next`)."""

    def __init__(self, what: str, max_pages: int = MAX_PAGES) -> None:
        self.what = what  # "GET https://api.anthropic.com/v1/messages/batches"
        self.max_pages = max_pages
        self.pages = 0
        self._seen: set[bytes] = set()  # digests: a cursor may be long, and is not ours

    def next(self, cursor: Any, items: int, *, empty_ok: bool = False) -> str:
        """The cursor of the page after one of `items` items that said there is more: checked
        to be new (and, unless `empty_ok`, the page to have listed something)."""
        self.pages += 1
        if items == 0 and not empty_ok:
            raise PagingError(
                f"{self.what}: page {self.pages} says there is more but lists nothing; the "
                "provider's paging makes no progress, so the listing stops here"
            )
        if not isinstance(cursor, str) or not cursor:
            raise PagingError(
                f"{self.what}: page {self.pages} says there is more but gives no cursor to it"
            )
        digest = hashlib.blake2b(cursor.encode("utf-8", "replace"), digest_size=16).digest()
        if digest in self._seen:
            shown = cursor if len(cursor) <= 60 else cursor[:57] + "..."
            raise PagingError(
                f"{self.what}: page {self.pages} gives the cursor {shown!r} again; the "
                "provider's paging would loop for ever, so the listing stops here"
            )
        if self.pages >= self.max_pages:
            raise PagingError(
                f"{self.what}: more than {self.max_pages:,} pages; the provider's paging does not "
                "end, so the listing stops here"
            )
        self._seen.add(digest)
        return cursor


async def unless_stopped(work: Awaitable[T], stopping: asyncio.Event) -> T:
    """`work`'s result, or `Stopped` as soon as `stopping` is set (the work is cancelled)."""
    task = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise Stopped
    return task.result()

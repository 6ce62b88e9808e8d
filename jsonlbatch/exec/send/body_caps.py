"""How much one answer may hold: the caps on HTTP bodies and streams, in one place.

A server chooses how much it sends. A 971 KB gzip body that inflated to 1 GB took 4 GB of memory
and ended in a MemoryError traceback; a chunked body or a stream that never ends grew until the
1,800 s `--timeout`. So every body exec reads is read here, counted in decoded bytes (after gzip,
deflate or br), and stopped at `max_response_bytes` (64 MiB by default, `--max-response-bytes` to
raise it): the answer is then a failure line `response_too_large`, not retried (the same request
would get the same answer), never a crash. A stream that keeps sending bytes (pings, empty
events) without an event that carries output for `stream_stall` seconds (600 by default,
`--stream-stall-timeout`) fails as `stream_stalled`; a server that sends nothing at all is
`--timeout`'s.

The Batch API client reads its JSON answers here too (`batchapi/client/batch_api.py`), with the default cap.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterable, Callable

from jsonlbatch.exec.send.streaming import StreamError, StreamReader

#: Decoded bytes one answer (plain or streamed) may hold before it is refused.
MAX_RESPONSE_BYTES = 64 << 20
#: Seconds a stream may send bytes without an event that carries output.
STREAM_STALL_S = 600.0
TOO_LARGE = "response_too_large"
STALLED = "stream_stalled"


def too_large(limit: int) -> StreamError:
    return StreamError(
        TOO_LARGE,
        f"the answer is larger than {limit:,} bytes (decoded); raise --max-response-bytes if "
        "such answers are expected",
    )


async def read_body(
    reads: AsyncIterable[bytes], limit: int = MAX_RESPONSE_BYTES, declared: int | None = None
) -> bytes:
    """A whole body from its decoded reads (`resp.content.iter_any()`), at most `limit` bytes;
    `declared` is the Content-Length, refused at once when it is already over."""
    if declared is not None and declared > limit:
        raise too_large(limit)
    parts: list[bytes] = []
    size = 0
    async for data in reads:
        size += len(data)
        if size > limit:
            raise too_large(limit)
        parts.append(data)
    return b"".join(parts)


async def read_stream(
    reads: AsyncIterable[bytes],
    *,
    chat: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> StreamReader:
    """Read a whole SSE answer, e.g. `await read_stream(resp.content.iter_any())`."""
    _, reader = await read_answer(reads, chat=chat, clock=clock, sniff=False)
    assert reader is not None
    return reader


async def read_answer(
    reads: AsyncIterable[bytes],
    *,
    chat: bool = True,
    clock: Callable[[], float] = time.perf_counter,
    sniff: bool = True,
    limit: int = MAX_RESPONSE_BYTES,
    stall: float = STREAM_STALL_S,
) -> tuple[bytes, StreamReader | None]:
    """Read the answer to a streamed request: (raw body, None) when it is plain JSON, else
    (b"", the `StreamReader` of its events).

    Decided by the content, not the Content-Type header, which servers and proxies get wrong
    both ways: a body whose first byte (after blanks) opens a JSON value is plain JSON
    (`sniff=False` reads it as SSE whatever it holds). `[DONE]` ends the answer: nothing after it
    is waited for, so a server that keeps the connection open does not hold the request until
    its timeout. (aiohttp reuses the connection when the body's end came with `[DONE]`, as it
    does from vLLM and SGLang, and closes it otherwise.) At most `limit` bytes are read, and
    bytes without an event that carries output for `stall` seconds end it (`body_caps.py`).
    """
    it = aiter(reads)
    head = b""
    try:
        while not head.strip():
            head += await anext(it)
            if len(head) > limit:
                raise too_large(limit)
    except StopAsyncIteration:
        pass
    size = len(head)
    if sniff and head.lstrip()[:1] in (b"{", b"["):
        parts = [head]
        async for data in it:
            size += len(data)
            if size > limit:
                raise too_large(limit)
            parts.append(data)
        return b"".join(parts), None
    reader = StreamReader(chat=chat)
    now = clock()
    if head:
        reader.feed(head, now)
    seen, moved = reader.chunks, now  # output events so far, and when the count last moved
    while not reader.done:
        try:
            data = await anext(it)
        except StopAsyncIteration:
            break
        size += len(data)
        if size > limit:
            raise too_large(limit)
        now = clock()
        reader.feed(data, now)
        if reader.chunks != seen:
            seen, moved = reader.chunks, now
        elif now - moved > stall:
            raise StreamError(
                STALLED, f"the stream sent bytes but no output for {stall:g}s (pings, empty events)"
            )
    reader.close(clock())
    return b"", reader

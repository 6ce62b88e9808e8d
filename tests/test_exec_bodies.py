"""What one answer may hold (exec/send/body_caps.py): a gzip bomb, a body that never ends and a stream
that never ends or only pings are failure lines, never a crash or a run held until --timeout.
Real servers on 127.0.0.1; caps set low so the bombs stay small."""

from __future__ import annotations

import asyncio
import functools
import gzip

import pytest
from aiohttp import web
from batchutil import exec_cli, odd_server, read_results, write_requests

SMALL = ("--max-response-bytes", "256KiB", "--max-retries", "2", "--backoff", "0.01")


@functools.cache
def _bomb() -> bytes:
    """8 MB of JSON inflated from about 8 KB of gzip."""
    answer = b'{"id": "b", "choices": [{"index": 0, "message": {"content": "'
    return gzip.compress(answer + b"a" * 8_000_000 + b'"}}]}', 9)


def _run(tmp_path, handler, *args: str, count: int = 2):
    url, stop = odd_server(handler)
    write_requests(tmp_path / "in.jsonl", count)
    try:
        done = exec_cli(tmp_path / "in.jsonl", tmp_path / "out.jsonl", "--url", url, *args)
    finally:
        stop()
    assert "Traceback" not in done.stderr, done.stderr
    return done, read_results(tmp_path / "out.jsonl")


def test_a_gzip_bomb_is_a_response_too_large_line_sent_once(tmp_path):
    calls = []

    async def handler(request: web.Request) -> web.Response:
        calls.append(1)
        await request.read()
        return web.Response(
            body=_bomb(),
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
        )

    done, results = _run(tmp_path, handler, *SMALL)
    assert done.returncode == 3 and len(results) == 2
    for line in results.values():
        assert line["error"]["code"] == "response_too_large", line
        assert "--max-response-bytes" in line["error"]["message"]
    assert len(calls) == 2  # not retried: the same request gets the same answer


@pytest.mark.parametrize("stream", [False, True])
def test_a_body_that_never_ends_is_cut_at_the_cap(tmp_path, stream):
    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        kind = "text/event-stream" if stream else "application/json"
        resp = web.StreamResponse(headers={"Content-Type": kind})
        await resp.prepare(request)
        event = b'data: {"id": "s", "choices": [{"index": 0, "delta": {"content": "xxxx"}}]}\n\n'
        await resp.write(b"" if stream else b'{"id": "x", "choices": [')
        for _ in range(100_000):  # bounded: far past the cap, never to an end
            await resp.write(event if stream else b'{"index": 0},' * 64)
            await asyncio.sleep(0)
        return resp

    args = (*SMALL, "--stream") if stream else SMALL
    done, results = _run(tmp_path, handler, *args, "--timeout", "120", count=1)
    assert done.returncode == 3, done.stderr
    [line] = results.values()
    assert line["error"]["code"] == "response_too_large", line


def test_a_stream_of_pings_without_output_stalls_out(tmp_path):
    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(
            b'data: {"id": "s", "choices": [{"index": 0, "delta": {"role": "a"}}]}\n\n'
        )
        for _ in range(6000):  # bounded: a minute of pings at most
            if request.transport is None or request.transport.is_closing():
                break  # the client gave up: stop at once, so that the server's cleanup is quick
            await resp.write(b": ping\n\n")
            await asyncio.sleep(0.01)
        return resp

    done, results = _run(
        tmp_path, handler, "--stream", "--stream-stall-timeout", "0.5", "--max-retries", "0",
        "--timeout", "120", count=1,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    [line] = results.values()
    assert line["error"]["code"] == "stream_stalled", line


def test_the_size_option_takes_units_and_refuses_nonsense(tmp_path):
    import click
    from batchutil import cli

    from jsonlbatch.cli.params import BYTES

    assert [BYTES.convert(v, None, None) for v in ("2048", "64MiB", "500KB", "1g")] == [
        2048,
        64 << 20,
        500_000,
        1 << 30,
    ]
    for bad in ("12", "lots", "2TiB", "-5M"):
        with pytest.raises(click.BadParameter):
            BYTES.convert(bad, None, None)
    done = cli("exec", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "o.jsonl"),
               "--url", "http://127.0.0.1:9/v1", "--max-response-bytes", "lots")  # fmt: skip
    assert done.returncode == 2 and "--max-response-bytes" in done.stderr, done.stderr

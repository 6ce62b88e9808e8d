"""Hosted code interpreter files under attack: a link planted where a request's folder goes,
server names too long to keep whole, Azure's v1 paths, a reference file swapped for a pipe
between the scan and the upload. On the mock over HTTP, with real files."""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from batchutil import ENV, cli, read_results, serve_app
from test_hosted_files import ci_line, write

from jsonlbatch.batch_format.records import Request
from jsonlbatch.exec.prepare.file_refs import FileRefs
from jsonlbatch.exec.route.endpoints import parse_endpoint
from jsonlbatch.exec.send.file_collect import safe_file_name
from jsonlbatch.exec.send.file_uploads import UploadFailed, Uploads
from jsonlbatch.mock import BackgroundMock, MockConfig


@pytest.fixture
def mock():
    with BackgroundMock(MockConfig()) as server:
        yield server


@pytest.mark.parametrize("planted", ["link-to-folder", "dangling-link", "plain-file"])
def test_a_link_planted_at_a_requests_folder_is_replaced_never_followed(tmp_path, mock, planted):
    """A request with no line (a kill -9 after its folder was made, or a user's mistake) whose
    DIR/<custom_id> is now a link to elsewhere: the link goes, its target stays untouched, and
    the request gets its files (it used to fail on every retry: 'cannot write its files: None')."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    fdir = tmp_path / "files"
    fdir.mkdir()
    if planted == "link-to-folder":
        (fdir / "r1").symlink_to(outside)
    elif planted == "dangling-link":
        (fdir / "r1").symlink_to(tmp_path / "gone")
    else:
        (fdir / "r1").write_text("not a folder")
    req = write(tmp_path / "req.jsonl", [ci_line("r1", "make it", [])])
    out = tmp_path / "out.jsonl"
    done = cli("exec", str(req), "-o", str(out), "--url", mock.url, "--files-dir", str(fdir), "-q")
    assert done.returncode == 0, done.stderr + done.stdout
    line = read_results(out)["r1"]
    assert line.get("error") is None
    folder = fdir / "r1"
    assert folder.is_dir() and not folder.is_symlink()
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        f["name"] for f in line["metrics"]["files"]
    )
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    assert (outside / "keep.txt").read_text() == "mine"


def test_a_name_too_long_to_keep_keeps_its_extension(tmp_path, mock):
    long = "Quarterly summary for the board " * 6 + ".xlsx"
    req = write(tmp_path / "req.jsonl", [ci_line("r1", f"mock:name={long.replace(' ', '_')}", [])])
    out, fdir = tmp_path / "out.jsonl", tmp_path / "files"
    done = cli("exec", str(req), "-o", str(out), "--url", mock.url, "--files-dir", str(fdir), "-q")
    assert done.returncode == 0, done.stderr
    names = [f["name"] for f in read_results(out)["r1"]["metrics"]["files"]]
    assert names[0].endswith(".xlsx") and len(names[0]) <= 122
    assert (fdir / "r1" / names[0]).is_file()


@pytest.mark.parametrize(
    "name, kept",
    [
        ("x" * 5000 + ".txt", ".txt"),
        ("résumé" * 40 + ".docx", ".docx"),
        ("a" * 150, ""),  # no extension: none made up
        ("report_" * 20 + "." + "z" * 40, ""),  # an "extension" of 40 letters is not one
    ],
)
def test_safe_file_name_keeps_a_real_extension_within_its_length(name, kept):
    safe = safe_file_name(name)
    assert len(safe) <= 122 and "/" not in safe
    assert re.search(r"-[0-9a-f]{8}" + re.escape(kept) + "$", safe), safe
    assert safe != safe_file_name(name + "x")  # two long names never meet


def test_azure_v1_paths_need_no_api_version(tmp_path, mock):
    """Azure OpenAI's v1 API (`.../openai/v1`) takes no `api-version` (Microsoft's "API version
    lifecycle" page); docs/files.md lists it, so the mock must serve it as Azure does."""
    ref = tmp_path / "ledger.csv"
    ref.write_text("a,b\n1,2\n")
    base = mock.url.removesuffix("/v1") + "/openai/v1"
    req = write(tmp_path / "req.jsonl", [ci_line("r1", "make it", [f"file://{ref}"])])
    out, fdir = tmp_path / "out.jsonl", tmp_path / "files"
    done = cli("exec", str(req), "-o", str(out), "--url", base, "--files-dir", str(fdir), "-q")
    assert done.returncode == 0, done.stderr
    line = read_results(out)["r1"]
    assert line.get("error") is None and len(line["metrics"]["files"]) == 2
    assert mock.stats.requests.get("/openai/v1/files", 0) == 1


def test_a_reference_swapped_for_a_pipe_after_the_scan_fails_its_request(tmp_path, mock):
    """The scan read a regular file; by the upload it is a FIFO. Opening it plainly would block
    the event loop (every request in flight) until a writer came: it fails the request instead."""
    ref = tmp_path / "ref.csv"
    ref.write_text("a")
    refs = FileRefs()
    body = ci_line("g", "x", [f"file://{ref}"])["body"]
    assert refs.resolve(body) == []
    ref.unlink()
    os.mkfifo(ref)
    caught: list[BaseException] = []

    async def send() -> None:
        async with aiohttp.ClientSession() as session:
            uploads = Uploads(refs, [str(tmp_path / "side.json")], session, 5.0)
            endpoint = parse_endpoint(mock.url)
            await uploads.swap(Request("g", "/v1/responses", body), endpoint, {})

    def run() -> None:
        try:
            asyncio.run(send())
        except BaseException as exc:  # handed to the test's thread
            caught.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # blocked opening the pipe: let it go, then fail
        fd = os.open(ref, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        worker.join(10)
        pytest.fail("the upload blocked on a FIFO put where the reference file was")
    assert len(caught) == 1 and isinstance(caught[0], UploadFailed), caught
    assert "not a regular file" in str(caught[0])
    assert mock.stats.requests.get("/v1/files", 0) == 0


def test_files_dir_with_a_cache_from_the_environment_says_how_to_turn_it_off(tmp_path, mock):
    """A user who never typed --cache (it came from $JSONLBATCH_CACHE) is told the way out."""
    req = write(tmp_path / "req.jsonl", [ci_line("r1", "make it", [])])
    env = {**ENV, "JSONLBATCH_CACHE": str(tmp_path / "cache")}
    args = ("exec", str(req), "-o", str(tmp_path / "out.jsonl"), "--url", mock.url,
            "--files-dir", str(tmp_path / "files"), "-q")  # fmt: skip
    refused = cli(*args, env=env)
    assert refused.returncode == 2 and "--cache off" in refused.stderr, refused.stderr
    assert "JSONLBATCH_CACHE" in refused.stderr and "Traceback" not in refused.stderr
    assert cli(*args, "--cache", "off", env=env).returncode == 0


def _container_server(listing, pages: list | None = None) -> tuple[str, Callable[[], None]]:
    """A Responses server whose answers used container `cntr_1`, which lists what `listing`
    streams (given the page's `after` cursor); each file's content is its id. `pages` gets
    each listing page's cursor."""
    from aiohttp import web

    pages = [] if pages is None else pages

    async def respond(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"id": "resp_1", "object": "response", "status": "completed",
            "model": "mock", "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
            "output": [{"type": "code_interpreter_call", "id": "ci", "container_id": "cntr_1",
                        "code": "", "status": "completed"},
                       {"type": "message", "id": "m", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": "ok", "annotations": []}]}]})  # fmt: skip

    async def files(request: web.Request) -> web.StreamResponse:
        pages.append(request.query.get("after"))
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        for chunk in listing(request.query.get("after")):
            await resp.write(chunk)
        return resp

    async def content(request: web.Request) -> web.Response:
        return web.Response(body=request.match_info["fid"].encode())

    app = web.Application()
    app.router.add_post("/v1/responses", respond)
    app.router.add_get("/v1/containers/{cid}/files", files)
    app.router.add_get("/v1/containers/{cid}/files/{fid}/content", content)
    return serve_app(app)


def _run_on(tmp_path: Path, listing, pages: list | None = None):
    """exec --files-dir of one request on `_container_server(listing)`: (its run, out, DIR)."""
    url, stop = _container_server(listing, pages)
    try:
        req = write(tmp_path / "req.jsonl", [ci_line("r1", "x", [])])
        out, fdir = tmp_path / "out.jsonl", tmp_path / "files"
        done = cli("exec", str(req), "-o", str(out), "--url", url, "--files-dir", str(fdir),
                   "--model", "mock", "-q", timeout=60)  # fmt: skip
    finally:
        stop()
    return done, out, fdir


def test_a_listing_page_without_end_fails_the_request_in_bounded_memory(tmp_path):
    """A listing page is read whole before it is parsed: one that never ends (or holds a
    gigabyte) used to grow until memory or --timeout ran out; it fails at 8 MB."""

    def endless(after):
        yield b'{"object": "list", "data": [' + b'{"id": "cfile_0", "source": "user"},' * 100
        for _ in range(20_000):  # 40 MB in 2 KB pieces: past the cap, within a test's time
            yield b" " * 2048

    done, out, fdir = _run_on(tmp_path, endless)
    assert done.returncode == 3, done.stderr
    error = read_results(out)["r1"]["error"]
    assert error["code"] == "too_many_files" and "listing page is over" in error["message"]
    assert [p.name for p in fdir.iterdir()] == [".partial"]


def test_names_differing_only_in_case_are_two_files_on_any_disk(tmp_path):
    """`Report.txt` and `report.txt` are one file on macOS's and Windows' disks: the second
    gets a number, so a run gives the same names everywhere and never fails on 'File exists'."""
    entries = [{"id": f"cfile_{i}", "path": f"/mnt/data/{name}", "source": "assistant",
                "bytes": 7} for i, name in enumerate(["Report.txt", "report.txt", "REPORT.TXT"])]  # fmt: skip

    def listing(after):
        yield json.dumps({"object": "list", "data": entries, "has_more": False}).encode()

    done, out, fdir = _run_on(tmp_path, listing)
    assert done.returncode == 0, done.stderr
    names = [f["name"] for f in read_results(out)["r1"]["metrics"]["files"]]
    assert names == ["Report.txt", "2-report.txt", "3-REPORT.TXT"]
    assert len({n.casefold() for n in names}) == 3
    assert sorted(p.name for p in (fdir / "r1").iterdir()) == sorted(names)


@pytest.mark.parametrize("cursor", ["loop", "fresh"])
def test_a_listing_that_never_ends_is_read_a_bounded_number_of_pages(tmp_path, cursor):
    """`has_more` forever with empty pages: cursors that come round again (a, b, a, ...) end
    the listing; ever new ones fail the request after 100 pages. Either used to ask forever."""

    def listing(after):
        n = int(after.rsplit("_", 1)[1]) if after else 0
        last = f"c_{(n + 1) % 2 if cursor == 'loop' else n + 1}"
        yield json.dumps({"object": "list", "data": [], "has_more": True, "last_id": last}).encode()

    pages: list = []
    done, out, _ = _run_on(tmp_path, listing, pages)
    line = read_results(out)["r1"]
    if cursor == "loop":
        assert done.returncode == 0 and line["metrics"]["files"] == [], done.stderr
        assert len(pages) == 3  # None, c_1, c_0: c_1 again ends it
    else:
        assert done.returncode == 3 and line["error"]["code"] == "too_many_files"
        assert "did not end after 100 pages" in line["error"]["message"]
        assert len(pages) == 100

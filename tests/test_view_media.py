"""Images in the viewer: the search skips base64 payloads, the detail lists each image with a
link, and `/api/media` answers one image's decoded bytes read from its request line by offset
(the right type, refused when it is no image, too large, or remote)."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import mediautil
import pytest
from mediautil import data_url
from viewutil import ViewProcess, response_line

from jsonlbatch.errors import UsageError
from jsonlbatch.view import query as query_module
from jsonlbatch.view.index import LineIndex
from jsonlbatch.view.media import MAX_IMAGE_BYTES, Source, image_bytes
from jsonlbatch.view.query import Query, Searcher


def picture(seed: int, size: int = 48, fmt: str = "PNG") -> bytes:
    return mediautil.picture(seed, size, fmt)


def image_request(i: int, *parts: dict[str, Any]) -> dict[str, Any]:
    animal = "dog" if i % 10 == 0 else "cat"
    content = [{"type": "text", "text": f"Is this a {animal}?"}, *parts]
    return {
        "custom_id": f"task-{i:05d}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": [{"role": "user", "content": content}]},
    }


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def write_image_run(folder: Path, n: int) -> tuple[Path, Path, list[dict[str, Any]]]:
    requests = [image_request(i, image_part(data_url(picture(i)))) for i in range(n)]
    req_path, out_path = folder / "requests.jsonl", folder / "out.jsonl"
    req_path.write_text("".join(json.dumps(x) + "\n" for x in requests))
    out_path.write_text("".join(json.dumps(response_line(i)) + "\n" for i in range(n)))
    return req_path, out_path, requests


def _index(path: Path) -> LineIndex:
    index = LineIndex(str(path))
    while index.refresh():
        pass
    return index


@pytest.mark.parametrize("chunk", [61, 253, 997, 4096, 4 << 20])
def test_the_search_skips_base64_payloads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    monkeypatch.setattr(query_module, "_CHUNK", chunk)  # payloads across chunk borders too
    req_path, out_path, requests = write_image_run(tmp_path, 200)
    in_base64 = sum(
        b"dog" in json.dumps(r).lower().encode().replace(b"a dog?", b"") for r in requests
    )
    assert in_base64 > 20  # the pictures themselves hold "dog" (what the old search matched)
    searcher = Searcher(_index(out_path), [_index(req_path)])
    total, rows = searcher.page(Query(q="dog", size=500))
    assert total == 20 and rows == list(range(0, 200, 10))
    # text after an image in the same line is still found, and so is an escaped '/'
    total, _ = searcher.page(Query(q="is this a cat?", size=500))
    assert total == 180


def test_the_search_skips_anthropic_base64_sources(tmp_path: Path) -> None:
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(picture(7, 96)).decode()}}  # fmt: skip
    line = image_request(1, block)
    assert b"dog" in json.dumps(block).lower().encode()
    req_path, out_path = tmp_path / "r.jsonl", tmp_path / "o.jsonl"
    req_path.write_text(json.dumps(line) + "\n")
    out_path.write_text(json.dumps(response_line(1)) + "\n")
    searcher = Searcher(_index(out_path), [_index(req_path)])
    assert searcher.page(Query(q="dog"))[0] == 0
    assert searcher.page(Query(q="a cat"))[0] == 1


def _get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


@pytest.fixture
def viewer(tmp_path: Path) -> Any:
    png, jpeg = picture(1), picture(2, fmt="JPEG")
    svg = data_url(b"<svg xmlns='http://www.w3.org/2000/svg'><script>alert(1)</script></svg>",
                   "image/svg+xml")  # fmt: skip
    pdf = {
        "type": "file",
        "file": {"filename": "a.pdf", "file_data": data_url(b"%PDF-1.4\n", "application/pdf")},
    }
    requests = [
        image_request(0, image_part(data_url(png)), image_part(data_url(jpeg, "image/jpeg"))),
        image_request(1, image_part("https://example.org/cat.png"), pdf),
        image_request(2, image_part(svg)),
    ]
    req_path, out_path = tmp_path / "requests.jsonl", tmp_path / "out.jsonl"
    req_path.write_text("".join(json.dumps(x) + "\n" for x in requests))
    out_path.write_text("".join(json.dumps(response_line(i)) + "\n" for i in (1, 2, 0)))
    proc = ViewProcess(str(out_path), "--requests", str(req_path))
    yield proc, png, jpeg
    proc.close()


def _detail(url: str, row: int) -> dict[str, Any]:
    status, _, body = _get(f"{url}api/line?row={row}")
    assert status == 200, body
    return json.loads(body)


def test_the_detail_lists_images_and_serves_their_bytes(viewer: Any) -> None:
    proc, png, jpeg = viewer
    base = proc.url if proc.url.endswith("/") else proc.url + "/"
    detail = _detail(base, 2)  # task-00000, the third response line
    (turn,) = detail["prompt"]
    assert turn["text"] == "Is this a dog?"  # no [image_url], no base64
    first, second = turn["media"]
    assert first["kind"] == "image" and first["mime"] == "image/png" and first["bytes"] == len(png)
    assert "data:" not in json.dumps(detail)  # the page never gets the base64
    status, kind, body = _get(base + first["src"].lstrip("/"))
    assert status == 200 and kind == "image/png" and body == png
    status, kind, body = _get(base + second["src"].lstrip("/"))
    assert status == 200 and kind == "image/jpeg" and body == jpeg

    remote, pdf = _detail(base, 0)["prompt"][0]["media"]
    assert remote == {
        "kind": "image",
        "mime": None,
        "bytes": 0,
        "url": "https://example.org/cat.png",
    }
    assert pdf["kind"] == "file" and pdf["filename"] == "a.pdf" and "src" not in pdf

    (svg,) = _detail(base, 1)["prompt"][0]["media"]
    status, kind, body = _get(base + svg["src"].lstrip("/"))
    assert status == 400 and kind == "application/json" and b"not a PNG, JPEG" in body

    req_row = first["src"].split("row=")[1].split("&")[0]
    for query, wanted in (
        (f"req=0&row={req_row}&message=0&part=0", b"no image or file"),  # the text part
        (f"req=0&row={req_row}&message=3&part=1", b"no message 3"),
        ("req=5&row=0&message=0&part=1", b"req:"),
        (f"req=0&row={req_row}&message=0&part=x", b"part:"),
    ):
        status, _, body = _get(f"{base}api/media?{query}")
        assert status == 400 and wanted in body, (query, body)


def test_an_image_over_the_cap_or_with_broken_base64_is_refused() -> None:
    big = Source("image", "image/png", data="A" * (MAX_IMAGE_BYTES // 3 * 4 + 8))
    with pytest.raises(UsageError, match="over the"):
        image_bytes(big)
    with pytest.raises(UsageError, match="does not decode"):
        image_bytes(Source("image", "image/png", data="iVBORw0KG"))
    with pytest.raises(UsageError, match="not fetched"):
        image_bytes(Source("image", None, url="https://example.org/a.png"))
    # the type sniffed is the shared one (jsonlbatch.batch_format.media), which knows PDFs: a PDF named as
    # a picture is still never served from the viewer's origin
    pdf = base64.b64encode(b"%PDF-1.7\n" + b"0" * 64).decode()
    with pytest.raises(UsageError, match="not a PNG"):
        image_bytes(Source("image", "image/png", data=pdf))


def test_every_api_shape_of_an_image_is_listed_with_a_link() -> None:
    from jsonlbatch.view.detail import prompt_turns

    png = picture(3)
    b64 = base64.b64encode(png).decode()
    responses = {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "What is it?"},
        {"type": "input_image", "image_url": data_url(png)}]}]}  # fmt: skip
    messages = {"system": "Be brief.", "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
        {"type": "text", "text": "And this?"}]}]}  # fmt: skip
    link = "/api/media?m={}&p={}".format
    (turn,) = prompt_turns(responses, lambda m, p: link(m, p))
    assert turn["media"] == [{"kind": "image", "mime": "image/png", "bytes": len(png),
                              "src": "/api/media?m=0&p=1"}]  # fmt: skip
    system, user = prompt_turns(messages, lambda m, p: link(m, p))
    assert user["text"] == "And this?" and user["media"][0]["src"] == "/api/media?m=0&p=0"
    assert "media" not in system

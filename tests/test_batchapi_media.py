"""Images and files in provider batches: `exec --batch-api` translates OpenAI `image_url` and
`file` parts to Anthropic's image/document blocks and Gemini's `inlineData`, `serve --batch-api`
translates Gemini's back to chat for its upstream, every provider's limits are checked before
anything is uploaded, and what a provider cannot take is refused naming the line."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from batchapiutil import BatchServer
from batchutil import exec_cli, read_results
from mediautil import data_url, picture

FAST = ("--batch-api", "--poll-interval", "0.1")
CLAUDE, GEMINI = "claude-haiku-4-5", "gemini-2.5-flash"


PDF = b"%PDF-1.4\n1 0 obj<<>>endobj\ntrailer<<>>\n%%EOF\n"


def image_line(i: int, *parts: dict[str, Any], model: str = CLAUDE) -> dict[str, Any]:
    content = [{"type": "text", "text": f"What is in picture {i}?"}, *parts]
    return {
        "custom_id": f"img-{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": model,
            "max_tokens": 16,
            "messages": [{"role": "user", "content": content}],
        },
    }


def image_part(url: str, detail: str | None = None) -> dict[str, Any]:
    inner = {"url": url, **({"detail": detail} if detail else {})}
    return {"type": "image_url", "image_url": inner}


def write(path: Path, lines: list[dict[str, Any]]) -> None:
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))


def stored_lines(server: BatchServer) -> list[dict[str, Any]]:
    """Every request line the front stored for its runner (what it sends upstream)."""
    out = []
    for path in sorted((server.directory / "files").iterdir()):
        for raw in path.read_bytes().splitlines():
            obj = json.loads(raw)
            if "body" in obj and "url" in obj and "response" not in obj:
                out.append(obj)
    return out


def _get(url: str) -> Any:
    import urllib.request

    request = urllib.request.Request(url, headers={"x-api-key": "k", "x-goog-api-key": "k"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@pytest.fixture
def front(tmp_path: Path, mock_server: Any) -> BatchServer:
    server = BatchServer(tmp_path / "state", mock_server(served_models=(CLAUDE, GEMINI))).start()
    yield server
    server.kill()


def test_anthropic_batches_carry_images_and_pdfs(tmp_path: Path, front: BatchServer) -> None:
    png, jpeg = picture(1), picture(2, fmt="JPEG")
    pdf = {
        "type": "file",
        "file": {"filename": "a.pdf", "file_data": data_url(PDF, "application/pdf")},
    }
    lines = [
        image_line(0, image_part(data_url(png), "low")),
        image_line(1, image_part(data_url(jpeg, "image/jpeg")), pdf),
        image_line(2, image_part("https://example.org/cat.png")),
    ]
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(requests, lines)
    done = exec_cli(requests, out, "--url", front.url, *FAST, "--batch-provider", "anthropic")
    assert done.returncode == 0, done.stderr
    results = read_results(out)
    assert set(results) == {"img-0", "img-1", "img-2"}
    for line in results.values():
        assert line["response"]["status_code"] == 200
        assert line["response"]["body"]["type"] == "message"
    sent = {x["custom_id"]: x["body"]["messages"][0]["content"] for x in stored_lines(front)}
    assert sent["img-0"][1] == {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                            "data": base64.b64encode(png).decode()}}  # fmt: skip
    assert sent["img-1"][1]["source"]["media_type"] == "image/jpeg"
    assert base64.b64decode(sent["img-1"][1]["source"]["data"]) == jpeg  # the same bytes
    assert sent["img-1"][2] == {"type": "document", "source": {"type": "base64",
                                "media_type": "application/pdf", "data": base64.b64encode(PDF).decode()}}  # fmt: skip
    assert sent["img-2"][1] == {
        "type": "image",
        "source": {"type": "url", "url": "https://example.org/cat.png"},
    }
    assert sent["img-0"][0] == {"type": "text", "text": "What is in picture 0?"}


def test_gemini_batches_carry_inline_images_there_and_back(
    tmp_path: Path, front: BatchServer
) -> None:
    lines = [image_line(i, image_part(data_url(picture(i))), model=GEMINI) for i in range(3)]
    pdf = {
        "type": "file",
        "file": {"filename": "a.pdf", "file_data": data_url(PDF, "application/pdf")},
    }
    lines.append(image_line(3, pdf, model=GEMINI))
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(requests, lines)
    url = front.url.removesuffix("/v1") + "/v1beta"
    done = exec_cli(requests, out, "--url", url, *FAST, "--batch-provider", "gemini")
    assert done.returncode == 0, done.stderr
    results = read_results(out)
    assert set(results) == {f"img-{i}" for i in range(4)}
    for line in results.values():
        assert line["response"]["body"]["object"] == "chat.completion"
    # the front translated Gemini's inlineData back to chat parts for its upstream: the same
    # data: URL the file holds, byte for byte
    sent = {x["custom_id"]: x["body"]["messages"] for x in stored_lines(front)}
    assert len(sent) == 4
    by_text = {m[-1]["content"][0]["text"]: m[-1]["content"] for m in sent.values()}
    for line in lines:
        wanted = line["body"]["messages"][0]["content"]
        got = by_text[wanted[0]["text"]]
        if wanted[1]["type"] == "image_url":
            assert got[1] == {
                "type": "image_url",
                "image_url": {"url": wanted[1]["image_url"]["url"]},
            }
        else:
            assert got[1]["type"] == "file"
            assert got[1]["file"]["file_data"] == wanted[1]["file"]["file_data"]


def test_an_https_image_to_gemini_is_refused_naming_the_line(
    tmp_path: Path, front: BatchServer
) -> None:
    lines = [
        image_line(0, image_part(data_url(picture(0))), model=GEMINI),
        image_line(1, image_part("https://example.org/cat.png"), model=GEMINI),
    ]
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(requests, lines)
    done = exec_cli(requests, out, "--url", front.url, *FAST, "--batch-provider", "gemini")
    assert done.returncode == 1, done.stderr
    assert "in.jsonl:2: body.messages.0.content.1" in done.stderr
    assert "data: URL" in done.stderr and "nothing was submitted" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()
    assert _get(front.url.removesuffix("/v1") + "/v1beta/batches")["operations"] == []


@pytest.mark.parametrize("provider", ["anthropic", "gemini"])
def test_broken_base64_is_refused_before_submitting(
    tmp_path: Path, front: BatchServer, provider: str
) -> None:
    model = CLAUDE if provider == "anthropic" else GEMINI
    good = data_url(picture(0))
    lines = [
        image_line(0, image_part(good), model=model),
        image_line(1, image_part(good[:-6] + "!!" + good[-4:]), model=model),
        image_line(2, image_part("data:image/png;base64,"), model=model),  # no picture at all
    ]
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(requests, lines)
    done = exec_cli(requests, out, "--url", front.url, *FAST, "--batch-provider", provider)
    assert done.returncode == 1, done.stderr
    # exec's input scan finds it, before any provider translation
    assert "in.jsonl:2: body.messages[0].content[1].image_url.url" in done.stderr
    assert "base64 does not decode" in done.stderr and "Traceback" not in done.stderr
    assert "in.jsonl:3: body.messages[0].content[1].image_url.url: the base64 is empty" in (
        done.stderr
    )
    assert stored_lines(front) == []


@pytest.mark.parametrize(
    ("provider", "raw_mb", "cap"), [("anthropic", 25, "32,000,000"), ("gemini", 16, "20,000,000")]
)
def test_a_request_over_the_providers_cap_is_refused_naming_it(
    tmp_path: Path, front: BatchServer, provider: str, raw_mb: int, cap: str
) -> None:
    # base64 of 25 MB (33 MB) is over Anthropic's 32 MB a request; of 16 MB (21 MB) over
    # Gemini's 20 MB of inline data
    big = "data:image/png;base64," + base64.b64encode(b"\0" * (raw_mb * 1000 * 1000)).decode()
    model = CLAUDE if provider == "anthropic" else GEMINI
    lines = [image_line(0, image_part(data_url(picture(0))), model=model),
             image_line(1, image_part(big), model=model)]  # fmt: skip
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(requests, lines)
    done = exec_cli(requests, out, "--url", front.url, *FAST, "--batch-provider", provider)
    assert done.returncode == 1, done.stderr
    assert f"in.jsonl:2: a request of {len(big) // 1000 // 1000}," in done.stderr
    assert f"{provider} API's limit on a request ({cap} bytes)" in done.stderr
    assert "in.jsonl:1" not in done.stderr and "Traceback" not in done.stderr
    assert stored_lines(front) == [] and not out.exists()


def test_a_request_larger_than_a_part_is_refused_not_sent_alone(
    tmp_path: Path, front: BatchServer
) -> None:
    lines = [image_line(i, image_part(data_url(picture(i, size=48)))) for i in range(3)]
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(requests, lines)
    done = exec_cli(requests, out, "--url", front.url, *FAST, "--batch-max-bytes", "1000")
    assert done.returncode == 1, done.stderr
    assert "in.jsonl:1: a request of" in done.stderr and "--batch-max-bytes" in done.stderr
    assert stored_lines(front) == []


def test_image_batches_are_split_by_bytes(tmp_path: Path, front: BatchServer) -> None:
    lines = [image_line(i, image_part(data_url(picture(i, size=48)))) for i in range(6)]
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(requests, lines)
    size = max(len(orjson.dumps(x)) for x in lines)
    done = exec_cli(requests, out, "--url", front.url, *FAST, "--batch-provider", "anthropic",
                    "--batch-max-bytes", str(int(size * 2.5)))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert set(read_results(out)) == {x["custom_id"] for x in lines}
    batches = _get(front.url + "/messages/batches?limit=100")["data"]
    assert sorted(b["request_counts"]["succeeded"] for b in batches) == [2, 2, 2]


def _wait_for(check: Any, timeout: float = 60) -> Any:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found is not None:
            return found
        time.sleep(0.1)
    raise AssertionError("the batch did not end")


def test_the_anthropic_sdk_sends_an_image_batch(front: BatchServer) -> None:
    anthropic = pytest.importorskip("anthropic", reason="pip install anthropic (the test extra)")
    client = anthropic.Anthropic(base_url=front.url.removesuffix("/v1"), api_key="k", max_retries=0)
    png = base64.b64encode(picture(5)).decode()
    content = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}},
        {"type": "text", "text": "Describe it."},
    ]
    params = {"model": CLAUDE, "max_tokens": 16, "messages": [{"role": "user", "content": content}]}
    batch = client.messages.batches.create(requests=[{"custom_id": "pic", "params": params}])
    _wait_for(
        lambda: client.messages.batches.retrieve(batch.id).processing_status == "ended" or None
    )
    (result,) = list(client.messages.batches.results(batch.id))
    assert result.result.type == "succeeded" and result.result.message.content[0].text
    (line,) = stored_lines(front)
    assert line["body"]["messages"][0]["content"] == content  # to the upstream as sent


def test_the_genai_sdk_sends_inline_images_the_front_passes_them_on(front: BatchServer) -> None:
    genai = pytest.importorskip("google.genai", reason="pip install google-genai (the test extra)")
    from google.genai import types

    options = types.HttpOptions(base_url=front.url.removesuffix("/v1"), api_version="v1")
    client = genai.Client(api_key="g-key", http_options=options)
    pictures = [picture(10 + i) for i in range(2)]
    src = [
        {"contents": [{"role": "user", "parts": [
            {"text": f"Describe picture {i}."},
            {"inline_data": {"mime_type": "image/png", "data": data}}]}],
         "config": {"max_output_tokens": 16}}
        for i, data in enumerate(pictures)
    ]  # fmt: skip
    job = client.batches.create(model=GEMINI, src=src)
    done = _wait_for(
        lambda: (lambda j: j if j.state.name.endswith(("SUCCEEDED", "FAILED")) else None)(
            client.batches.get(name=job.name)
        )
    )
    assert done.state.name == "JOB_STATE_SUCCEEDED"
    assert all(r.error is None and r.response.text for r in done.dest.inlined_responses)
    sent = sorted(stored_lines(front), key=lambda x: x["custom_id"])
    for line, data in zip(sent, pictures, strict=True):
        parts = line["body"]["messages"][-1]["content"]
        assert parts[1] == {"type": "image_url", "image_url": {"url": data_url(data)}}


def test_the_cache_key_of_an_image_request_does_not_depend_on_its_route(
    tmp_path: Path, front: BatchServer
) -> None:
    from jsonlbatch.cache.keys import body_key

    lines = [image_line(i, image_part(data_url(picture(20 + i)))) for i in range(3)]
    for line in lines:
        line["body"]["temperature"] = 0  # one draw: every route asks the same question
    requests, cache = tmp_path / "in.jsonl", tmp_path / "cache"
    write(requests, lines)
    live = exec_cli(
        requests, tmp_path / "live.jsonl", "--url", front.upstream, "--cache", str(cache)
    )
    assert live.returncode == 0, live.stderr
    keyed = read_results(tmp_path / "live.jsonl")
    for line in lines:  # keyed on the request as the file holds it (its data: URL)
        key = keyed[line["custom_id"]]["metrics"]["cache_key"]
        assert key.split(".")[0] == body_key(line["url"], line["body"])
    # the same bytes through Anthropic's batch (translated to base64 blocks there and back):
    # marked with exec's own fingerprint, so a later exec run resumes over them
    batch = exec_cli(requests, tmp_path / "batch.jsonl", "--url", front.url, *FAST,
                     "--batch-provider", "anthropic")  # fmt: skip
    assert batch.returncode == 0, batch.stderr
    merged = read_results(tmp_path / "batch.jsonl")
    for cid, line in merged.items():
        assert line["metrics"]["fingerprint"] == keyed[cid]["metrics"]["fingerprint"]
    # the same file written by another tool (spaces, '/' escaped in the base64): the same keys
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps(x, separators=(", ", ": ")).replace("/", "\\/") + "\n"
                             for x in reversed(lines)))  # fmt: skip
    again = exec_cli(
        other, tmp_path / "again.jsonl", "--url", front.upstream, "--cache", str(cache)
    )
    assert again.returncode == 0, again.stderr
    hits = read_results(tmp_path / "again.jsonl")
    assert {c: x["metrics"]["cache"] for c, x in hits.items()} == {c: "hit" for c in keyed}
    assert {c: x["metrics"]["cache_key"] for c, x in hits.items()} == {
        c: x["metrics"]["cache_key"] for c, x in keyed.items()
    }

"""Pictures and files in requests: gen embeds them, validate and exec's scan refuse parts no
server takes, and every estimate (dry-run, gen, budgets) and the mock count image tokens as
billed. Pictures are written here, byte by byte or with Pillow: nothing is downloaded."""

from __future__ import annotations

import asyncio
import base64
import io
import os
import struct
import subprocess
import sys
import zlib

import orjson
import pytest
from batchutil import ENV, cli
from test_mock import post_json

from jsonlbatch.batch_format import media
from jsonlbatch.gen import RequestWriter, file_part, image_part
from jsonlbatch.gen.data_urls import MediaError, data_url
from jsonlbatch.pricing import cost

PDF = b"%PDF-1.4\n1 0 obj << >> endobj\ntrailer << >>\n%%EOF\n"


def png(width: int, height: int) -> bytes:
    """A valid grey PNG, written by hand (no Pillow)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    raw = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def jpeg_header(width: int, height: int, app1: int = 0) -> bytes:
    """The marker segments of a JPEG: an `app1`-byte EXIF block, the frame header (SOF0), a
    start of scan with two bytes of scan, the end marker: enough for every check that reads
    headers."""
    segments = b"\xff\xd8" + b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01" + b"\x00" * 7
    if app1:
        segments += b"\xff\xe1" + struct.pack(">H", app1 + 2) + b"E" * app1
    sof = struct.pack(">BHHB", 8, height, width, 3) + b"\x01\x11\x00\x02\x11\x00\x03\x11\x00"
    sos = b"\x03\x01\x00\x02\x11\x03\x11\x00\x3f\x00"
    frame = b"\xff\xc0" + struct.pack(">H", len(sof) + 2) + sof
    return (
        segments + frame + b"\xff\xda" + struct.pack(">H", len(sos) + 2) + sos + b"\x12\x34\xff\xd9"
    )


def gif(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\x00\x00\x00" + b",;"


def webp_vp8x(width: int, height: int) -> bytes:
    body = b"WEBP" + b"VP8X" + struct.pack("<I", 10) + b"\x00\x00\x00\x00"
    body += (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    return b"RIFF" + struct.pack("<I", len(body)) + body


def as_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def chat(*parts: dict, model: str = "gpt-4o") -> dict:
    return {
        "model": model,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Describe it"}, *parts]}
        ],
    }


def image(url: str, detail: str | None = None) -> dict:
    return {
        "type": "image_url",
        "image_url": {"url": url, **({"detail": detail} if detail else {})},
    }


# -- sizes from headers, and the billing rules ----------------------------------------------


def test_picture_sizes_come_from_headers_read_a_window_at_a_time():
    pictures = {
        "png": (png(640, 480), (640, 480)),
        "jpeg behind a 60 KB EXIF block": (jpeg_header(1920, 1080, app1=60_000), (1920, 1080)),
        "gif": (gif(300, 200), (300, 200)),
        "webp": (webp_vp8x(4000, 3000), (4000, 3000)),
    }
    for name, (data, size) in pictures.items():
        reader = media.Base64Bytes(base64.b64encode(data).decode())
        asked: list[int] = []

        def read(offset: int, count: int, reader=reader, asked=asked) -> bytes:
            asked.append(count)
            return reader(offset, count)

        assert media.image_size(read) == size, name
        assert sum(asked) < 200, f"{name}: read {sum(asked)} bytes for a header"
    assert media.image_size(media.bytes_reader(b"\xff\xd8\xff\xe0\x00")) is None  # cut short
    assert media.image_size(media.bytes_reader(b"not a picture at all")) is None


def test_sizes_of_pictures_pillow_writes(tmp_path):
    """Real encoders' output: baseline and progressive JPEG (SOF0, SOF2), lossy and lossless
    WebP (VP8, VP8L), GIF, and a PNG with transparency."""
    image_module = pytest.importorskip("PIL.Image")
    picture = image_module.new("RGB", (321, 123), (10, 200, 30))
    cases = {
        "JPEG": {},
        "JPEG progressive": {"progressive": True},
        "WEBP lossy": {"quality": 80},
        "WEBP lossless": {"lossless": True},
        "GIF": {},
        "PNG": {},
    }
    for name, options in cases.items():
        out = io.BytesIO()
        source = picture.convert("RGBA") if name == "PNG" else picture
        source.save(out, format=name.split()[0], **options)
        encoded = base64.b64encode(out.getvalue()).decode()
        assert media.image_size(media.Base64Bytes(encoded)) == (321, 123), name


def test_a_cut_jpeg_is_truncated_and_one_with_bytes_after_its_end_is_not(tmp_path):
    image_module = pytest.importorskip("PIL.Image")
    out = io.BytesIO()
    image_module.effect_noise((300, 200), 60).convert("RGB").save(out, format="JPEG")
    whole = out.getvalue()
    assert not media.truncated(whole, "image/jpeg")
    assert media.truncated(whole[: len(whole) // 2], "image/jpeg")
    assert not media.truncated(whole + b"\x00" * 10_000 + b"ftypmp42", "image/jpeg")  # motion photo
    (tmp_path / "half.jpg").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(MediaError, match="truncated JPEG"):
        data_url(tmp_path / "half.jpg")


@pytest.mark.parametrize("fmt, mime", [("GIF", "image/gif"), ("WEBP", "image/webp")])
def test_a_cut_gif_or_webp_is_truncated(tmp_path, fmt, mime):
    """A noisy GIF's compressed data holds `;` bytes anywhere, so one cut in half used to pass
    as whole (its last 1 KB held one); a WebP was never checked."""
    image_module = pytest.importorskip("PIL.Image")
    out = io.BytesIO()
    image_module.effect_noise((200, 200), 60).convert("RGB").save(out, format=fmt)
    whole = out.getvalue()
    assert not media.truncated(whole, mime)
    assert not media.truncated(whole + b"\0" * 16, mime)  # padding after the end is no cut
    cuts = [whole[:n] for n in range(len(whole) // 4, len(whole) - 1, max(1, len(whole) // 40))]
    assert all(media.truncated(cut, mime) for cut in cuts if not cut.endswith(b";"))
    (tmp_path / "half.img").write_bytes(whole[: len(whole) // 2].rstrip(b";"))
    with pytest.raises(MediaError, match=f"truncated {fmt}"):
        data_url(tmp_path / "half.img")


def test_image_tokens_follow_the_published_rules():
    # OpenAI's examples: 1024 x 1024 high is 765; 2048 x 4096 is scaled to 768 x 1536, 6 tiles
    assert cost.openai_image_tokens(1024, 1024, "high") == 765
    assert cost.openai_image_tokens(2048, 4096, "auto") == 1105
    assert cost.openai_image_tokens(4096, 8192) == 1105
    assert cost.openai_image_tokens(4000, 3000, "low") == 85
    assert cost.openai_image_tokens(100, 100) == 255
    # Anthropic: width x height / 750, scaled down first to a long edge of 1568 and to about
    # 1,600 tokens (1.15 megapixels): 1092 x 1092 is its largest square sent as it is
    assert cost.anthropic_image_tokens(1000, 1000) == 1334
    assert cost.anthropic_image_tokens(1092, 1092) == 1590
    assert cost.anthropic_image_tokens(1568, 1568) == 1600
    assert cost.anthropic_image_tokens(3136, 2000) == 1600
    assert cost.anthropic_image_tokens(8000, 200) == 1568 * 39 // 750 + 1


def test_the_estimate_counts_images_by_model_and_reports_what_it_cannot_size():
    body = chat(image(as_url(png(1024, 1024))), image(as_url(png(512, 512)), "low"))
    text_only = cost.estimate_prompt(chat())
    estimate = cost.estimate_prompt(body)
    assert estimate.images == 765 + 85 and estimate.text == text_only.text
    assert estimate.tokens == cost.estimate_prompt_tokens(body)  # budgets and --max-cost
    claude = cost.estimate_prompt({**body, "model": "claude-sonnet-4-5"})
    assert claude.images == 1399 + 350
    by_url = cost.estimate_prompt(chat(image("https://example.com/cat.png")))
    assert by_url.images == 0 and by_url.uncounted_images == 1
    broken = cost.estimate_prompt(chat(image(as_url(b"\x89PNG\r\n\x1a\n" + b"\x00" * 4))))
    assert broken.uncounted_images == 1
    pdf = {
        "type": "file",
        "file": {"filename": "a.pdf", "file_data": as_url(PDF, "application/pdf")},
    }
    assert cost.estimate_prompt(chat(pdf)).uncounted_files == 1


def test_tiktoken_fallback_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # not installed
    assert cost.tiktoken_counter("gpt-4o") is None
    assert "not installed" in (cost.tiktoken_unavailable("gpt-4o") or "")

    class Offline:
        @staticmethod
        def encoding_for_model(model: str):
            raise ConnectionError("no network")

    monkeypatch.setitem(sys.modules, "tiktoken", Offline)
    why = cost.tiktoken_unavailable("gpt-4o") or ""
    assert "ConnectionError" in why and "TIKTOKEN_CACHE_DIR" in why


# -- gen: a folder of pictures into requests ---------------------------------------------------

MESSAGES = """[{"role": "user", "content": [
  {"type": "text", "text": "What is in these pictures?"},
  {{ photo | image_part(detail="low") | tojson }},
  {"type": "image_url", "image_url": {"url": {{ second | data_url | tojson }}}},
  {{ doc | file_part | tojson }}
]}]"""


def write_rows(folder, rows: list[dict]):
    path = folder / "rows.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def test_gen_embeds_local_pictures_and_files_read_from_the_data_files_folder(tmp_path):
    data = tmp_path / "data"
    (data / "pics").mkdir(parents=True)
    (data / "pics" / "a.png").write_bytes(png(1024, 1024))
    (data / "pics" / "b.png").write_bytes(jpeg_header(800, 600))  # a JPEG named .png
    (data / "report.pdf").write_bytes(PDF)
    rows = write_rows(data, [{"photo": "pics/a.png", "second": "pics/b.png", "doc": "report.pdf"}])
    template = tmp_path / "messages.j2"
    template.write_text(MESSAGES)
    out = tmp_path / "requests.jsonl"
    result = cli("gen", "--data", str(rows), "--messages", str(template), "--model", "gpt-4o",
                 "-o", str(out), cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    parts = orjson.loads(out.read_bytes())["body"]["messages"][0]["content"]
    assert parts[1] == {
        "type": "image_url",
        "image_url": {"url": as_url(png(1024, 1024)), "detail": "low"},
    }
    assert parts[2]["image_url"]["url"] == as_url(jpeg_header(800, 600), "image/jpeg")
    assert parts[3] == {
        "type": "file",
        "file": {"filename": "report.pdf", "file_data": as_url(PDF, "application/pdf")},
    }
    # gen's estimate: 85 (low) + 85 + 170 x 4 tiles (800 x 600), and the PDF not counted
    assert (
        "850 of them image tokens" in result.stderr
        and "1 image/file parts not counted" in result.stderr
    )
    assert cli("validate", str(out)).returncode == 0
    dry = cli("exec", str(out), "-o", str(tmp_path / "out.jsonl"), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "of which image tokens: 850" in dry.stdout + dry.stderr
    assert "1 file parts not counted" in dry.stdout + dry.stderr


def test_max_side_shrinks_a_picture_and_keeps_a_small_one_as_it_is(tmp_path):
    image_module = pytest.importorskip("PIL.Image")
    image_module.new("RGB", (3000, 1500), (20, 120, 40)).save(tmp_path / "big.jpg", quality=85)
    (tmp_path / "small.png").write_bytes(png(64, 64))
    shrunk = data_url(tmp_path / "big.jpg", max_side=1024)
    assert shrunk.startswith("data:image/jpeg;base64,")
    payload = media.split_data_url(shrunk)[1]
    assert media.image_size(media.Base64Bytes(payload)) == (1024, 512)
    assert data_url(tmp_path / "small.png", max_side=1024) == as_url(png(64, 64))  # byte for byte
    exif = image_module.Exif()
    exif[0x0112] = 6  # orientation: stored sideways, shown turned 90 degrees
    image_module.new("RGB", (2000, 1000)).save(tmp_path / "portrait.jpg", exif=exif.tobytes())
    turned = media.split_data_url(data_url(tmp_path / "portrait.jpg", max_side=500))[1]
    assert media.image_size(media.Base64Bytes(turned)) == (250, 500)  # upright, as shown


def test_max_side_without_pillow_names_the_extra(tmp_path):
    shim = tmp_path / "shim" / "PIL"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('no Pillow here')\n")
    (tmp_path / "a.png").write_bytes(png(2000, 100))
    rows = write_rows(tmp_path, [{"p": "a.png"}])
    template = tmp_path / "m.j2"
    template.write_text(
        '[{"role": "user", "content": [{{ p | image_part(max_side=512) | tojson }}]}]'
    )
    out = tmp_path / "out.jsonl"
    env = {**ENV, "PYTHONPATH": f"{tmp_path / 'shim'}:{ENV.get('PYTHONPATH', '')}"}
    result = cli(
        "gen",
        "--data",
        str(rows),
        "--messages",
        str(template),
        "--model",
        "m",
        "-o",
        str(out),
        env=env,
    )
    assert result.returncode == 2, result.stderr
    assert "pip install 'jsonlbatch[images]'" in result.stderr and "Pillow" in result.stderr
    assert "Traceback" not in result.stderr and not out.exists()


def _bad_files(folder) -> dict[str, tuple[str, str]]:
    """name -> (path in the row, what the error must say)."""
    (folder / "dir").mkdir()
    with open(folder / "huge.png", "wb") as file:  # 2 GB, sparse: refused by its size alone
        file.truncate(2 << 30)
    (folder / "cut.png").write_bytes(png(300, 300)[:-20])
    (folder / "notes.jpg").write_bytes(b"just some text, named like a picture\n")
    (folder / "old.bmp").write_bytes(b"BM" + b"\x00" * 60)
    (folder / "headless.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    return {
        "missing": ("nowhere.png", "No such file"),
        "folder": ("dir", "is a folder"),
        "2 GB": ("huge.png", "2,048.0 MB, over the 20 MB"),
        "truncated": ("cut.png", "truncated PNG"),
        "not a picture": ("notes.jpg", "is not a PNG, JPEG, GIF, WebP or PDF file"),
        "unknown type": ("old.bmp", "is not a PNG, JPEG, GIF, WebP or PDF file"),
        "no header": ("headless.png", "header gives no size"),
    }


def test_gen_refuses_bad_media_naming_the_row_and_writes_nothing(tmp_path):
    template = tmp_path / "m.j2"
    template.write_text('[{"role": "user", "content": [{{ p | image_part | tojson }}]}]')
    out = tmp_path / "out.jsonl"
    out.write_bytes(b"an earlier file\n")
    for name, (path, says) in _bad_files(tmp_path).items():
        rows = write_rows(tmp_path, [{"p": "a.png"}, {"p": path}])
        (tmp_path / "a.png").write_bytes(png(10, 10))
        result = cli("gen", "--data", str(rows), "--messages", str(template), "--model", "m",
                     "-o", str(out), "--force")  # fmt: skip
        assert result.returncode == 1, (name, result.stderr)
        assert "rows.jsonl:2" in result.stderr and "row 1:" in result.stderr, (name, result.stderr)
        assert says in result.stderr and path in result.stderr, (name, result.stderr)
        assert "Traceback" not in result.stderr, name
        assert out.read_bytes() == b"an earlier file\n", name


def test_request_writer_takes_the_same_parts(tmp_path):
    (tmp_path / "cat.png").write_bytes(png(200, 100))
    (tmp_path / "form.pdf").write_bytes(PDF)
    with RequestWriter(tmp_path / "requests.jsonl", model="gpt-4o") as writer:
        content = [
            {"type": "text", "text": "Fill in the form from the picture."},
            image_part(tmp_path / "cat.png", detail="high"),
            file_part(tmp_path / "form.pdf", filename="form.pdf"),
        ]
        writer.add("q1", [{"role": "user", "content": content}])
    assert writer.summary.image_tokens == 85 + 170
    line = orjson.loads((tmp_path / "requests.jsonl").read_bytes())
    assert line["body"]["messages"][0]["content"][1]["image_url"]["url"] == as_url(png(200, 100))
    with pytest.raises(MediaError, match="not a picture"):
        image_part(tmp_path / "form.pdf")


# -- validate and exec's scan -----------------------------------------------------------------


def test_validate_and_exec_refuse_local_paths_and_broken_base64(tmp_path):
    good = as_url(png(8, 8))
    bodies = [
        chat(image(good), image("https://example.com/a.png")),
        chat(image("file:///home/me/cat.png")),
        chat(image("pics/cat.png")),
        chat(image("data:image/png;base64,iVBORw0KGgo!!!AAAA")),
        chat(image(good[:-1])),  # one character short
        chat(
            {
                "type": "file",
                "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,%%%"},
            }
        ),
    ]
    path = tmp_path / "requests.jsonl"
    path.write_bytes(b"".join(
        orjson.dumps({"custom_id": str(i), "method": "POST", "url": "/v1/chat/completions", "body": b}) + b"\n"
        for i, b in enumerate(bodies)
    ))  # fmt: skip
    result = cli("validate", str(path))
    assert result.returncode != 0
    text = result.stdout + result.stderr
    field = "body.messages[0].content[1].image_url.url"
    for line in (2, 3, 4, 5):
        assert f"requests.jsonl:{line}: {field}" in text, text
    assert "requests.jsonl:1:" not in text
    assert "file:///home/me/cat.png" in text and "data_url" in text
    assert "does not decode" in text
    assert "requests.jsonl:6: body.messages[0].content[1].file.file_data" in text
    out = tmp_path / "out.jsonl"
    sent = cli("exec", str(path), "-o", str(out), "--url", "http://127.0.0.1:9/v1")
    assert sent.returncode != 0 and f"requests.jsonl:2: {field}" in sent.stderr
    assert "nothing was sent" in sent.stderr and "Traceback" not in sent.stderr


def test_validate_checks_responses_and_messages_api_parts_too(tmp_path):
    good = as_url(png(8, 8))
    lines = [
        ("/v1/responses", {"model": "m", "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "hi"}, {"type": "input_image", "image_url": good}]}]}),
        ("/v1/responses", {"model": "m", "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "./cat.png"}]}]}),
        ("/v1/messages", {"model": "claude", "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO*"}}]}]}),
    ]  # fmt: skip
    path = tmp_path / "requests.jsonl"
    path.write_bytes(b"".join(
        orjson.dumps({"custom_id": str(i), "method": "POST", "url": url, "body": body}) + b"\n"
        for i, (url, body) in enumerate(lines)
    ))  # fmt: skip
    result = cli("validate", str(path))
    text = result.stdout + result.stderr
    assert result.returncode != 0 and "requests.jsonl:1:" not in text
    assert "requests.jsonl:2: body.input[0].content[0].image_url: must be an http(s)://" in text
    assert (
        "requests.jsonl:3: body.messages[0].content[0].source.data: the base64 does not decode"
        in text
    )


def test_an_input_image_naming_a_local_path_as_its_file_id_is_refused():
    """Only the slots docs/files.md lists upload a `file://` path; an input_image's file_id
    holding one went out as it was, for the server to refuse after the batch was sent."""
    part = {"type": "input_image", "file_id": "file://photos/cat.png"}
    where, why = media.part_problem(part)
    assert where == "file_id" and "data_url" in why
    assert media.part_problem({"type": "input_image", "file_id": "file-abc123"}) is None


def test_base64_check_is_exact():
    for text in ("QUJD", "QUI=", "QQ==", base64.b64encode(bytes(range(256)) * 100).decode()):
        assert media.base64_problem(text) is None
    for text in ("", "QUJ", "QU=D", "QUJD\n", "QUJD====", "QU-_", "Q===", "QUJD QUJD"):
        assert media.base64_problem(text) is not None, text
    # the two ways a real picture's base64 goes wrong are named, so a user knows the fix
    assert "wrapped in lines" in media.base64_problem("QUJD\nQUJD")
    assert "URL-safe" in media.base64_problem("QU-_")


def test_max_cost_counts_the_pictures_it_pays_for(tmp_path, mock_server):
    """Six requests of one 1024 x 1024 picture each (765 tokens) at $1,000 per million input
    tokens: about $0.77 a request, so a $2 budget sends two. Counting text alone, all six went."""
    url = mock_server()
    path, out = tmp_path / "requests.jsonl", tmp_path / "out.jsonl"
    body = {**chat(image(as_url(png(1024, 1024))), model="mock"), "max_tokens": 1}
    path.write_bytes(b"".join(
        orjson.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}) + b"\n"
        for i in range(6)
    ))  # fmt: skip
    price = ["--price", "in=1000,out=0"]
    proc = cli(
        "exec", str(path), "-o", str(out), "--url", url, "-c", "1", *price, "--max-cost", "2"
    )
    assert proc.returncode == 4, proc.stderr  # stopped by the budget
    assert "stopped by --max-cost" in proc.stderr
    lines = [orjson.loads(raw) for raw in out.read_bytes().splitlines()]
    assert len(lines) == 2
    assert all(line["response"]["body"]["usage"]["prompt_tokens"] == 2 + 765 for line in lines)


# -- the mock counts the same -------------------------------------------------------------------


def test_mock_usage_counts_image_tokens_as_the_estimate_does(mock_server):
    url = mock_server()
    body = chat(image(as_url(png(1024, 1024))), image(as_url(png(300, 200)), "low"), model="mock")
    body["max_tokens"] = 4
    status, answer = asyncio.run(post_json(url, body))
    assert status == 200, answer
    words = 2  # "Describe it"
    assert answer["usage"]["prompt_tokens"] == words + 765 + 85
    assert cost.image_tokens(body)[0] == 765 + 85


# -- memory: multi-MB lines stream -------------------------------------------------------------


def _exec_peak_mb(requests, out, url: str) -> float:
    """Run exec as a real process at concurrency 2; its peak RSS in MB (Linux: ru_maxrss in KB)."""
    command = [sys.executable, "-m", "jsonlbatch", "exec", str(requests), "-o", str(out),
               "--url", url, "-c", "2", "-q"]  # fmt: skip
    proc = subprocess.Popen(command, env=ENV, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, proc.stderr.read() if proc.stderr else ""
    return usage.ru_maxrss / 1024


def _image_requests(path, lines: int, line_mb: float) -> None:
    header = png(1024, 1024)[:33]  # the IHDR: the mock and the estimate size it
    with open(path, "wb") as file:
        for i in range(lines):
            payload = header + os.urandom(int(line_mb * 2**20 * 3 / 4))
            body = chat(image(as_url(payload)), model="mock")
            file.write(orjson.dumps({"custom_id": f"r{i}", "method": "POST",
                                     "url": "/v1/chat/completions", "body": body}) + b"\n")  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss in KB is Linux's")
def test_multi_mb_lines_stream_through_exec_in_memory_bounded_by_concurrency(
    tmp_path, mock_process
):
    """Tripling the file adds nothing to exec's peak: what it holds is a few lines per worker
    (the queue of parsed requests, the encoded body in flight), never the file."""
    url = mock_process("--served-model-name", "mock").url
    line_mb = 1.5
    peaks = []
    for lines in (20, 60):
        requests, out = tmp_path / f"req{lines}.jsonl", tmp_path / f"out{lines}.jsonl"
        _image_requests(requests, lines, line_mb)
        peaks.append(_exec_peak_mb(requests, out, url))
        results = [orjson.loads(raw) for raw in out.read_bytes().splitlines()]
        assert len(results) == lines and all(r["error"] is None for r in results)
        usage = results[0]["response"]["body"]["usage"]
        assert usage["prompt_tokens"] == 2 + 765  # the mock sized the picture from its header
    text = tmp_path / "text.jsonl"
    text.write_bytes(b"".join(
        orjson.dumps({"custom_id": f"t{i}", "method": "POST", "url": "/v1/chat/completions",
                      "body": chat(model="mock")}) + b"\n" for i in range(60)
    ))  # fmt: skip
    baseline = _exec_peak_mb(text, tmp_path / "text-out.jsonl", url)
    assert peaks[1] - peaks[0] < 8 * line_mb, (peaks, baseline)  # 60 MB more file, not held
    assert peaks[1] - baseline < 32 * line_mb, (peaks, baseline)  # a few lines a worker, of 60


def _bytes_read() -> int:
    with open("/proc/self/io") as io:
        return int(next(line for line in io if line.startswith("rchar:")).split()[1])


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="counts reads through /proc")
def test_lines_read_out_of_order_cost_their_size_not_a_buffer_each(tmp_path):
    """--route prefix sends the requests about one picture together (VQA: questions after an
    image), so exec reads lines out of file order: each jump must read that line, not refill a
    1 MB buffer (which made image runs at half the text runs' speed)."""
    from jsonlbatch.file_io.jsonl import iter_lines_at, read_lines_at

    path = tmp_path / "requests.jsonl"
    path.write_bytes(b"".join(b'{"i": %d, "x": "%s"}\n' % (i, b"A" * 25_000) for i in range(400)))
    with open(path, "ab") as file:
        file.write(b'{"last": "no newline"}')
    lines = {offset: raw for _, offset, raw in iter_lines_at(path)}
    offsets = sorted(lines)
    jumping = [offsets[i + part] for i in range(100) for part in (0, 100, 200, 300)]  # 2.5 MB apart
    before = _bytes_read()
    assert list(read_lines_at(path, jumping)) == [lines[o] for o in jumping]
    assert _bytes_read() - before < 3 * path.stat().st_size
    unstripped = list(read_lines_at(path, [offsets[-1], offsets[0]], strip=False))
    assert unstripped == [b'{"last": "no newline"}', lines[offsets[0]] + b"\n"]

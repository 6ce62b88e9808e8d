"""`export` writes a short placeholder (type, size, SHA-256 prefix) where an answer carries a
picture or file as a base64 `data:` URL, in every format, and keeps the rest of the text."""

from __future__ import annotations

import base64
import csv
import hashlib
import json
from pathlib import Path

import mediautil
from batchutil import cli
from mediautil import data_url
from postutil import ENV, chat_line, write_jsonl


def picture(seed: int) -> bytes:
    return mediautil.picture(seed, 64)


def url(data: bytes, mime: str = "image/png") -> str:
    return data_url(data, mime)


def expected(data: bytes, mime: str = "image/png") -> str:
    return f"[{mime}, {len(data):,} bytes, sha256 {hashlib.sha256(data).hexdigest()[:12]}]"


def test_export_keeps_a_placeholder_instead_of_base64(tmp_path: Path) -> None:
    chart, pdf = picture(1), b"%PDF-1.4\n" + bytes(range(256)) * 40
    answers = [
        chat_line("a", f"Here is the chart:\n\n![chart]({url(chart)})\n\nDone."),
        chat_line("b", json.dumps({"label": "invoice", "file": url(pdf, "application/pdf")})),
        chat_line("c", "No picture; data:text/plain,hello stays as it is."),
        chat_line("d", "broken: data:image/png;base64,@@@"),
    ]
    responses = write_jsonl(tmp_path / "responses.jsonl", answers)
    before = responses.read_bytes()
    for fmt in ("csv", "jsonl"):
        out = tmp_path / f"table.{fmt}"
        done = cli("export", str(responses), "-o", str(out), env=ENV)
        assert done.returncode == 0, done.stderr
        if fmt == "csv":
            rows = {r["custom_id"]: r for r in csv.DictReader(out.open())}
        else:
            rows = {r["custom_id"]: r for r in map(json.loads, out.read_text().splitlines())}
        assert rows["a"]["answer"] == f"Here is the chart:\n\n![chart]({expected(chart)})\n\nDone."
        assert json.loads(rows["b"]["answer"]) == {
            "label": "invoice",
            "file": expected(pdf, "application/pdf"),
        }
        assert rows["c"]["answer"] == "No picture; data:text/plain,hello stays as it is."
        assert rows["d"]["answer"] == "broken: data:image/png;base64,@@@"
        assert base64.b64encode(chart).decode()[:40] not in out.read_text()
        assert len(out.read_bytes()) < 2000  # no megabytes of base64
    assert responses.read_bytes() == before  # the response file is untouched

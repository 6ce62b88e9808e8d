"""The viewer's detail pane lists the files `exec --files-dir` collected, with their sizes, in a
real browser (skipped where Playwright or Chromium is missing)."""

from __future__ import annotations

import json
import shutil

import pytest
from batchutil import cli
from viewutil import ViewProcess

from jsonlbatch.mock import BackgroundMock, MockConfig

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed")]


def test_detail_pane_lists_collected_files_with_sizes(tmp_path):
    tool = {"type": "code_interpreter", "container": {"type": "auto", "file_ids": []}}
    line = {"custom_id": "task-1", "method": "POST", "url": "/v1/responses",
            "body": {"model": "mock", "input": "make it", "tools": [tool]}}  # fmt: skip
    req = tmp_path / "req.jsonl"
    req.write_text(json.dumps(line) + "\n")
    out, fdir = tmp_path / "out.jsonl", tmp_path / "files"
    with BackgroundMock(MockConfig()) as mock:
        done = cli("exec", str(req), "-o", str(out), "--url", mock.url, "--files-dir", str(fdir))
    assert done.returncode == 0, done.stderr
    sizes = {p.name: p.stat().st_size for p in (fdir / "task-1").iterdir()}
    view = ViewProcess(str(out))
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(view.url + "?open=0")
            page.wait_for_selector("#detail:not([hidden]) .files")
            text = page.locator("#detail .files").inner_text()
            browser.close()
        assert "files (2)" in text
        for name, size in sizes.items():
            assert f"task-1/{name}" in text and f"{size:,} bytes" in text
        assert not errors, errors
    finally:
        view.close()

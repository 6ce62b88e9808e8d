"""Images in the viewer in a real browser (Playwright over the system's Chromium, the page's
own Content-Security-Policy in force): the detail shows each picture, loaded from /api/media,
and a search for a word skips the pictures' base64. Skipped where either is missing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_view_browser import BROWSER, playwright  # skips this file as it skips that one
from test_view_media import write_image_run
from viewutil import ViewProcess

pytestmark = [
    pytest.mark.skipif(BROWSER is None, reason="no Chromium installed (apt-get install chromium)"),
    pytest.mark.timeout(240),
]


@pytest.fixture
def page() -> Iterator[Any]:
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=BROWSER, args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        yield page
        browser.close()
        assert not errors, errors  # no script error, no CSP refusal of an image


def test_the_detail_shows_the_pictures_and_the_search_skips_them(tmp_path: Path, page: Any) -> None:
    requests, out, _ = write_image_run(tmp_path, 200)
    proc = ViewProcess(str(out), "--requests", str(requests))
    try:
        p = page
        p.goto(proc.url + "?open=10")
        thumb = p.locator("#detail .turn.user a.thumb img")
        thumb.wait_for()
        p.wait_for_timeout(200)
        assert thumb.evaluate("img => img.complete && img.naturalWidth") == 48
        text = p.locator("#detail .turn.user").inner_text()
        assert "Is this a dog?" in text and "[image_url]" not in text and "base64" not in text
        assert thumb.get_attribute("alt").startswith("image · image/png")
        p.screenshot(path=str(tmp_path / "detail.png"))

        p.goto(proc.url + "?q=dog")
        p.locator("#range", has_text="of 20").wait_for()
        ids = p.locator("#rows tbody td.id").all_inner_texts()
        assert ids and all(int(i.split("-")[1]) % 10 == 0 for i in ids)
    finally:
        proc.close()

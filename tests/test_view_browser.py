"""The viewer in a real browser: Playwright drives the system's Chromium over `jsonlbatch view`
(and a live `exec`) on 127.0.0.1. Skipped where Playwright or Chromium is missing."""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from batchutil import start_cli
from viewutil import ViewProcess, write_requests, write_run

playwright = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
BROWSER = next(
    (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
    None,
)
pytestmark = [
    pytest.mark.skipif(BROWSER is None, reason="no Chromium installed (apt-get install chromium)"),
    pytest.mark.timeout(240),
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright.sync_playwright() as p:
        instance = p.chromium.launch(executable_path=BROWSER, args=["--no-sandbox"])
        yield instance
        instance.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    # bypass_csp: the page script must keep answers as text on its own (the CSP is a second
    # wall, checked in test_view.py), and Playwright evaluates its waits as strings.
    context = browser.new_context(viewport={"width": 1400, "height": 900}, bypass_csp=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert not errors, errors  # the page's own script never failed


def test_browse_filter_open_and_compare_ten_thousand_lines(tmp_path: Path, page: Any) -> None:
    a = write_run(tmp_path / "baseline.jsonl", 10_000)
    b = write_run(tmp_path / "tuned.jsonl", 10_000, shift=1)
    requests = write_requests(tmp_path / "requests.jsonl", 10_000)
    proc = ViewProcess(str(a), str(b), "--requests", str(requests))
    try:
        p = page
        p.goto(proc.url)
        p.wait_for_function("document.querySelector('#range').textContent.includes('of 10,000')")

        # Filter to failures: every row shown is a failure, and the URL holds the filter.
        p.select_option("#filters select[name=status]", "failed")
        p.wait_for_function("document.querySelector('#range').textContent.includes('of 589')")
        assert "status=failed" in p.url
        tags = p.locator("#rows tbody td:nth-child(3)").all_inner_texts()
        assert tags and set(tags) == {"http_500"}

        # Open one: its error is shown, and the open request is in the URL too.
        p.locator("#rows tbody tr[data-row]").nth(1).click()
        p.wait_for_selector("#detail:not([hidden]) h2")
        assert p.locator("#detail h2").inner_text() == "task-00017"
        assert "HTTP 500" in p.locator("#detail").inner_text()
        assert re.search(r"open=17\b", p.url)

        # A bookmarked view: an answer holding <script> shows as the text the model wrote.
        p.goto(proc.url + "?open=1")
        p.wait_for_selector("#detail:not([hidden]) .turn.assistant")
        answer = p.locator("#detail .turn.assistant").inner_text()
        assert "<script>document.title='pwned'</script>" in answer
        assert "<b>bold</b>" in answer
        assert p.locator("#detail script, #detail b").count() == 0
        assert p.title() == "jsonlbatch view"
        prompt = p.locator("#detail .turn.user").inner_text()
        assert "needle-1?" in prompt

        # Side by side: the same custom_id in both runs, the differing answer marked.
        p.click("#detail [data-compare]")
        p.wait_for_selector("#panes .pane h2")
        assert p.locator("#panes .pane").count() == 2
        assert p.locator("#panes .pane.differs").count() == 1
        assert "id=task-00001" in p.url
        p.screenshot(path=str(tmp_path / "compare.png"))
    finally:
        proc.close()


@pytest.mark.slow
def test_a_live_run_grows_on_the_page(tmp_path: Path, page: Any) -> None:
    requests = write_requests(tmp_path / "requests.jsonl", 40)
    out = tmp_path / "out.jsonl"
    out.touch()
    proc = ViewProcess(str(out), "--requests", str(requests))
    run = start_cli(
        "exec", str(requests), "-o", str(out), "--serve", "mock", "--server-arg=--latency=0.2",
        "-c", "2", "--quiet",
    )  # fmt: skip
    try:
        p = page
        p.goto(proc.url)
        p.wait_for_selector("#live b")
        seen = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            text = p.locator("#live").get_attribute("data-lines")
            count = int(text or 0)
            if not seen or count != seen[-1]:
                seen.append(count)
            if count == 40:
                break
            p.wait_for_timeout(300)
        assert seen[-1] == 40, seen
        assert len(seen) >= 3, f"the count never grew while the run went on: {seen}"
        p.wait_for_function("document.querySelector('#range').textContent.includes('of 40')")
    finally:
        run.kill()
        run.wait()
        proc.close()


def test_a_conversation_shows_as_a_thread_of_calls_and_results(tmp_path: Path, page: Any) -> None:
    import orjson
    from toolutil import answered_call

    messages = answered_call()
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    requests.write_bytes(orjson.dumps({"custom_id": "conv#t2", "method": "POST",
                                       "url": "/v1/chat/completions",
                                       "body": {"model": "m", "messages": messages}}) + b"\n")  # fmt: skip
    answer = {"role": "assistant", "content": None, "tool_calls": [{"id": "call_def",
              "type": "function", "function": {"name": "refund", "arguments": '{"amount": 5}'}}]}  # fmt: skip
    body = {"id": "x", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": answer, "finish_reason": "tool_calls"}]}  # fmt: skip
    out.write_bytes(orjson.dumps({"id": "b", "custom_id": "conv#t2", "error": None, "response": {
        "status_code": 200, "request_id": "r", "body": body}}) + b"\n")  # fmt: skip
    proc = ViewProcess(str(out), "--requests", str(requests))
    try:
        page.goto(proc.url + "?open=0")
        page.wait_for_selector("#detail:not([hidden]) .turn.tool")
        tool = page.locator("#detail .turn.tool").inner_text()
        assert "result of get_order" in tool and "call_abc" in tool and "shipped Monday" in tool
        called = page.locator("#detail .turn.assistant").all_inner_texts()
        assert "get_order" in called[0] and '"order_id": "A17"' in called[0]
        assert "refund" in called[-1] and "call_def" in called[-1] and '"amount": 5' in called[-1]
    finally:
        proc.close()


def test_a_calls_files_line_lists_its_conversation(tmp_path: Path, page: Any) -> None:
    import orjson

    def line(cid: str, message: dict) -> bytes:
        body = {"id": "x", "object": "chat.completion", "model": "m",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}  # fmt: skip
        return orjson.dumps({"id": "b", "custom_id": cid, "error": None, "response": {
            "status_code": 200, "request_id": "r", "body": body}}) + b"\n"  # fmt: skip

    call = {"id": "c1", "type": "function", "function": {"name": "get_order", "arguments": "{}"}}
    out = tmp_path / "conv.calls.jsonl"
    out.write_bytes(
        line("other#t1", {"role": "assistant", "content": "unrelated"})
        + line("conv#t2", {"role": "assistant", "content": "It shipped on Monday."})
        + line("conv#t1", {"role": "assistant", "content": None, "tool_calls": [call]})
        + line("conv#t1.ask1", {"role": "assistant", "content": "ask the expert"})
    )
    proc = ViewProcess(str(out))
    try:
        page.goto(proc.url + "?open=1")
        page.wait_for_selector("#detail:not([hidden]) .conversation li")
        items = page.locator("#detail .conversation li").all_inner_texts()
        assert len(items) == 3
        assert "turn 1" in items[0] and "calls get_order" in items[0]
        assert "ask 1" in items[1] and "turn 2" in items[2] and "shipped" in items[2]
        assert page.locator("#detail .conversation li.open").inner_text() == items[2]
        page.locator("#detail .conversation li").first.click()
        page.wait_for_function("document.querySelector('#detail h2').textContent === 'conv#t1'")
        assert "open=2" in page.url
    finally:
        proc.close()

"""The HTML report in a real browser: headless Chromium lays out a comparison of two runs at a
wide and a narrow window, and the page must never be wider than the window (tables scroll
inside their own box instead).

The report itself has no script; the test measures a copy with a small probe added, which
writes the page's width into its title once everything (the charts included) has loaded.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from batchutil import cli
from report_fixtures import streamed_run

BROWSER = next(
    (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
    None,
)
pytestmark = pytest.mark.skipif(
    BROWSER is None, reason="no Chromium installed (apt-get install chromium) to lay the page out"
)

_PROBE = """<script>
addEventListener("load", () => {
  const page = document.documentElement;
  // Tables of the grid of small ones (side by side) that do not fit their box: a run's column
  // cut off behind a scroll bar. Wide tables may scroll inside their box; these must not.
  const clipped = [...document.querySelectorAll(".tables .box")]
    .filter(box => box.scrollWidth > box.clientWidth + 1).length;
  // Key cells holding a URL that break across lines (mid-address).
  const wrapped = [...document.querySelectorAll("td")]
    .filter(td => td.textContent.includes("://"))
    .filter(td => {
      const range = document.createRange();
      range.selectNodeContents(td);
      return new Set([...range.getClientRects()].map(r => Math.round(r.top))).size > 1;
    }).length;
  document.title = "measured " + page.scrollWidth + " " + innerWidth + " " + clipped + " " +
    wrapped;
});
</script>"""


def _measure(page: Path, width: int, profile: Path) -> tuple[int, int, int, int]:
    """(page width, window width) in CSS pixels, as Chromium lays `page` out, then how many
    side-by-side tables are clipped and how many URL cells wrap."""
    assert BROWSER is not None
    result = subprocess.run(
        [
            BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile}", f"--window-size={width},900",
            "--virtual-time-budget=5000", "--dump-dom", page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )  # fmt: skip
    found = re.search(r"<title>measured (\d+) (\d+) (\d+) (\d+)</title>", result.stdout)
    assert found, (
        f"Chromium gave no measurement (exit {result.returncode}): {result.stderr[-2000:]}"
    )
    return int(found[1]), int(found[2]), int(found[3]), int(found[4])


@pytest.mark.timeout(240)
def test_a_comparison_report_fits_the_window(tmp_path: Path) -> None:
    # Long run names and a breakdown: the widest tables a comparison makes.
    a = streamed_run(tmp_path / "baseline-qwen3-8b-tp1-dp8-concurrency-256.jsonl", 60, slow_every=5)
    b = streamed_run(tmp_path / "tuned-qwen3-8b-tp2-dp4-concurrency-512.jsonl", 60, slow_every=9)
    report = tmp_path / "compare.html"
    args = ["report", str(a), str(b), "--sla", "ttft=500ms", "--sla", "e2e=2s", "--by", "endpoint"]
    result = cli(*args, "--price", "in=1,out=2", "-o", str(report))
    assert result.returncode == 0, result.stderr
    html = report.read_text(encoding="utf-8")
    assert "<script" not in html
    probe = tmp_path / "probe.html"
    probe.write_text(html.replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    for width in (1400, 800):
        page_width, window, clipped, wrapped = _measure(probe, width, tmp_path / f"p{width}")
        assert page_width <= window, f"at {width} px the page is {page_width} px wide"
        # issue 26: three tables across clipped the second run's column at 1400 px, and
        # endpoint URLs broke mid-address at 800 px
        assert clipped == 0, f"at {width} px {clipped} side-by-side tables are clipped"
        assert wrapped == 0, f"at {width} px {wrapped} URL cells wrap"

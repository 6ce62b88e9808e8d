"""`jsonlbatch report` output formats (terminal, Markdown, JSON, HTML) and comparison mode,
through the real command line."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from batchutil import ENV, cli
from report_fixtures import streamed_run

OPTIONS = ["--sla", "ttft=500ms", "--sla", "e2e=2s", "--by", "endpoint", "--price", "in=1,out=2"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    # a: 50 ok, every 5th slow (TTFT 1 s) and truncated; b: 60 ok, every 10th slow.
    return (
        streamed_run(tmp_path / "a.jsonl", 50, slow_every=5),
        streamed_run(tmp_path / "b.jsonl", 60, slow_every=10),
    )


def _ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def test_terminal_table(runs: tuple[Path, Path]) -> None:
    out = _ok(cli("report", str(runs[0]), *OPTIONS))
    rows = {line.split("  ")[0].strip(): line for line in out.splitlines()}
    assert rows["succeeded"].split()[-1] == "50"
    assert rows["failed"].split()[-1] == "1"
    assert rows["length"].split()[-1] == "10"
    assert rows["truncated (length) share"].split()[-1] == "20.0%"
    # 40 of 50 have TTFT 0.1 s, all have e2e <= 1.98 s: 80% and 100%, 40 good requests.
    assert rows["ttft within 500ms"].split()[-1] == "80.0%"
    assert rows["e2e within 2s"].split()[-1] == "100.0%"
    assert rows["meeting every SLA"].split()[-1] == "40"
    ttft = rows["TTFT"].split()
    assert ttft[1] == "50" and ttft[-2:] == ["1.000", "s"]  # count, max
    assert "By endpoint" in out and "http://127.0.0.1:8001/v1" in out
    assert "Failed requests count in the outcomes" in out


def test_markdown(runs: tuple[Path, Path], tmp_path: Path) -> None:
    target = tmp_path / "report.md"
    _ok(cli("report", str(runs[0]), *OPTIONS, "-o", str(target)))
    text = target.read_text()
    assert text.startswith("# jsonlbatch report: a.jsonl\n")
    titles = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    assert titles[:5] == [
        "At a glance",
        "Outcomes",
        "Finish reasons (choices)",
        "Tokens",
        "Throughput",
    ]
    assert "| requests ok | 50 |" in text and "| TTFT p99 | 1.000 s |" in text
    assert {"Latency", "SLA", "Cost", "By endpoint"} <= set(titles)
    # Every table is well formed: each row has the header's number of cells.
    for block in text.split("\n## ")[1:]:
        table = [line for line in block.splitlines() if line.startswith("|")]
        widths = {line.count(" | ") for line in table if not line.startswith("|:")}
        assert len(widths) == 1, block
    assert "| succeeded | 50 |" in text
    assert "| total | $0.005500 |" in text  # 500 in x $1/M + 2500 out x $2/M


def test_json(runs: tuple[Path, Path], tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    _ok(cli("report", str(runs[0]), *OPTIONS, "-o", str(target)))
    data = json.loads(target.read_text())
    assert data["version"] == 1
    run = data["runs"][0]
    assert (run["lines"], run["succeeded"], run["failed"]) == (51, 50, 1)
    assert run["latency"]["ttft"]["p50"] == pytest.approx(0.1)
    assert run["latency"]["ttft"]["p90"] == pytest.approx(1.0)
    assert run["latency"]["tpot"]["mean"] == pytest.approx(0.02)
    assert run["truncated_share"] == pytest.approx(0.2)
    assert run["good"] == 40
    assert run["cost"]["total_usd"] == pytest.approx(0.0055)
    assert set(run["breakdown"]["endpoint"]) == {
        "http://127.0.0.1:8000/v1",
        "http://127.0.0.1:8001/v1",
    }
    assert [s["metric"] for s in data["sla"]] == ["ttft", "e2e"]
    assert "comparison" not in data


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text())
    page.close()
    return page


def _assert_self_contained(page: _Page) -> None:
    names = {tag for tag, _ in page.tags}
    assert not names & {"script", "link", "iframe", "object", "embed"}
    for tag, attrs in page.tags:
        for name, value in attrs.items():
            if name in ("src", "href", "srcset", "data", "action") and value:
                assert value.startswith("data:"), (tag, name, value[:80])
    style = "".join(page.text)
    assert "url(" not in style and "@import" not in style


def test_html_is_self_contained_with_embedded_charts(
    runs: tuple[Path, Path], tmp_path: Path
) -> None:
    target = tmp_path / "report.html"
    _ok(cli("report", str(runs[0]), *OPTIONS, "-o", str(target)))
    page = _parse(target)
    _assert_self_contained(page)
    images = [attrs for tag, attrs in page.tags if tag == "img"]
    alts = [img["alt"] for img in images]
    assert alts[:2] == ["Requests/s over time", "Output tokens/s over time"]
    for name in ("E2E latency", "TTFT", "TPOT"):
        assert f"{name}: distribution" in alts and f"{name}: CDF" in alts
    text = "".join(page.text)
    assert text.index("requests ok") < text.index("Charts") < text.index("Outcomes")
    for img in images:
        src = img["src"] or ""
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(PNG)
    assert sum(tag == "table" for tag, _ in page.tags) >= 8
    assert "Latency" in page.text and "By endpoint" in page.text


def test_html_without_matplotlib_still_written_and_says_so(
    runs: tuple[Path, Path], tmp_path: Path
) -> None:
    target = tmp_path / "report.html"
    hide = "import sys; sys.modules['matplotlib'] = None; from jsonlbatch.cli import main; main()"
    result = subprocess.run(
        [sys.executable, "-c", hide, "report", str(runs[0]), "-o", str(target)],
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )
    _ok(result)
    assert result.stderr.startswith(
        "note: the page will have no charts: drawing charts in the HTML report needs matplotlib, "
        "which is not installed: pip install 'jsonlbatch[report]'"
    )
    page = _parse(target)
    _assert_self_contained(page)
    assert not [tag for tag, _ in page.tags if tag == "img"]
    assert "needs matplotlib, which is not installed" in "".join(page.text)
    assert "Outcomes" in page.text


def test_comparison_side_by_side(runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = runs
    out = _ok(cli("report", str(a), str(b), "--sla", "ttft=500ms"))
    assert out.startswith("jsonlbatch report: a.jsonl vs b.jsonl")
    lines = out.splitlines()
    header = lines[lines.index("Outcomes") + 2]
    assert header.split() == ["a.jsonl", "b.jsonl"]  # one column per run
    rows = {line.split("  ")[0].strip(): line for line in lines}
    assert rows["succeeded"].split() == ["succeeded", "50", "60", "(+20.0%)"]
    assert rows["truncated (length) share"].split()[-4:] == ["20.0%", "10.0%", "(-10.0", "pp)"]
    assert rows["failed"].split() == ["failed", "1", "1"]  # unchanged: no delta
    latency = [r for r in map(str.split, lines) if r[:1] == ["TTFT"] and r[1].endswith(".jsonl")]
    assert [row[1] for row in latency] == ["a.jsonl", "b.jsonl"]

    target = tmp_path / "compare.json"
    _ok(cli("report", str(a), str(b), "-o", str(target)))
    data = json.loads(target.read_text())
    assert [run["label"] for run in data["runs"]] == ["a.jsonl", "b.jsonl"]
    changes = data["comparison"]["runs"][0]["changes"]
    assert data["comparison"]["baseline"] == "a.jsonl"
    assert changes["succeeded"] == {"baseline": 50, "value": 60, "change": 10, "relative": 0.2}
    assert changes["truncated_share"]["change"] == pytest.approx(-0.1)
    # TTFT mean: a has 10 of 50 at 1 s (0.28 s), b 6 of 60 (0.19 s).
    assert changes["latency.ttft.mean"]["baseline"] == pytest.approx(0.28)
    assert changes["latency.ttft.mean"]["value"] == pytest.approx(0.19)

    html = tmp_path / "compare.html"
    _ok(cli("report", str(a), str(b), "-o", str(html)))
    page = _parse(html)
    _assert_self_contained(page)
    assert "a.jsonl" in page.text and "b.jsonl" in page.text
    assert "+20.0%" in page.text  # the change of succeeded, beside the value


def test_changes_below_the_shown_precision_read_as_unchanged() -> None:
    from jsonlbatch.report.tables import Cell, format_delta

    assert format_delta(Cell(0.99999, "seconds", 1.0)) == ""  # not "(-0.0%)"
    assert format_delta(Cell(0.5, "share", 0.50001)) == ""
    assert format_delta(Cell(1.1, "seconds", 1.0)) == "+10.0%"


def test_an_unknown_suffix_names_every_known_one(runs: tuple[Path, Path], tmp_path: Path) -> None:
    result = cli("report", str(runs[0]), "-o", str(tmp_path / "report.pdf"))
    assert result.returncode == 2
    assert "name it .html, .md, .json or .txt" in result.stderr


def _glance_row(html: str, label: str) -> str:
    """The HTML of one 'At a glance' card."""
    start = html.index(f'<div class="label">{label}</div>')
    return html[start : html.index("</table>", start)]


def test_a_comparison_colours_new_failures_and_no_cheaper_run_that_only_failed_more(
    tmp_path: Path,
) -> None:
    """Issue 26: "requests failed 0 -> 13" had no colour (no change is shown from 0), and a cost
    drop caused by failures showed green."""
    from report_fixtures import failed_line, ok_line, write_lines

    def run(path: Path, failed: int) -> Path:
        lines = [ok_line(f"r{i}", start=1e9 + i, latency=0.5) for i in range(40 - failed)]
        lines += [failed_line(f"f{i}", start=1e9 + i, latency=0.5) for i in range(failed)]
        return write_lines(path, lines)

    a, b = run(tmp_path / "a.jsonl", 0), run(tmp_path / "b.jsonl", 13)
    out = tmp_path / "c.html"
    done = cli("report", str(a), str(b), "--price", "in=1,out=2", "-o", str(out))
    assert done.returncode == 0, done.stderr
    html = out.read_text()
    failed = _glance_row(html, "requests failed")
    assert '<td class="d bad">+13</td>' in failed, failed
    cost = _glance_row(html, "cost")
    assert 'class="d good"' not in cost and 'class="d same">-32.5%</td>' in cost, cost
    text = cli("report", str(a), str(b)).stdout
    assert "+13" in text  # the text and Markdown tables show the change from 0 too

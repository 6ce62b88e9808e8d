"""`summary.results` after another process changed the output (exec/output/run_outcome.py):
lookups check the file and the line, and iteration sees lines appended since."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from batchutil import cli, write_requests

from jsonlbatch import execute
from jsonlbatch.errors import OutputError
from jsonlbatch.exec.output.run_outcome import Results


def _line(cid: str, text: str) -> bytes:
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
    return orjson.dumps({"custom_id": cid, "response": {"status_code": 200, "body": body},
                         "error": None}) + b"\n"  # fmt: skip


def test_results_follow_a_retry_failed_rewrite_of_the_output(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    requests, out = tmp_path / "req.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 40, max_tokens=4)
    flaky = mock_server(fail_rate=0.5, seed=3)
    summary = execute(requests, out, urls=[flaky], max_retries=0, quiet=True)
    results = summary.results
    failed = [cid for cid, answer in results.items() if not answer.ok]
    assert 5 < len(failed) < 35
    before = {cid: results[cid].text for cid in results}
    inode = out.stat().st_ino
    # another process re-sends the failed ones: their lines are dropped (an atomic replace)
    # and appended again, so every later line moves
    done = cli("exec", str(requests), "-o", str(out), "--url", mock_server(), "--retry-failed",
               "-q")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert out.stat().st_ino != inode
    for cid in before:
        answer = results[cid]
        assert answer.custom_id == cid and answer.ok
        if cid not in failed:
            assert answer.text == before[cid]
    assert len(results) == 40


def test_a_rewrite_in_place_is_noticed_at_the_line_and_appends_are_seen(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(b"".join(_line(f"id{i}", f"answer {i}") for i in range(20)))
    results = Results(str(out))
    assert results["id5"].text == "answer 5" and len(results) == 20
    # the same inode, the same size, the lines in another order, mtime kept: only the line at
    # the offset tells
    stat = out.stat()
    with open(out, "r+b") as f:
        f.write(b"".join(_line(f"id{i}", f"answer {i}") for i in reversed(range(20))))
    os.utime(out, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    for i in range(20):
        assert results[f"id{i}"].text == f"answer {i}"
    # a resumed run appends: the new ids are found, iteration and len see them
    with open(out, "ab") as f:
        f.write(_line("late", "appended"))
    assert results["late"].text == "appended"
    with open(out, "ab") as f:
        f.write(_line("later", "appended too"))
    assert "later" in list(results) and len(results) == 22
    assert [a.custom_id for a in results.answers()][-1] == "later"
    # a line being written (no newline yet) is indexed once complete
    with open(out, "ab") as f:
        f.write(_line("torn", "half")[:20])
    assert "torn" not in results
    with open(out, "ab") as f:
        f.write(_line("torn", "half")[20:])
    assert results["torn"].text == "half"


def test_a_file_that_keeps_changing_under_a_lookup_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(_line("a", "x") + _line("b", "y"))
    results = Results(str(out))
    assert results["b"].text == "y"
    import jsonlbatch.exec.output.run_outcome as run_outcome

    # every read finds another id at the offset (a writer racing the reader)
    monkeypatch.setattr(run_outcome, "read_lines_at", lambda path, offsets: iter([_line("a", "x")]))
    with pytest.raises(OutputError, match="changed while 'b' was being read"):
        results["b"]

"""Resume against what is really in the files: request fingerprints, unreadable complete lines
(never cut as torn), and outputs that are not regular files."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
from batchutil import ENV, cli, exec_cli, read_results, write_requests

from jsonlbatch.batch_format.records import Result


def _run(tmp_path, url, *args):
    return exec_cli(tmp_path / "req.jsonl", tmp_path / "out.jsonl", "--url", url, *args)


def test_an_edited_request_is_refused_then_resent_or_kept(tmp_path, mock_server):
    url = mock_server()
    req, out = tmp_path / "req.jsonl", tmp_path / "out.jsonl"
    lines = write_requests(req, 4)
    assert _run(tmp_path, url).returncode == 0
    before = read_results(out)
    assert all(len(line["metrics"]["fingerprint"]) == 16 for line in before.values())
    # reordered keys and other spacing are the same request
    req.write_bytes(
        b"".join(
            orjson.dumps(dict(reversed(x.items())), option=orjson.OPT_INDENT_2).replace(b"\n", b" ")
            + b"\n"
            for x in lines
        )
    )
    same = _run(tmp_path, url)
    assert same.returncode == 0 and "nothing to send" in same.stderr, same.stderr
    lines[1]["body"]["messages"][0]["content"] = "an edited question"
    lines[3]["body"]["temperature"] = 0.5
    req.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    data = out.read_bytes()
    refused = _run(tmp_path, url)
    assert refused.returncode == 1
    assert "2 requests changed" in refused.stderr and "req-1, req-3" in refused.stderr
    assert "--changed resend" in refused.stderr and "Traceback" not in refused.stderr
    assert out.read_bytes() == data
    kept = _run(tmp_path, url, "--changed", "keep")
    assert kept.returncode == 0 and "nothing to send" in kept.stderr
    assert out.read_bytes() == data
    resent = _run(tmp_path, url, "--changed", "resend")
    assert resent.returncode == 0, resent.stderr
    assert "re-sending 2 requests changed" in resent.stderr
    after = read_results(out)  # one line per id
    assert set(after) == set(before)
    for cid in ("req-0", "req-2"):
        assert after[cid] == before[cid]
    for cid in ("req-1", "req-3"):
        assert after[cid]["metrics"]["fingerprint"] != before[cid]["metrics"]["fingerprint"]
    assert _run(tmp_path, url).returncode == 0  # and now they match


def test_results_written_before_fingerprints_are_accepted_with_a_note(tmp_path, mock_server):
    url = mock_server()
    req, out = tmp_path / "req.jsonl", tmp_path / "out.jsonl"
    write_requests(req, 3)
    assert _run(tmp_path, url).returncode == 0
    old = []
    for raw in out.read_bytes().splitlines():
        line = orjson.loads(raw)
        del line["metrics"]["fingerprint"]
        old.append(orjson.dumps(line) + b"\n")
    out.write_bytes(b"".join(old))
    write_requests(req, 4)
    proc = _run(tmp_path, url)
    assert proc.returncode == 0, proc.stderr
    assert "3 results" in proc.stderr and "without a request fingerprint" in proc.stderr
    assert len(read_results(out)) == 4


def test_a_complete_unreadable_last_line_is_reported_not_cut(tmp_path, mock_server):
    """`NaN` written by another tool ends in a newline: not torn. exec and validate agree."""
    url = mock_server()
    req, out = tmp_path / "req.jsonl", tmp_path / "out.jsonl"
    write_requests(req, 3)
    out.write_bytes(Result("req-0", 200, {"choices": []}).to_line() + b"NaN\n")
    data = out.read_bytes()
    proc = _run(tmp_path, url)
    assert proc.returncode == 1
    assert f"{out}:2: bad JSON" in proc.stderr and "Traceback" not in proc.stderr
    assert out.read_bytes() == data
    assert cli("validate", str(out)).returncode == 1
    # a fragment without its newline is torn, and cut
    out.write_bytes(data[: -len(b"NaN\n")] + b'{"id": "batch_req_1", "custom_')
    proc = _run(tmp_path, url)
    assert proc.returncode == 0 and "cut a torn last line" in proc.stderr, proc.stderr
    assert len(read_results(out)) == 3


def test_a_bom_before_the_only_line_is_read_alike_by_exec_and_validate(tmp_path, mock_server):
    url = mock_server()
    req, out = tmp_path / "req.jsonl", tmp_path / "out.jsonl"
    write_requests(req, 2)
    assert _run(tmp_path, url).returncode == 0
    first = out.read_bytes().splitlines(keepends=True)[0]
    out.write_bytes(b"\xef\xbb\xbf" + first)
    assert cli("validate", str(out)).returncode == 0
    proc = _run(tmp_path, url)
    assert proc.returncode == 0, proc.stderr
    assert "1 ok" in proc.stderr and "1 already done" in proc.stderr
    assert len(out.read_bytes().splitlines()) == 2


def test_a_response_line_validate_rejects_is_rejected_by_exec_too(tmp_path, mock_server):
    url = mock_server()
    req, out = tmp_path / "req.jsonl", tmp_path / "out.jsonl"
    write_requests(req, 2)
    bad = {"custom_id": "req-0", "response": {"status_code": "200", "body": {}}, "error": None}
    out.write_bytes(orjson.dumps(bad) + b"\n")
    assert cli("validate", str(out)).returncode == 1
    proc = _run(tmp_path, url)
    assert proc.returncode == 1 and f"{out}:1: response.status_code" in proc.stderr


def test_an_output_that_is_not_a_regular_file_is_refused(tmp_path, mock_server):
    url = mock_server()
    write_requests(tmp_path / "req.jsonl", 2)
    os.mkfifo(tmp_path / "out.jsonl")
    proc = exec_cli(tmp_path / "req.jsonl", tmp_path / "out.jsonl", "--url", url, timeout=60)
    assert proc.returncode == 1
    assert "is not a regular file (a FIFO)" in proc.stderr
    proc = exec_cli(tmp_path / "req.jsonl", tmp_path, "--url", url, timeout=60)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr


def test_validate_never_calls_an_unreadable_file_ok_and_reads_pipes(tmp_path):
    missing = cli("validate", "--kind", "requests", str(tmp_path / "missing.jsonl"))
    assert missing.returncode == 1 and "cannot read" in missing.stderr
    assert "ok" not in missing.stdout
    torn = Result("a", None, error={"code": "x", "message": "y"}).to_line() + b'{"id": "batch_'
    piped = subprocess.run(
        [sys.executable, "-m", "jsonlbatch", "validate", "-"],
        input=torn,
        capture_output=True,
        env=ENV,
        timeout=60,
    )
    assert piped.returncode == 1
    assert b"/dev/stdin:2: torn last line" in piped.stdout

"""What a newcomer reads (issue 40, items 3, 5 and 7): the line a dead `--url` shows while it is
waited for, `gen --model` per row for a fleet, exit statuses, hints and examples in `--help`,
and messages in plain English. The real CLI in subprocesses, real HTTP to the mock."""

from __future__ import annotations

import signal
import subprocess
from collections import Counter
from pathlib import Path

import orjson
from batchutil import cli, exec_cli, read_results, start_cli, write_requests
from conftest import free_port
from contractutil import SCHEMA

from jsonlbatch.answer_contract.schema_forms import with_schema
from jsonlbatch.batch_format.records import CHAT_URL


def test_a_dead_url_says_how_long_it_is_waited_for_and_what_waits(tmp_path: Path) -> None:
    requests = tmp_path / "req.jsonl"
    write_requests(requests, 5)
    dead = f"http://127.0.0.1:{free_port()}/v1"
    done = exec_cli(requests, tmp_path / "out.jsonl", "--url", dead, "--ready-timeout", "2")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    waiting = [x for x in done.stderr.splitlines() if x.startswith("waiting for")]
    assert waiting, done.stderr
    assert "of --ready-timeout 2s)" in waiting[0]  # how long, and the option that changes it
    assert waiting[0].endswith("; 5 requests waiting")


def test_sigterm_stops_a_wait_whose_stderr_is_gone(tmp_path: Path) -> None:
    """`exec ... 2>&1 | head -1`: once the reader is gone, writing the "stopping" note raised
    before the run stopped anything, so SIGTERM was ignored for the whole --ready-timeout."""
    requests = tmp_path / "req.jsonl"
    write_requests(requests, 5)
    dead = f"http://127.0.0.1:{free_port()}/v1"
    proc = start_cli("exec", str(requests), "-o", str(tmp_path / "out.jsonl"), "--url", dead)
    assert proc.stderr is not None
    assert proc.stderr.readline().startswith("waiting for")  # what `head -1` reads
    proc.stderr.close()  # ... then it exits
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)  # the grace period is 10 s; the wait was 1800 s
    except subprocess.TimeoutExpired:
        raise AssertionError("SIGTERM was ignored while stderr was gone") from None
    assert proc.returncode != 0
    assert not (tmp_path / "out.jsonl").exists() or (tmp_path / "out.jsonl").read_bytes() == b""


def test_gen_model_from_a_template_writes_a_fleets_file(tmp_path: Path) -> None:
    data = tmp_path / "rows.jsonl"
    rows = [{"id": f"t{i}", "q": f"q{i}", "model": ("small", "large")[i % 2]} for i in range(6)]
    data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    out = tmp_path / "req.jsonl"
    done = cli("gen", "--data", str(data), "--prompt", "{{ q }}", "--id", "{{ id }}",
               "--samples", "2", "--model", "{{ model }}", "-o", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert Counter(x["body"]["model"] for x in lines) == {"small": 6, "large": 6}
    assert {x["custom_id"]: x["body"]["model"] for x in lines}["t1|1"] == "large"
    assert all(next(iter(x["body"])) == "model" for x in lines)  # first, where one looks
    # a row without the field: an error naming file, line and field; nothing written
    data.write_bytes(data.read_bytes() + b'{"id": "t9", "q": "q9"}\n')
    bad = cli("gen", "--data", str(data), "--prompt", "{{ q }}", "--id", "{{ id }}",
              "--model", "{{ model }}", "-o", str(tmp_path / "bad.jsonl"))  # fmt: skip
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert f"{data}:7: model:" in bad.stderr and not (tmp_path / "bad.jsonl").exists()


def test_help_lists_every_exit_status_and_groups_show_examples() -> None:
    text = " ".join(cli("exec", "--help").stdout.split())  # unwrapped
    for status in ("0 all ok", "1 bad input", "2 a wrong option", "3 some requests failed",
                   "4 stopped by --max-cost", "130 interrupted"):  # fmt: skip
        assert status in text
    for group in ("post", "batches"):
        shown = cli(group, "--help")
        assert shown.returncode == 0 and "Examples:" in shown.stdout
        assert f"jsonlbatch {group} " in shown.stdout.split("Examples:")[1]


def test_validate_gives_the_gen_hint_exec_gives(tmp_path: Path) -> None:
    bare = tmp_path / "bare.jsonl"
    bare.write_text('{"model": "m", "messages": [{"role": "user", "content": "hi"}]}\n')
    table = tmp_path / "rows.csv"
    table.write_text("id,text\n1,hello\n")
    for path in (bare, table):
        checked = cli("validate", str(path))
        sent = exec_cli(path, path.with_suffix(".out.jsonl"), "--url", "http://127.0.0.1:9/v1")
        assert checked.returncode == 1 and sent.returncode == 1
        hint = [x for x in sent.stderr.splitlines() if x.startswith("hint: ")]
        assert hint and "jsonlbatch gen" in hint[0]
        assert hint[0] in checked.stderr.splitlines()


def test_a_failure_after_reasks_reads_as_english(tmp_path: Path, mock_server) -> None:
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    body = with_schema(CHAT_URL, {"model": "mock", "messages": [
        {"role": "user", "content": "label it"}]}, SCHEMA)  # fmt: skip
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": CHAT_URL,
              "body": {**body, "seed": i}} for i in range(6)]  # fmt: skip
    requests.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    done = exec_cli(requests, out, "--url", mock_server(break_json=1.0), "--reask", "2", "-q")
    assert done.returncode == 3, done.stderr
    messages = [r["error"]["message"] for r in read_results(out).values() if r["error"]]
    assert any(m.startswith("all 3 answers broke the schema") for m in messages), messages
    assert not any("the all" in m for m in messages)

"""What `jsonlbatch report` reads: bad files, torn tails, request fields joined by custom_id."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from batchutil import cli
from report_fixtures import failed_line, ok_line, write_lines

from jsonlbatch.errors import InputError, UsageError
from jsonlbatch.report import build_report


def _requests(path: Path, rows: list[tuple[str, float, str]]) -> Path:
    lines = [
        {
            "custom_id": cid,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "mock",
                "messages": [{"role": "user", "content": "hi"}],
                "temperature": temperature,
                "metadata": {"task": task},
            },
        }
        for cid, temperature, task in rows
    ]
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return path


def test_breakdown_by_request_fields_joined_by_custom_id(tmp_path: Path) -> None:
    requests = _requests(
        tmp_path / "requests.jsonl",
        [("a", 0.0, "math"), ("b", 0.7, "math"), ("c", 0.7, "code")],
    )
    responses = write_lines(
        tmp_path / "responses.jsonl",
        [
            ok_line("a", start=0.0, latency=1.0, completion=10),
            ok_line("b", start=0.0, latency=2.0, completion=20),
            failed_line("c", start=0.0, latency=3.0),
            ok_line("zz", start=0.0, latency=1.0),  # a line whose request is not given
        ],
    )
    report = build_report(
        [str(responses)], by=["body.temperature", "task", "model"], requests=[str(requests)]
    )
    breakdown = report.runs[0].breakdown
    temperature = breakdown["body.temperature"]
    assert {k: v.lines for k, v in temperature.items()} == {
        "0.0": 1,
        "0.7": 2,
        "(not in requests)": 1,
    }
    assert temperature["0.7"].failed == 1
    assert temperature["0.0"].completion_tokens == 10
    # `task` is found under body.metadata; the failed line's model comes from its request.
    assert {k: v.lines for k, v in breakdown["task"].items()} == {
        "math": 2,
        "code": 1,
        "(not in requests)": 1,
    }
    assert {k: v.lines for k, v in breakdown["model"].items()} == {"mock": 4}


def test_request_field_without_requests_file_is_a_usage_error(tmp_path: Path) -> None:
    responses = write_lines(tmp_path / "r.jsonl", [ok_line("a", start=0.0, latency=1.0)])
    with pytest.raises(UsageError, match="--requests"):
        build_report([str(responses)], by=["body.temperature"])


def test_malformed_lines_are_all_reported_with_file_line_and_field(tmp_path: Path) -> None:
    good = orjson.dumps(ok_line("a", start=0.0, latency=1.0)).decode()
    bad_metric = ok_line("b", start=0.0, latency=1.0)
    bad_metric["metrics"]["latency_s"] = "slow"
    path = tmp_path / "r.jsonl"
    path.write_text(
        "\n".join([good, "{not json", orjson.dumps(bad_metric).decode(), '{"custom_id": 3}']) + "\n"
    )
    with pytest.raises(InputError) as caught:
        build_report([str(path)])
    located = {(p.line, p.field) for p in caught.value.problems}
    assert (2, None) in located
    assert (3, "metrics.latency_s") in located
    assert (4, "custom_id") in located
    assert all(p.path == str(path) for p in caught.value.problems)


def test_torn_last_line_is_skipped_and_said(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "r.jsonl", [ok_line("a", start=0.0, latency=1.0)])
    with open(path, "ab") as f:
        f.write(b'{"custom_id": "b", "respo')  # a run still writing
    run = build_report([str(path)]).runs[0]
    assert run.lines == 1 and run.torn_tail
    result = cli("report", str(path))
    assert result.returncode == 0, result.stderr
    assert "torn last line" in result.stdout


@pytest.mark.parametrize("choices", [5, "stop", {"finish_reason": "stop"}])
def test_ok_line_with_choices_not_a_list_is_read(tmp_path: Path, choices: object) -> None:
    line = ok_line("a", start=0.0, latency=1.0)
    line["response"]["body"]["choices"] = choices
    path = write_lines(tmp_path / "r.jsonl", [line, ok_line("b", start=0.0, latency=2.0)])
    run = build_report([str(path)]).runs[0]
    assert run.lines == 2
    result = cli("report", str(path))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr


def test_cli_errors_are_clean_messages(tmp_path: Path) -> None:
    requests = _requests(tmp_path / "requests.jsonl", [("a", 0.0, "x")])
    cases = [
        (["report", str(tmp_path / "missing.jsonl")], 1, "cannot read"),
        (["report", str(requests)], 1, "holds requests, not responses"),
        (["report", str(requests), "--sla", "ttft=soon"], 2, "--sla"),
    ]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    cases.append((["report", str(empty)], 1, "no response lines"))
    responses = write_lines(tmp_path / "r.jsonl", [ok_line("a", start=0.0, latency=1.0)])
    cases.append((["report", str(responses), "-o", str(tmp_path / "out.pdf")], 2, "--format"))
    cases.append((["report", str(responses), "--by", "temperature"], 2, "--requests"))
    for args, code, message in cases:
        result = cli(*args)
        assert result.returncode == code, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr


def test_a_conversations_file_is_refused_naming_its_calls_file(tmp_path: Path) -> None:
    """`report conv.jsonl` (a rollout's conversations) said "N malformed response lines"."""
    conv = tmp_path / "conv.jsonl"
    line = {"custom_id": "c0", "status": "completed", "turns": 1, "messages": []}
    conv.write_bytes(orjson.dumps(line) + b"\n")
    result = cli("report", str(conv))
    assert result.returncode == 1, result.stderr
    assert "conversations file" in result.stderr
    assert str(tmp_path / "conv.calls.jsonl") in result.stderr
    assert "malformed" not in result.stderr and "Traceback" not in result.stderr


def test_a_calls_file_turn_sent_again_counts_its_last_line(tmp_path: Path) -> None:
    """A failed conversation run again appends its turn's new answer after the old failure:
    the turn counts once, as its last line (as exec's resume takes a success over a failure)."""
    path = write_lines(
        tmp_path / "conv.calls.jsonl",
        [
            ok_line("c0#t1", start=0.0, latency=1.0),
            failed_line("c0#t2", start=1.0, latency=1.0),
            failed_line("c1#t1", start=0.0, latency=1.0),  # never sent again: still a failure
            ok_line("c0#t2", start=5.0, latency=1.0),
        ],
    )
    run = build_report([str(path)]).runs[0]
    assert (run.lines, run.succeeded, run.failed) == (3, 2, 1)

"""`jsonlbatch report` on the output of a real `jsonlbatch exec` run against the mock server:
every figure is checked against the response file itself."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from batchutil import cli, read_results

from jsonlbatch.batch_format.records import is_failure

N = 30


def _requests(path: Path) -> None:
    lines = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "mock",
                "messages": [{"role": "user", "content": f"question number {i}"}],
                "max_tokens": 4 if i % 3 == 0 else 32,  # the mock cuts the first at 4 words
            },
        }
        for i in range(N)
    ]
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))


def _run(tmp_path: Path, url: str, *extra: str) -> tuple[Path, Path, dict[str, dict]]:
    requests, responses = tmp_path / "requests.jsonl", tmp_path / "responses.jsonl"
    _requests(requests)
    result = cli("exec", str(requests), "-o", str(responses), "--url", url, "-q", *extra)
    assert result.returncode in (0, 3), result.stderr  # 3: finished with failed requests
    return requests, responses, read_results(responses)


def _report(*args: str) -> dict:
    result = cli("report", *args, "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_report_of_a_real_exec_run(tmp_path: Path, mock_server: Callable[..., str]) -> None:
    url = mock_server(fail_rate=0.25, seed=11)
    requests, responses, lines = _run(tmp_path, url, "--max-retries", "0")
    assert len(lines) == N
    ok = [line for line in lines.values() if not is_failure(line)]
    failed = [line for line in lines.values() if is_failure(line)]
    assert ok and failed, "the seeded mock should both answer and fail"

    data = _report(str(responses), "--by", "endpoint", "--by", "max_tokens",
                   "--requests", str(requests))  # fmt: skip
    run = data["runs"][0]
    assert (run["lines"], run["succeeded"], run["failed"]) == (N, len(ok), len(failed))
    statuses = Counter(str(line["response"]["status_code"]) for line in lines.values())
    assert run["status_codes"] == dict(statuses)
    usage = [line["response"]["body"]["usage"] for line in ok]
    assert run["prompt_tokens"] == sum(u["prompt_tokens"] for u in usage)
    assert run["completion_tokens"] == sum(u["completion_tokens"] for u in usage)
    reasons = Counter(
        c["finish_reason"] for line in ok for c in line["response"]["body"]["choices"]
    )
    assert run["finish_reasons"] == dict(reasons)
    assert reasons["length"] > 0
    latencies = [line["metrics"]["latency_s"] for line in ok]
    assert run["latency"]["e2e"]["count"] == len(ok)
    assert run["latency"]["e2e"]["max"] == pytest.approx(max(latencies))
    assert run["latency"]["ttft"] is None  # not streamed
    starts = [line["metrics"]["start_time"] for line in lines.values()]
    ends = [line["metrics"]["start_time"] + line["metrics"]["latency_s"] for line in lines.values()]
    assert run["wall_s"] == pytest.approx(max(ends) - min(starts))
    assert run["requests_per_s"] == pytest.approx(len(ok) / run["wall_s"])

    assert list(run["breakdown"]["endpoint"]) == [url]
    by_budget = run["breakdown"]["max_tokens"]
    assert set(by_budget) == {"4", "32"}
    assert by_budget["4"]["lines"] == N // 3
    assert by_budget["4"]["truncated"] == by_budget["4"]["succeeded"]  # every one cut
    assert by_budget["32"]["truncated"] == 0

    table = cli("report", str(responses))
    assert table.returncode == 0, table.stderr
    assert "TTFT, TPOT and ITL are measured by `jsonlbatch exec --stream` only." in table.stdout


def test_report_of_a_streamed_exec_run(tmp_path: Path, mock_server: Callable[..., str]) -> None:
    url = mock_server(tokens_per_second=2000)
    _, responses, lines = _run(tmp_path, url, "--stream")
    data = _report(str(responses), "--sla", "ttft=10s")
    run = data["runs"][0]
    assert run["succeeded"] == N
    ttfts = [line["metrics"]["ttft_s"] for line in lines.values()]
    assert run["latency"]["ttft"]["count"] == N
    assert run["latency"]["ttft"]["max"] == pytest.approx(max(ttfts))
    tpots = [line["metrics"]["tpot_s"] for line in lines.values() if "tpot_s" in line["metrics"]]
    assert run["latency"]["tpot"]["count"] == len(tpots) > 0
    assert run["sla"][0]["judged"] == N


def test_report_of_a_resumed_file_counts_only_the_time_spent_sending(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    """Issue 26: a file resumed later showed the wall time from the first run's first send to
    the last run's last answer (304 s for 3 s of work). exec marks each run's lines."""
    url = mock_server(latency=0.02)
    requests, responses = tmp_path / "requests.jsonl", tmp_path / "responses.jsonl"
    _requests(requests)
    part = tmp_path / "part.jsonl"
    part.write_bytes(b"".join(requests.read_bytes().splitlines(keepends=True)[:10]))
    for source in (part, requests):  # the second run resumes: 10 done, 20 to send
        done = cli("exec", str(source), "-o", str(responses), "--url", url, "-q")
        assert done.returncode == 0, done.stderr
    lines = list(read_results(responses).values())
    windows: dict[str, list[float]] = {}
    for line in lines:
        m = line["metrics"]
        a, b = windows.setdefault(m["run"], [m["start_time"], 0.0]), m["start_time"]
        a[0], a[1] = min(a[0], b), max(a[1], b + m["latency_s"])
    assert len(windows) == 2
    sending = sum(b - a for a, b in windows.values())
    run = _report(str(responses))["runs"][0]
    assert run["runs"] == 2
    assert run["wall_s"] == pytest.approx(sending)
    # the second exec's start-up lies between the runs: it is no part of the time sending
    assert run["wall_s"] < run["end_time"] - run["start_time"]
    assert run["requests_per_s"] == pytest.approx(N / sending)
    text = cli("report", str(responses))
    assert "responses.jsonl spans 2 runs of exec" in text.stdout
    html = cli("report", str(responses), "--format", "html", "-o", str(tmp_path / "r.html"))
    assert html.returncode == 0, html.stderr

"""The viewer's index, queries and HTTP API: real files, and `jsonlbatch view` as a real
process answering over 127.0.0.1."""

from __future__ import annotations

import json
import select
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from batchutil import cli, start_cli
from viewutil import ViewProcess, response_line, write_requests, write_run

from jsonlbatch.pricing.cost import Price
from jsonlbatch.view.index import LineIndex
from jsonlbatch.view.query import Query, Searcher


def _index(path: Path, **kwargs: object) -> LineIndex:
    index = LineIndex(str(path), **kwargs)  # type: ignore[arg-type]
    while index.refresh(max_lines=7):  # small steps: the stepping itself is under test
        pass
    return index


def test_index_summarizes_every_line_in_small_steps(tmp_path: Path) -> None:
    index = _index(write_run(tmp_path / "r.jsonl", 100), price=Price(1.0, 4.0))
    assert len(index) == 100 and index.done
    failed = [i for i in range(100) if not index.flags[i] & 1]
    assert failed == [i for i in range(100) if i % 17 == 0]
    assert index.errors.names[index.error[0]] == "http_500"
    assert index.finishes.names[index.finish[23]] == "length" and index.flags[23] & 2
    assert index.prompt[1] == 21 and index.completion[1] == 11
    assert index.cost[1] == pytest.approx((21 * 1.0 + 11 * 4.0) / 1e6)
    assert json.loads(index.read(42))["custom_id"] == "task-00042"


def test_index_follows_a_growing_file_and_waits_for_a_torn_line(tmp_path: Path) -> None:
    path = write_run(tmp_path / "r.jsonl", 10)
    index = _index(path)
    assert len(index) == 10
    half = json.dumps(response_line(10)).encode()
    with path.open("ab") as fh:
        fh.write(half[:30])  # a line still being written
    assert index.refresh() == 0 and len(index) == 10
    with path.open("ab") as fh:
        fh.write(half[30:] + b"\n")
    assert index.refresh() == 1 and json.loads(index.read(10))["custom_id"] == "task-00010"


def test_index_starts_again_when_the_file_is_replaced(tmp_path: Path) -> None:
    path = write_run(tmp_path / "r.jsonl", 30)
    index = _index(path)
    replacement = write_run(tmp_path / "new.jsonl", 5, shift=1)
    replacement.replace(path)  # an atomic rewrite, as --retry-failed does
    while index.refresh():
        pass
    assert len(index) == 5
    assert [json.loads(index.read(i))["custom_id"] for i in range(5)] == [
        f"task-{i:05d}" for i in range(5)
    ]


def test_index_marks_lines_that_are_not_responses(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(
        '{"custom_id": "a", "response": {"status_code": 200, "body": {}}}\nnot json\n[1]\n'
    )
    index = _index(path)
    assert len(index) == 3
    assert [index.flags[i] & 8 for i in range(3)] == [0, 8, 8]


def test_queries_filter_sort_page_and_search(tmp_path: Path) -> None:
    path = write_run(tmp_path / "r.jsonl", 200)
    requests = write_requests(tmp_path / "q.jsonl", 200)
    index = _index(path)
    req_index = _index(requests)
    searcher = Searcher(index, [req_index])

    total, rows = searcher.page(Query(status="failed"))
    assert total == len([i for i in range(200) if i % 17 == 0]) and rows[0] == 0
    total, rows = searcher.page(Query(status="truncated"))
    assert rows == [i for i in range(200) if i % 23 == 0 and i % 17 != 0]
    total, rows = searcher.page(Query(model="m", size=5, page=1))
    assert total == len([i for i in range(200) if i % 2 and i % 17]) and len(rows) == 5
    assert all(i % 2 for i in rows)

    _, rows = searcher.page(Query(sort="latency", desc=True, size=200))
    latencies = [index.latency[i] for i in rows]
    assert latencies == sorted(latencies, reverse=True)

    # Text: in the answer (as typed, with JSON escapes undone) and in the joined request.
    _, rows = searcher.page(Query(q="<SCRIPT>", size=200))
    assert rows and all(ANSWER_SCRIPT in index.read(i).decode() for i in rows)
    _, rows = searcher.page(Query(q="needle-123"))
    assert rows == [123]
    assert searcher.page(Query(q="needle-123", status="failed"))[0] == 0

    facets = searcher.facets()
    assert facets["error"] == {"http_500": 12} and facets["status"]["failed"] == 12
    assert index.find("task-00077") == [77] and index.find("task-99999") == []


ANSWER_SCRIPT = "<script>document.title='pwned'</script>"


@pytest.mark.parametrize(
    ("params", "field"),
    [({"status": "weird"}, "status"), ({"sort": "name"}, "sort"), ({"page": "-1"}, "page")],
)
def test_a_bad_query_names_its_field(params: dict[str, str], field: str) -> None:
    from jsonlbatch.errors import UsageError

    with pytest.raises(UsageError, match=field):
        Query.from_params(params)


@pytest.fixture
def viewer(tmp_path: Path) -> Iterator[tuple[ViewProcess, Path]]:
    a = write_run(tmp_path / "a.jsonl", 60)
    write_run(tmp_path / "b.jsonl", 60, shift=1)
    requests = write_requests(tmp_path / "q.jsonl", 60)
    proc = ViewProcess(str(a), str(tmp_path / "b.jsonl"), "--requests", str(requests))
    yield proc, tmp_path
    proc.close()


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_api_serves_rows_a_request_and_a_comparison(viewer: tuple[ViewProcess, Path]) -> None:
    proc, _ = viewer
    assert proc.url.startswith("http://127.0.0.1:")
    status, data = _get(proc.url + "api/rows?status=failed&size=2")
    assert status == 200 and data["total"] == 4 and data["rows"][0]["custom_id"] == "task-00000"
    assert data["rows"][0]["error"] == "http_500"

    _, line = _get(proc.url + "api/line?row=3")
    assert line["custom_id"] == "task-00003"
    assert [t["role"] for t in line["prompt"]] == ["system", "user"]
    assert line["choices"][0]["reasoning"] == "First I add, then I check."
    assert line["choices"][0]["text"] == "Paris is the capital."
    _, line = _get(proc.url + "api/line?row=2")
    assert json.loads(line["choices"][0]["json"]) == {"label": "positive", "score": 0.9}

    _, compare = _get(proc.url + "api/compare?id=task-00005")
    texts = [pane["choices"][0]["text"] for pane in compare["panes"]]
    assert texts[0] != texts[1] and all(pane["found"] for pane in compare["panes"])


def test_the_api_is_read_only_and_checks_the_host(viewer: tuple[ViewProcess, Path]) -> None:
    proc, _ = viewer
    status, data = _get(proc.url + "api/files", headers={"Host": "attacker.example"})
    assert status == 421 and "Host" in data["error"]
    request = urllib.request.Request(proc.url + "api/files", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == 405
    status, data = _get(proc.url + "api/line?row=999")
    assert status == 400 and "row" in data["error"]
    with urllib.request.urlopen(proc.url, timeout=30) as response:
        policy = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy.split("style-src")[0]


def test_view_refuses_a_missing_file_and_a_request_file(tmp_path: Path) -> None:
    result = cli("view", str(tmp_path / "nope.jsonl"))
    assert result.returncode == 2 and "nope.jsonl" in result.stderr
    assert "Traceback" not in result.stderr
    requests = write_requests(tmp_path / "q.jsonl", 3)
    result = cli("view", str(requests))
    assert result.returncode == 2 and "holds requests, not responses" in result.stderr
    assert f"--requests {requests}" in result.stderr


def _read_until(proc: object, marker: str, timeout: float = 60.0) -> str:
    """The first stderr line of a running CLI process that holds `marker`."""
    deadline = time.monotonic() + timeout
    stream = proc.stderr  # type: ignore[attr-defined]
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], 0.2)
        if ready:
            line = stream.readline()
            if marker in line:
                return line
            if not line and proc.poll() is not None:  # type: ignore[attr-defined]
                break
    raise AssertionError(f"no {marker!r} line")


def _prometheus(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


@pytest.mark.slow
def test_exec_view_and_metrics_follow_a_live_run(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    from conftest import free_port

    requests = write_requests(tmp_path / "requests.jsonl", 30)
    out = tmp_path / "out.jsonl"
    metrics_port = free_port()
    run = start_cli(
        "exec", str(requests), "-o", str(out), "--serve", "mock", "--server-arg=--latency=0.15",
        "--server-arg=--fail-rate=0.2", "-c", "2", "--max-retries", "0", "--view",
        "--metrics-port", str(metrics_port), "--quiet",
    )  # fmt: skip
    view_url = _read_until(run, "view: ").split("view: ")[1].split()[0]
    assert view_url.startswith("http://127.0.0.1:")
    seen: list[int] = []
    for _ in range(300):  # bounded: about a minute at most
        _, live = _get(view_url + "api/live")
        if live["run"] and live["run"].get("total"):
            assert live["run"]["total"] == 30
            seen.append(live["run"]["written"])
            if seen[-1] >= 10:
                break
        time.sleep(0.2)
    assert seen and seen[-1] >= 10 and len(set(seen)) > 1, seen
    assert live["files"][0]["lines"] >= 1  # the page indexes the output as it grows

    samples = _prometheus(f"http://127.0.0.1:{metrics_port}/metrics")
    ok = samples.get('jsonlbatch_requests_total{outcome="ok"}', 0.0)
    failed = samples.get('jsonlbatch_requests_total{outcome="failed"}', 0.0)
    assert 10 <= ok + failed <= 30
    assert failed == sum(v for k, v in samples.items() if k.startswith("jsonlbatch_failures_total"))
    assert samples["jsonlbatch_request_latency_seconds_count"] == ok
    assert (
        sum(v for k, v in samples.items() if k.startswith("jsonlbatch_attempts_total"))
        >= ok + failed
    )
    assert samples["jsonlbatch_requests_total_in_job"] == 30
    assert samples['jsonlbatch_tokens_total{kind="completion"}'] > 0

    assert run.wait(120) in (0, 3)  # 3: some requests failed, as the mock was told to
    ids = [json.loads(x)["custom_id"] for x in out.read_text().splitlines()]
    assert sorted(ids) == [f"task-{i:05d}" for i in range(30)]
    with pytest.raises(OSError):  # the page and the metrics went with the run
        urllib.request.urlopen(view_url + "api/files", timeout=5)


def test_exec_view_is_refused_with_the_batch_api(tmp_path: Path) -> None:
    requests = write_requests(tmp_path / "requests.jsonl", 2)
    result = cli("exec", str(requests), "-o", str(tmp_path / "o.jsonl"), "--batch-api",
                 "--url", "http://127.0.0.1:9/v1", "--view")  # fmt: skip
    assert result.returncode != 0 and "--view" in result.stderr
    assert "Traceback" not in result.stderr


def test_schema_and_judge_verdicts_and_cache_hits_are_shown(tmp_path: Path) -> None:
    lines = [response_line(i) for i in (1, 2, 3, 4)]
    lines[0]["metrics"]["contract"] = {"valid": True, "asks": 1, "choices": []}
    lines[1]["metrics"]["contract"] = {"valid": False, "asks": 3, "choices": []}
    lines[2]["metrics"]["cache"] = "hit"
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    index = _index(path)
    searcher = Searcher(index)
    assert searcher.page(Query(status="valid"))[1] == [0]
    assert searcher.page(Query(status="invalid"))[1] == [1]
    assert searcher.page(Query(status="cached"))[1] == [2]
    assert searcher.facets()["status"]["invalid"] == 1


def test_a_calls_file_turn_1_shows_its_request_lines_prompt(tmp_path: Path) -> None:
    """`view --requests req.jsonl conv.calls.jsonl`: the request line `task-00001` is the first
    turn `task-00001#t1`; a later turn's prompt is not in either file, and the pane says so."""
    calls = tmp_path / "conv.calls.jsonl"
    with calls.open("w") as fh:
        for cid in ("task-00001#t1", "task-00001#t1.ask1", "task-00001#t2"):
            line = response_line(1, fail_every=1000)
            line["custom_id"] = cid
            fh.write(json.dumps(line) + "\n")
    requests = write_requests(tmp_path / "q.jsonl", 3)
    proc = ViewProcess(str(calls), "--requests", str(requests))
    try:
        _, first = _get(proc.url + "api/line?row=0")
        assert first["request_known"] and [t["role"] for t in first["prompt"]] == ["system", "user"]
        assert "prompt_note" not in first
        for row in (1, 2):
            _, later = _get(proc.url + f"api/line?row={row}")
            assert not later["request_known"] and later["prompt"] == []
            assert "conversations file" in later["prompt_note"]
    finally:
        proc.close()

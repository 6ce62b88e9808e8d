"""Every count a run shows adds up to the lines of its file (issue 40, item 1): the cache's hits
and misses to the requests looked up, `metrics.attempts` never below `contract.asks` across a
resumed re-ask, the summary's re-asks within its retries, and the metrics endpoint's requests to
the lines written, cache hits included. Real HTTP to the mock, real cache directories."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import orjson
import pytest
from batchutil import chat_body, read_results
from contractutil import SCHEMA

from jsonlbatch import execute
from jsonlbatch.answer_contract.schema_forms import with_schema
from jsonlbatch.batch_format.records import CHAT_URL, fingerprint, request_line
from jsonlbatch.cache import cache_stats
from jsonlbatch.exec.hooks.contract_check import journal_path
from jsonlbatch.exec.hooks.seams import Seams
from jsonlbatch.file_io.jsonl import iter_lines


def sent(url: str) -> int:
    """Chat requests the mock has answered so far."""
    with urllib.request.urlopen(url.replace("/v1", "/mock/stats"), timeout=10) as resp:
        return json.loads(resp.read())["requests"].get(CHAT_URL, 0)


def write(path: Path, bodies: list[dict]) -> None:
    path.write_bytes(b"".join(request_line(f"r{i}", b) for i, b in enumerate(bodies)))


def test_cache_hits_and_misses_add_up_to_the_requests(tmp_path, mock_server):
    """`gen --samples 4` with a fresh cache: each sampled body's first copy is looked up during
    the input scan, then once more with the later copies once the file is counted; that is one
    miss, not two (the summary said "50 misses" for 40 requests)."""
    url = mock_server()
    cache = str(tmp_path / "cache")
    sampled = [chat_body(i, temperature=0.8, max_tokens=4) for i in range(10)]
    bodies = [b for b in sampled for _ in range(4)] + [chat_body(99, temperature=0, max_tokens=4)]
    requests = tmp_path / "req.jsonl"
    write(requests, bodies)
    first = execute(str(requests), str(tmp_path / "a.jsonl"), urls=[url], quiet=True,
                    cache=cache)  # fmt: skip
    assert sent(url) == 41 and first.succeeded == 41
    assert "0 hits (" in first.cache and "41 misses, 41 answers stored" in first.cache
    # the same file into a new output: answered whole by the cache
    again = execute(str(requests), str(tmp_path / "b.jsonl"), urls=[url], quiet=True,
                    cache=cache)  # fmt: skip
    assert sent(url) == 41 and again.cache_hits == 41
    assert "41 hits (" in again.cache and "0 misses, 0 answers stored" in again.cache
    # one more request: one miss, one answer stored (in the singular)
    write(requests, [*bodies, chat_body(100, temperature=0.8, max_tokens=4)])
    third = execute(str(requests), str(tmp_path / "c.jsonl"), urls=[url], quiet=True,
                    cache=cache)  # fmt: skip
    assert sent(url) == 42 and third.cache_hits == 41
    assert "41 hits (" in third.cache and "1 miss, 1 answer stored" in third.cache
    stats = cache_stats(cache)
    assert (stats.hits, stats.misses) == (82, 42)  # hits + misses = the 123 requests looked up


def _schema_request(path: Path, count: int) -> list[bytes]:
    lines = []
    for i in range(count):
        body = {"model": "mock", "messages": [{"role": "user", "content": f"review {i}"}]}
        lines.append(request_line(f"r{i}", with_schema(CHAT_URL, body, SCHEMA)))
    path.write_bytes(b"".join(lines))
    return [raw for _, raw in iter_lines(path)]


@pytest.mark.parametrize("journaled_attempts", [5, None])  # None: a journal from before 0.x
def test_a_resumed_reask_counts_the_earlier_runs_attempts(
    tmp_path, mock_server, journaled_attempts
):
    """A run killed while re-asking left its journal: request r0 had two answers, both broken,
    and its third ask in flight. The resume sends that third ask; the line's `attempts` counts
    the killed run's too (it said 1 with `asks` 3), and the summary's re-asks are this run's,
    within its retries, with the earlier run's said apart."""
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    raws = _schema_request(requests, 3)
    obj = orjson.loads(raws[0])
    entry = {"custom_id": "r0", "fingerprint": fingerprint(raws[0], obj["url"], obj["body"]),
             "asks": 2, "answer": "not json", "error": "not JSON"}  # fmt: skip
    if journaled_attempts is not None:
        entry["attempts"] = journaled_attempts
    Path(journal_path(str(out))).write_bytes(orjson.dumps(entry) + b"\n")
    summary = execute(str(requests), str(out), urls=[mock_server()], quiet=True, reask=3)
    lines = read_results(out)
    r0 = lines["r0"]["metrics"]
    assert r0["contract"]["asks"] == 3 and r0["contract"]["asks_before"] == 2
    assert r0["attempts"] == 1 + (journaled_attempts or 2)  # this run's one, and the earlier
    for line in lines.values():
        assert line["metrics"]["attempts"] >= line["metrics"]["contract"]["asks"]
    assert summary.reasks == 0 and summary.reasks_before == 2 and summary.retries == 0
    assert "0 re-asks (and 2 by an earlier run)" in summary.format()


def test_the_metrics_endpoint_counts_the_lines_the_cache_answered(tmp_path, mock_server):
    """Lines the cache answers while the input is scanned are written in one go, with no event
    each: `jsonlbatch_requests_total` still counts every line the run wrote."""
    pytest.importorskip("prometheus_client")
    from jsonlbatch.view import PrometheusExporter

    url = mock_server()
    cache = str(tmp_path / "cache")
    requests = tmp_path / "req.jsonl"
    write(requests, [chat_body(i, temperature=0, max_tokens=4) for i in range(5)])
    execute(str(requests), str(tmp_path / "a.jsonl"), urls=[url], quiet=True, cache=cache)
    write(requests, [chat_body(i, temperature=0, max_tokens=4) for i in range(7)])
    exporter = PrometheusExporter()
    summary = execute(str(requests), str(tmp_path / "b.jsonl"), urls=[url], quiet=True,
                      cache=cache, seams=Seams(subscribers=exporter.subscriptions()))  # fmt: skip
    value = exporter.registry.get_sample_value
    assert summary.cache_hits == 5 and summary.written == 7
    assert value("jsonlbatch_requests_total", {"outcome": "ok"}) == 7
    assert value("jsonlbatch_cache_hits_total") == 5
    assert value("jsonlbatch_requests_pending") == 0
    assert sum(value("jsonlbatch_attempts_total", {"endpoint": e}) or 0
               for e in summary.endpoints) == 2  # fmt: skip

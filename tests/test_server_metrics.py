"""Reading vLLM's and SGLang's Prometheus `/metrics` into per-run prefix cache figures."""

from __future__ import annotations

from pathlib import Path

import orjson

from jsonlbatch.exec.output.run_summary import RunSummary
from jsonlbatch.exec.route.server_metrics import (
    ServerCounters,
    ServerStats,
    compare,
    counters,
    keep_servers,
    parse_prometheus,
    servers_path,
)

VLLM = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-8B"} 12000.0
vllm:prefix_cache_queries_total{engine="1",model_name="Qwen/Qwen3-8B"} 8000.0
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-8B"} 9000.0
vllm:prefix_cache_hits_total{engine="1",model_name="Qwen/Qwen3-8B"} 1000.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="Qwen/Qwen3-8B"} 30.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="Qwen/Qwen3-8B"} 10.0
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="Qwen/Qwen3-8B"} 40.0
weird line without a value
vllm:broken{label="a } b"} not-a-number
"""

SGLANG = """\
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.128902e+06
sglang:cached_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct",cache_source="device"} 4.0e+06
sglang:cached_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct",cache_source="host"} 64.0
sglang:num_requests_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 1200
sglang:cache_hit_rate{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.49
"""


def test_vllm_samples_are_summed_over_labels_and_junk_is_skipped():
    samples = parse_prometheus(VLLM)
    assert samples["vllm:prefix_cache_queries_total"] == 20000
    assert samples["vllm:request_success_total"] == 40
    assert "vllm:broken" not in samples and "weird" not in samples
    got = counters(samples)
    assert got == ServerCounters("vllm", 20000, 10000, 40, None)


def test_sglang_cached_tokens_over_prompt_tokens_and_its_gauge():
    got = counters(parse_prometheus(SGLANG))
    assert got is not None and got.kind == "sglang"
    assert got.queries == 8128902 and got.hits == 4000064 and got.requests == 1200
    assert got.hit_rate == 0.49
    assert counters(parse_prometheus("process_cpu_seconds_total 3.5\n")) is None


def test_a_run_is_the_difference_of_two_scrapes():
    before = ServerCounters("vllm", 1000, 900, None, None)  # no request finished yet
    after = ServerCounters("vllm", 5000, 3900, 8, None)
    stats = ServerStats.between("http://a/v1", before, after)
    assert (stats.requests, stats.prefix_cache_queries, stats.prefix_cache_hits) == (8, 4000, 3000)
    assert stats.prefix_cache_hit_rate == 0.75
    # an old SGLang with only the gauge: the gauge after the run
    gauge_only = ServerStats.between(
        "x", ServerCounters("sglang", hit_rate=0.1), ServerCounters("sglang", hit_rate=0.6)
    )
    assert gauge_only.prefix_cache_hit_rate == 0.6 and gauge_only.prefix_cache_queries is None


def test_endpoints_without_metrics_are_left_out():
    class Ep:
        def __init__(self, name: str) -> None:
            self.name = name

    a, b, c = Ep("a"), Ep("b"), Ep("c")
    vllm = ServerCounters("vllm", 0, 0, 0)
    out = compare([a, b, c], [vllm, None, vllm], [vllm, vllm, ServerCounters("sglang", 1, 1)])
    assert [s.endpoint for s in out] == ["a"]


def test_figures_are_kept_per_run_beside_the_output(tmp_path):
    out = tmp_path / "responses.jsonl"
    summary = RunSummary(str(out), started_at=1.0)
    assert keep_servers(out, summary)  # nothing to keep: no file
    assert not (tmp_path / "responses.jsonl.servers.json").exists()
    summary.servers = [ServerStats("http://a/v1", "vllm", 3, 100, 50, 0.5)]
    assert keep_servers(out, summary) and keep_servers(out, summary)
    runs = orjson.loads(Path(servers_path(out)).read_bytes())["runs"]
    assert len(runs) == 2 and runs[0]["endpoints"][0]["prefix_cache_hit_rate"] == 0.5
    Path(servers_path(out)).write_text("{torn")  # unreadable: started afresh
    assert keep_servers(out, summary)
    assert len(orjson.loads(Path(servers_path(out)).read_bytes())["runs"]) == 1

"""`exec --route` against replicas of the GPU-model mock: prefix affinity shows in the servers'
own hit rates, the summary shows the spread, and grouping never costs exactly-once."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest
from batchutil import cli, content, failures, kill_at_random, read_results

from jsonlbatch.mock import reply_text
from jsonlbatch.mock.gpu import GpuModel

FAST = GpuModel(prefill_tokens_per_s=2e5, decode_step_s=0.002)


def write_tasks(path, tasks: int, samples: int, words: int = 300, interleaved: bool = False):
    rng = random.Random(3)
    prompts = [" ".join(f"w{rng.randrange(10**6)}" for _ in range(words)) for _ in range(tasks)]
    order = [(t, s) for s in range(samples) for t in range(tasks)]
    if not interleaved:
        order.sort()
    lines = [
        {"custom_id": f"t{t}|s{s}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "mock", "messages": [{"role": "user", "content": prompts[t]}],
                  "seed": s}}
        for t, s in order
    ]  # fmt: skip
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return lines


def hit_rate(out) -> float:
    runs = orjson.loads(Path(str(out) + ".servers.json").read_bytes())["runs"]
    ends = runs[-1]["endpoints"]
    return sum(e["prefix_cache_hits"] for e in ends) / sum(e["prefix_cache_queries"] for e in ends)


def test_prefix_routing_keeps_samples_together_and_reports_the_servers(tmp_path, mock_server):
    # 13 tasks: round robin cannot keep samples together by accident
    write_tasks(tmp_path / "req.jsonl", tasks=13, samples=4, interleaved=True)
    rates = {}
    for policy in ("prefix", "round-robin"):
        urls = [mock_server(gpu=FAST) for _ in range(2)]  # fresh, cold replicas
        out = tmp_path / f"{policy}.jsonl"
        args = ["exec", str(tmp_path / "req.jsonl"), "-o", str(out), "--route", policy, "-c", "8"]
        if policy == "prefix":
            # A given threshold holds the load guard off (see test_router for the guard): the
            # automatic one also sends a sample to a replica that is idle at that instant, which
            # depends on when answers come back, and on a loaded machine cost ~0.1 of the rate.
            args += ["--balance-abs-threshold", "64"]
        done = cli(*args, *(a for u in urls for a in ("--url", u)))
        assert done.returncode == 0, done.stderr
        assert len(read_results(out)) == 52
        rates[policy] = hit_rate(out)
        assert "endpoints:" in done.stderr and "prefix cache hit rate" in done.stderr
        for url in urls:
            assert url.removesuffix("/v1") in done.stderr
        assert "server counted" in done.stderr
        assert "per_endpoint=" in done.stderr  # the progress bar's spread, in --url order
    # the ideal is 3/4 of each task's prompt tokens (whole blocks only): 0.72 here; without the
    # guard every later sample of a task reaches the replica its first one went to
    assert rates["prefix"] > 0.7
    assert rates["prefix"] > rates["round-robin"] + 0.15


def test_a_plain_server_leaves_no_servers_file(tmp_path, mock_server):
    write_tasks(tmp_path / "req.jsonl", tasks=2, samples=2, words=50)
    out = tmp_path / "out.jsonl"
    urls = [mock_server(), mock_server()]
    done = cli("exec", str(tmp_path / "req.jsonl"), "-o", str(out), "--url", urls[0],
               "--url", urls[1])  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "out.jsonl.servers.json").exists()
    assert "endpoints:" in done.stderr and "prefix cache" not in done.stderr


def test_bad_route_options_are_usage_errors(tmp_path, mock_server):
    write_tasks(tmp_path / "req.jsonl", tasks=1, samples=1, words=5)
    base = ["exec", str(tmp_path / "req.jsonl"), "-o", str(tmp_path / "o.jsonl"), "--url",
            mock_server()]  # fmt: skip
    for bad in (["--route", "random"], ["--balance-rel-threshold", "0.5"]):
        done = cli(*base, *bad)
        assert done.returncode == 2 and "Traceback" not in done.stderr
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.slow
def test_kill_9_while_grouping_then_resume_is_exactly_once(tmp_path, mock_server):
    """The look-ahead window reorders what is sent; a crash at any moment and the same command
    again must still end with one right answer per request."""
    lines = write_tasks(tmp_path / "req.jsonl", tasks=40, samples=6, words=80, interleaved=True)
    urls = [mock_server(latency=0.05, latency_jitter=0.04, gpu=FAST) for _ in range(2)]
    out = tmp_path / "out.jsonl"
    args = ["exec", str(tmp_path / "req.jsonl"), "-o", str(out), "-c", "8", "--order-window",
            "64", *(a for u in urls for a in ("--url", u))]  # fmt: skip
    # three crashes at random moments, then a clean finish
    kills = kill_at_random(args, rounds=3, seed=99, wait=(0.8, 1.6))
    assert kills >= 2, "the run finished before it could be killed; slow the mock down"
    final = cli(*args)
    assert final.returncode == 0, final.stderr
    results = read_results(out)
    assert set(results) == {x["custom_id"] for x in lines} and not failures(results)
    for x in lines:
        assert content(results[x["custom_id"]]) == reply_text(x["body"], 0)


def test_report_shows_what_the_servers_counted_over_resumed_runs(tmp_path, mock_server):
    lines = write_tasks(tmp_path / "req.jsonl", tasks=3, samples=4, words=200)
    half = tmp_path / "half.jsonl"
    half.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines[:6]))
    urls = [mock_server(gpu=FAST) for _ in range(2)]
    out = tmp_path / "out.jsonl"
    for requests in (half, tmp_path / "req.jsonl"):  # two runs, the second resumes
        done = cli("exec", str(requests), "-o", str(out), "--url", urls[0], "--url", urls[1])
        assert done.returncode == 0, done.stderr
    runs = orjson.loads(Path(str(out) + ".servers.json").read_bytes())["runs"]
    assert len(runs) == 2
    assert sum(e["requests"] for run in runs for e in run["endpoints"]) == 12
    text = cli("report", str(out))
    assert text.returncode == 0, text.stderr
    assert "Servers" in text.stdout and "prefix cache hit rate" in text.stdout
    assert urls[0].removesuffix("/v1") in text.stdout
    report = orjson.loads(cli("report", str(out), "--format", "json").stdout)
    figures = report["servers"][out.name]
    assert sum(f["requests"] for f in figures) == 12 and all(f["runs"] == 2 for f in figures)
    assert (
        sum(f["prefix_cache_hits"] for f in figures)
        / sum(f["prefix_cache_queries"] for f in figures)
        > 0.5
    )


def test_prefix_routing_at_low_concurrency_uses_every_replica(tmp_path, mock_server):
    """Issue 26: a template whose fixed part is most of each prompt, `-c 4` over 3 replicas:
    the load guard (16 in flight) never triggered and one replica took every request."""
    template = " ".join(f"rule{i}" for i in range(400))  # ~3 kB shared by every request
    lines = [
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "mock", "messages": [{"role": "user", "content": f"{template} q{i}"}]}}
        for i in range(24)
    ]  # fmt: skip
    (tmp_path / "req.jsonl").write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    urls = [mock_server(gpu=FAST, latency=0.05) for _ in range(3)]
    out = tmp_path / "out.jsonl"
    done = cli("exec", str(tmp_path / "req.jsonl"), "-o", str(out), "-c", "4",
               *(a for u in urls for a in ("--url", u)))  # fmt: skip
    assert done.returncode == 0, done.stderr
    spread = [e["requests"] for e in orjson.loads(Path(str(out) + ".servers.json").read_bytes())[
        "runs"][-1]["endpoints"]]  # fmt: skip
    assert sum(spread) == 24 and min(spread) >= 4, spread

"""`-c auto` (exec/route/adaptive_concurrency.py) and `--priority` (exec/send/priority.py): the controller's decisions
from server gauges and latency, a real run converging on GPU-model mock replicas, and the
priority each kind of server receives in its request body (the mock records the bodies)."""

from __future__ import annotations

import json
import re
import urllib.request

import orjson
import pytest
from batchutil import cli_process, exec_cli, failures, read_results, write_requests

from jsonlbatch.exec.route.adaptive_concurrency import START, WINDOW, AdaptiveConcurrency
from jsonlbatch.exec.route.endpoint_concurrency import EndpointAttempt
from jsonlbatch.exec.route.server_metrics import ServerLoad, load, parse_prometheus
from jsonlbatch.exec.send.priority import Payloads, sign_of
from jsonlbatch.mock.gpu import GpuModel


def _tick(c: AdaptiveConcurrency, waiting: float, running: float, in_flight: int | None = None):
    c.decide(ServerLoad("vllm", waiting, running, 0.5), c.limit if in_flight is None else in_flight)


def test_slow_start_doubles_while_the_server_queues_nothing():
    c = AdaptiveConcurrency(maximum=1000)
    seen = [c.limit]
    for _ in range(4):
        _tick(c, waiting=0, running=c.limit)
        seen.append(c.limit)
    assert seen == [START, 2 * START, 4 * START, 8 * START, 16 * START]
    _tick(c, waiting=0, running=5, in_flight=5)  # the limit does not bind: no reason to grow
    assert c.limit == 16 * START


def test_a_lasting_queue_cuts_the_limit_to_what_runs_and_a_passing_one_does_not():
    c = AdaptiveConcurrency(maximum=1000, start=256)
    _tick(c, waiting=150, running=64)  # the batch is full: while doubling, cut at once
    cut = c.limit
    assert 64 <= cut <= 64 + 256 // 32
    for waiting in (100, 0):  # a queue caught between two engine steps, then none
        _tick(c, waiting=waiting, running=64)
    assert cut < c.limit <= cut + cut // 16 + 1  # not cut; grown a little, no longer doubled
    grown = c.limit
    for _ in range(WINDOW - 1):
        _tick(c, waiting=150, running=64)
        assert c.limit == grown
    _tick(c, waiting=150, running=64)  # a queue in WINDOW scrapes in a row: cut
    assert 64 <= c.limit < grown


def test_429s_and_503s_cut_the_limit_and_it_stays_within_its_bounds():
    c = AdaptiveConcurrency(maximum=40, start=32)
    c.observe(EndpointAttempt(429, 0.1, True))
    _tick(c, waiting=0, running=32)
    assert c.limit == int(32 * 0.7)
    for _ in range(20):
        c.observe(EndpointAttempt(503, 0.1))
        c.decide(None, c.limit)
    assert c.limit == 1
    for _ in range(100):
        _tick(c, waiting=0, running=c.limit)
    assert c.limit == 40  # never above the run's workers


def test_without_gauges_latency_steers():
    c = AdaptiveConcurrency(maximum=1000)
    for _ in range(3):  # answers stay as fast as the best seen: grow
        for _ in range(c.limit):
            c.observe(EndpointAttempt(200, 1.0))
        c.decide(None, c.limit)
    assert c.limit == 8 * START
    grown = c.limit
    for _ in range(grown):  # three times slower: shrink
        c.observe(EndpointAttempt(200, 3.0))
    c.decide(None, c.limit)
    assert c.limit < grown


def test_load_gauges_of_both_servers_and_old_vllm_names():
    vllm = load(parse_prometheus('vllm:num_requests_waiting{e="0"} 3\n'
                                 'vllm:num_requests_running{e="0"} 60\n'
                                 "vllm:gpu_cache_usage_perc 0.5\n"))  # fmt: skip
    assert vllm == ServerLoad("vllm", 3.0, 60.0, 0.5)
    sglang = load(parse_prometheus("sglang:num_queue_reqs 7\nsglang:num_running_reqs 9\n"
                                   "sglang:token_usage 0.9\n"))  # fmt: skip
    assert sglang == ServerLoad("sglang", 7.0, 9.0, 0.9)
    assert load(parse_prometheus("process_cpu_seconds_total 1\n")) is None


def _limits(stderr: str) -> list[list[int]]:
    return [[int(n) for n in m.split("/")] for m in re.findall(r"c=([\d/]+)", stderr)]


def test_auto_converges_on_replicas_of_different_speeds(tmp_path, mock_server):
    batch = 6
    urls = [
        mock_server(gpu=GpuModel(max_batch=batch, decode_step_s=0.01 * slow, time_scale=1.0,
                                 prefill_tokens_per_s=1e6))
        for slow in (1, 3)
    ]  # fmt: skip
    write_requests(tmp_path / "req.jsonl", 240, max_tokens=30)
    out = tmp_path / "out.jsonl"
    args = ["--route", "least-busy", "--url", urls[0], "--url", urls[1]]
    # no -c: auto, the URLs have /metrics. A process of its own: the controller reads latencies,
    # which the mocks' threads would stretch if the client shared their interpreter (its GIL)
    proc = cli_process("exec", str(tmp_path / "req.jsonl"), "-o", str(out), *args)
    assert proc.returncode == 0, proc.stderr
    results = read_results(out)
    assert len(results) == 240 and not failures(results)
    seen = _limits(proc.stderr)
    assert seen, proc.stderr  # the bar shows each endpoint's limit
    fast, slow = seen[-1]
    assert batch <= fast <= 3 * batch and batch <= slow <= 3 * batch, seen
    per = [sum(1 for r in results.values() if r["metrics"]["endpoint"] == u) for u in urls]
    assert per[0] > per[1]  # the fast replica answered more


def test_a_number_is_kept_and_plain_servers_get_a_fixed_default(tmp_path, mock_server):
    gpu = mock_server(gpu=GpuModel(max_batch=4, decode_step_s=0.001))
    write_requests(tmp_path / "req.jsonl", 20, max_tokens=4)
    proc = exec_cli(tmp_path / "req.jsonl", tmp_path / "a.jsonl", "--url", gpu, "-c", "8")
    assert proc.returncode == 0 and not _limits(proc.stderr), proc.stderr
    proc = exec_cli(tmp_path / "req.jsonl", tmp_path / "b.jsonl", "--url", mock_server())
    assert proc.returncode == 0 and not _limits(proc.stderr), proc.stderr


def _bodies(url: str) -> list[dict]:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/mock/bodies", timeout=10) as resp:
        return json.loads(resp.read())


def test_priority_reaches_the_body_in_the_servers_terms(tmp_path, mock_server):
    vllm = mock_server(gpu=GpuModel(decode_step_s=0.001), record_bodies=100)  # vLLM's /metrics
    plain = mock_server(record_bodies=100)  # no /metrics: not known to schedule by priority
    lines = write_requests(tmp_path / "req.jsonl", 4)
    lines[0]["priority"] = 5  # a line's own priority wins over --priority
    lines[1]["body"]["priority"] = 42  # already in the body: the user's own, left alone
    (tmp_path / "req.jsonl").write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    for url, name in ((vllm, "v.jsonl"), (plain, "p.jsonl")):
        proc = exec_cli(tmp_path / "req.jsonl", tmp_path / name, "--url", url, "--priority", "-3",
                        "-c", "1")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    got = {b["messages"][0]["content"]: b.get("priority") for b in _bodies(vllm)}
    # higher = more important; vLLM serves lower values first
    assert got == {"question 0": -5, "question 1": 42, "question 2": 3, "question 3": 3}
    assert [b.get("priority") for b in _bodies(plain)] == [None, 42, None, None]
    assert "no priority is sent" in proc.stderr


def test_sglang_gets_the_priority_as_it_is_and_a_bad_one_is_refused(tmp_path, mock_server):
    assert (sign_of("sglang"), sign_of("vllm"), sign_of(None)) == (1, -1, 0)
    payloads = Payloads({"model": "m"}, -2)
    assert orjson.loads(payloads.for_sign(1)) == {"model": "m", "priority": -2}
    assert orjson.loads(payloads.for_sign(0)) == {"model": "m"}
    lines = write_requests(tmp_path / "req.jsonl", 2)
    lines[1]["priority"] = "high"
    (tmp_path / "req.jsonl").write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    proc = exec_cli(tmp_path / "req.jsonl", tmp_path / "out.jsonl", "--url", mock_server())
    assert proc.returncode == 1 and "req.jsonl:2: priority: must be an integer" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("value", ["1.5", "x"])
def test_priority_option_must_be_an_integer(tmp_path, value):
    write_requests(tmp_path / "req.jsonl", 1)
    proc = exec_cli(tmp_path / "req.jsonl", tmp_path / "out.jsonl", "--priority", value)
    assert proc.returncode == 2 and "--priority" in proc.stderr

"""Metric definitions of `jsonlbatch report` on hand-computed examples."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from report_fixtures import failed_line, ok_line, write_lines

from jsonlbatch.errors import UsageError
from jsonlbatch.report import (
    build_report,
    describe,
    parse_duration,
    parse_price,
    parse_sla,
    percentile,
)


def test_percentile_interpolates_linearly_between_closest_ranks() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    # rank = p/100 * (n - 1): p25 -> 0.75, p50 -> 1.5, p90 -> 2.7
    assert percentile(values, 25) == pytest.approx(1.75)
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_percentile_matches_numpy_default() -> None:
    numpy = pytest.importorskip("numpy")
    rng = random.Random(7)
    for size in (1, 2, 3, 10, 101):
        values = sorted(rng.uniform(0, 10) for _ in range(size))
        for p in (10, 25, 50, 90, 95, 99):
            assert percentile(values, p) == pytest.approx(float(numpy.percentile(values, p)))


def test_describe_drops_unmeasured_values_and_uses_population_std() -> None:
    dist = describe([2.0, math.nan, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0])
    assert dist is not None
    assert dist.count == 8
    assert dist.mean == pytest.approx(5.0)
    assert dist.std == pytest.approx(2.0)  # the textbook population example
    assert (dist.min, dist.max) == (2.0, 9.0)
    assert dist.p50 == pytest.approx(4.5)
    assert describe([math.nan]) is None


@pytest.fixture
def hand_run(tmp_path: Path) -> Path:
    """Three successes and two failures with timings chosen to be computed by hand."""
    return write_lines(
        tmp_path / "hand.jsonl",
        [
            ok_line("a", start=100.0, latency=1.0, ttft=0.2, prompt=10, completion=5),
            ok_line("b", start=100.5, latency=2.0, ttft=0.5, prompt=20, completion=11),
            ok_line("c", start=101.0, latency=0.5, ttft=0.1, prompt=30, completion=1,
                    finish="length"),
            failed_line("d", start=101.5, latency=3.0, status=500, attempts=3),
            failed_line("e", start=99.0, latency=0.25, status=None, attempts=2),
        ],
    )  # fmt: skip


def test_counts_throughput_and_distributions_by_hand(hand_run: Path) -> None:
    run = build_report([str(hand_run)]).runs[0]
    assert (run.lines, run.succeeded, run.failed) == (5, 3, 2)
    assert run.status_codes == {"200": 3, "500": 1, "no response": 1}
    assert run.errors == {"http_500": 1, "request_timeout": 1}
    assert (run.retries, run.retried_requests, run.max_attempts) == (3, 2, 3)
    assert run.finish_reasons == {"stop": 2, "length": 1}
    assert run.truncated == 1 and run.truncated_share == pytest.approx(1 / 3)
    assert (run.prompt_tokens, run.completion_tokens) == (60, 17)
    # Window: first start (e, 99.0) to last end (d, 101.5 + 3.0), failures included.
    assert run.wall_s == pytest.approx(5.5)
    assert run.requests_per_s == pytest.approx(3 / 5.5)
    assert run.output_tokens_per_s == pytest.approx(17 / 5.5)
    assert run.total_tokens_per_s == pytest.approx(14.0)
    # Failed lines stay out of the distributions: e2e over 1.0, 2.0, 0.5 only.
    e2e = run.latency["e2e"]
    assert e2e is not None and e2e.count == 3
    assert e2e.mean == pytest.approx(3.5 / 3)
    assert e2e.p10 == pytest.approx(0.6)
    assert e2e.p25 == pytest.approx(0.75)
    assert e2e.p50 == pytest.approx(1.0)
    assert e2e.p90 == pytest.approx(1.8)
    assert e2e.p99 == pytest.approx(1.98)
    assert e2e.std == pytest.approx(math.sqrt((3.5 / 3) / 3))
    ttft = run.latency["ttft"]
    assert ttft is not None and ttft.mean == pytest.approx(0.8 / 3)
    # TPOT = (e2e - ttft) / (completion - 1): 0.8/4 and 1.5/10; one output token has none.
    tpot = run.latency["tpot"]
    assert tpot is not None and tpot.count == 2
    assert (tpot.min, tpot.max) == (pytest.approx(0.15), pytest.approx(0.2))
    prompt = run.tokens["prompt"]
    assert prompt is not None and prompt.mean == pytest.approx(20.0)


def test_sla_shares_and_goodput_by_hand(hand_run: Path) -> None:
    slas = parse_sla(["ttft=300ms", "e2e=1.5s", "tpot=0.25"])
    run = build_report([str(hand_run)], sla=slas).runs[0]
    shares = {r.metric: (r.judged, r.met) for r in run.sla}
    assert shares == {"ttft": (3, 2), "e2e": (3, 2), "tpot": (2, 2)}
    # a meets all three; b misses ttft; c has no TPOT (one output token) so cannot meet it.
    assert run.good == 1
    assert run.goodput_per_s == pytest.approx(1 / 5.5)


def test_price_gives_cost(hand_run: Path) -> None:
    run = build_report([str(hand_run)], price=parse_price("in=1.5,out=6")).runs[0]
    assert run.cost is not None
    assert run.cost.input_usd == pytest.approx(60 * 1.5 / 1e6)
    assert run.cost.output_usd == pytest.approx(17 * 6 / 1e6)
    assert run.cost.per_request_usd == pytest.approx(run.cost.total_usd / 3)


def test_tpot_derived_and_usage_read_when_metrics_lack_them(tmp_path: Path) -> None:
    line = ok_line("a", start=10.0, latency=2.0, ttft=0.5, completion=7)
    del line["metrics"]["tpot_s"], line["metrics"]["completion_tokens"]
    bare = ok_line("b", start=0.0, latency=0.0, prompt=3, completion=4)
    del bare["metrics"]  # as vllm run-batch writes it
    bare["response"]["body"]["usage"]["reasoning_tokens"] = 2  # SGLang's place for it
    run = build_report([str(write_lines(tmp_path / "r.jsonl", [line, bare]))]).runs[0]
    tpot = run.latency["tpot"]
    assert tpot is not None and tpot.p50 == pytest.approx(1.5 / 6)
    assert (run.completion_tokens, run.reasoning_tokens, run.untimed) == (11, 2, 1)
    assert run.latency["e2e"] is not None and run.latency["e2e"].count == 1
    assert run.wall_s == pytest.approx(2.0)


def test_itl_pooled_mean_weights_requests_by_their_gaps(tmp_path: Path) -> None:
    lines = [
        ok_line("a", start=0.0, latency=1.0, ttft=0.1, itl=0.01, chunks=11),  # 10 gaps
        ok_line("b", start=0.0, latency=1.0, ttft=0.1, itl=0.04, chunks=3),  # 2 gaps
    ]
    run = build_report([str(write_lines(tmp_path / "r.jsonl", lines))]).runs[0]
    assert run.itl_pooled_mean_s == pytest.approx((10 * 0.01 + 2 * 0.04) / 12)
    itl = run.latency["itl"]
    assert itl is not None and itl.mean == pytest.approx(0.025)


def test_n_choices_and_abort_counted_per_choice(tmp_path: Path) -> None:
    line = ok_line("a", start=0.0, latency=1.0, finish=["stop", "length", "abort", "length"])
    run = build_report([str(write_lines(tmp_path / "r.jsonl", [line]))]).runs[0]
    assert (run.choices, run.truncated, run.aborted) == (4, 2, 1)
    assert run.truncated_share == pytest.approx(0.5)


def test_breakdown_groups_use_the_whole_run_window(tmp_path: Path) -> None:
    lines = [
        ok_line("a", start=0.0, latency=1.0, completion=10, endpoint="http://x/v1"),
        ok_line("b", start=1.0, latency=3.0, completion=30, endpoint="http://y/v1"),
        failed_line("c", start=2.0, latency=1.0, endpoint="http://y/v1"),
    ]
    run = build_report([str(write_lines(tmp_path / "r.jsonl", lines))], by=["endpoint"]).runs[0]
    groups = run.breakdown["endpoint"]
    assert list(groups) == ["http://x/v1", "http://y/v1"]
    x, y = groups["http://x/v1"], groups["http://y/v1"]
    assert (x.lines, x.failed, y.lines, y.failed) == (1, 0, 2, 1)
    assert x.wall_s == y.wall_s == pytest.approx(4.0)
    assert x.output_tokens_per_s + y.output_tokens_per_s == pytest.approx(run.output_tokens_per_s)


def test_options_parse_units_and_reject_typos() -> None:
    assert parse_duration("50ms") == pytest.approx(0.05)
    assert parse_duration("2s") == 2.0
    assert parse_duration("1.5m") == 90.0
    assert parse_duration("800us") == pytest.approx(0.0008)
    assert parse_duration("0.25") == 0.25
    assert [(s.metric, s.bound_s) for s in parse_sla(["e2el=5s", "TTFT=2s", "e2e=4s"])] == [
        ("e2e", 4.0),
        ("ttft", 2.0),
    ]
    price = parse_price("out=0.6")
    assert price is not None and (price.input_per_m, price.output_per_m) == (0.0, 0.6)
    for bad in (["ttft"], ["speed=2s"], ["ttft=fast"], ["ttft=-1s"]):
        with pytest.raises(UsageError, match="--sla"):
            parse_sla(bad)
    for text in ("in=0.1;out=2", "in=cheap", "in=-1", "tokens=3"):
        with pytest.raises(UsageError, match="--price"):
            parse_price(text)

"""The routing policies, the load guard, the prefix index and the look-ahead ordering window."""

from __future__ import annotations

import random
from dataclasses import dataclass

import orjson
import pytest

from jsonlbatch.errors import UsageError
from jsonlbatch.exec.route import router as router_module
from jsonlbatch.exec.route.router import (
    RouteOptions,
    Router,
    grouped,
    ordered_lines,
    prefix_group,
    prefix_key,
)


@dataclass(eq=False)
class Ep:
    name: str
    in_flight: int = 0


def body(text: str, model: str = "m") -> dict:
    return {"model": model, "messages": [{"role": "user", "content": text}]}


LONG = "shared document " * 400  # ~6.4 kB: ~100 index blocks


def make(n: int = 3, **options) -> tuple[Router, list[Ep]]:
    eps = [Ep(f"e{i}") for i in range(n)]
    return Router(eps, RouteOptions(**options)), eps


def send(router: Router, eps: list[Ep], text: str, model: str = "m") -> Ep:
    chosen = router.choose(eps, router.key(body(text, model)))
    chosen.in_flight += 1
    return chosen


def test_prefix_keys_share_exactly_the_shared_part():
    a = prefix_key(body(LONG + "question one"))
    b = prefix_key(body(LONG + "question two, longer than the first one by far"))
    assert a.depths[0] == b.depths[0]
    shared = {d for d in a.depths if d in set(b.depths)}
    assert shared and max(depth for depth, _ in shared) <= len(LONG) + 40
    assert a.depths[-1] != b.depths[-1]
    assert prefix_key(body(LONG, "m")).depths[0] != prefix_key(body(LONG, "other")).depths[0]
    assert prefix_key(body("hi")).depths == ()  # too short to share a cache block
    assert len(prefix_key(body("x" * 10**6)).depths) < 40  # logarithmic in the length


@pytest.mark.parametrize("share", [0.01, 0.3, 0.5, 1.0])
def test_prefix_group_tells_apart_what_the_key_s_group_does(share):
    """The look-ahead window's one-hash group must partition requests as `prefix_key(...).group`
    does: the same prompts together, the same ones alone (None: too short to share a block)."""
    rng = random.Random(7)
    words = ["alpha", "beta", "gamma", "delta", "x" * 50]
    bodies = [
        {"model": rng.choice("ab"), "messages": [
            {"role": "system", "content": " ".join(rng.choice(words[:2]) for _ in range(rng.randint(0, 40)))},
            {"role": "user", "content": " ".join(rng.choice(words) for _ in range(rng.randint(0, 300)))},
        ]}
        for _ in range(1500)
    ]  # fmt: skip
    bodies += [{"model": "a", "prompt": "y" * k} for k in range(0, 700, 7)]
    bodies += [{"model": "a"}, {"model": "a", "input": [1, 2, 3]}, body(LONG), body(LONG, "o")]

    def partition(groups: list) -> tuple[list[bool], list[list[int]]]:
        together: dict = {}
        for i, g in enumerate(groups):
            if g is not None:
                together.setdefault(g, []).append(i)
        return [g is None for g in groups], sorted(together.values())

    by_key = partition([prefix_key(b).group(share) for b in bodies])
    assert partition([prefix_group(b, share) for b in bodies]) == by_key
    assert len(by_key[1]) > 10  # a real partition, with shared prefixes below the whole prompt
    assert share == 1.0 or any(len(g) > 1 for g in by_key[1])


def test_same_prompt_sticks_to_one_endpoint_and_new_prompts_spread():
    router, eps = make(4, balance_abs_threshold=100)
    first = send(router, eps, LONG + "task 1")
    for _ in range(7):
        assert send(router, eps, LONG + "task 1") is first
    # new prompts go to the least busy endpoints, not to the busy holder
    others = {send(router, eps, f"{i} " * 50 + LONG) for i in range(3)}
    assert first not in others and len(others) == 3
    assert router.affine == 7


def test_load_guard_needs_both_the_absolute_and_the_relative_gap():
    router, eps = make(2, balance_abs_threshold=4, balance_rel_threshold=2.0)
    holder = send(router, eps, LONG)
    other = eps[1] if holder is eps[0] else eps[0]
    other.in_flight = 3
    holder.in_flight = 7  # gap 4: not above the absolute threshold
    assert send(router, eps, LONG) is holder
    holder.in_flight = 8  # gap 5 > 4 and 8 > 2 x 3: imbalanced
    assert send(router, eps, LONG) is other
    assert router.guarded == 1
    other.in_flight, holder.in_flight = 10, 16  # gap 6 but 16 < 2 x 10: still affine
    # the diverted request made `other` a holder too: the least busy holder wins
    assert send(router, eps, LONG) is other
    other.in_flight = 30
    assert send(router, eps, LONG) is holder


def test_a_short_common_prefix_is_no_reason_for_affinity():
    """A shared system prompt that is a small part of each prompt must not pull every request
    onto one endpoint (sglang-router's hot spot)."""
    router, eps = make(4)
    system = "You are a careful assistant. " * 20  # ~600 bytes
    for i in range(40):
        send(router, eps, system + f"task {i} " + "details " * 200)
    assert sorted(ep.in_flight for ep in eps) == [10, 10, 10, 10]
    assert router.affine == 0


def test_least_busy_and_round_robin_ignore_prompts():
    router, eps = make(3, policy="least-busy")
    assert router.key(body(LONG)) is None
    assert Router([Ep("alone")]).key(body(LONG)) is None  # no choice to make: no hashing
    eps[0].in_flight, eps[1].in_flight, eps[2].in_flight = 5, 1, 3
    assert router.choose(eps) is eps[1]
    router, eps = make(3, policy="round-robin")
    picks = [router.choose(eps).name for _ in range(6)]
    assert sorted(picks) == ["e0", "e0", "e1", "e1", "e2", "e2"]
    assert picks[:3] == picks[3:]


def test_an_endpoint_that_is_down_is_not_chosen_even_if_it_holds_the_prefix():
    router, eps = make(2)
    holder = send(router, eps, LONG)
    up = [ep for ep in eps if ep is not holder]
    assert router.choose(up, router.key(body(LONG))) is up[0]


def test_the_index_is_bounded(monkeypatch):
    monkeypatch.setattr(router_module, "INDEX_SIZE", 100)
    router, eps = make(2)
    for i in range(200):
        send(router, eps, f"{i} " + LONG)
    assert len(router._index) == 100


def test_bad_options_are_usage_errors():
    for options in ({"policy": "random"}, {"balance_rel_threshold": 0.5},
                    {"balance_abs_threshold": -1}, {"order_window": -1}, {"min_match": 0}):  # fmt: skip
        with pytest.raises(UsageError):
            RouteOptions(**options)


def test_grouped_emits_each_item_once_groups_within_the_window_and_keeps_unique_order():
    rng = random.Random(7)
    items = [(i, rng.choice("abcdefgh") if i % 3 else None) for i in range(500)]
    for window in (0, 1, 2, 5, 64, 1000):
        out = list(grouped(iter(items), window))
        assert sorted(out) == list(range(500))
    # no groups: file order
    assert list(grouped(((i, None) for i in range(50)), 8)) == list(range(50))
    # the oldest first, with its group pulled forward
    pairs = [(0, "a"), (1, "b"), (2, "a"), (3, "c"), (4, "b"), (5, "a")]
    assert list(grouped(iter(pairs), 3)) == [0, 2, 1, 4, 3, 5]
    assert list(grouped(iter(pairs), 0)) == [0, 1, 2, 3, 4, 5]


def test_grouped_holds_at_most_the_window():
    held = 0

    def source():
        nonlocal held
        for i in range(10_000):
            held += 1
            yield i, i % 97

    most = 0
    for _ in grouped(source(), 50):
        held -= 1
        most = max(most, held)
    assert most <= 50


def test_ordered_lines_groups_samples_of_a_task_in_a_file(tmp_path):
    path = tmp_path / "req.jsonl"
    lines, offsets, pos = [], [], 0
    for s in range(3):  # round by round: the samples of a task are far apart
        for t in range(4):
            raw = orjson.dumps({"custom_id": f"t{t}|{s}", "body": body(f"task {t} " + LONG)})
            lines.append(raw + b"\n")
            offsets.append(pos)
            pos += len(raw) + 1
    path.write_bytes(b"".join(lines))
    route = RouteOptions(order_window=16)
    got = [orjson.loads(raw)["custom_id"] for raw in ordered_lines(str(path), offsets, route)]
    assert got == [f"t{t}|{s}" for t in range(4) for s in range(3)]
    plain = RouteOptions(policy="least-busy")
    got = [orjson.loads(raw)["custom_id"] for raw in ordered_lines(str(path), offsets, plain)]
    assert got == [f"t{t}|{s}" for s in range(3) for t in range(4)]


def _template_run(router: Router, eps: list[Ep], concurrency: int, total: int) -> list[int]:
    """`total` requests whose template's fixed part is most of each prompt, kept `concurrency`
    in flight, the oldest finishing first; returns how many each endpoint got."""
    rng = random.Random(7)
    template = "Read the passage and answer in one word. " * 60  # ~2.5 kB of every prompt
    flying: list[Ep] = []
    counts = dict.fromkeys(map(id, eps), 0)
    for i in range(total):
        if len(flying) == concurrency:
            done = flying.pop(rng.randrange(len(flying)))
            done.in_flight -= 1
        chosen = send(router, eps, template + f"item {i}: " + "x" * rng.randrange(100, 400))
        counts[id(chosen)] += 1
        flying.append(chosen)
        idle = [ep for ep in eps if ep.in_flight == 0]
        assert not idle or len(flying) < len(eps), f"-c {concurrency}: an endpoint idles"
    return [counts[id(ep)] for ep in eps]


@pytest.mark.parametrize("concurrency", [4, 16, 64])
def test_a_template_prefix_common_to_all_requests_does_not_pin_them_on_one_endpoint(concurrency):
    """Issue 26: at -c 16 or below a fixed guard of 16 never triggered, so one replica took all
    440 requests of a template-heavy file and two idled."""
    router, eps = make(3, concurrency=concurrency)
    counts = _template_run(router, eps, concurrency, 300)
    assert min(counts) >= 60, counts  # a fair share is 100
    assert max(ep.in_flight for ep in eps) - min(ep.in_flight for ep in eps) <= max(
        2, concurrency // 4
    )


def test_the_automatic_guard_scales_with_concurrency_and_replicas():
    router, _ = make(3, concurrency=16)
    assert router.gap_allowed(3) == 2 and router.gap_allowed(1) == 8
    assert make(4, concurrency=512)[0].gap_allowed(4) == 16  # as sglang-router's at scale
    assert make(3, concurrency=2)[0].gap_allowed(3) == 1
    assert make(3, concurrency=16, balance_abs_threshold=16)[0].gap_allowed(3) == 16

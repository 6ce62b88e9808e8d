"""Cost before and during a run: exec --dry-run, --price spend, --max-cost and resuming past it."""

from __future__ import annotations

import asyncio
import os

import orjson
import pytest
from batchutil import ENV, exec_cli, failures, read_results, write_requests

from jsonlbatch.exec.send.budget import Budget, BudgetReached, spent_in_output
from jsonlbatch.pricing.cost import Price, estimate_prompt_tokens, max_output_tokens, parse_price

EXIT_BUDGET = 4


def test_estimates_read_every_endpoints_fields():
    chat = {"messages": [{"role": "user", "content": "abcdefgh"}], "max_tokens": 5, "n": 3}
    assert estimate_prompt_tokens(chat) == 2 + 4  # 8 characters, one message
    assert max_output_tokens(chat) == 15
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "abcd"}]}]}
    assert estimate_prompt_tokens(parts) == 1 + 4
    responses = {"input": "abcdefgh", "instructions": "abcd", "max_output_tokens": 7}
    assert estimate_prompt_tokens(responses) == 3 and max_output_tokens(responses) == 7
    messages = {"system": "abcd", "messages": [{"role": "user", "content": "ab"}], "max_tokens": 9}
    assert estimate_prompt_tokens(messages) == 2 + 4 and max_output_tokens(messages) == 9
    assert max_output_tokens({"prompt": "x"}) is None
    assert parse_price("in=1.5,out=6").of(1_000_000, 500_000) == 4.5


async def test_budget_holds_back_while_reservations_are_in_flight():
    budget = Budget(Price(0, 1_000_000), max_cost=2.5)  # $1 per output token
    first = await budget.reserve(0, 1)
    await budget.reserve(0, 1)
    third = asyncio.ensure_future(budget.reserve(0, 1))  # could pass the budget: it waits
    await asyncio.sleep(0.01)
    assert not third.done() and not budget.reached
    budget.settle(first, 0, 0)  # an empty answer: the reservation comes back
    assert await third == 1.0 and budget.spent == 0


async def test_budget_is_reached_only_when_nothing_in_flight_could_make_room():
    budget = Budget(Price(0, 1_000_000), max_cost=2.5)
    held = [await budget.reserve(0, 1), await budget.reserve(0, 1)]
    waiters = [asyncio.ensure_future(budget.reserve(0, 1)) for _ in range(3)]
    await asyncio.sleep(0.01)
    for amount in held:
        budget.settle(amount, 0, 1)  # each cost its full $1: $2 spent
    # one waiter fits nothing ($2 + $1 > $2.5) with nothing in flight: all of them stop
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, BudgetReached) for r in results)
    assert budget.reached and budget.spent == 2.0
    with pytest.raises(BudgetReached):
        await budget.reserve(0, 0.1)


def test_max_cost_far_from_spent_never_stops_a_wide_run(tmp_path, mock_server):
    """Issue 26: 80 requests in flight each reserving their output cap add up past the budget
    long before the answers (a few tokens each) spend any of it: they wait, not stop."""
    url = mock_server()
    write_requests(tmp_path / "req.jsonl", 40, max_tokens=32768)
    out = tmp_path / "out.jsonl"
    price = ["--price", "in=1.1,out=4.4"]  # a worst case of $0.144 a request: 40 of them, $5.77
    proc = exec_cli(
        tmp_path / "req.jsonl", out, "--url", url, "-c", "40", *price, "--max-cost", "1"
    )
    assert proc.returncode == 0, proc.stderr
    assert "--max-cost" not in proc.stderr
    results = read_results(out)
    assert len(results) == 40 and not failures(results)
    assert spent_in_output(str(out), parse_price("in=1.1,out=4.4")) < 0.01


def _listing(path):
    return sorted(os.listdir(path))


def test_dry_run_counts_and_prices_without_touching_anything(tmp_path):
    write_requests(tmp_path / "req.jsonl", 10, max_tokens=10)
    before = _listing(tmp_path)
    proc = exec_cli(
        tmp_path / "req.jsonl", tmp_path / "out.jsonl", "--dry-run", "--price", "in=1000,out=2000"
    )
    assert proc.returncode == 0, proc.stderr
    assert _listing(tmp_path) == before  # no output, no lock file
    # "question 0".."question 9": 10 characters (3 tokens) + 4 for the message, each
    assert "prompt tokens: 70 (counted with characters / 4" in proc.stdout  # and why, if so
    assert "completion tokens at most: 100" in proc.stdout
    assert "projected cost: $0.0700 .. $0.2700" in proc.stdout
    assert "/v1/chat/completions x10" in proc.stdout


def test_dry_run_skips_what_is_done_and_leaves_the_output_alone(tmp_path, mock_server):
    url = mock_server()
    write_requests(tmp_path / "req.jsonl", 4, max_tokens=3)
    out = tmp_path / "out.jsonl"
    assert exec_cli(tmp_path / "req.jsonl", out, "--url", url, "-q").returncode == 0
    write_requests(tmp_path / "req.jsonl", 6, max_tokens=3)
    data = out.read_bytes() + b'{"id":"batch_req_x","custom_id":"req-'  # a torn last line
    out.write_bytes(data)
    proc = exec_cli(tmp_path / "req.jsonl", out, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "dry run: 2 requests to send of 6 (4 already done)" in proc.stdout
    assert out.read_bytes() == data  # not even the torn tail is cut


def test_dry_run_refuses_bad_input_like_a_run(tmp_path):
    (tmp_path / "req.jsonl").write_text('{"custom_id": "a", "url": "/v1/chat/completions"}\n')
    proc = exec_cli(tmp_path / "req.jsonl", tmp_path / "out.jsonl", "--dry-run")
    assert proc.returncode == 1
    assert "req.jsonl:1" in proc.stderr and "body" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_dry_run_counts_with_tiktoken_when_it_is_installed(tmp_path):
    # A stand-in package with tiktoken's interface (the real one needs its encoding files
    # downloaded): one token per word.
    fake = tmp_path / "site" / "tiktoken"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "class _Enc:\n"
        "    def encode(self, text, disallowed_special=()):\n"
        "        return text.split()\n"
        "def encoding_for_model(name):\n"
        "    raise KeyError(name)\n"
        "def get_encoding(name):\n"
        "    assert name == 'o200k_base'\n"
        "    return _Enc()\n"
    )
    write_requests(tmp_path / "req.jsonl", 10, max_tokens=10)
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(fake.parent), ENV.get("PYTHONPATH", "")])}
    proc = exec_cli(tmp_path / "req.jsonl", tmp_path / "out.jsonl", "--dry-run", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "prompt tokens: 60 (counted with tiktoken)" in proc.stdout  # 2 words + 4, each


def test_max_cost_stops_sending_and_a_higher_budget_resumes(tmp_path, mock_server):
    url = mock_server()
    requests = write_requests(tmp_path / "req.jsonl", 10, max_tokens=10)
    out = tmp_path / "out.jsonl"
    price = ["--price", "in=0,out=100000"]  # $0.10 an output token: $1 a request (10 tokens)
    args = ["--url", url, "-c", "2", *price]
    proc = exec_cli(tmp_path / "req.jsonl", out, *args, "--max-cost", "4.5")
    assert proc.returncode == EXIT_BUDGET, proc.stderr
    assert "stopped by --max-cost" in proc.stderr
    assert "spent: $4.0000" in proc.stderr
    assert "nothing in flight, and the next request (up to $1.0000) could pass" in proc.stderr
    assert len(read_results(out)) == 4
    assert spent_in_output(str(out), parse_price("in=0,out=100000")) == 4.0

    same = exec_cli(tmp_path / "req.jsonl", out, *args, "--max-cost", "4.5")
    assert same.returncode == EXIT_BUDGET  # the budget is for the whole file: nothing more
    assert len(read_results(out)) == 4

    more = exec_cli(tmp_path / "req.jsonl", out, *args, "--max-cost", "100")
    assert more.returncode == 0, more.stderr
    assert "spent: $10.0000 ($4.0000 before this run)" in more.stderr
    results = read_results(out)
    assert sorted(results) == sorted(r["custom_id"] for r in requests)
    assert not failures(results)


def test_max_cost_needs_a_price(tmp_path):
    write_requests(tmp_path / "req.jsonl", 1)
    proc = exec_cli(tmp_path / "req.jsonl", tmp_path / "out.jsonl", "--max-cost", "1")
    assert proc.returncode == 2 and "--price" in proc.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_spend_shows_in_the_summary_without_a_budget(tmp_path, mock_server):
    url = mock_server()
    write_requests(tmp_path / "req.jsonl", 3, max_tokens=5)
    proc = exec_cli(
        tmp_path / "req.jsonl", tmp_path / "out.jsonl", "--url", url, "--price", "out=1000000"
    )
    assert proc.returncode == 0, proc.stderr
    assert "spent: $15.0000" in proc.stderr
    line = orjson.loads((tmp_path / "out.jsonl").read_bytes().splitlines()[0])
    assert line["metrics"]["completion_tokens"] == 5

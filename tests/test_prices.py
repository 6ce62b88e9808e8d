"""Cost as billed: the dated table, usage in each provider's dialect (cached input priced as
cached), the batch discount on batch results, and what the report and a batch run say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from batchutil import cli

from jsonlbatch.errors import UsageError
from jsonlbatch.pricing.cost import Price, parse_price
from jsonlbatch.pricing.prices import TABLE, PriceBook, Tokens, bill, load_price_file, tokens_of


def test_usage_in_every_dialect_is_read_as_billed() -> None:
    openai = {"prompt_tokens": 1000, "completion_tokens": 50,
              "prompt_tokens_details": {"cached_tokens": 600}}  # fmt: skip
    assert tokens_of(openai) == Tokens(400, 600, 0, 50)
    anthropic = {"input_tokens": 100, "cache_read_input_tokens": 800,
                 "cache_creation_input_tokens": 50, "output_tokens": 20}  # fmt: skip
    assert tokens_of(anthropic) == Tokens(100, 800, 50, 20)
    gemini = {"promptTokenCount": 900, "cachedContentTokenCount": 300,
              "candidatesTokenCount": 40, "thoughtsTokenCount": 60}  # fmt: skip
    assert tokens_of(gemini) == Tokens(600, 300, 0, 100)
    responses = {
        "input_tokens": 500,
        "output_tokens": 9,
        "input_tokens_details": {"cached_tokens": 100},
    }
    assert tokens_of(responses) == Tokens(400, 100, 0, 9)
    assert tokens_of(None) == Tokens() and tokens_of({"prompt_tokens": -5}) == Tokens()


def test_bill_prices_cached_input_and_the_batch_share() -> None:
    sonnet = TABLE["claude-sonnet-5-5"]  # 2.00 in, 10.00 out, 0.10 cached, 2.50 write
    tokens = Tokens(uncached=1_000_000, cached=1_000_000, written=1_000_000, output=1_000_000)
    assert bill(tokens, sonnet) == pytest.approx(2.00 + 0.10 + 2.50 + 10.00)
    assert bill(tokens, sonnet, batch=True) == pytest.approx((2.00 + 0.10 + 2.50 + 10.00) / 2)
    flash = TABLE["gemini-2.5-flash"]  # Gemini bills cache hits in batches as live traffic
    cached_only = Tokens(cached=1_000_000)
    assert bill(cached_only, flash, batch=True) == pytest.approx(0.03)
    assert bill(Tokens(uncached=1_000_000), flash, batch=True) == pytest.approx(0.15)


def test_models_are_found_by_name_and_prefix_and_price_wins() -> None:
    book = PriceBook()
    assert book.for_model("claude-sonnet-5-5-20261001") is TABLE["claude-sonnet-5-5"]
    assert book.for_model("models/gemini-2.5-flash") is TABLE["gemini-2.5-flash"]
    assert book.for_model("my-finetune") is None
    mine = Price(1.0, 2.0)
    assert PriceBook(mine).for_model("claude-sonnet-5-5") is mine
    assert parse_price("in=1,out=2,cached=0.1") == Price(1.0, 2.0, cached_input_per_m=0.1)
    with pytest.raises(UsageError):
        parse_price("in=1,cached=x")


def test_a_price_file_adds_models(tmp_path: Path) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text("my-finetune:\n  in: 3\n  out: 6\n  cached: 0.3\n  batch: 0.4\n")
    found = load_price_file(path)["my-finetune"]
    assert (found.input_per_m, found.cached_input_per_m, found.batch_share) == (3.0, 0.3, 0.4)
    path.write_text("bad:\n  in: 3\n")
    with pytest.raises(UsageError, match="in and out"):
        load_price_file(path)


def _line(cid: str, model: str, usage: dict, batch: bool) -> dict:
    metrics = {"batch_id": "msgbatch_x"} if batch else {"latency_s": 1.0, "start_time": 1.0}
    return {"id": "r", "custom_id": cid, "error": None, "metrics": metrics,
            "response": {"status_code": 200, "body": {"model": model, "usage": usage,
                         "type": "message", "content": [{"type": "text", "text": "ok"}]}}}  # fmt: skip


def test_report_costs_batch_results_as_billed(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    usage = {
        "input_tokens": 1_000_000,
        "cache_read_input_tokens": 1_000_000,
        "output_tokens": 1_000_000,
    }
    lines = [_line("a", "claude-haiku-4-5", usage, True), _line("b", "no-such-model", usage, False)]
    out.write_text("".join(json.dumps(x) + "\n" for x in lines))
    shown = cli("report", str(out), "--format", "json")
    assert shown.returncode == 0, shown.stderr
    cost = json.loads(shown.stdout)["runs"][0]["cost"]
    # haiku 4.5: (1.00 in + 0.10 cached + 5.00 out) per million, half for a batch result
    assert cost["total_usd"] == pytest.approx((1.00 + 0.10 + 5.00) / 2)
    assert cost["unpriced_models"] == ["no-such-model"]
    text = cli("report", str(out)).stdout
    assert "built-in prices dated" in text and "no-such-model" in text
    flat = json.loads(cli("report", str(out), "--format", "json", "--price", "in=1,out=1").stdout)
    assert flat["runs"][0]["cost"]["total_usd"] == pytest.approx((1 + 1 + 1) / 2 + 3)

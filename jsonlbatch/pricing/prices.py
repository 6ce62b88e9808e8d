"""What answers cost as billed: a dated price table of common hosted models, and the rules that
turn an answer's reported usage into dollars (cached input priced as cached, cache writes as
writes, the batch discount on batch results).

The table is a starting point, dated below: providers change prices. `--price in=...,out=...`
(`cost.parse_price`) replaces it for every model of a run, and `--price-file FILE` (a JSON or
YAML mapping of model names to `{in, out, cached, write, batch}`) adds or replaces entries.
A model is found by its name, or by the longest table name it starts with
(`claude-sonnet-5-5-20261001` is `claude-sonnet-5-5`).

Usage comes in three dialects, all read here:

- OpenAI (and vLLM, SGLang, and Gemini's answers once exec translated them): `prompt_tokens`
  includes `prompt_tokens_details.cached_tokens`; Responses: `input_tokens` and
  `input_tokens_details.cached_tokens`;
- Anthropic: `input_tokens` excludes both `cache_read_input_tokens` and
  `cache_creation_input_tokens`;
- Gemini: `promptTokenCount` includes `cachedContentTokenCount`; thinking is output.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from jsonlbatch.errors import UsageError
from jsonlbatch.pricing.cost import Price

#: When the table below was gathered (USD per million tokens; batch = share of the live price).
PRICES_DATE = "2026-11-25"


def _p(inp: float, out: float, cached: float, write: float | None = None, **kw: float) -> Price:
    return Price(inp, out, cached_input_per_m=cached, cache_write_per_m=write, **kw)


#: Live prices; batch results cost `batch_share` of them (half, for all three providers). Gemini
#: bills cache hits in batches as live traffic (`batch_cached_share` 1). Sources and caveats:
#: docs/batch-api.md ("Cost as billed"); OpenAI's rows are from secondary sources.
TABLE: dict[str, Price] = {
    "gpt-6.1-sol": _p(2.00, 10.00, 0.10, 2.50),
    "gpt-6.1-terra": _p(1.00, 5.00, 0.05, 1.25),
    "gpt-6-luna": _p(0.10, 0.50, 0.01, 0.125),
    "claude-opus-5-5": _p(4.00, 20.00, 0.20, 5.00),
    "claude-sonnet-5-5": _p(2.00, 10.00, 0.10, 2.50),
    "claude-haiku-5-5": _p(0.10, 0.50, 0.01, 0.125),
    "claude-haiku-4-5": _p(1.00, 5.00, 0.10, 1.25),
    "gemini-3.8-flash": _p(0.75, 3.75, 0.075, batch_cached_share=1.0),
    "gemini-3.5-flash": _p(1.50, 9.00, 0.15, batch_cached_share=1.0),
    "gemini-3.1-pro-preview": _p(2.00, 12.00, 0.20, batch_cached_share=1.0),
    "gemini-2.5-flash": _p(0.30, 2.50, 0.03, batch_cached_share=1.0),
}


@dataclass(frozen=True, slots=True)
class Tokens:
    """An answer's tokens as billed: input not from a cache, input read from one, input
    written to one, and output (reasoning included)."""

    uncached: float = 0.0
    cached: float = 0.0
    written: float = 0.0
    output: float = 0.0

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(self.uncached + other.uncached, self.cached + other.cached,
                      self.written + other.written, self.output + other.output)  # fmt: skip


def _num(value: Any) -> float:
    return (
        float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
        else 0.0
    )


def tokens_of(usage: Any) -> Tokens:
    """The billed tokens of a `usage` object in any of the three dialects."""
    if not isinstance(usage, Mapping):
        return Tokens()
    if "promptTokenCount" in usage or "candidatesTokenCount" in usage:  # Gemini, untranslated
        cached = _num(usage.get("cachedContentTokenCount"))
        prompt = _num(usage.get("promptTokenCount")) + _num(usage.get("toolUsePromptTokenCount"))
        output = _num(usage.get("candidatesTokenCount")) + _num(usage.get("thoughtsTokenCount"))
        return Tokens(max(prompt - cached, 0.0), cached, 0.0, output)
    if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:  # Anthropic
        return Tokens(_num(usage.get("input_tokens")), _num(usage.get("cache_read_input_tokens")),
                      _num(usage.get("cache_creation_input_tokens")), _num(usage.get("output_tokens")))  # fmt: skip
    if "prompt_tokens" in usage:  # chat completions
        details = usage.get("prompt_tokens_details")
        cached = _num(details.get("cached_tokens")) if isinstance(details, Mapping) else 0.0
        written = _num(details.get("cache_write_tokens")) if isinstance(details, Mapping) else 0.0
        prompt = _num(usage.get("prompt_tokens"))
        return Tokens(
            max(prompt - cached - written, 0.0),
            cached,
            written,
            _num(usage.get("completion_tokens")),
        )
    details = usage.get("input_tokens_details")  # Responses API, or Anthropic without caching
    cached = _num(details.get("cached_tokens")) if isinstance(details, Mapping) else 0.0
    return Tokens(
        max(_num(usage.get("input_tokens")) - cached, 0.0),
        cached,
        0.0,
        _num(usage.get("output_tokens")),
    )


def bill(tokens: Tokens, price: Price, *, batch: bool = False) -> float:
    """Dollars for `tokens` at `price`; batch results at the batch share."""
    share = price.batch_share if batch else 1.0
    cached_share = price.batch_cached_share if batch else 1.0
    cached_rate = (
        price.input_per_m if price.cached_input_per_m is None else price.cached_input_per_m
    )
    write_rate = price.input_per_m if price.cache_write_per_m is None else price.cache_write_per_m
    return (
        (tokens.uncached * price.input_per_m + tokens.written * write_rate
         + tokens.output * price.output_per_m) * share
        + tokens.cached * cached_rate * cached_share
    ) / 1e6  # fmt: skip


class PriceBook:
    """Where a run's prices come from: one `--price` for every model, else the table (plus a
    `--price-file`), by model name."""

    def __init__(
        self, price: Price | None = None, extra: Mapping[str, Price] | None = None
    ) -> None:
        self.price = price
        self.table = {**TABLE, **(extra or {})}

    def for_model(self, model: str | None) -> Price | None:
        if self.price is not None:
            return self.price
        if not model:
            return None
        name = model.removeprefix("models/").lower()
        if name in self.table:
            return self.table[name]
        prefixes = [k for k in self.table if name.startswith(k)]
        return self.table[max(prefixes, key=len)] if prefixes else None

    def describe(self) -> str:
        if self.price is not None:
            p = self.price
            cached = (
                f", cached input ${p.cached_input_per_m:g}"
                if p.cached_input_per_m is not None
                else ""
            )
            return f"At ${p.input_per_m:g} per million input and ${p.output_per_m:g} per million output tokens{cached} (--price)."
        return (f"At the built-in prices dated {PRICES_DATE} (per model; cached input as cached, "
                "batch results at the batch discount); --price or --price-file to change them.")  # fmt: skip


def load_price_file(path: str | os.PathLike[str]) -> dict[str, Price]:
    """A user's prices: `{"model": {"in": 1.0, "out": 5.0, "cached": 0.1, "write": 1.25,
    "batch": 0.5}}` as JSON or YAML."""
    from jsonlbatch.file_io.filecheck import FileChecker

    data = FileChecker(os.fspath(path)).load("price file")
    if not isinstance(data, Mapping):
        raise UsageError(f"{os.fspath(path)}: a price file maps model names to prices")
    out = {}
    for model, entry in data.items():
        if not isinstance(entry, Mapping) or not {"in", "out"} <= set(entry):
            raise UsageError(
                f"{os.fspath(path)}: {model}: give at least in and out (dollars per million tokens)"
            )
        try:
            numbers = {
                k: float(v)
                for k, v in entry.items()
                if k in ("in", "out", "cached", "write", "batch")
            }
        except (TypeError, ValueError):
            raise UsageError(f"{os.fspath(path)}: {model}: prices must be numbers") from None
        if any(v < 0 or v != v for v in numbers.values()):
            raise UsageError(f"{os.fspath(path)}: {model}: prices must be finite and not negative")
        base = Price(numbers["in"], numbers["out"], cached_input_per_m=numbers.get("cached"),
                     cache_write_per_m=numbers.get("write"))  # fmt: skip
        out[str(model).lower()] = replace(base, batch_share=numbers.get("batch", 0.5))
    return out

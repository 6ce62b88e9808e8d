"""`jsonlbatch exec --dry-run`: what a run would send and may cost, without sending anything.

The input is validated exactly as a real run validates it, and what is already done in the
output is skipped as a real run would skip it; the output is only read (no lock file, no
repair). Prompt tokens are counted with tiktoken when it is installed, else estimated from the
characters (about four a token); the report says which, and why tiktoken could not count.
Images are counted as billed (`cost.estimate_prompt`); those it cannot size are reported.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import orjson

from jsonlbatch.exec.job import Job
from jsonlbatch.file_io.jsonl import read_lines_at
from jsonlbatch.pricing.cost import (
    UNCAPPED_OUTPUT_TOKENS,
    Price,
    estimate_prompt,
    max_output_tokens,
    tiktoken_counter,
    tiktoken_unavailable,
)


@dataclass
class DryRunReport:
    requests: int = 0  # in the file (this shard)
    already_done: int = 0
    pending: int = 0
    by_url: Counter[str] = field(default_factory=Counter)
    by_model: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0  # images included
    image_tokens: int = 0
    uncounted_images: int = 0  # image parts by URL, or whose header could not be read
    uncounted_files: int = 0  # file parts (PDF): billed by pages, not estimated
    max_completion_tokens: int = 0  # over the requests that set a cap
    uncapped: int = 0  # requests without max_tokens / max_completion_tokens / max_output_tokens
    counted_with: str = "characters / 4"
    price: Price | None = None

    @property
    def cost_range(self) -> tuple[float, float] | None:
        """Dollars: prompts alone (every answer empty) .. prompts plus every output cap (requests
        without a cap counted at UNCAPPED_OUTPUT_TOKENS)."""
        if self.price is None:
            return None
        ceiling = self.max_completion_tokens + self.uncapped * UNCAPPED_OUTPUT_TOKENS
        return (
            self.price.of(self.prompt_tokens, 0),
            self.price.of(self.prompt_tokens, ceiling),
        )

    def format(self) -> str:
        lines = [
            f"dry run: {self.pending} requests to send of {self.requests}"
            + (f" ({self.already_done} already done)" if self.already_done else ""),
            "  endpoints: " + (", ".join(f"{u} x{n}" for u, n in self.by_url.most_common()) or "-"),
            "  models: " + (", ".join(f"{m} x{n}" for m, n in self.by_model.most_common()) or "-"),
            f"  prompt tokens: {self.prompt_tokens:,} (counted with {self.counted_with})",
            *self._media_lines(),
            f"  completion tokens at most: {self.max_completion_tokens:,}"
            + (
                f" (+ {self.uncapped} requests with no cap, counted at {UNCAPPED_OUTPUT_TOKENS} "
                "each below)"
                if self.uncapped
                else ""
            ),
        ]
        cost = self.cost_range
        if cost is not None:
            lines.append(f"  projected cost: ${cost[0]:,.4f} .. ${cost[1]:,.4f}")
        lines.append("  nothing was sent and the output was not touched")
        return "\n".join(lines)

    def _media_lines(self) -> list[str]:
        lines = []
        if self.image_tokens:
            lines.append(f"  of which image tokens: {self.image_tokens:,} (as billed, by size)")
        if self.uncounted_images:
            lines.append(
                f"  {self.uncounted_images:,} image parts not counted (a URL, or a header that "
                "gives no size): the estimate is low"
            )
        if self.uncounted_files:
            lines.append(
                f"  {self.uncounted_files:,} file parts not counted (billed by their pages): the "
                "estimate is low"
            )
        return lines


def dry_run(job: Job, *, use_tiktoken: bool = True) -> DryRunReport:
    """Validate `job`'s input and count what it would send. Raises as a real run would."""
    scan = job.prepare(lock=False)
    opts = job.options
    report = DryRunReport(
        requests=scan.total,
        already_done=scan.already_done,
        pending=len(scan.pending),
        price=opts.price,
    )
    counters: dict[str, object] = {}
    why: str | None = None  # the first reason tiktoken could not count
    for raw in read_lines_at(job.source, scan.pending):
        obj = orjson.loads(raw)
        body = obj["body"]
        model = opts.model if opts.model not in (None, "auto") else body.get("model")
        report.by_url[obj["url"]] += 1
        report.by_model[str(model or "(served model)")] += 1
        counter = None
        if use_tiktoken:
            if model not in counters:
                counters[model] = tiktoken_counter(model)
                if counters[model] is None and why is None:
                    why = tiktoken_unavailable(model)
            counter = counters[model]
        name = model if isinstance(model, str) else None
        estimate = estimate_prompt(body, counter, name)  # type: ignore[arg-type]
        report.prompt_tokens += estimate.tokens
        report.image_tokens += estimate.images
        report.uncounted_images += estimate.uncounted_images
        report.uncounted_files += estimate.uncounted_files
        cap = max_output_tokens(body)
        if cap is None:
            report.uncapped += 1
        else:
            report.max_completion_tokens += cap
    if any(counters.values()):
        report.counted_with = "tiktoken" + (
            "" if all(counters.values()) else " where it had an encoding, else characters / 4"
        )
    if why is not None:
        report.counted_with += f": {why}"
    job.close()
    return report

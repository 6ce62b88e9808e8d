"""What a Batch API run takes besides exec's own options, and what it says at its end.

A `--batch-api` run is a `RunSpec` like any other (exec/front_door.py): its `ExecOptions` hold
what every target shares (the URL, credentials, `--model`, `--retry-failed`, `--max-retries`,
`--price`, `--no-schema-check`, `--quiet`), and its target (`provider_target.ProviderBatch`)
holds these `BatchOptions`: what only a provider's batch API has (windows, part sizes, polling,
a price file, a budget priced by the table).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from jsonlbatch.batchapi.formats.batch_objects import DEFAULT_POLL_S, DEFAULT_WINDOW
from jsonlbatch.errors import UsageError
from jsonlbatch.exec.output.run_outcome import Results
from jsonlbatch.pricing.cost import Price


@dataclass(frozen=True)
class BatchOptions:
    """The Batch API's own options. Field docs are the CLI's help (`exec --help-all`)."""

    completion_window: str = DEFAULT_WINDOW
    metadata: Mapping[str, str] = field(default_factory=dict)
    max_requests: int | None = None  # None: the provider's limit
    max_bytes: int | None = None
    provider: str | None = None  # openai, anthropic, gemini; None: from the URL and the lines
    #: first wait between looks; grows 1.5x while nothing changes
    poll_interval: float = DEFAULT_POLL_S
    poll_max: float = 120.0
    prices: Mapping[str, Price] = field(default_factory=dict)  # `--price-file` entries
    #: dollars that OUT's answers plus the parts submitted may cost at most (`--max-cost`),
    #: priced by `--price` or else the built-in table and `prices` (so no `--price` is needed)
    max_cost: float | None = None

    def __post_init__(self) -> None:
        if (self.max_requests is not None and self.max_requests < 1) or (
            self.max_bytes is not None and self.max_bytes < 1
        ):
            raise UsageError("--batch-max-requests and --batch-max-bytes must be positive")
        if self.poll_interval <= 0:
            raise UsageError("--poll-interval must be positive")
        if len(self.metadata) > 14:  # OpenAI allows 16 keys; two mark the part
            raise UsageError("--batch-metadata takes at most 14 keys")
        if self.max_cost is not None and self.max_cost < 0:
            raise UsageError("--max-cost must not be negative")


@dataclass
class SubmitSummary:
    output: str
    requests: int = 0
    already_done: int = 0
    batches: list[str] = field(default_factory=list)
    merged: int = 0
    failed: int = 0  # lines written this run that record a failure
    failed_before: int = 0
    cost: float = 0.0  # the answers merged this run, as billed (batch prices)
    unpriced: int = 0  # answers merged this run whose model has no price
    budget_stopped: bool = False  # --max-cost held parts back: the same command resumes
    unreadable: int = 0  # results lines that answered nothing (not JSON, no string id, ...)

    def add_cost(self, cost: float | None, failed: bool) -> None:
        if cost is not None:
            self.cost += cost
        elif not failed:
            self.unpriced += 1

    @property
    def results(self) -> Results:
        """The output's answers by custom_id, typed (read from the file on use)."""
        return Results(self.output)

    def format(self) -> str:
        text = (
            f"{self.output}: {self.requests} requests; {self.already_done} had a result before; "
            f"{self.merged} results merged from {len(self.batches)} batches "
            f"({self.failed} failed)"
        )
        if self.cost or self.merged > self.failed + self.unpriced:
            text += f"; ${self.cost:,.4f} as billed"
        if self.unpriced:
            text += f" ({self.unpriced} answers of models without a price not counted)"
        if self.unreadable:
            text += f"; {self.unreadable} results lines could not be read"
        if self.budget_stopped:
            text += "; stopped by --max-cost: the same command with a higher budget resumes"
        return text

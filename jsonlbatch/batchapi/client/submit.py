"""`submit`: a request file through a provider's Batch API from Python, kept for callers of
earlier releases. It starts the same `RunSpec` as `jsonlbatch.execute(..., batch_api=True)` and
`exec --batch-api` (exec/front_door.py, `provider_target.ProviderBatch`); new code calls
`jsonlbatch.execute` with the command line's option names.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from jsonlbatch.batchapi.client.provider_target import ProviderBatch
from jsonlbatch.batchapi.client.providers import PROVIDERS
from jsonlbatch.batchapi.client.submit_options import BatchOptions, SubmitSummary
from jsonlbatch.batchapi.client.submitter import Submitter
from jsonlbatch.batchapi.formats.batch_objects import DEFAULT_POLL_S, DEFAULT_WINDOW
from jsonlbatch.exec.exec_options import ExecOptions
from jsonlbatch.exec.front_door import RunSpec, start
from jsonlbatch.pricing.cost import Price

__all__ = ["BatchOptions", "SubmitOptions", "SubmitSummary", "Submitter", "submit"]

#: The OpenAI Batch API's limits per input file (each provider's are in providers.py).
MAX_REQUESTS = PROVIDERS["openai"].max_requests
MAX_BYTES = PROVIDERS["openai"].max_bytes


@dataclass
class SubmitOptions:
    """A run through a Batch API, all in one value (`submit`'s): split by `spec` into the
    options every run has and the Batch API's own."""

    url: str
    api_key: str | None = field(default=None, repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    model: str | None = None  # override every body's model (Azure: the deployment name)
    completion_window: str = DEFAULT_WINDOW
    metadata: Mapping[str, str] = field(default_factory=dict)
    max_requests: int | None = None  # None: the provider's limit
    max_bytes: int | None = None
    provider: str | None = None  # openai, anthropic, gemini; None: from the URL and the lines
    poll_interval: float = DEFAULT_POLL_S
    poll_max: float = 120.0
    retry_failed: bool = False
    max_retries: int = 8
    quiet: bool = False
    price: Price | None = None  # one price for every model; None: the table plus `prices`
    prices: Mapping[str, Price] = field(default_factory=dict)  # `--price-file` entries
    max_cost: float | None = None

    def spec(self, requests: str | os.PathLike[str], output: str | os.PathLike[str]) -> RunSpec:
        """The run these options describe, as the command line would build it."""
        options = ExecOptions(urls=(self.url,), api_key=self.api_key, headers=self.headers,
                              model=self.model, retry_failed=self.retry_failed,
                              max_retries=self.max_retries, quiet=self.quiet, price=self.price)  # fmt: skip
        batch = BatchOptions(
            completion_window=self.completion_window, metadata=self.metadata,
            max_requests=self.max_requests, max_bytes=self.max_bytes, provider=self.provider,
            poll_interval=self.poll_interval, poll_max=self.poll_max, prices=self.prices,
            max_cost=self.max_cost,
        )  # fmt: skip
        return RunSpec(requests=os.fspath(requests), output=os.fspath(output), options=options,
                       target=ProviderBatch(batch))  # fmt: skip


def submit(
    requests: str | os.PathLike[str], output: str | os.PathLike[str], options: SubmitOptions
) -> SubmitSummary:
    """Run a request file through a Batch API to completion (blocking). Raises `Interrupted`
    on Ctrl-C, leaving the batches running; the same call again resumes."""
    summary = start(options.spec(requests, output)).summary
    assert isinstance(summary, SubmitSummary)
    return summary

"""A provider's Batch API as a run target (`exec --batch-api`): a `RunSpec`'s `target`
(exec/front_door.py) that submits the request file in parts, watches them and merges the results
into the output (`submit.py`). It reads the request file itself, so it takes no prepared job.
"""

from __future__ import annotations

from dataclasses import dataclass

from jsonlbatch.batchapi.client.submit import SubmitOptions, SubmitSummary, submit
from jsonlbatch.exec.front_door import Running


@dataclass(frozen=True)
class ProviderBatch:
    """Submit, watch and merge through the Batch API at `options.url` (OpenAI's, Anthropic's
    Message Batches, Gemini's batch mode, or `serve --batch-api`)."""

    options: SubmitOptions
    uses_job = False

    def start(self, running: Running, /) -> SubmitSummary:
        spec = running.spec
        return submit(spec.requests, spec.output, self.options)  # Ctrl-C: `Interrupted`

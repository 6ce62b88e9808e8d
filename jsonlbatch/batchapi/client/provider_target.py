"""A provider's Batch API as a run target (`exec --batch-api`, `execute(..., batch_api=True)`):
a `RunSpec`'s `target` (exec/front_door.py) that submits the prepared job in parts, watches them
and merges the results into the output (`submitter.py`).

It is started as every target is: the front door prepares the job (the output locked, the
input checked, resume, `--retry-failed` and `--changed` decided) with the spec's options and
seams, the watchers' subscribers included; the target sends it. Ctrl-C is handled only where
the caller asked for it (`start(handle_signals=True)`, the command line), so the same run
works from a worker thread (`astart`, `aexecute` in a notebook), where a cancel stops the
watching as Ctrl-C does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jsonlbatch.batchapi.client.submit_options import BatchOptions, SubmitSummary
from jsonlbatch.batchapi.client.submitter import Submitter
from jsonlbatch.exec.front_door import Running
from jsonlbatch.exec.job import run_coroutine


@dataclass(frozen=True)
class ProviderBatch:
    """Submit, watch and merge through the Batch API at the spec's one URL (OpenAI's,
    Anthropic's Message Batches, Gemini's batch mode, or `serve --batch-api`)."""

    options: BatchOptions = field(default_factory=BatchOptions)
    uses_job = True

    def start(self, running: Running, /) -> SubmitSummary:
        assert running.job is not None
        submitter = Submitter(running.job, self.options, handle_signals=running.handle_signals)
        return run_coroutine(submitter.run())  # stopped: `Interrupted`, the batches run on

"""The exec stage: send an OpenAI Batch request file to OpenAI-compatible servers, crash-safely.

`Job` (in `job`) scans what the output already holds and validates the whole input before
anything is sent (`scan`); `run` is the loop: `admit` checks the servers, `send` sends each
request (pools by model: `pools`; endpoints and health: `endpoints`, `router`; rate limits and
budget: `budget`, `limits`; retries: `retry`; streamed answers: `streaming`), `record` appends one
whole line per finished request, `events` tells the progress bar and any listener what happened.
`seams` gathers what a caller plugs in (`checks`, `lookup`, `pools`, `events`, `concurrency`).
`shard` splits a file across machines and merges the parts back; `summary` says what happened.

    from jsonlbatch.exec import execute
    summary = execute("requests.jsonl", "responses.jsonl", urls=["http://localhost:8000/v1"])
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jsonlbatch.lazy import lazy

#: Public name -> its module, imported on first use: `import jsonlbatch.exec.scan` (validate,
#: report, batchapi) must not import the run loop and aiohttp with it.
_LAZY = {
    "ExecOptions": "jsonlbatch.exec.options",
    "Job": "jsonlbatch.exec.job",
    "aexecute": "jsonlbatch.exec.front",
    "execute": "jsonlbatch.exec.front",
    "RunSpec": "jsonlbatch.exec.front",
    "start": "jsonlbatch.exec.front",
    "astart": "jsonlbatch.exec.front",
    "run_coroutine": "jsonlbatch.exec.job",
    "MergeError": "jsonlbatch.exec.shard",
    "MergeSummary": "jsonlbatch.exec.shard",
    "merge": "jsonlbatch.exec.shard",
    "parse_shard": "jsonlbatch.exec.shard",
    "RunSummary": "jsonlbatch.exec.summary",
    "Seams": "jsonlbatch.exec.seams",
    "ValidationReport": "jsonlbatch.exec.validate",
    "validate_file": "jsonlbatch.exec.validate",
}

if TYPE_CHECKING:
    from jsonlbatch.exec.front import RunSpec, aexecute, astart, execute, start
    from jsonlbatch.exec.job import Job, run_coroutine
    from jsonlbatch.exec.options import ExecOptions
    from jsonlbatch.exec.seams import Seams
    from jsonlbatch.exec.shard import MergeError, MergeSummary, merge, parse_shard
    from jsonlbatch.exec.summary import RunSummary
    from jsonlbatch.exec.validate import ValidationReport, validate_file


__getattr__, __dir__ = lazy(__name__, _LAZY)


__all__ = [
    "ExecOptions",
    "Job",
    "MergeError",
    "MergeSummary",
    "RunSpec",
    "RunSummary",
    "Seams",
    "ValidationReport",
    "aexecute",
    "astart",
    "execute",
    "merge",
    "parse_shard",
    "run_coroutine",
    "start",
    "validate_file",
]

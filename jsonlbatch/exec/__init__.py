"""The exec stage: send an OpenAI Batch request file to OpenAI-compatible servers, crash-safely.

`Job` (in `job`) is the run: it scans what the output already holds (`scan`), validates the whole
input before anything is sent (`validate`), then streams pending lines through a bounded pool of
workers that pick an endpoint (`endpoints`, by prompt prefix or load: `router`; the servers'
own cache figures: `server_metrics`), retry with backoff (`retry`), read
streamed answers (`streaming`) and append one whole line per finished request. `shard` splits a
file across machines and merges the parts back; `summary` and `progress` say what happened.

    from jsonlbatch.exec import execute
    summary = execute("requests.jsonl", "responses.jsonl", urls=["http://localhost:8000/v1"])
"""

from __future__ import annotations

from jsonlbatch.exec.job import ExecOptions, Job, aexecute, execute, run_coroutine
from jsonlbatch.exec.shard import MergeError, MergeSummary, merge, parse_shard
from jsonlbatch.exec.summary import RunSummary
from jsonlbatch.exec.validate import ValidationReport, validate_file

__all__ = [
    "ExecOptions",
    "Job",
    "MergeError",
    "MergeSummary",
    "RunSummary",
    "ValidationReport",
    "aexecute",
    "execute",
    "merge",
    "parse_shard",
    "run_coroutine",
    "validate_file",
]

"""The exec stage: send an OpenAI Batch request file to OpenAI-compatible servers, crash-safely.

`front_door` is the way in: a `RunSpec` (what every way of asking for a run builds) started by
`start`/`astart` (`execute`/`aexecute` here are deprecated aliases: the public ones are
`jsonlbatch.execute`/`aexecute`, with the command line's option names); `job.Job` is a run
prepared, `run_loop` the run itself (`run_setup` what is built for it before the first send,
`request_lines` its readers). The stages, in the order a request meets them: `prepare/` (the
input and output passes), `route/` (which server), `send/` (the attempts), `hooks/` (what a
caller plugs in: checks, an answer store; the answer contract), `output/` (the written line,
events, the bar, the summary, what a caller gets back). docs/architecture.md draws one request's path.

    from jsonlbatch.exec import RunSpec, Urls, start
    outcome = start(RunSpec(requests="requests.jsonl", output="responses.jsonl",
                            target=Urls(("http://localhost:8000/v1",))))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jsonlbatch.lazy import lazy

#: Public name -> its module, imported on first use: `import jsonlbatch.exec.prepare.input_scan` (validate,
#: report, batchapi) must not import the run loop and aiohttp with it.
_LAZY = {
    "ExecOptions": "jsonlbatch.exec.exec_options",
    "Job": "jsonlbatch.exec.job",
    "aexecute": "jsonlbatch.exec.front_door",
    "execute": "jsonlbatch.exec.front_door",
    "RunSpec": "jsonlbatch.exec.front_door",
    "start": "jsonlbatch.exec.front_door",
    "Urls": "jsonlbatch.exec.front_door",
    "astart": "jsonlbatch.exec.front_door",
    "run_coroutine": "jsonlbatch.exec.job",
    "MergeError": "jsonlbatch.exec.prepare.shard",
    "MergeSummary": "jsonlbatch.exec.prepare.shard",
    "merge": "jsonlbatch.exec.prepare.shard",
    "parse_shard": "jsonlbatch.exec.prepare.shard",
    "RunSummary": "jsonlbatch.exec.output.run_summary",
    "Seams": "jsonlbatch.exec.hooks.seams",
    "ValidationReport": "jsonlbatch.exec.prepare.validate",
    "validate_file": "jsonlbatch.exec.prepare.validate",
}

if TYPE_CHECKING:
    from jsonlbatch.exec.exec_options import ExecOptions
    from jsonlbatch.exec.front_door import RunSpec, Urls, aexecute, astart, execute, start
    from jsonlbatch.exec.hooks.seams import Seams
    from jsonlbatch.exec.job import Job, run_coroutine
    from jsonlbatch.exec.output.run_summary import RunSummary
    from jsonlbatch.exec.prepare.shard import MergeError, MergeSummary, merge, parse_shard
    from jsonlbatch.exec.prepare.validate import ValidationReport, validate_file


__getattr__, __dir__ = lazy(__name__, _LAZY)


__all__ = [
    "ExecOptions",
    "Job",
    "MergeError",
    "MergeSummary",
    "RunSpec",
    "RunSummary",
    "Seams",
    "Urls",
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

"""jsonlbatch: offline LLM batch work over JSONL.

    import jsonlbatch

    with jsonlbatch.RequestWriter("requests.jsonl", model="Qwen/Qwen3-8B") as w:
        w.add("q1", [{"role": "user", "content": "2+2?"}], n=3)
    summary = jsonlbatch.execute("requests.jsonl", "responses.jsonl",
                                 urls=["http://localhost:8000/v1"], concurrency=256)

The stages are subpackages (`jsonlbatch.gen`, `.exec`, `.serve`, `.post`, `.report`, `.mock`) over
a small shared core (`batch_format`, `file_io`, `pricing`, `answer_contract`, `errors`, `redact`,
`stats`); docs/architecture.md draws the map. Importing the package imports no stage: each name
below is loaded on first use (`jsonlbatch.execute` imports the executor, `jsonlbatch.post` the post
stage), so a command line or a script that only writes requests never pays for aiohttp or the
executor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jsonlbatch.errors import (
    AuthenticationError,
    InputError,
    Interrupted,
    JsonlbatchError,
    LaunchError,
    ModelNotServedError,
    OutputError,
    Problem,
    ServerError,
    ServerUnavailableError,
    UsageError,
)
from jsonlbatch.lazy import lazy

#: Public name -> the module that defines it (a stage, imported on first use).
_LAZY = {
    "ExecOptions": "jsonlbatch.exec",
    "Job": "jsonlbatch.exec",
    "RunSummary": "jsonlbatch.exec",
    "Seams": "jsonlbatch.exec",
    "ValidationReport": "jsonlbatch.exec",
    # the front door: every mode of `jsonlbatch exec`, with its option names (cli/library.py)
    "aexecute": "jsonlbatch.cli.library",
    "execute": "jsonlbatch.cli.library",
    "build_spec": "jsonlbatch.cli.library",
    "validate_file": "jsonlbatch.exec",
    # rollouts: conversations with tools on the same front door (cli/rollout.py)
    "rollout": "jsonlbatch.cli.rollout",
    "arollout": "jsonlbatch.cli.rollout",
    "current_conversation": "jsonlbatch.rollouts",
    "GenSummary": "jsonlbatch.gen",
    "RequestWriter": "jsonlbatch.gen",
    "ServeOptions": "jsonlbatch.serve",
    "serving": "jsonlbatch.serve",
    # stages reachable as attributes (`jsonlbatch.post.run_votes(...)`) without importing first
    "post": "jsonlbatch.post",
    "report": "jsonlbatch.report",
}

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from jsonlbatch import post, report
    from jsonlbatch.cli.library import aexecute, build_spec, execute
    from jsonlbatch.cli.rollout import arollout, rollout
    from jsonlbatch.exec import (
        ExecOptions,
        Job,
        RunSummary,
        Seams,
        ValidationReport,
        validate_file,
    )
    from jsonlbatch.gen import GenSummary, RequestWriter
    from jsonlbatch.rollouts import current_conversation
    from jsonlbatch.serve import ServeOptions, serving


__getattr__, __dir__ = lazy(__name__, _LAZY)


__all__ = [
    "AuthenticationError",
    "ExecOptions",
    "GenSummary",
    "InputError",
    "Interrupted",
    "Job",
    "JsonlbatchError",
    "LaunchError",
    "ModelNotServedError",
    "OutputError",
    "Problem",
    "RequestWriter",
    "RunSummary",
    "Seams",
    "ServeOptions",
    "ServerError",
    "ServerUnavailableError",
    "UsageError",
    "ValidationReport",
    "aexecute",
    "arollout",
    "build_spec",
    "current_conversation",
    "execute",
    "post",
    "report",
    "rollout",
    "serving",
    "validate_file",
]

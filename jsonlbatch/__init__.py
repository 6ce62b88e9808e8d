"""jsonlbatch: offline LLM batch work over JSONL.

    import jsonlbatch

    with jsonlbatch.RequestWriter("requests.jsonl", model="Qwen/Qwen3-8B") as w:
        w.add("q1", [{"role": "user", "content": "2+2?"}], n=3)
    summary = jsonlbatch.execute("requests.jsonl", "responses.jsonl",
                                 urls=["http://localhost:8000/v1"], concurrency=256)

The stages are subpackages (`jsonlbatch.gen`, `.exec`, `.serve`, `.post`, `.report`, `.mock`)
over a small shared core (`records`, `jsonl`, `errors`, `redact`, `stats`, `idset`); docs/architecture.md
draws the map. `jsonlbatch.post` and `jsonlbatch.report` are reachable after `import jsonlbatch`.
"""

from jsonlbatch import post, report
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
from jsonlbatch.exec import (
    ExecOptions,
    Job,
    RunSummary,
    ValidationReport,
    aexecute,
    execute,
    validate_file,
)
from jsonlbatch.gen import GenSummary, RequestWriter
from jsonlbatch.serve import ServeOptions, serving

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
    "ServeOptions",
    "ServerError",
    "ServerUnavailableError",
    "UsageError",
    "ValidationReport",
    "aexecute",
    "execute",
    "post",
    "report",
    "serving",
    "validate_file",
]

"""jsonlbatch: offline LLM batch work over JSONL.

    import jsonlbatch

    with jsonlbatch.RequestWriter("requests.jsonl", model="Qwen/Qwen3-8B") as w:
        w.add("q1", [{"role": "user", "content": "2+2?"}], n=3)
    summary = jsonlbatch.execute("requests.jsonl", "responses.jsonl",
                                 urls=["http://localhost:8000/v1"], concurrency=256)

Post-processing lives in `jsonlbatch.post`, reports in `jsonlbatch.report`.
"""

from jsonlbatch.backends import ServeOptions
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
from jsonlbatch.executor import ExecOptions, Job, aexecute, execute
from jsonlbatch.gen import GenSummary, RequestWriter
from jsonlbatch.launch import serving
from jsonlbatch.summary import RunSummary
from jsonlbatch.validate import ValidationReport, validate_file

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
    "serving",
    "validate_file",
]

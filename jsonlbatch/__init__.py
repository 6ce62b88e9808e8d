"""jsonlbatch: offline LLM batch work over JSONL.

import jsonlbatch
summary = jsonlbatch.execute("requests.jsonl", "responses.jsonl",
                             urls=["http://localhost:8000/v1"], concurrency=256)
"""

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
    "ServerError",
    "ServerUnavailableError",
    "UsageError",
    "ValidationReport",
    "aexecute",
    "execute",
    "validate_file",
]

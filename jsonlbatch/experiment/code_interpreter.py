"""A condition in hosted code interpreter mode (`code_interpreter: [COLUMN, ...]`).

Its requests go to the Responses API with a `code_interpreter` tool whose container holds the
row's reference files: each named column holds a path (relative ones from the data file's
folder), sent as `file://PATH` so exec uploads it once per distinct content
(`exec/prepare/file_refs.py`). With the exec step's `files_dir: true` the deliverables are
collected into the condition's `container_files/` folder, and `require_files` with `reask`
gives GDPVal's "needs files" retry.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from jsonlbatch.errors import InputError
from jsonlbatch.gen.sources import Row


def interpreter_tools(columns: Sequence[str], data_file: str) -> Callable[[Row], dict[str, Any]]:
    """The per-row body part: the tool, with the row's files as `file://` references."""
    base = os.path.dirname(os.path.abspath(data_file))

    def tools(row: Row) -> dict[str, Any]:
        refs = []
        for column in columns:
            value = row.data.get(column)
            if value in (None, ""):
                continue  # this row has no file there
            if not isinstance(value, str):
                raise InputError(
                    "no reference file", [row.problem(column, "must hold a file's path")]
                )
            refs.append("file://" + os.path.join(base, os.path.expanduser(value)))
        container = {"type": "auto", "file_ids": refs}
        return {"tools": [{"type": "code_interpreter", "container": container}]}

    return tools

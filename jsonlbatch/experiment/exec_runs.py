"""How the experiment runner sends a file: a `RunSpec` started by the front door, as every run.

The exec step and the judge rounds of a condition send to its `target`: `Urls` for servers
that already run, `serve.target.KeptLaunch` for servers the condition asks to `serve`
(launched with the first run that has something to send, kept for its later steps). Going
through the launch target gives each run the launcher's watchdog (a server that dies ends the
run at once, instead of being waited for until the ready timeout), each server its own key, and
a pool per model when the endpoints serve different ones.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from jsonlbatch.exec.exec_options import ExecOptions
from jsonlbatch.exec.front_door import RunSpec, Target, start
from jsonlbatch.exec.output.run_summary import RunSummary


def send(
    requests: str | os.PathLike[str],
    output: str | os.PathLike[str],
    target: Target,
    options: Mapping[str, Any],
    *,
    quiet: bool = False,
) -> RunSummary:
    """Send `requests` to `target` with exec's `options` (ExecOptions names); resumable as
    `jsonlbatch exec` is. Raises what a run raises (`Interrupted` on Ctrl-C)."""
    opts = ExecOptions(**{**options, "quiet": quiet})
    spec = RunSpec(requests=os.fspath(requests), output=os.fspath(output), options=opts,
                   target=target)  # fmt: skip
    return start(spec).summary

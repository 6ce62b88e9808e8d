"""What a run is given and what is built for it before its first request is sent.

`Prepared` is what `Job.prepare` hands the run loop. The rest are the parts the loop builds
from the options before sending: the meter (`--price`/`--max-cost`, pacing), the hosted files
(the lines' `file://` uploads and `--files-dir`'s collector), and each server's priority sign
(from its `/metrics`, for `--priority`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

from jsonlbatch.exec.exec_options import ExecOptions
from jsonlbatch.exec.hooks.check_hook import Check
from jsonlbatch.exec.hooks.contract_check import AnswerChecker
from jsonlbatch.exec.hooks.store_hook import EarlyAnswers
from jsonlbatch.exec.output.run_summary import RunSummary
from jsonlbatch.exec.prepare.file_refs import FileRefs
from jsonlbatch.exec.prepare.input_scan import InputScan, OutputScan
from jsonlbatch.exec.route.endpoints import Endpoint
from jsonlbatch.exec.route.server_metrics import ServerCounters
from jsonlbatch.exec.send.budget import Budget, Meter, spent_in_output
from jsonlbatch.exec.send.file_collect import Collector
from jsonlbatch.exec.send.file_uploads import Uploads, sidecar_paths
from jsonlbatch.exec.send.hosted_files import HostedFiles
from jsonlbatch.exec.send.pacing import Pacing
from jsonlbatch.exec.send.priority import sign_of
from jsonlbatch.file_io.output_guard import OutputLock


@dataclass
class Prepared:
    """What `Job.prepare` found and holds, handed to the run loop: the two files (and `source`,
    what is read: the request file or a copy of a pipe), the options, both scans, the lock."""

    requests: str
    output: str
    source: str
    options: ExecOptions
    scan: InputScan
    existing: OutputScan
    lock: OutputLock
    checks: Check | None  # every check an answer passes (`Job.checks`)
    contract: AnswerChecker  # the answer contract's journal is closed with the run
    early: EarlyAnswers | None = None  # lines answered during the scan, waiting to be written
    file_refs: FileRefs | None = None  # the `file://` files its lines name (prepare/file_refs.py)


def make_meter(opts: ExecOptions, output: str, summary: RunSummary) -> Meter:
    """The run's pacing and, with `--price`, its budget (what the output already spent counts
    against `--max-cost`, and is kept in `summary`)."""
    budget = None
    if opts.price is not None:
        spent = spent_in_output(output, opts.price) if opts.max_cost is not None else 0.0
        budget = Budget(opts.price, opts.max_cost, spent)
        summary.spent_before = spent
    return Meter(Pacing.of(opts), budget)


def hosted_files(
    opts: ExecOptions, refs: FileRefs | None, output: str, session: aiohttp.ClientSession
) -> HostedFiles | None:
    """The uploads of the lines' `file://` files and `--files-dir`'s collector, if any."""
    uploads = None
    if refs is not None and refs.by_hash:
        sidecars = sidecar_paths(output, opts.cache)
        uploads = Uploads(refs, sidecars, session, opts.timeout)
    collector = None
    if opts.files_dir is not None:
        collector = Collector(opts.files_dir, output, session, timeout=opts.timeout,
                              stall=opts.stream_stall_timeout,
                              max_bytes=opts.max_file_bytes)  # fmt: skip
    if uploads is None and collector is None:
        return None
    return HostedFiles(uploads, collector, opts.require_files, opts.reask)


def set_priority_signs(
    opts: ExecOptions,
    endpoints: Sequence[Endpoint],
    found: Sequence[ServerCounters | None],
    note: Callable[[str], None],
) -> None:
    """Each endpoint's priority sign from what its `/metrics` showed; with `--priority`, a note
    for each server that will not be sent one."""
    for ep, metrics in zip(endpoints, found, strict=True):
        ep.priority_sign = sign_of(metrics.kind if metrics is not None else None)
        if opts.priority is not None and not ep.priority_sign:
            note(
                f"--priority: {ep.name} shows no vLLM or SGLang /metrics; no priority is sent to it"
            )

"""`exec --batch-api`: send a request file through a remote Batch API, exactly once.

1. Split what OUT still lacks into parts within the API's limits (one endpoint and one model
   per part, at most `max_requests` lines and `max_bytes` bytes each).
2. Upload each part and create one batch from it, saving the state around each call
   (`submit_state.py`), so no crash ever makes a second file or batch for a part.
3. Watch the batches (`request_counts` in a progress bar; status changes as notes) at an
   interval that backs off while nothing changes.
4. When a batch ends, append its output and error lines to OUT (bodies as the API wrote them,
   `metrics.batch_id` added) and a failure line for each request that got none
   (`batch_expired`, `batch_cancelled`, ...), so OUT has exactly one line per request and
   `--retry-failed` submits only the failures.

Ctrl-C stops the watching, never the batches: the same command again picks them up.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from tqdm import tqdm

from jsonlbatch.batchapi.client.batch_api import BatchProvider, QuotaExceeded, api_path
from jsonlbatch.batchapi.client.batch_parts import (
    check_lines,
    marks_path,
    read_asked,
    read_marks,
    write_parts,
)
from jsonlbatch.batchapi.client.batch_result_check import ResultChecks
from jsonlbatch.batchapi.client.paging import Stopped, unless_stopped
from jsonlbatch.batchapi.client.providers import PROVIDERS, choose, open_api
from jsonlbatch.batchapi.client.result_merge import (
    Unreadable,
    batch_count,
    chunks,
    merged_lines,
    missing_reason,
    refused_for_quota,
    spent_in,
    worst_cost,
)
from jsonlbatch.batchapi.client.safe_names import safe_name
from jsonlbatch.batchapi.client.submit_state import Part, State
from jsonlbatch.batchapi.formats.batch_objects import (
    DEFAULT_POLL_S,
    DEFAULT_WINDOW,
    TERMINAL,
    failure_line,
    new_id,
)
from jsonlbatch.cost import Price
from jsonlbatch.errors import Interrupted, UsageError
from jsonlbatch.exec.job import ExecOptions, Job
from jsonlbatch.exec.output.run_outcome import Results
from jsonlbatch.exec.prepare.input_scan import InputScan, OutputScan, line_custom_id
from jsonlbatch.exec.route.credentials import check_url_credentials, clean_headers, clean_secret
from jsonlbatch.exec.route.endpoints import parse_endpoint
from jsonlbatch.exec.send.retry import Backoff
from jsonlbatch.jsonl import (
    AppendWriter,
    filter_lines,
    repair_tail,
    rewrite_atomically,
)
from jsonlbatch.prices import PriceBook

#: The OpenAI Batch API's limits per input file (each provider's are in providers.py).
MAX_REQUESTS = PROVIDERS["openai"].max_requests
MAX_BYTES = PROVIDERS["openai"].max_bytes


@dataclass
class SubmitOptions:
    """A run through a Batch API. Field docs are the CLI's help."""

    url: str
    api_key: str | None = field(default=None, repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    model: str | None = None  # override every body's model (Azure: the deployment name)
    completion_window: str = DEFAULT_WINDOW
    metadata: Mapping[str, str] = field(default_factory=dict)
    max_requests: int | None = None  # None: the provider's limit
    max_bytes: int | None = None
    provider: str | None = None  # openai, anthropic, gemini; None: from the URL and the lines
    #: first wait between looks; grows 1.5x while nothing changes
    poll_interval: float = DEFAULT_POLL_S
    poll_max: float = 120.0
    retry_failed: bool = False
    max_retries: int = 8
    quiet: bool = False
    #: one price for every model (`--price`); None: the built-in table plus `prices`
    price: Price | None = None
    prices: Mapping[str, Price] = field(default_factory=dict)  # `--price-file` entries
    #: dollars that OUT's answers plus the parts submitted may cost at most (`--max-cost`)
    max_cost: float | None = None

    def __post_init__(self) -> None:
        self.api_key = clean_secret(self.api_key, "--api-key (or $OPENAI_API_KEY)")
        self.headers = clean_headers(self.headers)
        check_url_credentials([self.url], self.api_key, self.headers)
        if (self.max_requests is not None and self.max_requests < 1) or (
            self.max_bytes is not None and self.max_bytes < 1
        ):
            raise UsageError("--batch-max-requests and --batch-max-bytes must be positive")
        if self.poll_interval <= 0:
            raise UsageError("--poll-interval must be positive")
        if self.model == "auto":
            raise UsageError("--model auto needs a live server; name the model with --batch-api")
        if len(self.metadata) > 14:  # OpenAI allows 16 keys; two mark the part
            raise UsageError("--batch-metadata takes at most 14 keys")


@dataclass
class SubmitSummary:
    output: str
    requests: int = 0
    already_done: int = 0
    batches: list[str] = field(default_factory=list)
    merged: int = 0
    failed: int = 0  # lines written this run that record a failure
    failed_before: int = 0
    cost: float = 0.0  # the answers merged this run, as billed (batch prices)
    unpriced: int = 0  # answers merged this run whose model has no price
    budget_stopped: bool = False  # --max-cost held parts back: the same command resumes
    unreadable: int = 0  # results lines that answered nothing (not JSON, no string id, ...)

    def add_cost(self, cost: float | None, failed: bool) -> None:
        if cost is not None:
            self.cost += cost
        elif not failed:
            self.unpriced += 1

    @property
    def results(self) -> Results:
        """The output's answers by custom_id, typed (read from the file on use)."""
        return Results(self.output)

    def format(self) -> str:
        text = (
            f"{self.output}: {self.requests} requests; {self.already_done} had a result before; "
            f"{self.merged} results merged from {len(self.batches)} batches "
            f"({self.failed} failed)"
        )
        if self.cost or self.merged > self.failed + self.unpriced:
            text += f"; ${self.cost:,.4f} as billed"
        if self.unpriced:
            text += f" ({self.unpriced} answers of models without a price not counted)"
        if self.unreadable:
            text += f"; {self.unreadable} results lines could not be read"
        if self.budget_stopped:
            text += "; stopped by --max-cost: the same command with a higher budget resumes"
        return text


def submit(
    requests: str | os.PathLike[str], output: str | os.PathLike[str], options: SubmitOptions
) -> SubmitSummary:
    """Run a request file through a Batch API to completion (blocking). Raises `Interrupted`
    on Ctrl-C, leaving the batches running; the same call again resumes."""
    from jsonlbatch.exec.job import run_coroutine

    run = Submitter(requests, output, options).run()
    return run_coroutine(run, ("jsonlbatch.batchapi.client.submit", "Submitter(...).run"))


class Submitter:
    def __init__(
        self,
        requests: str | os.PathLike[str],
        output: str | os.PathLike[str],
        options: SubmitOptions,
    ) -> None:
        self.options = options
        self.endpoint = parse_endpoint(options.url)
        exec_options = ExecOptions(model=options.model, retry_failed=options.retry_failed)
        self.job = Job(requests, output, exec_options)
        self.output = self.job.output
        self.state = State.for_output(self.output)
        self.summary = SubmitSummary(self.output)
        self.book = PriceBook(options.price, options.prices)
        self.stopping = asyncio.Event()
        self.bar: tqdm | None = None

    async def run(self) -> SubmitSummary:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal)
        try:
            scan = self.job.prepare()
            try:
                self._take_scan(scan)
                self.provider = choose(
                    self.options.provider or self.state.provider or None,
                    self.options.url,
                    scan.urls,
                )
                if self.state.provider and self.state.provider != self.provider.name:
                    raise UsageError(
                        f"{self.output}'s batches went to {self.state.provider}; this run would "
                        f"use {self.provider.name}: finish those first (or move the state away)"
                    )
                async with aiohttp.ClientSession(trust_env=False) as session:
                    api = open_api(
                        self.provider,
                        self.endpoint,
                        session,
                        api_key=self.options.api_key,
                        headers=self.options.headers,
                        max_retries=self.options.max_retries,
                        backoff=Backoff(1.0, 30.0),
                    )
                    if self.state.open_parts:
                        self.note(
                            f"resuming {len(self.state.open_parts)} batch part(s) of {self.output}"
                        )
                        await self._drive(api)
                        self.job.close()  # what OUT holds has changed: look again
                        scan = self.job.prepare()
                        self._take_scan(scan)
                    if scan.pending and not self.stopping.is_set():
                        self._split(scan)
                        await self._drive(api)
                    elif not scan.pending:
                        self.note(f"nothing to submit: all {scan.total} requests have a result")
            finally:
                self.job.close()
                if self.bar is not None:
                    self.bar.close()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        if self.stopping.is_set() and self.state.open_parts:
            running = [p.batch_id for p in self.state.open_parts if p.batch_id]
            raise Interrupted(
                f"stopped watching; {len(running)} batch(es) keep running on "
                f"{self.endpoint.name} (Ctrl-C stops the watching, not the batches). Run the "
                f"same command again to collect their results, or `jsonlbatch batches cancel "
                f"{self.output}` to cancel them",
                summary=self.summary,
            )
        return self.summary

    def _take_scan(self, scan: InputScan) -> None:
        existing = self.job.existing
        assert existing is not None
        self.existing: OutputScan = existing
        self.replaced = scan.replace  # ids whose old lines are dropped before submitting
        self.summary.requests = scan.total
        self.summary.already_done = scan.already_done
        self.summary.failed_before = scan.failed_before
        if existing.torn:
            cut = repair_tail(self.output, existing.keep_bytes)
            existing.cut_bytes = 0
            self.note(f"repaired {self.output}: cut a torn last line ({cut} bytes)")

    def _present(self, custom_id: str) -> bool:
        """Whether OUT already holds a line for this id (a merge cut short by a crash)."""
        if custom_id in self.existing.ok:
            return True
        return custom_id in self.existing.failed and custom_id not in self.replaced

    # -- splitting -----------------------------------------------------------------------------

    def _split(self, scan: InputScan) -> None:
        """Write the pending lines into part files and record them, before any upload."""
        if scan.replace:
            replace = scan.replace
            rewrite_atomically(
                self.output,
                filter_lines(self.output, lambda line: line_custom_id(line) not in replace),
            )
            self.job._lock.hold_output()  # as exec does: the lock on the replaced file went with it
            self.note(f"retrying {scan.retried} failed requests")
        check_lines(self.job.requests, scan.pending, self.provider)
        folder = self.state.folder
        folder.mkdir(parents=True, exist_ok=True)
        opts = self.options
        parts = write_parts(
            self.job.requests,
            scan.pending,
            folder,
            new_id("")[:12],
            self.provider,
            max_requests=opts.max_requests or self.provider.max_requests,
            max_bytes=opts.max_bytes or self.provider.max_bytes,
            model=opts.model,
            rewrite=self._line_rewriter(),
        )
        self.state.url = self.endpoint.name
        self.state.provider = self.provider.name
        self.state.requests = os.path.abspath(self.job.requests)
        self.state.parts += parts
        self.state.save()
        self.note(
            f"split {len(scan.pending)} requests into {len(parts)} part(s) for the "
            f"{self.provider.name} batch API at {self.endpoint.name}"
        )

    def _line_rewriter(self) -> Callable[[dict[str, Any]], bytes] | None:
        """How a request line must change for the API (model override, Azure's endpoint
        names), or None when it goes byte for byte."""
        model = self.options.model
        azure_strip = api_path(self.endpoint, "/v1/x") == "/x"
        if model is None and not azure_strip:
            return None

        def rewrite(obj: dict[str, Any]) -> bytes:
            if model is not None:
                obj["body"]["model"] = model
            if azure_strip and obj["url"].startswith("/v1/"):
                obj["url"] = obj["url"][3:]
            return orjson.dumps(obj) + b"\n"

        return rewrite

    # -- uploading, creating, watching ---------------------------------------------------------

    async def _drive(self, api: BatchProvider) -> None:
        await self._start_parts(api)
        await self._watch(api)

    async def _start_parts(self, api: BatchProvider) -> bool:
        """Start every part without a batch, in order, until the provider's queue refuses
        one: that one and the rest wait for earlier batches to end. True if any started."""
        started = False
        for part in self.state.open_parts:
            if self.stopping.is_set():
                break
            if part.batch_id is not None:
                continue
            if not self._within_budget(part):
                break
            try:
                await self._start(api, part)
            except Stopped:  # SIGTERM while a listing was under way: nothing was made
                break
            except QuotaExceeded as exc:
                waiting = [p for p in self.state.open_parts if p.batch_id is None]
                for p in waiting:
                    p.waiting, p.status = True, "waiting for quota"
                self.state.save()
                self.note(f"{len(waiting)} part(s) wait for the provider's queue: {exc}")
                break
            part.waiting = False
            self.summary.batches.append(part.batch_id or "")
            started = True
        self.state.save()
        return started

    def _within_budget(self, part: Part) -> bool:
        """Whether `part` may be submitted under `--max-cost`: what OUT's answers cost as billed,
        plus the most the parts in flight and this one can cost, stays within it."""
        budget = self.options.max_cost
        if budget is None:
            return True
        folder = self.state.folder
        spent = spent_in(self.output, self.book)
        running = [p for p in self.state.open_parts if p.batch_id is not None]
        worst = sum(worst_cost(folder / p.path, self.book) for p in [*running, part])
        if spent + worst <= budget:
            return True
        self.summary.budget_stopped = True
        self.note(
            f"--max-cost {budget:g}: part {part.index} could bring the cost to ${spent + worst:,.2f} "
            f"(${spent:,.2f} spent); it and the parts after it are not submitted"
        )
        return False

    async def _start(self, api: BatchProvider, part: Part) -> None:
        """Upload and create, each at most once per part, whatever crashes in between."""
        folder = self.state.folder
        if part.batch_id is None and part.file_id is None:
            if part.uploading:  # a crash during an earlier upload: did it arrive?
                found = await unless_stopped(api.find_file(part.filename), self.stopping)
                part.file_id = found["id"] if found else None
            if part.file_id is None:
                part.uploading = True
                self.state.save()
                made = await api.upload(folder / part.path, part.filename)
                part.file_id = made["id"]
            part.uploading = False
            self.state.save()
        if part.batch_id is None:
            found = None
            if part.creating_since is not None:  # a crash around an earlier create
                found = await unless_stopped(
                    api.find_batch(part.metadata, part.creating_since - 600, count=part.count),
                    self.stopping,
                )
            if found is None:
                part.creating_since = time.time()
                self.state.save()
                metadata = {**self.options.metadata, **part.metadata}
                try:
                    found = await api.create_batch(
                        part.file_id or "", part.endpoint, self.options.completion_window, metadata
                    )
                except QuotaExceeded:
                    part.creating_since = None  # refused: nothing was made to look for
                    raise
                self.note(f"created {found['id']} for part {part.index} ({part.count} requests)")
            else:
                self.note(f"found {found['id']} for part {part.index}: not creating it again")
            part.batch_id = found["id"]
            part.status = found.get("status")
            self.state.save()

    async def _watch(self, api: BatchProvider) -> None:
        interval = self.options.poll_interval
        for part in self.state.open_parts:
            if part.batch_id and part.batch_id not in self.summary.batches:
                self.summary.batches.append(part.batch_id)
        while not self.stopping.is_set() and self.state.open_parts:
            changed = False
            for part in [p for p in self.state.open_parts if p.batch_id]:
                batch = await api.retrieve(part.batch_id or "")
                changed |= self._update(part, batch)
                if refused_for_quota(batch):
                    self._requeue(part)
                    changed = True
                elif batch.get("status") in TERMINAL:
                    await self._merge(api, part, batch)
            waiting = [p for p in self.state.open_parts if p.waiting]
            running = [p for p in self.state.open_parts if p.batch_id]
            if waiting and (changed or not running):  # a batch ended: room in the queue?
                changed |= await self._start_parts(api)
            if not running and self.summary.budget_stopped:
                return  # the rest waits for a higher --max-cost
            self._show()
            if not self.state.open_parts:
                return
            interval = (
                self.options.poll_interval
                if changed
                else min(interval * 1.5, max(self.options.poll_max, self.options.poll_interval))
            )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), timeout=interval)

    def _requeue(self, part: Part) -> None:
        """OpenAI makes a batch beyond its enqueued-token limit and fails it at once, with
        nothing run: the part waits and gets a new batch once earlier ones end."""
        self.note(f"{part.batch_id} (part {part.index}): the provider's queue is full; waiting")
        if part.batch_id in self.summary.batches:
            self.summary.batches.remove(part.batch_id)
        part.batch_id, part.creating_since, part.status = None, None, "waiting for quota"
        part.waiting = True
        self.state.save()

    def _update(self, part: Part, batch: dict[str, Any]) -> bool:
        status = batch.get("status")
        news = (status, batch_count(batch, "completed"), batch_count(batch, "failed"))
        old = (part.status, part.completed, part.failed)
        part.status, part.completed, part.failed = news
        if status != old[0]:
            self.note(
                f"{part.batch_id} (part {part.index}): {old[0] or 'new'} -> {status} "
                f"({news[1]} completed, {news[2]} failed of "
                f"{batch_count(batch, 'total') or part.count})"
            )
        return news != old

    def _show(self) -> None:
        if self.options.quiet:
            return
        parts = [p for p in self.state.parts if p.batch_id in self.summary.batches]
        total = sum(p.count for p in parts)
        done = sum(p.count if p.merged else p.completed + p.failed for p in parts)
        if self.bar is None:
            self.bar = tqdm(
                total=total, unit="req", desc="batches", file=sys.stderr, dynamic_ncols=True
            )
        self.bar.total = total
        self.bar.update(done - self.bar.n)
        failed = sum(p.failed for p in parts)
        running = sum(1 for p in parts if not p.merged)
        waiting = sum(1 for p in self.state.open_parts if p.waiting)
        self.bar.set_postfix_str(
            f"{running} running, {waiting} waiting for quota, {failed} failed", refresh=True
        )

    # -- merging -------------------------------------------------------------------------------

    async def _merge(self, api: BatchProvider, part: Part, batch: dict[str, Any]) -> None:
        """Append a finished batch's lines to OUT, then mark the part merged."""
        folder = self.state.folder
        downloads = []
        for key in ("output_file_id", "error_file_id"):
            file_id = batch.get(key)
            if file_id:
                # the server's id is data: reduced to a name of ours, never a path
                dest = folder / f"{safe_name(part.batch_id)}.{key[:-8]}.jsonl"
                await api.download(file_id, dest)
                downloads.append(dest)
        left = read_marks(folder, part)  # id as sent -> (custom_id, fingerprint); what stays
        code, message = missing_reason(batch)  # there gets a failure line
        written = failed = 0
        batch_id = part.batch_id or ""
        unreadable = Unreadable()
        with AppendWriter(self.output) as writer:
            # every answer takes the checks exec's take before its line (batch_result_check.py)
            checks = ResultChecks(self.output, read_asked(folder, part))
            merged = merged_lines(downloads, left, batch_id, self._present, self.book, unreadable)
            for chunk in chunks(checks(merged)):
                writer.write(b"".join(m.line for m in chunk))
                written += len(chunk)
                failed += sum(m.failed for m in chunk)
                for m in chunk:
                    self.summary.add_cost(m.cost, m.failed)
            if unreadable.count:
                message += f" ({unreadable.count} lines of its results could not be read)"
                self.summary.unreadable += unreadable.count
                print(unreadable.note(batch_id), file=sys.stderr, flush=True)
            missing = [(cid, mark) for cid, mark in left.values() if not self._present(cid)]
            for lines in chunks(
                failure_line(c, code, message, batch_id=batch_id, fingerprint=m) for c, m in missing
            ):
                writer.write(b"".join(lines))
                written += len(lines)
                failed += len(lines)
        part.merged = True
        self.state.save()
        self.summary.merged += written
        self.summary.failed += failed
        for path in (*downloads, folder / part.path, folder / marks_path(part)):
            path.unlink(missing_ok=True)
        if not self.state.open_parts:
            shutil.rmtree(folder, ignore_errors=True)
        self.note(f"{part.batch_id}: {batch.get('status')}; {written} lines added to {self.output}")

    # -- messages and signals ------------------------------------------------------------------

    def note(self, message: str) -> None:
        if self.options.quiet:
            return
        if self.bar is not None:
            self.bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr, flush=True)

    def _on_signal(self) -> None:
        if not self.stopping.is_set():
            self.note("stopping the watch (the batches keep running)")
        self.stopping.set()

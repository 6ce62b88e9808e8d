"""`exec --batch-api`: a prepared job sent through a remote Batch API, exactly once.

1. Split what OUT still lacks (the job's scan: `--retry-failed`, `--changed` and resume as for
   any run) into parts within the API's limits (one endpoint and one model per part, at most
   `max_requests` lines and `max_bytes` bytes each).
2. Upload each part and create one batch from it, saving the state around each call
   (`submit_state.py`), so no crash ever makes a second file or batch for a part.
3. Watch the batches (`request_counts` in a progress bar; status changes as notes) at an
   interval that backs off while nothing changes.
4. When a batch ends, merge it into OUT (`part_merge.py`: every answer through the run's
   checks, one line per request, the run's events).

The job comes from the front door (exec/front_door.py) with the output locked and the input
checked; stopping it (`Job.stop`: a cancelled `aexecute`) or Ctrl-C when the caller handles
signals stops the watching, never the batches: the same run again picks them up.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from tqdm import tqdm

from jsonlbatch.batchapi.client.batch_api import BatchProvider, QuotaExceeded, api_path
from jsonlbatch.batchapi.client.batch_parts import check_lines, check_part_limits, write_parts
from jsonlbatch.batchapi.client.paging import Stopped, unless_stopped
from jsonlbatch.batchapi.client.part_merge import PartMerge
from jsonlbatch.batchapi.client.providers import choose, open_api
from jsonlbatch.batchapi.client.result_merge import (
    batch_count,
    refused_for_quota,
    spent_in,
    worst_cost,
)
from jsonlbatch.batchapi.client.submit_options import BatchOptions, SubmitSummary
from jsonlbatch.batchapi.client.submit_state import Part, State
from jsonlbatch.batchapi.formats.batch_objects import TERMINAL, new_id
from jsonlbatch.errors import Interrupted, UsageError
from jsonlbatch.exec.job import Job
from jsonlbatch.exec.prepare.input_scan import InputScan, OutputScan, line_custom_id
from jsonlbatch.exec.route.endpoints import parse_endpoint
from jsonlbatch.exec.send.retry import Backoff
from jsonlbatch.file_io.jsonl import repair_tail
from jsonlbatch.pricing.prices import PriceBook


class Submitter:
    """One Batch API run of a prepared `job` (its options: the URL, credentials, `--model`,
    `--max-retries`, `--price`, `--quiet`; `batch`: the Batch API's own)."""

    def __init__(self, job: Job, batch: BatchOptions, *, handle_signals: bool = False) -> None:
        opts = job.options
        if len(opts.urls) != 1:
            raise UsageError("--batch-api takes exactly one --url: the Batch API's base URL")
        if opts.model == "auto":
            raise UsageError("--model auto needs a live server; name the model with --batch-api")
        self.job, self.options, self.batch = job, opts, batch
        self.url = opts.urls[0]
        self.handle_signals = handle_signals
        self.endpoint = parse_endpoint(self.url)
        self.output = job.output
        self.state = State.for_output(self.output)
        self.summary = SubmitSummary(self.output)
        self.book = PriceBook(opts.price, batch.prices)
        self.stopping = asyncio.Event()
        self.bar: tqdm | None = None

    async def run(self) -> SubmitSummary:
        loop = asyncio.get_running_loop()
        signals = (signal.SIGINT, signal.SIGTERM) if self.handle_signals else ()
        for sig in signals:
            loop.add_signal_handler(sig, self._on_signal)
        try:
            with self.job.stoppable(self._on_signal):
                await self._run()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)
            self.job.close()
            if self.bar is not None:
                self.bar.close()
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

    async def _run(self) -> None:
        scan = self.job.input if self.job.input is not None else self.job.prepare()
        if self.job.file_refs.by_hash:  # exec/prepare/file_refs.py
            raise UsageError(
                "file:// references are uploaded by a direct run only (docs/files.md): "
                "upload the files yourself and put their ids in the requests, or run "
                "without --batch-api"
            )
        self._take_scan(scan)
        self.provider = choose(
            self.batch.provider or self.state.provider or None, self.url, scan.urls
        )
        if self.state.provider and self.state.provider != self.provider.name:
            raise UsageError(
                f"{self.output}'s batches went to {self.state.provider}; this run would "
                f"use {self.provider.name}: finish those first (or move the state away)"
            )
        self.merging = PartMerge(self.job, self.state, self.provider, self.book, self.summary,
                                 self._present, self.note)  # fmt: skip
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
                self.note(f"resuming {len(self.state.open_parts)} batch part(s) of {self.output}")
                await self._drive(api)
                self.job.close()  # what OUT holds has changed: look again
                scan = self.job.prepare()
                before = self.summary.already_done, self.summary.failed_before
                self._take_scan(scan)
                # what this run merged is no result "before": the first look's counts stand
                self.summary.already_done, self.summary.failed_before = before
            if scan.pending and not self.stopping.is_set():
                self._split(scan)
                await self._drive(api)
            elif not scan.pending:
                self.note(f"nothing to submit: all {scan.total} requests have a result")

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
        """Whether OUT already holds a line for this id (a merge cut short by a crash); not an
        id whose old line was dropped to be sent again (`--retry-failed`, `--changed resend`)."""
        if custom_id in self.replaced:
            return False
        return custom_id in self.existing.ok or custom_id in self.existing.failed

    # -- splitting -----------------------------------------------------------------------------

    def _split(self, scan: InputScan) -> None:
        """Write the pending lines into part files and record them, before any upload."""
        check_part_limits(self.provider, self.batch.max_requests, self.batch.max_bytes)
        if scan.replace:
            replace = scan.replace
            self.job.rewrite_output(lambda line: line_custom_id(line) not in replace)
            if scan.retried:
                self.note(f"retrying {scan.retried} failed requests")
            if scan.changed:
                self.note(f"re-submitting {scan.changed} requests changed since their results")
        batch = self.batch
        max_bytes = batch.max_bytes or self.provider.max_bytes
        check_lines(self.job.source, scan.pending, self.provider, max_bytes)
        folder = self.state.folder
        folder.mkdir(parents=True, exist_ok=True)
        parts = write_parts(
            self.job.source,
            scan.pending,
            folder,
            new_id("")[:12],
            self.provider,
            max_requests=batch.max_requests or self.provider.max_requests,
            max_bytes=max_bytes,
            model=self.options.model,
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
        budget = self.batch.max_cost
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
                metadata = {**self.batch.metadata, **part.metadata}
                try:
                    found = await api.create_batch(
                        part.file_id or "", part.endpoint, self.batch.completion_window, metadata
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
        first = self.batch.poll_interval
        interval = first
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
                    await self.merging.merge(api, part, batch)
            waiting = [p for p in self.state.open_parts if p.waiting]
            running = [p for p in self.state.open_parts if p.batch_id]
            if waiting and (changed or not running):  # a batch ended: room in the queue?
                changed |= await self._start_parts(api)
            if not running and self.summary.budget_stopped:
                return  # the rest waits for a higher --max-cost
            self._show()
            if not self.state.open_parts:
                return
            interval = first if changed else min(interval * 1.5, max(self.batch.poll_max, first))
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

    # -- messages and stopping -----------------------------------------------------------------

    def note(self, message: str) -> None:
        if self.options.quiet:
            return
        if self.bar is not None:
            self.bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr, flush=True)

    def _on_signal(self) -> None:
        """Ctrl-C, SIGTERM or `Job.stop`: stop watching (the batches keep running)."""
        if not self.stopping.is_set():
            self.note("stopping the watch (the batches keep running)")
        self.stopping.set()

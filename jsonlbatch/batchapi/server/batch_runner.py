"""The server's batch runner: one batch at a time, oldest first, through jsonlbatch's executor.

A batch's requests go through the same run as `jsonlbatch exec` (a `RunSpec` started by
`exec.front_door.astart`: the same checks, retries, timeouts and exactly-once resume) into a results
file in the work directory; that file is the batch's progress. After a `kill -9` the next server
process finds the batch still `in_progress` and starts the same run again, which skips every
request already answered. The
whole concurrency budget goes to the batch at the head of the queue, so batches finish in the
order they were created and never compete with each other for the backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from jsonlbatch.batch_format.records import is_failure
from jsonlbatch.batchapi.formats.batch_objects import MISSING_CODES, failure_line, now
from jsonlbatch.batchapi.server.batch_store import Store
from jsonlbatch.errors import InputError, JsonlbatchError, ServerError, ServerUnavailableError
from jsonlbatch.exec.exec_options import ExecOptions
from jsonlbatch.exec.front_door import RunSpec, Urls, astart
from jsonlbatch.exec.prepare.input_scan import scan_input
from jsonlbatch.file_io.jsonl import iter_lines

log = logging.getLogger("jsonlbatch.batchapi")

_TICK = 0.5  # seconds between looks at counts, cancels and deadlines while a batch runs
_RETRY_BACKEND = 5.0  # seconds before a batch whose backend stayed down is tried again


@dataclass
class RunnerOptions:
    """How batches reach the backend; the fields mean what `exec`'s options of that name do."""

    urls: Sequence[str]
    api_key: str | None = field(default=None, repr=False)
    concurrency: int = 256
    timeout: float = 1800.0
    max_retries: int = 8
    ready_timeout: float = 1800.0


class BatchRunner:
    """Moves batches along validating -> in_progress -> finalizing -> completed (or failed,
    expired, cancelled). All of it runs on the server's event loop; file passes run in a thread."""

    def __init__(self, store: Store, options: RunnerOptions) -> None:
        self.store = store
        self.options = options
        self.wake = asyncio.Event()
        self.running: str | None = None

    async def run_forever(self) -> None:
        """Advance batches until cancelled. Nothing ends the loop but a cancel: a failure
        (a database locked past the busy timeout, a bug) is logged, and the loop starts over
        from the stored state, which is safe to repeat at every step."""
        while True:
            try:
                await self._settle_waiting()
                head = next(
                    self.store.batches_where(
                        "status IN ('validating', 'in_progress', 'finalizing')"
                    ),
                    None,
                )
                if head is not None:
                    await self._advance(head)
                    continue
            except asyncio.CancelledError:
                raise
            except JsonlbatchError as exc:
                log.error("batch runner: %s; trying again in %g s", exc, _RETRY_BACKEND)
                await asyncio.sleep(_RETRY_BACKEND)
            except Exception as exc:  # never a silent death: batches would stay in_progress
                log.error(
                    "batch runner failed (%s: %s); restarting in %g s",
                    type(exc).__name__,
                    exc,
                    _RETRY_BACKEND,
                )
                await asyncio.sleep(_RETRY_BACKEND)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=1.0)
            self.wake.clear()

    async def _settle_waiting(self) -> None:
        """End batches that are cancelled, or past their deadline, without running them."""
        for batch in list(self.store.batches_where("status = 'cancelling'")):
            if batch["id"] != self.running:
                await self._finalize(batch, "cancelled")
        for batch in list(self.store.batches_where("status IN ('validating', 'in_progress')")):
            if batch["id"] != self.running and now() >= batch["expires_at"]:
                await self._finalize(batch, "expired")

    async def _advance(self, batch: dict[str, Any]) -> None:
        if batch["status"] == "validating":
            await self._validate(batch)
        elif batch["status"] == "in_progress":
            await self._execute(batch)
        else:  # finalizing: a crash came between the last request and the files
            await self._finalize(batch, "completed")

    # -- validating ----------------------------------------------------------------------------

    async def _validate(self, batch: dict[str, Any]) -> None:
        path = self.store.file_path(batch["input_file_id"])
        loop = asyncio.get_running_loop()
        total, errors = await loop.run_in_executor(None, check_input, path, batch["endpoint"])
        batch = self._fresh(batch)
        if batch["status"] != "validating":
            return
        if errors:
            batch.update(
                status="failed", failed_at=now(), errors={"object": "list", "data": errors}
            )
        else:
            batch.update(status="in_progress", in_progress_at=now())
            batch["request_counts"] = {"total": total, "completed": 0, "failed": 0}
        self.store.put_batch(batch)

    # -- in progress ---------------------------------------------------------------------------

    async def _execute(self, batch: dict[str, Any]) -> None:
        opts = self.options
        # The same run `jsonlbatch exec` makes (exec/front_door.py), started in a worker thread;
        # cancelling it stops it at once (grace 0), as a batch being cancelled wants.
        spec = RunSpec(
            requests=os.fspath(self.store.file_path(batch["input_file_id"])),
            output=os.fspath(self.results_path(batch["id"])),
            options=ExecOptions(
                urls=list(opts.urls),
                api_key=opts.api_key,
                concurrency=opts.concurrency,
                timeout=opts.timeout,
                max_retries=opts.max_retries,
                ready_timeout=opts.ready_timeout,
                quiet=True,
                grace=0.0,
            ),
            target=Urls(tuple(opts.urls)),
        )
        self.running = batch["id"]
        tally = _Tally(self.results_path(batch["id"]))
        ending: str | None = None
        task: asyncio.Future[Any] | None = None
        try:
            task = asyncio.ensure_future(astart(spec))
            while not task.done():
                await asyncio.wait({task}, timeout=_TICK)
                batch = self._fresh(batch)
                self._count(batch, tally)
                if batch["status"] == "cancelling":
                    ending = "cancelled"
                elif now() >= batch["expires_at"]:
                    ending = "expired"
                if ending is not None and not task.done():
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    break
                await self._settle_waiting()
            if ending is None:
                task.result()  # raises what the run raised
        except (InputError, ServerError) as exc:
            if isinstance(exc, ServerUnavailableError):  # wait for the backend, keep the batch
                log.warning("batch %s: %s; trying again", batch["id"], exc)
                await asyncio.sleep(_RETRY_BACKEND)
                return
            batch = self._fresh(batch)
            code = "invalid_request" if isinstance(exc, InputError) else "backend_error"
            batch["errors"] = {"object": "list", "data": [{"code": code, "message": str(exc)}]}
            await self._finalize(batch, "failed")
            return
        finally:
            self.running = None
            if task is not None and not task.done():  # the server is stopping
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        batch = self._fresh(batch)
        if ending is None:
            batch.update(status="finalizing", finalizing_at=now())
            self.store.put_batch(batch)
        await self._finalize(batch, ending or "completed")

    def _count(self, batch: dict[str, Any], tally: _Tally) -> None:
        completed, failed = tally.read()
        counts = batch["request_counts"]
        if (counts["completed"], counts["failed"]) != (completed, failed):
            counts.update(completed=completed, failed=failed)
            self.store.put_batch(batch)

    # -- the end -------------------------------------------------------------------------------

    async def _finalize(self, batch: dict[str, Any], status: str) -> None:
        """Split the results into output and error files (requests without an answer get an
        error line saying why) and end the batch. Safe to repeat after a crash."""
        batch_id = batch["id"]
        hexpart = batch_id.removeprefix("batch_")
        out_id, err_id = f"file-{hexpart}o", f"file-{hexpart}e"
        loop = asyncio.get_running_loop()
        made = await loop.run_in_executor(
            None,
            split_results,
            self.results_path(batch_id),
            self.store.file_path(batch["input_file_id"]),
            status,
            self.store.file_path(out_id),
            self.store.file_path(err_id),
        )
        completed, failed = made
        batch = self._fresh(batch)
        stamp = now()
        for file_id, kind, count in ((out_id, "output", completed), (err_id, "error", failed)):
            if count:
                self.store.put_file(
                    {
                        "id": file_id,
                        "object": "file",
                        "bytes": self.store.file_path(file_id).stat().st_size,
                        "created_at": stamp,
                        "filename": f"{batch_id}_{kind}.jsonl",
                        "purpose": "batch_output",
                        "status": "processed",
                    }
                )
                batch[f"{kind}_file_id"] = file_id
        if status != "failed" or batch.get("request_counts", {}).get("total"):
            total = batch.get("request_counts", {}).get("total") or completed + failed
            batch["request_counts"] = {"total": total, "completed": completed, "failed": failed}
        batch["status"] = status
        batch[f"{status}_at"] = stamp
        self.store.put_batch(batch)
        with contextlib.suppress(FileNotFoundError):
            self.results_path(batch_id).unlink()
        self._forget_deleted_inputs()

    def _forget_deleted_inputs(self) -> None:
        """Remove the bytes of deleted files no unfinished batch reads any more."""
        for file_id in self.store.deleted_files():
            if not self.store.file_in_use(file_id):
                with contextlib.suppress(FileNotFoundError):
                    self.store.file_path(file_id).unlink()

    def _fresh(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The stored object (an API call may have changed it, e.g. to cancelling)."""
        return self.store.get_batch(batch["id"]) or batch

    def results_path(self, batch_id: str) -> Path:
        return self.store.work_dir / f"{batch_id}.results.jsonl"


def check_input(path: Path, endpoint: str) -> tuple[int, list[dict[str, Any]]]:
    """Validate an input file as OpenAI does before a batch starts: (requests, errors), the
    errors naming their line and field. Each line must be a request for the batch's endpoint."""
    if not path.exists():
        return 0, [{"code": "file_not_found", "message": "the input file is gone"}]
    try:
        scan = scan_input(path)
    except InputError as exc:
        return 0, [
            {
                "code": "invalid_request",
                "message": p.message,
                "param": p.field,
                "line": p.line,
            }
            for p in exc.problems
        ] or [{"code": "invalid_file", "message": str(exc)}]
    errors = []
    for number, raw in iter_lines(path):
        url = orjson.loads(raw).get("url")
        if url != endpoint:
            errors.append(
                {
                    "code": "mismatched_endpoint",
                    "message": f"the line's url {url!r} is not the batch's endpoint {endpoint!r}",
                    "param": "url",
                    "line": number,
                }
            )
            if len(errors) >= 100:
                break
    if not errors and scan.total == 0:
        errors.append({"code": "empty_file", "message": "the input file has no requests"})
    return scan.total, errors


def split_results(
    results: Path, requests: Path, status: str, output: Path, error: Path
) -> tuple[int, int]:
    """Write the output file (2xx answers) and the error file (the rest, plus a line for every
    request without an answer unless the batch completed); return their line counts."""
    seen: set[str] = set()
    counts = [0, 0]
    tmp_out, tmp_err = output.with_suffix(".tmp"), error.with_suffix(".tmp")
    with open(tmp_out, "wb") as out, open(tmp_err, "wb") as err:
        if results.exists():
            for _, raw in iter_lines(results):
                try:
                    obj = orjson.loads(raw)
                except orjson.JSONDecodeError:  # a torn last line: its request had no answer
                    continue
                if obj.get("custom_id") in seen:
                    continue
                seen.add(obj["custom_id"])
                obj.pop("metrics", None)
                bad = is_failure(obj)
                (err if bad else out).write(orjson.dumps(obj) + b"\n")
                counts[bad] += 1
        if status != "completed" and requests.exists():
            code, message = MISSING_CODES[status]
            for _, raw in iter_lines(requests):
                try:
                    cid = orjson.loads(raw).get("custom_id")
                except orjson.JSONDecodeError:
                    continue
                if isinstance(cid, str) and cid not in seen:
                    seen.add(cid)
                    err.write(failure_line(cid, code, message))
                    counts[1] += 1
        for f in (out, err):
            f.flush()
            os.fsync(f.fileno())
    for tmp, final, count in ((tmp_out, output, counts[0]), (tmp_err, error, counts[1])):
        if count:
            os.replace(tmp, final)
        else:
            tmp.unlink()
    return counts[0], counts[1]


class _Tally:
    """Live request counts of a batch, read from the new whole lines of its results file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.seen: set[str] = set()
        self.completed = self.failed = 0

    def read(self) -> tuple[int, int]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return self.completed, self.failed
        end = data.rfind(b"\n") + 1
        self.offset += end
        for raw in data[:end].splitlines():
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if obj.get("custom_id") in self.seen:  # a failure retried, or a rewrite
                continue
            self.seen.add(obj.get("custom_id"))
            if is_failure(obj):
                self.failed += 1
            else:
                self.completed += 1
        return self.completed, self.failed

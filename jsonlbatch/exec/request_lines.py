"""The request file's pending lines as requests, onto the run loop's queues.

The run loop's readers: `read` puts each pending line of one pool (in the router's order,
`route/router.py`) onto that pool's bounded queue; `feed` does the same for a run whose requests
come from a source (`hooks/request_source.py`: a rollout), which is handed the lines and yields
what to send. Both check first that the file is the one the scan read, and turn a line into a
`Request` the same way (`request`): its `file://` files by content, its fingerprint as the file
asks it, then `--model`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from jsonlbatch.batch_format.records import Request, fingerprint
from jsonlbatch.errors import InputError
from jsonlbatch.exec.exec_options import ExecOptions
from jsonlbatch.exec.hooks.request_source import RequestSource
from jsonlbatch.exec.prepare.file_refs import FileRefs, has_refs
from jsonlbatch.exec.prepare.input_scan import InputScan, groups_of, stat_input
from jsonlbatch.exec.route.model_pools import ModelPools
from jsonlbatch.exec.route.model_routing import split_pending
from jsonlbatch.exec.route.router import ordered_lines


@dataclass
class RequestLines:
    """The pending lines of `path` (a copy of a pipe, or the file `requests` names), read as
    requests until `stopping` is set."""

    requests: str
    path: str
    scan: InputScan
    opts: ExecOptions
    file_refs: FileRefs | None
    stopping: asyncio.Event
    #: The model every request is sent to, once the preflight has said (`--model`).
    model_override: str | None = None

    def check_unchanged(self) -> None:
        """The file is still the one the scan read: its offsets mean the same lines."""
        stat = stat_input(self.path)
        if (stat.st_size, stat.st_mtime_ns) != (self.scan.size, self.scan.mtime_ns):
            raise InputError(f"{self.requests} changed after it was checked; run the command again")

    def request(self, raw: bytes) -> Request:
        """A pending line as the request to send (after `--model`), with its fingerprint."""
        obj = orjson.loads(raw)
        url, body = obj["url"], obj["body"]
        refs = self.file_refs
        # searched only when the scan found a line naming a file (most files name none)
        if refs is not None and self.scan.ref_lines and has_refs(raw) and not refs.resolve(body):
            raw = orjson.dumps(obj)  # its files by content (`file://sha256:`), not by path
        mark = fingerprint(raw, url, body)  # of the request as the file asks it
        if self.model_override is not None:
            body["model"] = self.model_override
        return Request(obj["custom_id"], url, body, fingerprint=mark, priority=obj.get("priority"))

    def parts(
        self, pools: ModelPools | None, pending: Sequence[int], n_workers: int
    ) -> list[tuple[Sequence[int], int]]:
        """The pending lines and workers of each pool (`model_routing.split_pending`)."""
        if pools is None or len(pools.pools) < 2:
            return [(pending, min(n_workers, len(pending)))]
        return split_pending(pools, self.path, pending, self.model_override, n_workers)

    async def read(
        self, queue: asyncio.Queue[Request | None], n_workers: int, offsets: Sequence[int]
    ) -> None:
        """Each line at `offsets` onto `queue`, then one end mark per worker."""
        self.check_unchanged()
        route = self.opts.route_options()
        for raw in ordered_lines(self.path, offsets, route, groups_of(self.scan, offsets)):
            await queue.put(self.request(raw))
            if self.stopping.is_set():
                break
        for _ in range(n_workers):
            await queue.put(None)

    async def feed(
        self,
        queue: asyncio.Queue[Request | None],
        source: RequestSource,
        pending: Sequence[int],
        n_workers: int,
    ) -> None:
        """`read` for a run whose requests come from `source`: the file's pending lines are
        its input; what it yields goes onto the same queue, as it becomes ready."""
        self.check_unchanged()
        groups = groups_of(self.scan, pending)
        lines = ordered_lines(self.path, pending, self.opts.route_options(), groups)
        async for request in source.requests(lines, self.request):
            await queue.put(request)
            if self.stopping.is_set():
                break
        for _ in range(n_workers):
            await queue.put(None)

"""Requests made while a run goes, instead of read from its file: `RequestSource`.

exec's own run reads the pending lines of its request file onto the workers' queue
(`request_lines.RequestLines.read`). A source replaces that reader: the run loop drains what the
source yields onto the same queue, the same workers send each request (the same scheduler,
routing by `body.model`, cache, retries, budget, on-answer checks) and the same recorder writes
its line;
then the result is handed back to the source, which may yield the next request that depends on
it. A rollout (`jsonlbatch/rollouts/`) is one: each conversation's next turn is a request made
from the answer to the last, sent as soon as its tools have run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from jsonlbatch.batch_format.records import Request, Result

if TYPE_CHECKING:
    from jsonlbatch.exec.prepare.input_scan import InputScan, OutputScan


class RequestSource(Protocol):
    """What a run calls when its requests come from a source (`Seams.source`)."""

    def prepare(self, scan: InputScan, existing: OutputScan, /) -> None:
        """At `Job.prepare`, after the request file was validated (`scan`: its lines, all
        pending) and the output read (`existing`): drop from `scan.pending` the lines the source
        has finished (counting them in `scan.already_done`), and refuse what cannot resume
        (raise `InputError`)."""
        ...

    def requests(
        self, lines: Iterator[bytes], make: Callable[[bytes], Request], /
    ) -> AsyncIterator[Request]:
        """The requests to send, yielded as they become ready; ends when nothing more will
        come. `lines` are the request file's pending lines; `make` turns one into the request
        to send (the run's `--model` applied, its fingerprint taken)."""
        ...

    def answered(self, request: Request, result: Result, /) -> None:
        """A request's result, after its checks, once its line is queued for writing."""
        ...

    @property
    def complete(self) -> bool:
        """Whether the source ended with nothing left to do (False after a stop)."""
        ...

    async def close(self) -> None:
        """The run ends (done, stopped or failed): stop what still runs, close files."""
        ...

"""The hosted-files steps of one request's sending: reference files in, generated files out.

`HostedFiles` is what the sender calls around a request when its run has `file://` references
(`file_uploads.py`) or `--files-dir` (`file_collect.py`): `prepare` before the first attempt
(the request with its files' ids, or the failure line when an upload fails), `on_answer` on
each usable answer (collect its files into the line's `metrics.files`; with `--require-files`,
an answer with none is refused as `no_files` or re-asked), `end` when the request is done.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jsonlbatch.batch_format.records import RESPONSES_URL, Request, Result
from jsonlbatch.exec.hooks.check_hook import AnswerToCheck, AskAgain, Reject
from jsonlbatch.exec.route.endpoint_pool import EndpointPool
from jsonlbatch.exec.route.endpoints import Endpoint
from jsonlbatch.exec.send.file_collect import Collector, FilesFailed, no_files_verdict
from jsonlbatch.exec.send.file_uploads import UploadFailed, Uploads, upload_failure


@dataclass
class HostedFiles:
    """A run's uploads and collector; `reask` re-asks an answer with no file that many times."""

    uploads: Uploads | None = None
    collector: Collector | None = None
    require: bool = False
    reask: int = 0
    _asked: dict[str, int] = field(default_factory=dict)

    async def prepare(self, req: Request, pool: EndpointPool) -> Request | Result:
        """`req` with its reference files' ids (uploaded on the pool's first endpoint), or the
        failure line naming the file that could not be uploaded."""
        if self.uploads is None:
            return req
        endpoint = pool.endpoints[0]
        try:
            return await self.uploads.swap(req, endpoint, pool.headers[endpoint])
        except UploadFailed as exc:
            return upload_failure(req, exc)

    async def on_answer(
        self, answer: AnswerToCheck, endpoint: Endpoint, pool: EndpointPool
    ) -> Reject | AskAgain | None:
        """Collect the answer's files; None to go on to the run's check, else the verdict."""
        if self.collector is None or answer.request.url != RESPONSES_URL:
            return None
        req, body = answer.request, answer.body()
        try:
            records = await self.collector.collect(
                req.custom_id, body, endpoint, pool.headers[endpoint]
            )
        except FilesFailed as exc:
            return Reject(str(exc), exc.code, keep=True)
        answer.result.metrics["files"] = records
        if records or not self.require:
            return None
        asked = self._asked.get(req.custom_id, 0)
        self._asked[req.custom_id] = asked + 1
        return no_files_verdict(req.body, req.custom_id, asked < self.reask)

    def end(self, req: Request) -> None:
        self._asked.pop(req.custom_id, None)

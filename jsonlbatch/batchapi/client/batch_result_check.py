"""A provider's answers take the checks exec's answers take, before their line is written.

A results line that is a success (after `result_merge.py` has made it an OpenAI Batch output line under
the request file's custom_id) is checked as exec checks an answer it got (`exec.hooks.check_hook.vet`):
the endpoint's shape (a usable answer, in the form of the endpoint the request was sent to:
a provider answers in its own), then the answer contract against the schema its request
declared (kept in the part's marks: `batch_parts.declares`; `--no-schema-check` turns it off as
for exec), then the caller's check (`Seams.check`), which sees the request as the marks keep it:
its URL as sent and the fields that declare its schema (the prompt is not kept while a batch
runs). An accepted answer's line gains the contract's verdict, as exec's lines have it; a refused
one becomes the failure exec would write (`schema_invalid` keeping the answer, `invalid_response`,
or the check's own code), which `--retry-failed` submits again. A batch cannot be re-asked, so a
re-ask (`AskAgain`) is written as its `otherwise`, as for an answer from a store.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from jsonlbatch.batch_format.records import Request, Result
from jsonlbatch.batchapi.client.result_merge import Merged
from jsonlbatch.exec.hooks.check_hook import Check, refused, vet


class ResultChecks:
    """The checks of one merge: `check` is the run's (the contract, then the caller's; None:
    the shape alone), `asked` custom_id -> (URL as sent, the fields declaring a schema)."""

    def __init__(
        self, check: Check | None, asked: Mapping[str, tuple[str, dict[str, Any]]]
    ) -> None:
        self.asked = asked
        self.check = check

    def __call__(self, merged: Iterator[Merged]) -> Iterator[Merged]:
        for item in merged:
            yield item if item.failed else self._checked(item)

    def _checked(self, item: Merged) -> Merged:
        line = orjson.loads(item.line)
        cid = line.get("custom_id")
        asked = self.asked.get(cid) if isinstance(cid, str) else None
        response = line.get("response")
        if asked is None or not isinstance(response, dict):
            return item  # no longer in the request file: nothing to check it against
        url, declares = asked
        metrics = dict(line.get("metrics") or {})
        mark = metrics.pop("fingerprint", None)
        status = response.get("status_code")
        result = Result(cid, status if isinstance(status, int) else 200, response.get("body"),
                        response.get("request_id"), None, metrics)  # fmt: skip
        verdict = vet(self.check, Request(cid, url, declares), result, None)
        if verdict is not None:
            result = refused(result, verdict, attempts=1)
        result.metrics["fingerprint"] = mark  # last, where a resume reads it
        return Merged(result.to_line(), verdict is not None, item.cost)  # billed all the same

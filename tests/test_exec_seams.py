"""The executor's seams (exec/hooks/seams.py) are called by a real run against the mock.

Each test plugs a hook into `execute` and proves from the output file (and the mock's own
counters) that the run called it and did what its verdict said.
"""

from __future__ import annotations

import itertools
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from batchutil import chat_body, read_results, write_requests

from jsonlbatch.batch_format.records import Request, Result
from jsonlbatch.errors import UsageError
from jsonlbatch.exec import execute
from jsonlbatch.exec.hooks.check_hook import Accept, AnswerToCheck, AskAgain, CheckVerdict, Reject
from jsonlbatch.exec.hooks.seams import Seams
from jsonlbatch.exec.output.events import Answered, Failed, RateLimited, Retried, Sent, Snapshot
from jsonlbatch.exec.route.endpoint_concurrency import EndpointAttempt
from jsonlbatch.exec.route.model_pools import PoolSpec


def mock_posts(url: str) -> int:
    """Chat requests the mock at `url` (ending in /v1) has answered or refused."""
    with urllib.request.urlopen(url.removesuffix("/v1") + "/mock/stats", timeout=10) as resp:
        return orjson.loads(resp.read())["requests"].get("/v1/chat/completions", 0)


def test_on_answer_check_accepts_rejects_and_reasks(tmp_path: Path, mock_server) -> None:
    url = mock_server()
    requests, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 4)
    seen: list[tuple[str, int]] = []

    def check(answer: AnswerToCheck) -> CheckVerdict:
        req = answer.request
        seen.append((req.custom_id, len(req.body["messages"])))
        assert answer.body()["choices"]  # the decoded answer is there to judge
        if req.custom_id == "req-1":
            return Reject("no good: the answer is not JSON", code="schema_mismatch")
        if req.custom_id == "req-2" and len(req.body["messages"]) == 1:
            again = [*req.body["messages"], {"role": "user", "content": "answer in JSON"}]
            return AskAgain({**req.body, "messages": again}, "not JSON")
        return Accept()

    summary = execute(requests, output, urls=[url], quiet=True, seams=Seams(check=check))
    results = read_results(output)
    assert results["req-1"]["error"]["code"] == "schema_mismatch"
    assert results["req-1"]["response"] is None
    assert results["req-2"]["error"] is None and results["req-2"]["metrics"]["attempts"] == 2
    assert ("req-2", 1) in seen and ("req-2", 2) in seen  # re-asked with the modified body
    assert summary.succeeded == 3 and summary.failed == 1 and summary.retries == 1
    # the line keeps the fingerprint of the request as the file asks it: a resume sends nothing
    again = execute(requests, output, urls=[url], quiet=True, seams=Seams(check=check))
    assert again.pending == 0


def test_reask_ends_as_a_failure_after_max_retries(tmp_path: Path, mock_server) -> None:
    url = mock_server()
    requests, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 1)

    def never(answer: AnswerToCheck) -> CheckVerdict:
        return AskAgain(answer.request.body, "still wrong")

    execute(requests, output, urls=[url], quiet=True, max_retries=2, seams=Seams(check=never))
    line = read_results(output)["req-0"]
    assert line["error"] == {"code": "check_failed", "message": "still wrong"}
    assert line["metrics"]["attempts"] == 3 and mock_posts(url) == 3


class DictStore:
    def __init__(self) -> None:
        self.answers: dict[tuple[bytes, int], Result] = {}
        self.lookups: list[tuple[str, int]] = []

    @staticmethod
    def key(request: Request) -> bytes:
        return orjson.dumps(request.body, option=orjson.OPT_SORT_KEYS)

    def lookup(self, request: Request, occurrence: int) -> Result | None:
        self.lookups.append((request.custom_id, occurrence))
        return self.answers.get((self.key(request), occurrence))

    def store(self, request: Request, occurrence: int, result: Result) -> None:
        if result.ok:
            self.answers[self.key(request), occurrence] = result


def test_before_send_lookup_answers_without_sending(tmp_path: Path, mock_server) -> None:
    url = mock_server()
    requests = tmp_path / "in.jsonl"
    lines = [
        {"custom_id": f"s{i}", "url": "/v1/chat/completions", "body": chat_body(0)}
        for i in range(3)  # three samples of the same request
    ] + [{"custom_id": "other", "url": "/v1/chat/completions", "body": chat_body(1)}]
    requests.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    store = DictStore()
    execute(requests, tmp_path / "a.jsonl", urls=[url], quiet=True, seams=Seams(store=store))
    assert sorted(store.lookups) == [("other", 0), ("s0", 0), ("s1", 1), ("s2", 2)]
    assert len(store.answers) == 4 and mock_posts(url) == 4
    sent: list[Sent] = []
    seams = Seams(store=store, subscribers=[(sent.append, (Sent,))])
    summary = execute(requests, tmp_path / "b.jsonl", urls=[url], quiet=True, seams=seams)
    assert sent == [] and mock_posts(url) == 4 and summary.succeeded == 4
    first, second = read_results(tmp_path / "a.jsonl"), read_results(tmp_path / "b.jsonl")
    for cid in ("s0", "s1", "s2", "other"):
        assert second[cid]["response"]["body"] == first[cid]["response"]["body"]


def test_per_model_pools_route_by_body_model(tmp_path: Path, mock_server) -> None:
    small, large = mock_server(served_models=("small",)), mock_server(served_models=("large",))
    requests, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = [
        {"custom_id": f"r{i}", "url": "/v1/chat/completions", "body": chat_body(i, model)}
        for i, model in enumerate(["small", "large"] * 3)
    ]
    requests.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    pools = [PoolSpec((small,), ("small",)), PoolSpec((large,), ("large",), concurrency=1)]
    summary = execute(requests, output, quiet=True, seams=Seams(pools=pools))
    assert summary.succeeded == 6
    for line in lines:
        result = read_results(output)[line["custom_id"]]
        assert result["response"]["body"]["model"] == line["body"]["model"]
    assert mock_posts(small) == 3 and mock_posts(large) == 3
    # a model without a pool is refused before anything is sent
    with pytest.raises(UsageError, match="no endpoint pool serves 'large'"):
        execute(
            requests, tmp_path / "x.jsonl", quiet=True,
            seams=Seams(pools=[PoolSpec((small,), ("small",))]),
        )  # fmt: skip
    assert not (tmp_path / "x.jsonl").exists() or not (tmp_path / "x.jsonl").read_bytes()


def test_event_stream_reports_each_step(tmp_path: Path, mock_server) -> None:
    url = mock_server(rate_limit_rate=0.3, retry_after=0.0, seed=3)
    requests, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 20)
    events: list[Any] = []
    seams = Seams(subscribers=[(events.append, ())])
    summary = execute(requests, output, urls=[url], quiet=True, backoff_base=0.01, seams=seams)
    kinds = [type(e) for e in events]
    assert kinds.count(Answered) == summary.succeeded == 20
    assert kinds.count(Failed) == 0
    assert kinds.count(Sent) == 20 + summary.retries
    assert kinds.count(RateLimited) == kinds.count(Retried) == summary.retries > 0
    final = [e for e in events if isinstance(e, Snapshot) and e.final]
    assert len(final) == 1 and final[0].summary.written == 20


class CountingLimit:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.outcomes: list[EndpointAttempt] = []

    def observe(self, outcome: EndpointAttempt) -> None:
        self.outcomes.append(outcome)


def test_concurrency_controller_bounds_each_endpoint(tmp_path: Path, mock_server) -> None:
    url = mock_server(latency=0.05)
    requests, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 6)
    made: dict[str, CountingLimit] = {}

    def controller(name: str) -> CountingLimit:
        return made.setdefault(name, CountingLimit(1))

    execute(
        requests, output, urls=[url], quiet=True, concurrency=6,
        seams=Seams(concurrency=controller),
    )  # fmt: skip
    (limit,) = made.values()
    assert [o.status for o in limit.outcomes] == [200] * 6
    spans = sorted(
        (m["start_time"], m["start_time"] + m["latency_s"])
        for m in (line["metrics"] for line in read_results(output).values())
    )
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end - 0.002  # one at a time: each attempt starts after the last ended

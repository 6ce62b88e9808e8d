"""The store and check seams as complete Protocols, and stored answers' events (issue 45,
items 2 and 3), over real HTTP to the mock.

A store or check written to the documented interface without a base class keeps every member
it has; one with part of it is refused where it enters the run; `--cache` with a caller's store
is refused; answers the cache gives during the input scan emit `Answered` as sent ones do.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pytest
from batchutil import chat_body, read_results, write_requests
from conftest import free_port

from jsonlbatch.batch_format.records import Request, Result, request_line
from jsonlbatch.errors import UsageError
from jsonlbatch.exec import execute
from jsonlbatch.exec.hooks.check_hook import (
    Accept,
    AnswerCheck,
    AnswerToCheck,
    Check,
    CheckVerdict,
    as_check,
)
from jsonlbatch.exec.hooks.seams import Seams
from jsonlbatch.exec.hooks.store_hook import EXTRA_MEMBERS, AnswerStore, StoreBase, as_store
from jsonlbatch.exec.output.events import Answered


def protocol_members(proto: type) -> set[str]:
    """What a Protocol class declares (its own annotations and functions, not object's)."""
    own = set(typing.get_type_hints(proto)) | {
        name
        for name, value in vars(proto).items()
        if callable(value) or isinstance(value, property)
    }
    return {n for n in own if not n.startswith("_") or n == "__call__"}


def test_the_store_protocol_declares_every_member_the_run_calls() -> None:
    base = {n for n in vars(StoreBase) if not n.startswith("_")}
    assert protocol_members(AnswerStore) == base == {"lookup", "store", *EXTRA_MEMBERS}
    assert len(base) == 14
    # every member of the Protocol is one the run (run_loop, job, store_hook) calls
    import jsonlbatch.exec.hooks.store_hook as hook
    import jsonlbatch.exec.job as job
    import jsonlbatch.exec.run_loop as loop

    sources = "".join(Path(m.__file__).read_text() for m in (hook, job, loop))
    for name in base:
        assert f".{name}" in sources, name
    assert protocol_members(AnswerCheck) == {"__call__", "begin", "end"}


class WholeStore:
    """A store written to `AnswerStore` without subclassing: every member its own."""

    counts_copies = False
    deferred = 0
    answers_early = False

    def __init__(self) -> None:
        self.answers: dict[tuple[str, int], Result] = {}
        self.calls: list[str] = []

    def lookup(self, request: Request, occurrence: int, /) -> Result | None:
        return self.answers.get((request.body["messages"][0]["content"], occurrence))

    def store(self, request: Request, occurrence: int, result: Result, /) -> None:
        if result.ok:
            self.answers[request.body["messages"][0]["content"], occurrence] = result

    def scan_line(self, obj: dict[str, Any], raw: bytes, pending: bool,
                  sorted_body: bytes | None, /) -> Result | None:  # fmt: skip
        return None

    def settle_line(self, obj: dict[str, Any], /) -> Result | None:
        return None

    def refused(self, request: Request, result: Result, /) -> None:
        self.calls.append("refused")

    def resume_into(self, output: str, /) -> None:
        self.calls.append("resume_into")

    def key_by(self, urls: Any, /) -> None:
        self.calls.append("key_by")

    def notes(self) -> list[str]:
        self.calls.append("notes")
        return ["whole store: ready"]

    def progress(self) -> str:
        return "whole"

    def describe(self) -> str:
        self.calls.append("describe")
        return f"whole store: {len(self.answers)} answers kept"

    def finish(self, output: str, /) -> None:
        self.calls.append("finish")


def test_a_store_with_every_member_and_no_base_class_keeps_describe_and_notes(
    tmp_path: Path, mock_server: Any
) -> None:
    url = mock_server()
    requests = tmp_path / "in.jsonl"
    write_requests(requests, 3)
    store = WholeStore()
    assert Seams(store=store).store is store  # used as it is, not trimmed to lookup/store
    summary = execute(requests, tmp_path / "a.jsonl", urls=[url], quiet=True,
                      seams=Seams(store=store))  # fmt: skip
    assert summary.cache == "whole store: 3 answers kept"
    assert {"notes", "describe", "finish"} <= set(store.calls)
    assert "whole store: 3 answers kept" in summary.format()


def test_a_store_with_part_of_the_interface_is_refused_not_trimmed() -> None:
    class Half:
        def lookup(self, request: Request, occurrence: int, /) -> Result | None:
            return None

        def store(self, request: Request, occurrence: int, result: Result, /) -> None:
            pass

        def describe(self) -> str:
            return "half"

    with pytest.raises(TypeError, match=r"Half has describe but not counts_copies, deferred"):
        Seams(store=Half())
    with pytest.raises(TypeError, match="has no lookup"):
        as_store(object())  # type: ignore[arg-type]

    class Simple:  # the documented least: completed with the defaults
        def lookup(self, request: Request, occurrence: int, /) -> Result | None:
            return None

        def store(self, request: Request, occurrence: int, result: Result, /) -> None:
            pass

    completed = as_store(Simple())
    assert isinstance(completed, StoreBase) and completed.describe() == ""


def test_a_check_with_begin_and_end_but_no_base_class_is_called_whole(
    tmp_path: Path, mock_server: Any
) -> None:
    url = mock_server()
    requests = tmp_path / "in.jsonl"
    write_requests(requests, 3)

    class Bracketing:
        def __init__(self) -> None:
            self.open: set[str] = set()
            self.log: list[str] = []

        def __call__(self, answer: AnswerToCheck, /) -> CheckVerdict:
            assert answer.request.custom_id in self.open
            self.log.append("call")
            return Accept()

        def begin(self, request: Request, /) -> Request:
            self.open.add(request.custom_id)
            self.log.append("begin")
            return request

        def end(self, request: Request, /) -> None:
            self.open.discard(request.custom_id)
            self.log.append("end")

    check = Bracketing()
    assert isinstance(check, AnswerCheck) and not isinstance(check, Check)
    summary = execute(requests, tmp_path / "a.jsonl", urls=[url], quiet=True,
                      seams=Seams(check=check))  # fmt: skip
    assert summary.succeeded == 3
    assert check.log.count("begin") == check.log.count("end") == check.log.count("call") == 3
    assert check.open == set()

    class OnlyBegin:
        def __call__(self, answer: AnswerToCheck, /) -> CheckVerdict:
            return Accept()

        def begin(self, request: Request, /) -> Request:
            return request

    with pytest.raises(TypeError, match="OnlyBegin has begin but not end"):
        as_check(OnlyBegin())  # type: ignore[arg-type]


def test_cache_and_a_store_of_ones_own_are_refused_together(tmp_path: Path) -> None:
    requests = tmp_path / "in.jsonl"
    write_requests(requests, 2)
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(UsageError, match="--cache and a store of your own"):
        execute(requests, tmp_path / "a.jsonl", urls=[url], quiet=True,
                cache=str(tmp_path / "cache"), seams=Seams(store=WholeStore()))  # fmt: skip
    assert not (tmp_path / "a.jsonl").exists() and not (tmp_path / "cache").exists()


def test_a_fully_cached_run_emits_an_answered_per_line(tmp_path: Path, mock_server: Any) -> None:
    """The cache answers all 5 lines while the input is scanned: 5 `Answered`, as 5 sent
    answers would have, with the lines' metrics (cache: hit); the metrics exporter counts them
    once each."""
    url = mock_server()
    requests = tmp_path / "in.jsonl"
    requests.write_bytes(
        b"".join(request_line(f"r{i}", chat_body(i, max_tokens=4)) for i in range(5))
    )
    cache = str(tmp_path / "cache")
    sent: list[Answered] = []
    seams = Seams(subscribers=[(sent.append, (Answered,))])
    execute(requests, tmp_path / "a.jsonl", urls=[url], quiet=True, cache=cache, seams=seams)
    assert len(sent) == 5
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing to send: no server is reached
    events: list[Answered] = []
    exporter = None
    subscribers = [(events.append, (Answered,))]
    try:
        from jsonlbatch.view.live import PrometheusExporter

        exporter = PrometheusExporter()
        subscribers += exporter.subscriptions()
    except Exception:  # the optional metrics extra is missing: the events alone
        exporter = None
    summary = execute(requests, tmp_path / "b.jsonl", urls=[dead], quiet=True, cache=cache,
                      seams=Seams(subscribers=subscribers))  # fmt: skip
    assert summary.cache_hits == 5 and summary.succeeded == 5
    assert sorted(e.custom_id for e in events) == [f"r{i}" for i in range(5)]
    assert {e.status for e in events} == {200}
    assert {e.metrics["cache"] for e in events} == {"hit"}
    written = read_results(tmp_path / "b.jsonl")
    assert {e.custom_id: e.metrics for e in events} == {k: v["metrics"] for k, v in written.items()}
    if exporter is not None:
        values = {
            (s.name, tuple(s.labels.values())): s.value
            for metric in exporter.registry.collect()
            for s in metric.samples
        }
        assert values[("jsonlbatch_cache_hits_total", ())] == 5
        assert values[("jsonlbatch_requests_total", ("ok",))] == 5

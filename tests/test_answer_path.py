"""One answer path: a stored answer passes the checks a sent one passes before its line.

A cache filled by a run that did not check schemas (`schema_check=False`) holds answers that
break them; a later run that checks must never write those as successes. It sends their
requests instead (re-asking as usual), and the answers it accepts from the cache carry the
contract's verdict like any other (the summary's "valid" count, export's typed columns).
Both ways a store is asked are covered: during the input scan (the cache's early answers) and
before sending (`--cache-key-url`, and a store of the caller's through `Seams`).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from batchutil import read_results
from contractutil import SCHEMA
from test_exec_contract import schema_requests

from jsonlbatch import execute
from jsonlbatch.answer_contract.contract import check_choice, compile_schema
from jsonlbatch.batch_format.records import Request, Result
from jsonlbatch.exec.hooks.seams import Seams


def answer_text(line: dict) -> str:
    return line["response"]["body"]["choices"][0]["message"]["content"]


def broken_cache(tmp_path: Path, mock_server, requests: Path) -> tuple[Path, set[str]]:
    """A cache whose answers for `requests` mostly break SCHEMA (stored unchecked), and the
    ids whose stored answer breaks it."""
    cache = tmp_path / "cache"
    first = tmp_path / "unchecked.jsonl"
    summary = execute(requests, first, urls=[mock_server(break_json=1.0)], quiet=True,
                      cache=str(cache), schema_check=False)  # fmt: skip
    assert summary.failed == 0  # unchecked: every answer is a success, and stored
    contract = compile_schema(SCHEMA)
    broken = {cid for cid, line in read_results(first).items()
              if not check_choice(contract, answer_text(line)).valid}  # fmt: skip
    assert broken  # the mock broke most of them (a third only wrapped in fences)
    return cache, broken


@pytest.mark.parametrize("key_url", [False, True], ids=["scan-time", "before-send"])
def test_cached_answers_that_break_the_schema_are_sent_not_served(
    tmp_path: Path, mock_server, key_url: bool
) -> None:
    requests = tmp_path / "in.jsonl"
    schema_requests(requests, 12)
    url = mock_server()  # answers that hold the schema
    if key_url:  # the URL is in every key: fill and re-run against the same server
        url = mock_server(break_json=1.0)  # its re-sent answers break too: re-asked, failed
        cache = tmp_path / "cache"
        execute(requests, tmp_path / "unchecked.jsonl", urls=[url], quiet=True,
                cache=str(cache), schema_check=False, cache_key_url=True)  # fmt: skip
        contract = compile_schema(SCHEMA)
        broken = {cid for cid, line in read_results(tmp_path / "unchecked.jsonl").items()
                  if not check_choice(contract, answer_text(line)).valid}  # fmt: skip
    else:
        cache, broken = broken_cache(tmp_path, mock_server, requests)
    out = tmp_path / "checked.jsonl"
    summary = execute(requests, out, urls=[url], quiet=True, cache=str(cache), reask=2,
                      cache_key_url=key_url)  # fmt: skip
    results = read_results(out)
    assert len(results) == 12
    for cid, line in results.items():
        record = line["metrics"].get("contract")
        assert record is not None, f"{cid} written without a verdict"
        if line["error"] is None:  # a success is only ever an answer that holds the schema
            assert record["valid"] is True
            assert check_choice(compile_schema(SCHEMA), answer_text(line)).valid
        if cid in broken:  # never the stored broken answer as a hit
            assert line["metrics"].get("cache") != "hit"
    hits = [c for c, r in results.items() if r["metrics"].get("cache") == "hit"]
    assert set(hits).isdisjoint(broken)
    assert summary.cache is not None and f"{len(broken)} refused by the checks" in summary.cache
    assert f"{len(hits)} hits" in summary.cache
    assert summary.schema_valid + summary.schema_invalid == 12


def test_a_valid_cached_answer_keeps_its_verdict(tmp_path: Path, mock_server) -> None:
    requests = tmp_path / "in.jsonl"
    schema_requests(requests, 6)
    url, cache = mock_server(), str(tmp_path / "cache")
    execute(requests, tmp_path / "a.jsonl", urls=[url], quiet=True, cache=cache)
    summary = execute(requests, tmp_path / "b.jsonl", urls=[url], quiet=True, cache=cache)
    results = read_results(tmp_path / "b.jsonl")
    assert all(r["metrics"]["cache"] == "hit" for r in results.values())
    valid = [r["metrics"]["contract"]["valid"] for r in results.values()]
    assert valid.count(True) == summary.schema_valid and summary.schema_valid > 0
    assert summary.schema_valid + summary.schema_invalid == 6


class EchoStore:
    """A caller's store with only `lookup` and `store`: it answers every request with a body
    that is no chat answer at all (a hostile or broken store)."""

    def __init__(self) -> None:
        self.stored: list[str] = []

    def lookup(self, request: Request, occurrence: int) -> Result | None:
        return Result(request.custom_id, 200, orjson.Fragment(b'{"not":"an answer"}'))

    def store(self, request: Request, occurrence: int, result: Result) -> None:
        self.stored.append(request.custom_id)


def test_a_stored_body_that_is_no_answer_is_sent(tmp_path: Path, mock_server) -> None:
    requests = tmp_path / "in.jsonl"
    schema_requests(requests, 3)
    store = EchoStore()
    summary = execute(requests, tmp_path / "out.jsonl", urls=[mock_server()], quiet=True,
                      seams=Seams(store=store))  # fmt: skip
    results = read_results(tmp_path / "out.jsonl")
    assert all(r["response"]["body"].get("choices") for r in results.values())
    assert sorted(store.stored) == sorted(results) and summary.succeeded == 3

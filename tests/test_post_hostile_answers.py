"""Model output is untrusted in every parser: extractors, normalizers, pass rules and line reading
are bounded in time and memory for any answer text (post/extract.py, experiment/rules.py,
samples.load_line). Each case took seconds to minutes, a traceback, or a gigabyte before."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
from batchutil import cli

from jsonlbatch.batch_format.samples import MAX_CONTAINERS, LineTooLarge, load_line
from jsonlbatch.experiment.rules import coerce
from jsonlbatch.post.extract import canonical_number, extract_answer, normalize_answer

pytestmark = pytest.mark.timeout(120, method="thread")

MB = 10**6
ALL = ["boxed", "answer-is", "last-number", "choice", "json:a.b"]

HOSTILE = {
    "exponent": "The answer is 1e400000",
    "tiny": "\\boxed{1e-400000}",
    "huge exponent": "\\boxed{1e999999999}",
    "digits": "\\boxed{" + "9" * MB + "}",
    "digits then text": "9" * MB + "x",
    "nested arrays": "[" * MB,
    "nested braces": "{" * MB,
    "newlines after the answer is": "the answer is" + "\n" * MB,
    "spaces after answer": "answer" + " " * MB + "!",
    "newlines after answer": "answer" + "\n" * MB + "!",
    "dollars": "$" * MB,
    "dollar pairs": "$ " * (MB // 2),
}


def _bounded(fn, text: str) -> tuple[object, float]:
    start = time.perf_counter()
    out = fn(text)
    return out, time.perf_counter() - start


@pytest.mark.parametrize("name", list(HOSTILE))
def test_every_parser_takes_any_answer_text_in_bounded_time(name: str) -> None:
    text = HOSTILE[name]
    found, _ = _bounded(lambda t: extract_answer(t, ALL), text)
    assert found is None or isinstance(found, str)
    normal, _ = _bounded(normalize_answer, found if found is not None else text)
    assert isinstance(normal, str)
    # too large to normalise: it stays as text, not a number written out in full
    assert len(normal) <= len(found if found is not None else text)
    assert coerce(text) is not None
    # (each of these took more than 5 s, or raised, before: a timed assertion would be a speed
    # target; the test's timeout bounds the whole file)


def test_numbers_too_large_to_normalise_stay_text() -> None:
    assert canonical_number("1e400000") is None
    assert canonical_number("1e-400000") is None
    assert canonical_number("9" * 5000) is None
    assert normalize_answer("1e400000") == "1e400000"
    assert canonical_number("1,000") == "1000" and canonical_number("1e3") == "1000"
    assert canonical_number("0.50") == "0.5"
    assert coerce("1e400000") == "1e400000"  # not inf
    assert coerce("9" * 1000) == "9" * 1000
    assert coerce("7") == 7 and coerce("7.5") == 7.5
    assert extract_answer('{"a": {"b": 3}}', ["json:a.b"]) == "3"
    assert extract_answer("The answer is: (C)", ["choice"]) == "C"
    assert extract_answer("answer: **B**", ["choice"]) == "B"
    assert extract_answer("The final answer is: 12. Done", ["answer-is"]) == "12"


def _response(cid: str, texts: list[str]) -> bytes:
    choices = [{"index": i, "message": {"role": "assistant", "content": t},
                "finish_reason": "stop"} for i, t in enumerate(texts)]  # fmt: skip
    body = {"object": "chat.completion", "model": "m", "choices": choices}
    return orjson.dumps({"custom_id": cid, "response": {"status_code": 200, "body": body},
                         "error": None}) + b"\n"  # fmt: skip


def test_a_line_of_too_many_objects_is_a_located_problem_not_a_gigabyte(tmp_path: Path) -> None:
    n = MAX_CONTAINERS  # two objects a choice: twice the cap
    many = tmp_path / "many.jsonl"
    many.write_bytes(_response("q|0", ["The answer is 7"] * n) + _response("r|0", ["8"]))
    with pytest.raises(LineTooLarge, match="more than 100,000 JSON objects and arrays"):
        load_line(many.read_bytes().splitlines()[0])
    for args in (("post", "votes", str(many), "-o", str(tmp_path / "v.jsonl")),
                 ("report", str(many)),
                 ("export", str(many), "-o", str(tmp_path / "e.jsonl"))):  # fmt: skip
        done = cli(*args)
        assert done.returncode == 1, (args, done.stderr)
        assert "many.jsonl:1: bad JSON: a " in done.stderr and "Traceback" not in done.stderr
    # a big line that is one long string (a 6 MB answer full of braces) is read as before
    braces = tmp_path / "braces.jsonl"
    braces.write_bytes(_response("q|0", ["{[" * (3 * MB) + " The answer is 5"]))
    assert load_line(braces.read_bytes().strip())["custom_id"] == "q|0"
    done = cli("post", "votes", str(braces), "-o", str(tmp_path / "b.jsonl"))
    assert done.returncode == 0, done.stderr
    assert orjson.loads((tmp_path / "b.jsonl").read_bytes())["answer"] == "5"


def test_votes_over_hostile_answers_end_cleanly(tmp_path: Path) -> None:
    responses = tmp_path / "hostile.jsonl"
    responses.write_bytes(
        b"".join(_response(f"q{i}|0", [text]) for i, text in enumerate(HOSTILE.values()))
    )
    out = tmp_path / "votes.jsonl"
    done = cli("post", "votes", str(responses), "-o", str(out), "--extract", "boxed",
               "--extract", "answer-is", "--extract", "choice", "--extract", "json:a")  # fmt: skip
    assert done.returncode == 0, done.stderr
    votes = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert len(votes) == len(HOSTILE)
    assert votes[0]["answer"] == "1e400000"

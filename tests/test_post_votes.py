"""Answer extraction, normalization, majority votes and maj@k/pass@k/mean@k, checked against
hand-computed examples."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from postutil import chat_line, post, read_jsonl, vllm_error_line, write_jsonl

from jsonlbatch.errors import UsageError
from jsonlbatch.post import (
    INVALID,
    extract_answer,
    get_extractor,
    normalize_answer,
    run_votes,
    vote,
)
from jsonlbatch.post.votes import Accuracy


@pytest.mark.parametrize(
    ("text", "spec", "answer"),
    [
        (
            "so $x = \\boxed{\\frac{1}{2}}$, and then \\boxed{\\frac{3}{4}}.",
            "boxed",
            "\\frac{3}{4}",
        ),
        ("nested \\boxed{\\sqrt{x^{2}}} done", "boxed", "\\sqrt{x^{2}}"),
        ("truncated \\boxed{\\frac{1}{2", "boxed", None),
        ("\\boxed 5 is it", "boxed", "5"),
        ("Thus the answer is $18$.\nCheck: fine.", "answer-is", "$18$"),
        ("The final answer is: **1,000**.", "answer-is", "1,000"),
        ("I have 3 apples and -2.5 pears, total 1,234.", "last-number", "1234"),
        ("no digits here", "last-number", None),
        ("Let me see... The answer is (C).", "choice", "C"),
        ("Option (B) looks right, but (D) is better", "choice", "D"),
        ("B", "choice", "B"),
        ("Result: 17 apples", "regex:Result: (\\d+)", "17"),
        ('Sure!\n```json\n{"answer": {"value": 12}}\n```', "json:answer.value", "12"),
        ('I think {"final": "Paris"} is it', "json:final", "Paris"),
        ("  Paris  ", "full", "Paris"),
    ],
)
def test_extractors(text: str, spec: str, answer: str | None) -> None:
    assert extract_answer(text, [spec]) == answer


def test_extractors_fall_back_in_order() -> None:
    text = "The answer is 12. Actually 13 apples."
    assert extract_answer(text, ["boxed", "answer-is", "last-number"]) == "12"
    assert extract_answer(text, ["boxed", "last-number"]) == "13"
    assert extract_answer("nothing", ["boxed", "last-number"]) is None


def test_unknown_extractor_and_bad_regex_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="unknown extractor 'boxd'"):
        get_extractor("boxd")
    with pytest.raises(UsageError, match="bad regex"):
        get_extractor("regex:(")


@pytest.mark.parametrize(
    "same",
    [
        ["1,000", "1000", "1000.0", "$1000$", "1000.", "\\boxed{1000}" and "1000", "+1e3"],
        ["\\dfrac{1}{2}", "\\frac{1}{2}", "\\frac12", "1/2", "$\\tfrac{1}{2}$"],
        ["New York", "new york", " New   York. "],
        ["0.50", ".5", "0.5"],
        ["90^\\circ", "90"],
        ["\\text{(A)}", "(a)"],
    ],
)
def test_normalization_makes_equal_answers_equal(same: list[str]) -> None:
    assert len({normalize_answer(a) for a in same}) == 1, [normalize_answer(a) for a in same]


def test_normalization_keeps_different_answers_apart() -> None:
    assert normalize_answer("10") != normalize_answer("100")
    assert normalize_answer("\\frac{1}{2}") != normalize_answer("\\frac{2}{1}")
    assert normalize_answer("-3") != normalize_answer("3")


def test_vote_majority_ties_invalid_and_weights() -> None:
    t = vote(["7", "8", "7", INVALID, INVALID, INVALID])
    assert (t.answer, t.votes, t.total, t.tally) == ("7", 2, 6, {"7": 2, "8": 1, INVALID: 3})
    assert t.agreement == pytest.approx(2 / 6)
    assert vote(["b", "a", "a", "b"]).answer == "b"  # tie: first seen
    assert vote(["bb", "a", "a", "bb"], tie_break="last").answer == "a"
    assert vote(["bb", "a", "a", "bb"], tie_break="shortest").answer == "a"
    assert vote([INVALID, INVALID]).answer == INVALID
    weighted = vote(["7", "7", "8"], [1.0, 1.0, 2.5])
    assert (weighted.answer, weighted.votes, weighted.total) == ("8", 2.5, 4.5)


def test_accuracy_at_k_by_hand() -> None:
    acc = Accuracy()
    acc.add(["42", "41", "42", "7"], [1] * 4, "42")
    acc.add(["3", "5", "5", INVALID], [1] * 4, "5")
    acc.add([INVALID, "10"], [1] * 2, "10")  # 2 samples: padded to 4 with [invalid]
    rows = acc.table()
    # maj@k: q1 right at every k; q2 wrong at 1 and 2 (tie 3/5 goes to 3), right after;
    # q3 wrong at 1 ([invalid] never wins but there is nothing else), right after.
    assert [r.maj for r in rows] == pytest.approx([1 / 3, 2 / 3, 1, 1])
    # pass@k = 1 - C(n-c,k)/C(n,k), n=4: q1 and q2 (c=2): 1/2, 5/6, 1, 1; q3 (c=1): 1/4, 1/2, 3/4, 1
    assert [r.pass_ for r in rows] == pytest.approx(
        [(0.5 + 0.5 + 0.25) / 3, (5 / 6 + 5 / 6 + 0.5) / 3, (1 + 1 + 0.75) / 3, 1]
    )
    # mean@k: right among the first k, over k: q1 1,1/2,2/3,2/4; q2 0,1/2,2/3,2/4; q3 0,1/2,1/3,1/4
    assert [r.mean for r in rows] == pytest.approx(
        [1 / 3, 0.5, (2 / 3 + 2 / 3 + 1 / 3) / 3, (0.5 + 0.5 + 0.25) / 3]
    )


def test_votes_cli_with_gold_table(tmp_path: Path) -> None:
    responses = write_jsonl(
        tmp_path / "responses.jsonl",
        [
            chat_line("q1", "So \\boxed{42}.", "The answer is 41.", "Hence 42.0", "\\boxed{7}"),
            chat_line("q2|0", "<think>1+2=3</think>\\boxed{3}"),
            chat_line("q2|1", "The answer is $5$."),
            chat_line("q2|2", "five... that is 5"),
            chat_line("q2|3", "I cannot solve this."),
            vllm_error_line("q3|0"),
            chat_line("q3|1", "\\boxed{10}"),
        ],
    )
    gold = tmp_path / "gold.jsonl"
    gold.write_text(
        '{"id": "q1", "answer": 42}\n{"id": "q2", "answer": "5"}\n{"q3": "10"}\n'
        '{"id": "q4", "answer": "1"}\n'
    )
    out = tmp_path / "votes.jsonl"
    result = post(
        "votes", responses, "--extract", "boxed", "--extract", "answer-is",
        "--extract", "last-number", "--gold", gold, "-o", out,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "accuracy over 3 groups with a gold answer",
        "    k   maj@k  pass@k  mean@k",
        "    1   0.333   0.417   0.333",
        "    2   0.667   0.722   0.500",
        "    3   1.000   0.917   0.556",
        "    4   1.000   1.000   0.417",
    ]
    q1, q2, q3 = read_jsonl(out)
    assert q1 == {
        "id": "q1", "answer": "42", "votes": 2, "total": 4, "agreement": 0.5,
        "tally": {"42": 2, "41": 1, "7": 1}, "samples": 4, "invalid": 0,
        "gold": "42", "correct": True,
    }  # fmt: skip
    assert (q2["answer"], q2["tally"], q2["invalid"]) == ("5", {"3": 1, "5": 2, INVALID: 1}, 1)
    assert (q3["answer"], q3["agreement"], q3["correct"]) == ("10", 0.5, True)
    assert "1 failed request: q3|0 (HTTP 400" in result.stderr
    assert "1 nothing extracted: q2|3" in result.stderr
    assert "gold id without responses (left out of the accuracy): q4" in result.stderr


def test_hybrid_weighted_sources(tmp_path: Path) -> None:
    text = write_jsonl(
        tmp_path / "text.jsonl",
        [chat_line("t1|0", "\\boxed{7}"), chat_line("t1|1", "\\boxed{7}"), chat_line("t1|2", "\\boxed{8}")],
    )  # fmt: skip
    code = tmp_path / "code.jsonl"  # answers computed by running the model's code
    code.write_text(orjson.dumps({"custom_id": "t1|code", "answer": 8.0}).decode() + "\n")
    out = tmp_path / "v.jsonl"
    summary = run_votes([str(text), str(code)], str(out), weights=[1.0, 2.0])
    [line] = read_jsonl(out)
    assert (line["answer"], line["votes"], line["total"], line["agreement"]) == ("8", 3, 5, 0.6)
    assert summary.groups == 1 and summary.samples == 4
    with pytest.raises(UsageError, match="one --weight per input"):
        run_votes([str(text), str(code)], str(out), weights=[1.0])


def test_no_split_pools_choices_of_each_request(tmp_path: Path) -> None:
    responses = write_jsonl(tmp_path / "r.jsonl", [chat_line("q|1", "A", "B", "B")])
    out = tmp_path / "v.jsonl"
    result = post("votes", responses, "--no-split", "--extract", "choice", "-o", out, "--strict")
    assert result.returncode == 0, result.stderr
    assert read_jsonl(out)[0]["id"] == "q|1" and read_jsonl(out)[0]["answer"] == "b"

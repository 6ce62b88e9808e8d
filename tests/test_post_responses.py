"""The one reader of response files: formats of jsonlbatch, vLLM and the OpenAI Batch API,
reasoning, tool calls, failures, and the streaming grouping of samples."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from postutil import chat_line, expired_line, openai_error_line, vllm_error_line, write_jsonl

from jsonlbatch.errors import InputError
from jsonlbatch.post import Unused, iter_groups, make_key, read_responses, split_key, split_think
from jsonlbatch.post.responses import request_field_key


def test_reads_choices_reasoning_and_usage(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "r.jsonl",
        [
            chat_line("q1", "42", "41", reasoning="let me think"),
            chat_line("q2", "x", reasoning="old field", reasoning_key="reasoning_content"),
            chat_line("q3", "<think>\nstep 1\nstep 2\n</think>\n\nThe answer is 7."),
            chat_line("q4", "cut off", finish="length"),
        ],
    )
    samples = list(read_responses(str(path)))
    assert [(s.custom_id, s.index) for s in samples] == [
        ("q1", 0), ("q1", 1), ("q2", 0), ("q3", 0), ("q4", 0)
    ]  # fmt: skip
    q1a, q1b, q2, q3, q4 = samples
    assert (q1a.text, q1b.text, q1a.reasoning) == ("42", "41", "let me think")
    assert q1a.sample_id == "q1[0]" and q2.sample_id == "q2"
    assert q2.reasoning == "old field"
    assert (q3.reasoning, q3.text) == ("step 1\nstep 2", "The answer is 7.")
    assert q4.truncated and not q4.failed
    assert q1a.usage == {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30}
    assert q1a.model == "Qwen/Qwen3-8B" and q1a.line == 1 and q4.line == 4


def test_split_think_variants() -> None:
    assert split_think("<think>a</think>b") == ("a", "b")
    assert split_think("only the end of thinking</think>\nanswer") == (
        "only the end of thinking",
        "answer",
    )
    assert split_think("<think>never finished") == ("never finished", "")
    assert split_think("no thinking at all") == ("", "no thinking at all")


def test_failures_in_every_shape(tmp_path: Path) -> None:
    errors = write_jsonl(tmp_path / "errors.jsonl", [openai_error_line("c", 500, "boom")])
    path = write_jsonl(
        tmp_path / "r.jsonl",
        [vllm_error_line("a"), expired_line("b"), chat_line("d", "fine")],
    )
    samples = {s.custom_id: s for s in read_responses([str(path), str(errors)])}
    assert samples["a"].error == "HTTP 400: maximum context length is 4096"
    assert samples["b"].error == "batch_expired: This request could not be executed"
    assert samples["c"].error == "HTTP 500: boom"
    assert samples["c"].source == 1
    assert not samples["d"].failed and samples["d"].text == "fine"


def test_an_http_error_code_is_not_said_twice(tmp_path: Path) -> None:
    line = {
        "custom_id": "e",
        "response": {"status_code": 500, "body": {"error": "x"}},
        "error": {"code": "http_500", "message": "Internal server error"},
    }
    path = write_jsonl(tmp_path / "r.jsonl", [line])
    [sample] = read_responses([str(path)])
    assert sample.error == "HTTP 500: Internal server error"


def test_tool_calls_and_content_parts(tmp_path: Path) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    line = chat_line("t", "", tool_calls=[call])
    line["response"]["body"]["choices"][0]["message"]["content"] = [
        {"type": "text", "text": "part one, "},
        {"type": "text", "text": "part two"},
    ]
    [sample] = read_responses(str(write_jsonl(tmp_path / "r.jsonl", [line])))
    assert sample.tool_calls == [call]
    assert sample.text == "part one, part two"


def test_bad_line_names_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    good = orjson.dumps(chat_line("a", "x")).decode()
    path.write_text(good + "\n{not json\n" + '{"custom_id": "b", "response": 5}\n')
    with pytest.raises(InputError) as info:
        list(iter_groups(str(path)))
    text = str(info.value)
    assert f"{path}:2: bad JSON" in text
    assert f"{path}:3: response: must be an object or null" in text


def test_torn_last_line_is_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    whole = orjson.dumps(chat_line("a|0", "x")).decode() + "\n"
    path.write_text(whole + orjson.dumps(chat_line("a|1", "y")).decode()[:40])
    unused = Unused()
    groups = list(iter_groups(str(path), unused=unused))
    assert [(g.key, [s.custom_id for s in g.samples]) for g in groups] == [("a", ["a|0"])]
    assert unused.counts == {"torn last line (file still being written?)": 1}


@pytest.mark.parametrize(
    ("custom_id", "group"),
    [
        ("django__django-11099|3", "django__django-11099"),
        ("q17#2", "q17"),
        ("astropy__astropy-12907__pass4", "astropy__astropy-12907"),
        ("plain", "plain"),
        ("a|b|2", "a|b"),
    ],
)
def test_default_split(custom_id: str, group: str) -> None:
    assert split_key()(custom_id) == group


def test_groups_stream_out_of_order_with_retries(tmp_path: Path) -> None:
    # OpenAI Batch output comes in any order; a retried request appears twice.
    path = write_jsonl(
        tmp_path / "r.jsonl",
        [
            chat_line("b|10", "b10"),
            chat_line("a|1", "a1"),
            vllm_error_line("b|2"),
            chat_line("a|0", "a0"),
            chat_line("b|2", "b2 retried"),
            chat_line("b|1", "b1"),
        ],
    )
    groups = list(iter_groups(str(path)))
    assert [g.key for g in groups] == ["a", "b"]  # in the order groups complete
    a, b = groups
    assert [s.text for s in a.samples] == ["a0", "a1"]
    assert [s.text for s in b.samples] == ["b1", "b2 retried", "b10"]  # numbers as numbers


def test_group_by_request_field(tmp_path: Path) -> None:
    requests = write_jsonl(
        tmp_path / "requests.jsonl",
        [
            {"custom_id": f"r{i}", "url": "/v1/chat/completions",
             "body": {"model": "m", "metadata": {"problem": "p1" if i < 2 else "p2"}}}
            for i in range(3)
        ],
    )  # fmt: skip
    responses = write_jsonl(tmp_path / "r.jsonl", [chat_line(f"r{i}", str(i)) for i in range(3)])
    key = make_key(requests=str(requests), group_field="body.metadata.problem")
    groups = {g.key: [s.text for s in g.samples] for g in iter_groups(str(responses), key)}
    assert groups == {"p1": ["0", "1"], "p2": ["2"]}


def test_group_field_missing_is_located(tmp_path: Path) -> None:
    requests = write_jsonl(tmp_path / "requests.jsonl", [{"custom_id": "r0", "body": {}}])
    with pytest.raises(InputError, match=r"requests.jsonl:1: body.metadata.problem: missing"):
        request_field_key(str(requests), "body.metadata.problem")


def test_tool_call_only_message_without_content(tmp_path: Path) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    line = chat_line("t", "", tool_calls=[call])
    del line["response"]["body"]["choices"][0]["message"]["content"]
    [sample] = read_responses(str(write_jsonl(tmp_path / "r.jsonl", [line])))
    assert sample.tool_calls == [call]
    assert sample.text == "" and not sample.failed


def test_utf8_bom_at_the_start_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    lines = [chat_line("a|0", "x"), chat_line("a|1", "y")]
    path.write_bytes(b"\xef\xbb\xbf" + b"".join(orjson.dumps(x) + b"\n" for x in lines))
    assert [s.text for s in read_responses(str(path))] == ["x", "y"]
    [group] = iter_groups(str(path))
    assert [s.custom_id for s in group.samples] == ["a|0", "a|1"]


def test_only_a_last_line_without_newline_is_torn(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    whole = orjson.dumps(chat_line("a|0", "x")).decode() + "\n"
    path.write_text(whole + orjson.dumps(chat_line("a|1", "y")).decode()[:40] + "\n\n")
    with pytest.raises(InputError) as info:
        list(iter_groups(str(path)))
    assert f"{path}:2: bad JSON" in str(info.value)
    path.write_text("\ufeff" + orjson.dumps(chat_line("a|1", "y")).decode()[:40])
    unused = Unused()
    assert list(iter_groups(str(path), unused=unused)) == []
    assert unused.counts == {"torn last line (file still being written?)": 1}


def test_unicode_digits_in_ids_group_and_sort_without_crashing(tmp_path: Path) -> None:
    """`q|1²`: `str.isdigit` takes the superscript, `int` does not; sorting a group by the
    numbers in its ids must only ever parse ASCII digits (issue 11, item 19)."""
    path = write_jsonl(
        tmp_path / "r.jsonl",
        [
            chat_line("q|1²", "a"),
            chat_line("q|10", "b"),
            chat_line("q|2", "c"),
            chat_line("q|١", "d"),
        ],
    )
    groups = list(iter_groups([str(path)], make_key()))
    assert [g.key for g in groups] == ["q"]
    assert [s.custom_id for s in groups[0].samples] == ["q|1²", "q|2", "q|10", "q|١"]


def test_votes_and_patches_cli_take_unicode_digit_ids(tmp_path: Path) -> None:
    from postutil import post

    path = write_jsonl(
        tmp_path / "r.jsonl", [chat_line("q|1²", "\\boxed{4}"), chat_line("q|2", "x")]
    )
    votes = post("votes", path, "-o", tmp_path / "v.jsonl")
    assert votes.returncode == 0, votes.stderr
    assert "Traceback" not in votes.stderr
    patches = post("patches", path, "-o", tmp_path / "p.jsonl")
    assert "Traceback" not in patches.stderr


def test_a_request_file_is_refused_once_not_per_line(tmp_path: Path) -> None:
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}
    path = write_jsonl(tmp_path / "requests.jsonl", [line, {**line, "custom_id": "b"}])
    with pytest.raises(InputError, match="holds requests, not responses") as caught:
        list(iter_groups(str(path)))
    assert len(caught.value.problems) == 1

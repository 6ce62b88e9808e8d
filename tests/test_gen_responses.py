"""Responses as a gen data source: every field, joins, per-choice rows, continuations."""

from __future__ import annotations

import orjson
import pytest
from batchutil import cli

from jsonlbatch.errors import InputError, UsageError
from jsonlbatch.gen import RequestWriter, write_requests
from jsonlbatch.gen.response_rows import looks_like_responses, response_rows
from jsonlbatch.gen.templates import Prompt, RowTemplate

USAGE = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}


def ok(cid, *texts, reasoning=None, finish="stop"):
    choices = []
    for i, text in enumerate(texts):
        message = {"role": "assistant", "content": text}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        choices.append({"index": i, "message": message, "finish_reason": finish})
    body = {"model": "m1", "choices": choices, "usage": USAGE}
    return {"custom_id": cid, "response": {"status_code": 200, "body": body}, "error": None}


def failed(cid):
    return {"custom_id": cid, "response": None, "error": {"message": "boom", "code": "500"}}


def request(cid, question):
    body = {"model": "m1", "messages": [{"role": "user", "content": question}], "seed": 3}
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}


def write(path, lines):
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return str(path)


@pytest.fixture
def files(tmp_path):
    responses = write(
        tmp_path / "responses.jsonl",
        [
            ok("q1|0", "The answer is 4.", reasoning="2+2 is 4"),
            ok("q1|1", "<think>hmm</think>Four", finish="length"),
            failed("q2|0"),
            ok("q3", "A", "B"),
        ],
    )
    requests = write(
        tmp_path / "requests.jsonl",
        [
            request("q3", "Pick"),
            request("q1|0", "2+2?"),
            request("q1|1", "2+2?"),
            request("q2|0", "3+3?"),
        ],
    )
    data = write(
        tmp_path / "data.jsonl",
        [
            {"id": "q1", "question": "2+2?", "gold": "4"},
            {"id": "q2", "question": "3+3?", "gold": "6"},
            {"id": "q3", "question": "Pick", "gold": "A", "answer": "shadowed"},
        ],
    )
    return responses, requests, data


def test_every_field_per_request(files):
    responses, requests, data = files
    rows = list(response_rows(responses, requests=requests, join=data, on="id"))
    assert [r.key for r in rows] == ["q1|0", "q1|1", "q2|0", "q3"]
    first = rows[0].data
    assert first["custom_id"] == "q1|0" and first["group"] == "q1" and first["sample"] == 0
    assert first["answer"] == "The answer is 4." and first["reasoning"] == "2+2 is 4"
    assert first["finish_reason"] == "stop" and first["usage"] == USAGE
    assert (first["prompt_tokens"], first["completion_tokens"], first["reasoning_tokens"]) == (
        5,
        7,
        None,
    )
    assert first["failed"] is False and first["error"] is None and first["model"] == "m1"
    assert (
        first["choice"] == 0 and first["choices"] == 1 and first["answers"] == ["The answer is 4."]
    )
    assert first["messages"] == [{"role": "user", "content": "2+2?"}]
    assert first["body"]["seed"] == 3
    assert first["conversation"] == [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "The answer is 4."},
    ]
    assert first["data"] == {"id": "q1", "question": "2+2?", "gold": "4"}
    assert first["question"] == "2+2?" and first["gold"] == "4"  # joined fields, top level
    second = rows[1].data
    assert (second["answer"], second["reasoning"]) == ("Four", "hmm")  # <think> split off
    assert second["finish_reason"] == "length"
    bad = rows[2].data
    assert bad["failed"] is True and "boom" in bad["error"] and bad["answer"] == ""
    assert "conversation" not in bad  # nothing to continue
    q3 = rows[3].data
    assert q3["group"] == "q3" and q3["sample"] is None
    assert q3["answers"] == ["A", "B"] and q3["choices"] == 2
    assert q3["answer"] == "A"  # the response's field wins over a joined field of the same name
    assert q3["data"]["answer"] == "shadowed"


def test_per_choice_rows(files):
    responses, _, _ = files
    rows = list(response_rows(responses, per="choice"))
    assert [r.key for r in rows] == ["q1|0", "q1|1", "q2|0", "q3[0]", "q3[1]"]
    assert [r.data["answer"] for r in rows[3:]] == ["A", "B"]
    assert [r.data["choice"] for r in rows[3:]] == [0, 1]
    assert "answers" not in rows[3].data


def test_join_errors_name_the_response_line(files, tmp_path):
    responses, _, _ = files
    partial = write(tmp_path / "partial.jsonl", [{"id": "q1", "question": "2+2?"}])
    with pytest.raises(InputError) as err:
        list(response_rows(responses, join=partial, on="id"))
    assert err.value.problems[0].line == 3 and "q2" in err.value.problems[0].message
    few = write(tmp_path / "few.jsonl", [request("q1|0", "2+2?")])
    with pytest.raises(InputError) as err:
        list(response_rows(responses, requests=few))
    assert err.value.problems[0].line == 2 and err.value.problems[0].field == "custom_id"
    with pytest.raises(UsageError):
        list(response_rows(responses, join=partial))


def test_join_on_row_index(tmp_path):
    responses = write(tmp_path / "r.jsonl", [ok("1", "x"), ok("0", "y")])
    data = write(tmp_path / "d.jsonl", [{"q": "zero"}, {"q": "one"}])
    rows = list(response_rows(responses, join=data, on="row_index"))
    assert [r.data["q"] for r in rows] == ["one", "zero"]


def test_continuation_from_python(files, tmp_path):
    responses, requests, data = files
    rows = response_rows(responses, requests=requests, join=data, on="id")
    prompt = Prompt(user=RowTemplate("Gold is {{ gold }}; you said {{ answer }}."), continues=True)
    out = tmp_path / "second.jsonl"
    with RequestWriter(out, model="m2") as writer:
        write_requests((r for r in rows if not r.data["failed"]), writer, prompt)
    lines = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert [x["custom_id"] for x in lines] == ["q1|0", "q1|1", "q3"]
    assert lines[0]["body"]["messages"] == [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "The answer is 4."},
        {"role": "user", "content": "Gold is 4; you said The answer is 4.."},
    ]
    assert lines[0]["body"]["model"] == "m2"


def test_continuing_a_failed_row_says_why(files):
    responses, requests, _ = files
    row = list(response_rows(responses, requests=requests))[2]
    with pytest.raises(InputError, match="continue") as err:
        Prompt(user=RowTemplate("again"), continues=True).build(row)
    assert "failed" in str(err.value.problems[0])
    with pytest.raises(UsageError):
        Prompt(user=RowTemplate("x"), system=RowTemplate("s"), continues=True)


def test_cli_detects_responses_and_continues(files, tmp_path):
    responses, requests, data = files
    assert looks_like_responses(responses) and not looks_like_responses(data)
    out = tmp_path / "turn2.jsonl"
    proc = cli(
        "gen", "--data", responses, "--requests", requests, "--join", data, "--on", "id",
        "--where", "not failed and finish_reason == 'stop'", "--continue",
        "--prompt", "Sure? ({{ group }}/{{ sample }})", "--model", "m1", "--suffix", " /no_think",
        "-o", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert [x["custom_id"] for x in lines] == ["q1|0", "q3"]
    assert lines[0]["body"]["messages"][-1] == {
        "role": "user",
        "content": "Sure? (q1/0) /no_think",
    }
    assert lines[1]["body"]["messages"][-1]["content"] == "Sure? (q3/None) /no_think"


def test_cli_refuses_response_options_on_plain_data(files, tmp_path):
    _, requests, data = files
    proc = cli(
        "gen",
        "--data",
        data,
        "--requests",
        requests,
        "--prompt",
        "x",
        "-o",
        str(tmp_path / "o.jsonl"),
    )
    assert proc.returncode == 2 and "read a response file" in proc.stderr
    proc = cli(
        "gen",
        "--responses",
        files[0],
        "--continue",
        "--prompt",
        "x",
        "-o",
        str(tmp_path / "o.jsonl"),
    )
    assert proc.returncode == 2 and "--continue needs --requests" in proc.stderr


def test_token_counts_and_unusable_answers_follow_the_endpoint_rules(tmp_path):
    """`answers` decides: the request's endpoint says what a usable body is and where its
    token counts are (numbers only)."""
    reasoning_usage = {
        "prompt_tokens": 5,
        "completion_tokens": "7",  # not a number: no count rather than a string
        "completion_tokens_details": {"reasoning_tokens": 3},
    }
    good = ok("a", "fine")
    good["response"]["body"]["usage"] = reasoning_usage
    hollow = {"choices": [{"index": 0, "message": {"role": "assistant"}}]}  # no answer, no reason
    empty = {"custom_id": "b", "response": {"status_code": 200, "body": hollow}, "error": None}
    responses = write(tmp_path / "r.jsonl", [good, empty])
    requests = write(tmp_path / "q.jsonl", [request("a", "x"), request("b", "y")])
    rows = [r.data for r in response_rows(responses, requests=requests)]
    assert (rows[0]["prompt_tokens"], rows[0]["completion_tokens"]) == (5, None)
    assert rows[0]["reasoning_tokens"] == 3 and rows[0]["usage"] == reasoning_usage
    assert rows[0]["failed"] is False
    assert rows[1]["failed"] is True and "unusable answer" in rows[1]["error"]
    assert rows[1]["prompt_tokens"] is None


def test_a_provider_batchs_messages_answer_to_a_chat_request_is_read(tmp_path):
    """`exec --batch-api` to Anthropic sends chat lines as Messages requests and writes the
    Messages answers it gets (batch-api.md): gen reads them as report and export do, with or
    without --requests, and continues the conversation (before: every row "failed", its answer
    empty, "there is no answer to continue")."""
    body = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
            "content": [{"type": "text", "text": "Four."}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 9, "output_tokens": 2}}  # fmt: skip
    line = {"custom_id": "q1", "response": {"status_code": 200, "body": body}, "error": None,
            "metrics": {"batch_id": "msgbatch_1"}}  # fmt: skip
    responses = write(tmp_path / "r.jsonl", [line])
    requests = write(tmp_path / "q.jsonl", [request("q1", "2+2?")])
    for given in ({}, {"requests": requests}):
        (row,) = [r.data for r in response_rows(responses, **given)]
        assert row["failed"] is False and row["answer"] == "Four.", row
        assert (row["prompt_tokens"], row["completion_tokens"]) == (9, 2)
    out = tmp_path / "next.jsonl"
    proc = cli("gen", "--responses", responses, "--requests", requests, "--continue",
               "--prompt", "Sure?", "--model", "m1", "-o", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    messages = orjson.loads(out.read_bytes())["body"]["messages"]
    assert messages[1:] == [{"role": "assistant", "content": "Four."},
                            {"role": "user", "content": "Sure?"}]  # fmt: skip

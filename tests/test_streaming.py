"""SSE reassembly and stream timing (`jsonlbatch.exec.send.streaming`), on hand-written streams."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from jsonlbatch.exec.send.body_caps import read_stream
from jsonlbatch.exec.send.streaming import StreamError, StreamReader, stream_body

HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000, "model": "m"}


def event(choices: list[dict[str, Any]] | None = None, **extra: Any) -> bytes:
    chunk = {**HEAD, "choices": choices if choices is not None else [], **extra}
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def delta(index: int, finish: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"index": index, "delta": fields, "logprobs": None, "finish_reason": finish}


CALL_A = {
    "index": 0,
    "id": "call_a",
    "type": "function",
    "function": {"name": "get", "arguments": ""},
}
CALL_B = {
    "index": 1,
    "id": "call_b",
    "type": "function",
    "function": {"name": "put", "arguments": ""},
}
USAGE = {
    "prompt_tokens": 7,
    "completion_tokens": 11,
    "total_tokens": 18,
    "completion_tokens_details": {"reasoning_tokens": 3},
}

# n=2: choice 0 reasons then answers, choice 1 calls two tools whose deltas interleave; a ping
# comment, an `id:` field and a `retry:` field on the way; the usage chunk; [DONE].
STREAM = b"".join(
    [
        b": ping\n\n",
        event([delta(0, role="assistant", content=""), delta(1, role="assistant", content="")]),
        event([delta(0, reasoning_content="Let me ")]),
        b"id: 7\nretry: 1000\n",
        event([delta(0, reasoning_content="think. ")]),
        event([delta(1, tool_calls=[CALL_A])]),
        event([delta(0, content="The answer")]),
        event([delta(1, tool_calls=[CALL_B])]),
        event([delta(1, tool_calls=[{"index": 0, "function": {"arguments": '{"k": '}}])]),
        event([delta(1, tool_calls=[{"index": 1, "function": {"arguments": '{"v": 2}'}}])]),
        b": another comment\n\n",
        event([delta(1, tool_calls=[{"index": 0, "function": {"arguments": '"x"}'}}])]),
        event([delta(0, "stop", content=" is 42.")]),
        event([delta(1, "tool_calls")]),
        event(usage=USAGE),
        b"data: [DONE]\n\n",
    ]
)

EXPECTED = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "The answer is 42.",
                "reasoning_content": "Let me think. ",
            },
            "logprobs": None,
            "finish_reason": "stop",
        },
        {
            "index": 1,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "get", "arguments": '{"k": "x"}'},
                    },
                    {
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "put", "arguments": '{"v": 2}'},
                    },
                ],
            },
            "logprobs": None,
            "finish_reason": "tool_calls",
        },
    ],
    "usage": USAGE,
}


def assemble(pieces: list[bytes], chat: bool = True) -> StreamReader:
    reader = StreamReader(chat=chat)
    for i, piece in enumerate(pieces):
        reader.feed(piece, float(i))
    reader.close(float(len(pieces)))
    return reader


def test_whole_stream_rebuilds_the_unstreamed_body():
    reader = assemble([STREAM])
    assert reader.body() == EXPECTED
    assert reader.usage == USAGE


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"])
def test_every_split_point_and_every_line_end_gives_the_same_body(line_end):
    """Network reads cut anywhere: inside `data:`, inside the JSON, between CR and LF."""
    stream = STREAM.replace(b"\n", line_end)
    for cut in range(1, len(stream)):
        reader = assemble([stream[:cut], stream[cut:]])
        assert reader.body() == EXPECTED, f"split at byte {cut}"
        assert reader.chunks == 9, f"split at byte {cut}"


def test_byte_by_byte_and_multibyte_characters_split_inside():
    text = "naïve ☃ 中文 🎉"
    stream = event([delta(0, content=text)]) + event([delta(0, "stop")]) + b"data: [DONE]\n\n"
    reader = assemble([stream[i : i + 1] for i in range(len(stream))])
    assert reader.body()["choices"][0]["message"]["content"] == text


def test_long_lines_are_not_limited():
    arguments = "x" * (3 << 20)  # aiohttp's readline gives up at 2 x read_bufsize
    stream = event(
        [delta(0, tool_calls=[{**CALL_A, "function": {"name": "get", "arguments": arguments}}])]
    )
    stream += event([delta(0, "tool_calls")]) + b"data: [DONE]\n\n"
    reader = assemble([stream[i : i + 65536] for i in range(0, len(stream), 65536)])
    call = reader.body()["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["arguments"] == arguments


def test_an_event_split_over_several_data_lines_is_joined_at_any_cut():
    chunk = orjson.dumps(
        {**HEAD, "choices": [delta(0, "stop", content="hi")]}, option=orjson.OPT_INDENT_2
    )
    stream = b"".join(b"data: " + line + b"\r\n" for line in chunk.split(b"\n")) + b"\r\n"
    stream += b"data:[DONE]\r\n\r\n"  # no space after the colon is valid too
    for cut in range(1, len(stream)):
        reader = assemble([stream[:cut], stream[cut:]])
        assert reader.body()["choices"][0]["message"]["content"] == "hi", f"split at byte {cut}"
        assert reader.done


def test_reasoning_keeps_the_field_name_the_server_used():
    stream = event([delta(0, reasoning="a")]) + event([delta(0, reasoning="b", content="c")])
    reader = assemble([stream + event([delta(0, "stop")]) + b"data: [DONE]\n\n"])
    message = reader.body()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "c", "reasoning": "ab"}


def test_both_reasoning_names_in_one_delta_are_each_kept_once():
    both = delta(0, reasoning="r", reasoning_content="r")
    reader = assemble([event([both]) + event([both]) + b"data: [DONE]\n\n"])
    message = reader.body()["choices"][0]["message"]
    assert (message["reasoning"], message["reasoning_content"]) == ("rr", "rr")
    assert reader.chunks == 2


def test_tool_call_name_repeated_in_every_delta_and_missing_index():
    first = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{"}}
    again = {"id": "c1", "function": {"name": "f", "arguments": "}"}}
    stream = event([delta(0, tool_calls=[first])]) + event([delta(0, tool_calls=[again])])
    reader = assemble([stream + event([delta(0, "tool_calls")]) + b"data: [DONE]\n\n"])
    calls = reader.body()["choices"][0]["message"]["tool_calls"]
    assert calls == [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]


def test_litellm_usage_chunk_with_an_empty_choice_and_a_missing_finish():
    """LiteLLM's usage chunk carries `choices: [{"index": 0, "delta": {}}]`; with n=2 only
    index 0 gets a finish_reason."""
    stream = b"".join(
        [
            event([delta(0, role="assistant", content="a")]),
            event([delta(1, role="assistant", content="b")]),
            event([delta(0, "stop")]),
            event([{"index": 0, "delta": {}}], usage={"prompt_tokens": 1, "completion_tokens": 2}),
            b"data: [DONE]\n\n",
        ]
    )
    reader = assemble([stream])
    body = reader.body()
    assert [c["message"]["content"] for c in body["choices"]] == ["a", "b"]
    assert [c["finish_reason"] for c in body["choices"]] == ["stop", None]
    assert body["usage"] == {"prompt_tokens": 1, "completion_tokens": 2}
    assert reader.chunks == 2


def test_vllm_system_fingerprint_on_the_usage_chunk_only_is_kept():
    """vLLM 0.32 streams `system_fingerprint` only on its last (usage) chunk, and ends the
    content with `finish_reason` on the last content delta (seen on the real server)."""
    usage = {"prompt_tokens": 17, "total_tokens": 20, "completion_tokens": 3}
    stream = b"".join(
        [
            event([delta(0, role="assistant", content="")], prompt_token_ids=None),
            event([delta(0, content=" a")]),
            event([{**delta(0, "length", content=" b"), "stop_reason": None}]),
            event([], usage=usage, system_fingerprint="vllm-0.32.0-0409a628"),
            b"data: [DONE]\n\n",
        ]
    )
    body = assemble([stream]).body()
    assert body["system_fingerprint"] == "vllm-0.32.0-0409a628"
    assert body["choices"][0]["message"]["content"] == " a b"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == usage


def test_logprobs_and_stop_reason_are_merged():
    lp = lambda tok: {"content": [{"token": tok, "logprob": -0.5}]}  # noqa: E731
    first = {**delta(0, content="a"), "logprobs": lp("a")}
    last = {**delta(0, "stop", content="b"), "logprobs": lp("b"), "stop_reason": "</s>"}
    reader = assemble([event([first]) + event([last]) + b"data: [DONE]\n\n"])
    choice = reader.body()["choices"][0]
    assert choice["logprobs"] == {"content": lp("a")["content"] + lp("b")["content"]}
    assert choice["stop_reason"] == "</s>"


def test_completions_stream_becomes_a_text_completion():
    head = {"id": "cmpl-9", "object": "text_completion", "created": 5, "model": "m"}

    def text_event(index: int, text: str, finish: str | None = None) -> bytes:
        choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish}
        return b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n"

    stream = b"".join(
        [
            text_event(0, "Hel"),
            text_event(1, "Bye"),
            text_event(0, "lo", "length"),
            text_event(1, "", "stop"),
            b"data: "
            + orjson.dumps(
                {**head, "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3}}
            )
            + b"\n\n",
            b"data: [DONE]\n\n",
        ]
    )
    reader = assemble([stream], chat=False)
    body = reader.body()
    assert body["object"] == "text_completion" and body["id"] == "cmpl-9"
    assert [(c["index"], c["text"], c["finish_reason"]) for c in body["choices"]] == [
        (0, "Hello", "length"),
        (1, "Bye", "stop"),
    ]
    assert reader.chunks == 3  # the empty finishing text carries nothing


# -- broken streams ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {"index": [0], "delta": {"content": "x"}},  # an unhashable index
        {"index": "1", "delta": {"content": "x"}},
        {"index": 0, "delta": [1]},
        {"index": 0, "delta": "x"},
        {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": 5}}]}},
        {"index": 0, "delta": {"tool_calls": [{"function": {"arguments": [1]}}]}},
        {"index": 0, "delta": {"function_call": {"name": ["f"], "arguments": {"a": 1}}}},
        {"index": 0, "delta": {"tool_calls": 5}},
    ],
)
def test_malformed_chunk_fields_are_ignored_not_a_crash(bad):
    """A chunk with fields of the wrong type must not crash the run (only StreamError is
    caught by exec): what is well-formed is kept, the rest ignored."""
    stream = event([delta(0, role="assistant", content="a")]) + event([bad])
    reader = assemble([stream + event([delta(0, "stop", content="b")]) + b"data: [DONE]\n\n"])
    choices = reader.body()["choices"]
    assert [c["index"] for c in choices] == [0]
    assert choices[0]["message"]["content"] in ("ab", "axb")
    assert choices[0]["finish_reason"] == "stop"
    for call in choices[0]["message"].get("tool_calls", []):
        assert call["function"] == {"name": "", "arguments": ""}
    assert choices[0]["message"].get("function_call", {"name": ""})["name"] == ""


def test_choices_or_usage_of_the_wrong_type_are_not_a_crash():
    stream = event([delta(0, content="a")]) + b'data: {"choices": 5}\n\n'
    stream += event([delta(0, "stop")], usage={"completion_tokens": "many"}) + b"data: [DONE]\n\n"
    reader = assemble([stream])
    assert reader.body()["choices"][0]["message"]["content"] == "a"
    assert "tpot_s" not in reader.metrics(start=0.0, end=1.0)


@pytest.mark.parametrize(
    "bad",
    [
        b'data: {"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}\n\n',
        b'data: {"object": "error", "message": "engine died", "code": 500}\n\n',
        b'event: error\ndata: {"message": "engine died"}\n\n',
    ],
)
def test_error_event_mid_stream_is_a_stream_error(bad):
    reader = StreamReader()
    reader.feed(event([delta(0, content="partial")]), 0.0)
    with pytest.raises(StreamError) as caught:
        reader.feed(bad + b"data: [DONE]\n\n", 1.0)
    assert caught.value.code == "stream_error"
    assert "engine died" in str(caught.value)


def test_bad_json_event_is_a_stream_error_quoting_it():
    with pytest.raises(StreamError) as caught:
        assemble([b"data: {not json\n\n"])
    assert caught.value.code == "stream_error" and "{not json" in str(caught.value)


def test_two_objects_in_one_event_are_bad_json_not_two_events():
    good = event([delta(0, content="a")])
    with pytest.raises(StreamError) as caught:
        assemble([good + b'data: {"choices": []},{"choices": []}\n\n' + good])
    assert caught.value.code == "stream_error" and "bad JSON" in str(caught.value)


def test_done_as_a_second_data_line_of_an_event_is_bad_json():
    stream = event([delta(0, content="a")])[:-1] + b"data: [DONE]\n\n"  # one event, two lines
    with pytest.raises(StreamError) as caught:
        assemble([stream])
    assert caught.value.code == "stream_error"


def test_stream_cut_before_done_is_a_connection_error():
    cut = event([delta(0, content="half")])
    with pytest.raises(StreamError) as caught:
        assemble([cut])
    assert caught.value.code == "connection_error" and "[DONE]" in str(caught.value)
    with pytest.raises(StreamError):
        assemble([b""])  # nothing at all


def test_finished_stream_without_done_is_accepted():
    reader = assemble(
        [event([delta(0, "stop", content="ok")]) + event(usage={"completion_tokens": 1})]
    )
    assert reader.body()["choices"][0]["message"]["content"] == "ok"
    assert not reader.done


def test_events_after_done_are_ignored():
    reader = assemble(
        [event([delta(0, "stop", content="ok")]) + b"data: [DONE]\n\n" + b"data: {bad\n\n"]
    )
    assert reader.body()["choices"][0]["message"]["content"] == "ok"


# -- timing -----------------------------------------------------------------------------------------


def test_metrics_on_hand_computed_timings():
    """Start at t=10. The role-only chunk (empty content) is not the first token; two events
    that arrive in one read share its time."""
    reader = StreamReader()
    reader.feed(event([delta(0, role="assistant", content="")]), 10.1)
    reader.feed(event([delta(0, content="a")]), 10.5)  # first token: TTFT 0.5
    reader.feed(event([delta(0, reasoning_content="b")]), 10.7)  # gap 0.2
    reader.feed(event([delta(0, content="c")]) + event([delta(0, content="d")]), 11.0)  # 0.3, 0
    reader.feed(event([delta(0, "stop")]) + event(usage=USAGE) + b"data: [DONE]\n\n", 11.1)
    reader.close(11.2)
    metrics = reader.metrics(start=10.0, end=11.2)
    assert metrics == {
        "prompt_tokens": 7,
        "completion_tokens": 11,
        "ttft_s": 0.5,
        "tpot_s": pytest.approx((1.2 - 0.5) / 10, abs=1e-6),  # (E2EL - TTFT) / (11 - 1)
        "itl_mean_s": pytest.approx(0.5 / 3, abs=1e-6),
        "itl_p50_s": pytest.approx(0.2, abs=1e-6),
        "itl_p90_s": pytest.approx(0.28, abs=1e-6),  # gaps 0, 0.2, 0.3: rank 1.8
        "itl_p99_s": pytest.approx(0.298, abs=1e-6),  # rank 1.98
        "itl_max_s": pytest.approx(0.3, abs=1e-6),
        "chunks": 4,
        "reasoning_tokens": 3,
    }


def test_metrics_without_usage_or_tokens():
    """No usage: no token counts and no TPOT; one content chunk: no gaps."""
    reader = StreamReader()
    reader.feed(event([delta(0, "stop", content="x")]) + b"data: [DONE]\n\n", 3.0)
    reader.close(3.0)
    assert reader.metrics(start=1.0, end=3.5) == {"ttft_s": 2.0, "chunks": 1}


def test_tpot_needs_more_than_one_token_and_sglang_reasoning_tokens():
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "reasoning_tokens": 0}
    reader = StreamReader()
    reader.feed(event([delta(0, "stop", content="x")]) + event(usage=usage), 1.0)
    reader.close(1.0)
    metrics = reader.metrics(start=0.0, end=1.0)
    assert "tpot_s" not in metrics
    assert metrics["reasoning_tokens"] == 0 and metrics["completion_tokens"] == 1


async def test_read_stream_takes_reads_and_a_clock():
    times = iter([1.0, 2.0, 4.0, 4.5])

    async def reads():
        yield event([delta(0, content="a")])
        yield event([delta(0, content="b")])
        yield event([delta(0, "stop")]) + b"data: [DONE]\n\n"

    reader = await read_stream(reads(), clock=lambda: next(times))
    assert reader.body()["choices"][0]["message"]["content"] == "ab"
    metrics = reader.metrics(start=0.5, end=4.5)
    assert (metrics["ttft_s"], metrics["itl_max_s"], metrics["chunks"]) == (0.5, 1.0, 2)


def test_stream_body_asks_for_usage_and_keeps_other_options():
    body = stream_body({"model": "m", "stream_options": {"continuous_usage_stats": True}})
    assert body["stream"] is True
    assert body["stream_options"] == {"continuous_usage_stats": True, "include_usage": True}
    assert stream_body({"model": "m"})["stream_options"] == {"include_usage": True}

"""Tool calls through every stage (issue 43, item 6): hermes text read into `tool_calls`, the
mock writing calls as text, and the stages after exec (gen --continue, validate, export, post
votes, the contract per tool, report, the viewer) reading calls. Real mock servers over HTTP,
the real CLI, real files."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest
from batchutil import cli, exec_cli, odd_server, read_results, start_exec
from toolutil import answered_call

from jsonlbatch.batch_format.records import CHAT_URL
from jsonlbatch.exec.hooks.tool_call_parser import Malformed, parse_hermes

ORDER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_order",
        "description": "Look an order up",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}, "count": {"type": "integer"}},
            "required": ["order_id"],
        },
    },
}


def write_lines(path: Path, lines: list[dict]) -> None:
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))


def tool_requests(path: Path, count: int, **extra) -> list[dict]:
    lines = [
        {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": CHAT_URL,
            "body": {
                "model": "mock",
                "messages": [{"role": "user", "content": f"where is order {i}?"}],
                "tools": [ORDER_TOOL],
                "tool_choice": "required",
                **extra,
            },
        }
        for i in range(count)
    ]
    write_lines(path, lines)
    return lines


def text_server(text: str, answer_id: str | None = "chatcmpl-1"):
    """A server whose every chat answer is `text` (with no `id` when `answer_id` is None):
    (its URL, a function that stops it)."""
    from aiohttp import web

    async def answer(request: web.Request) -> web.Response:
        body = {"object": "chat.completion", "model": "mock",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}  # fmt: skip
        if answer_id is not None:
            body["id"] = answer_id
        return web.json_response(body)

    return odd_server(answer)


def calls_file(path: Path, calls: list, custom_id: str = "q") -> Path:
    """A response file of one answer that made `calls` (of any shape), as written elsewhere."""
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    body = {"id": "x", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}  # fmt: skip
    write_lines(path, [{"id": "b", "custom_id": custom_id, "error": None,
                        "response": {"status_code": 200, "request_id": "r", "body": body}}])  # fmt: skip
    return path


# -- 1 and 9: hermes text, written by the mock and read by exec ------------------------------------


def test_parse_hermes_reads_calls_as_vllm_does():
    text = (
        'Let me check.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>{"name": "b"}</tool_call>'
    )
    content, calls = parse_hermes(text, "seed")
    assert content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["a", "b"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"x": 1}, {}]
    assert calls[0]["id"] != calls[1]["id"] and calls[0]["id"].startswith("call_")
    assert parse_hermes(text, "seed") == (content, calls)  # ids are made, not drawn
    assert parse_hermes(text, "other")[1][0]["id"] != calls[0]["id"]
    # a last tag left unclosed (the answer ended there) is read too; only calls: content null
    assert parse_hermes('<tool_call>{"name": "a", "arguments": {}}', "s")[0] is None
    assert parse_hermes("no tags here", "s") is None
    with pytest.raises(Malformed):
        parse_hermes("<tool_call>{not json</tool_call>", "s")
    with pytest.raises(Malformed):
        parse_hermes('<tool_call>{"arguments": {}}</tool_call>', "s")


def test_parse_hermes_keeps_the_arguments_as_written():
    """An id of 30 digits stays those digits (read as a float past 64 bits, before: the order
    looked up was another); NaN is not JSON; nesting past the reader's depth is no call."""
    big = 123456789012345678901234567890
    _, (call,) = parse_hermes(f'<tool_call>{{"name": "a", "arguments": {{"id": {big}}}}}'
                              "</tool_call>", "s")  # fmt: skip
    assert call["function"]["arguments"] == f'{{"id":{big}}}'
    _, (call,) = parse_hermes('<tool_call>{"name": "a", "arguments": {"q": "é", "x": 1.5}}', "s")
    assert call["function"]["arguments"] == '{"q":"é","x":1.5}'
    for inner in ('{"name": "a", "arguments": {"x": NaN}}',
                  '{"name": "a", "arguments": {"x": ' + "[" * 5000 + "]" * 5000 + "}}"):  # fmt: skip
        with pytest.raises(Malformed):
            parse_hermes(f"<tool_call>{inner}</tool_call>", "s")


@pytest.mark.parametrize("stream", [False, True])
def test_exec_parses_the_mocks_hermes_text_into_tool_calls(tmp_path, mock_server, stream):
    url = mock_server(tool_call_format="hermes")
    requests, plain, parsed = tmp_path / "in.jsonl", tmp_path / "plain.jsonl", tmp_path / "p.jsonl"
    tool_requests(requests, 3)
    extra = ("--stream",) if stream else ()
    proc = exec_cli(requests, plain, "--url", url, "--quiet", *extra)
    assert proc.returncode == 0, proc.stderr
    for line in read_results(plain).values():  # the mock wrote the calls as text
        choice = line["response"]["body"]["choices"][0]
        assert "<tool_call>" in choice["message"]["content"] and choice["finish_reason"] == "stop"
        assert not choice["message"].get("tool_calls")
    proc = exec_cli(requests, parsed, "--url", url, "--quiet", "--parse-tool-calls", "hermes",
                    *extra)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    results = read_results(parsed)
    ids = set()
    for line in results.values():
        choice = line["response"]["body"]["choices"][0]
        calls = choice["message"]["tool_calls"]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
        assert len(calls) == 1 and calls[0]["function"]["name"] == "get_order"
        arguments = json.loads(calls[0]["function"]["arguments"])
        assert isinstance(arguments["order_id"], str)
        assert line["metrics"]["tool_parser"] == {"parser": "hermes", "calls": 1}
        ids.add(calls[0]["id"])
    assert len(ids) == 3


def test_the_mock_process_takes_the_format_flag(tmp_path, mock_process):
    server = mock_process("--tool-call-format", "hermes")
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    tool_requests(requests, 1)
    proc = exec_cli(requests, out, "--url", server.url, "-q", "--parse-tool-calls", "hermes")
    assert proc.returncode == 0, proc.stderr
    assert read_results(out)["c0"]["metrics"]["tool_parser"]["calls"] == 1
    bad = subprocess.run([sys.executable, "-m", "jsonlbatch.mock", "--port", "0",
                          "--tool-call-format", "mistral"], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert bad.returncode != 0 and "--tool-call-format must be one of" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_the_library_takes_the_option_and_sees_the_calls(tmp_path, mock_server):
    import jsonlbatch

    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    tool_requests(requests, 2)
    summary = jsonlbatch.execute(str(requests), str(out), urls=[mock_server(tool_call_format="hermes")],
                                 quiet=True, parse_tool_calls="hermes")  # fmt: skip
    for cid in ("c0", "c1"):
        message = summary.results[cid].body["choices"][0]["message"]
        assert message["tool_calls"][0]["function"]["name"] == "get_order"
    with pytest.raises(jsonlbatch.UsageError, match="parse-tool-calls"):
        jsonlbatch.execute(str(requests), str(tmp_path / "o2.jsonl"), urls=["http://127.0.0.1:9/v1"],
                           parse_tool_calls="mistral")  # fmt: skip


def test_the_cache_answers_parsed_too(tmp_path, mock_server):
    """An answer cached by a run without the parser is parsed when a later run reads it."""
    url = mock_server(tool_call_format="hermes")
    requests, cache = tmp_path / "in.jsonl", tmp_path / "cache"
    tool_requests(requests, 2)
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert exec_cli(requests, first, "--url", url, "-q", "--cache", str(cache)).returncode == 0
    proc = exec_cli(requests, second, "--url", url, "-q", "--cache", str(cache),
                    "--parse-tool-calls", "hermes")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for line in read_results(second).values():
        assert line["metrics"]["cache"] == "hit"
        assert line["response"]["body"]["choices"][0]["message"]["tool_calls"]


def test_malformed_hermes_text_is_left_as_it_is(tmp_path):
    """A tag around broken JSON: the answer is kept as the model wrote it, with the parser's
    error in the line; no crash, exit 0."""
    text = 'checking <tool_call>{"name": "get_order", "arguments": {"order_id": </tool_call>'
    url, stop = text_server(text)
    try:
        requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        tool_requests(requests, 1)
        proc = exec_cli(requests, out, "--url", url, "-q", "--parse-tool-calls", "hermes")
    finally:
        stop()
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    line = read_results(out)["c0"]
    message = line["response"]["body"]["choices"][0]["message"]
    assert message["content"] == text and "tool_calls" not in message
    assert "not JSON" in line["metrics"]["tool_parser"]["error"]


def test_hermes_text_is_read_only_from_answers_to_requests_that_offer_tools(tmp_path):
    """A request with no tools has no calls to make: an answer that quotes the Hermes form (a
    judge citing a transcript, a question about the format) is its text, as vLLM's parser
    leaves it. Before, it was rewritten into `tool_calls` and the quote was lost."""
    text = 'The agent wrote <tool_call>{"name": "refund", "arguments": {}}</tool_call>: wrong.'
    url, stop = text_server(text)
    try:
        requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        lines = tool_requests(requests, 3)
        del lines[0]["body"]["tools"], lines[0]["body"]["tool_choice"]  # a judge's: no tools
        lines[2]["body"]["tool_choice"] = "none"  # a last turn (gen.md: --param tool_choice=none)
        write_lines(requests, lines)
        proc = exec_cli(requests, out, "--url", url, "-q", "--parse-tool-calls", "hermes")
    finally:
        stop()
    assert proc.returncode == 0, proc.stderr
    results = read_results(out)
    for cid in ("c0", "c2"):
        choice = results[cid]["response"]["body"]["choices"][0]
        assert choice["message"] == {"role": "assistant", "content": text}
        assert choice["finish_reason"] == "stop" and "tool_parser" not in results[cid]["metrics"]
    assert results["c1"]["response"]["body"]["choices"][0]["message"]["tool_calls"]


def test_made_ids_differ_between_turns_of_one_conversation_without_answer_ids(tmp_path):
    """`gen --continue` keeps a conversation's custom_id from turn to turn, and some servers
    give every answer the same `id` (or none): the ids made for two turns' calls still differ,
    so a tool result answers one call (before: the second turn's call had the first's id)."""
    text = '<tool_call>{"name": "get_order", "arguments": {"order_id": "A17"}}</tool_call>'
    url, stop = text_server(text, answer_id=None)
    ids = []
    try:
        for turn, messages in enumerate(([{"role": "user", "content": "where is A17?"}],
                                         answered_call("call_x"))):  # fmt: skip
            requests, out = tmp_path / f"in{turn}.jsonl", tmp_path / f"out{turn}.jsonl"
            write_lines(requests, [{"custom_id": "conv", "method": "POST", "url": CHAT_URL,
                                    "body": {"model": "mock", "messages": messages,
                                             "tools": [ORDER_TOOL]}}])  # fmt: skip
            proc = exec_cli(requests, out, "--url", url, "-q", "--parse-tool-calls", "hermes")
            assert proc.returncode == 0, proc.stderr
            message = read_results(out)["conv"]["response"]["body"]["choices"][0]["message"]
            ids.append(message["tool_calls"][0]["id"])
    finally:
        stop()
    assert ids[0] != ids[1]


def test_parse_tool_calls_refuses_an_unknown_format(tmp_path):
    requests = tmp_path / "in.jsonl"
    tool_requests(requests, 1)
    proc = exec_cli(requests, tmp_path / "o.jsonl", "--url", "http://127.0.0.1:9/v1",
                    "--parse-tool-calls", "llama")  # fmt: skip
    assert proc.returncode == 2 and "llama" in proc.stderr
    proc = exec_cli(requests, tmp_path / "o.jsonl", "--url", "http://127.0.0.1:9/v1",
                    "--batch-api", "--parse-tool-calls", "hermes")  # fmt: skip
    assert proc.returncode == 2 and "--parse-tool-calls does not go with --batch-api" in proc.stderr


# -- 2: gen --continue keeps the calls and the tools -------------------------------------------


def test_gen_continue_keeps_tool_calls_and_carries_the_tools(tmp_path, mock_server):
    url = mock_server()
    requests, out, turn2 = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "t2.jsonl"
    tool_requests(requests, 2, parallel_tool_calls=False)
    assert exec_cli(requests, out, "--url", url, "-q").returncode == 0
    answers = read_results(out)
    proc = cli("gen", "--responses", str(out), "--requests", str(requests), "--continue",
               "--prompt", "and the refund?", "--model", "mock", "-o", str(turn2))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for line in (orjson.loads(x) for x in turn2.read_bytes().splitlines()):
        cid, body = line["custom_id"], line["body"]
        sent = answers[cid]["response"]["body"]["choices"][0]["message"]
        assistant = body["messages"][-2]
        assert assistant == {"role": "assistant", "content": None,
                             "tool_calls": sent["tool_calls"]}  # fmt: skip
        assert body["messages"][-1] == {"role": "user", "content": "and the refund?"}
        assert body["tools"] == [ORDER_TOOL] and body["tool_choice"] == "required"
        assert body["parallel_tool_calls"] is False
    # the writer's own setting wins over the carried one
    again = tmp_path / "t3.jsonl"
    proc = cli("gen", "--responses", str(out), "--requests", str(requests), "--continue",
               "--prompt", "done?", "--model", "mock", "--param", "tool_choice=none",
               "-o", str(again))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    first = orjson.loads(again.read_bytes().splitlines()[0])
    assert first["body"]["tool_choice"] == "none" and first["body"]["tools"] == [ORDER_TOOL]


# -- 3: a tool message that answers no call ------------------------------------------------------


def test_validate_and_exec_refuse_a_tool_message_that_answers_no_call(tmp_path, mock_server):
    good = answered_call("call_1")
    orphan = [*good, {"role": "tool", "tool_call_id": "call_9", "content": "x"}]
    unnamed = [good[0], {"role": "tool", "content": "x"}]
    lines = [
        {"custom_id": cid, "method": "POST", "url": CHAT_URL,
         "body": {"model": "mock", "messages": m, "tools": [ORDER_TOOL]}}
        for cid, m in (("ok", good), ("orphan", orphan), ("unnamed", unnamed))
    ]  # fmt: skip
    requests = tmp_path / "in.jsonl"
    write_lines(requests, lines)
    proc = cli("validate", str(requests))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    said = proc.stdout + proc.stderr
    assert f"{requests}:2: body.messages[3].tool_call_id" in said and "'call_9'" in said
    assert f"{requests}:3: body.messages[1].tool_call_id" in said
    assert ":1:" not in said
    out = tmp_path / "out.jsonl"
    proc = exec_cli(requests, out, "--url", mock_server(), "-q")
    assert proc.returncode == 1 and "body.messages[3].tool_call_id" in proc.stderr
    assert not out.exists() or out.read_bytes() == b""
    write_lines(requests, lines[:1])
    assert cli("validate", str(requests)).returncode == 0


def test_validate_refuses_an_assistant_turn_whose_calls_are_no_calls(tmp_path):
    """`gen --continue` carries an answer's calls as the server wrote them, and a response
    file is hostile input: calls that are no calls (a string, an entry without an id or a
    function name) are refused naming the field, not sent for a 400 per line (before: "ok")."""
    good = answered_call("call_1")
    odd = {"as text": "call it", "no id": [{"type": "function", "function": {"name": "f"}}],
           "name a list": [{"id": "c", "type": "function", "function": {"name": ["f"]}}],
           "function text": [{"id": "c", "type": "function", "function": "f"}]}  # fmt: skip
    lines = [{"custom_id": "ok", "method": "POST", "url": CHAT_URL,
              "body": {"model": "mock", "messages": good}}]  # fmt: skip
    for cid, calls in odd.items():
        messages = [good[0], {"role": "assistant", "content": None, "tool_calls": calls}]
        lines.append({"custom_id": cid, "method": "POST", "url": CHAT_URL,
                      "body": {"model": "mock", "messages": messages}})  # fmt: skip
    requests = tmp_path / "in.jsonl"
    write_lines(requests, lines)
    proc = cli("validate", str(requests))
    said = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in said
    assert f"{requests}:2: body.messages[1].tool_calls: must be a list of calls" in said
    for n in (3, 4, 5):
        assert f"{requests}:{n}: body.messages[1].tool_calls[0]: a call is an object" in said
    assert ":1:" not in said


# -- 4: export's tool-calls column ----------------------------------------------------------------


def test_export_has_a_tool_calls_column(tmp_path, mock_server):
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    tool_requests(requests, 2)
    write_lines(tmp_path / "plain.jsonl", [{
        "custom_id": "text", "method": "POST", "url": CHAT_URL,
        "body": {"model": "mock", "messages": [{"role": "user", "content": "hi"}]}}])  # fmt: skip
    with requests.open("ab") as f:
        f.write((tmp_path / "plain.jsonl").read_bytes())
    assert exec_cli(requests, out, "--url", mock_server(), "-q").returncode == 0
    answers = read_results(out)
    table = tmp_path / "t.jsonl"
    proc = cli("export", str(out), "--column", "custom_id", "--column", "calls=tool_calls",
               "-o", str(table))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = {r["custom_id"]: r for r in map(orjson.loads, table.read_bytes().splitlines())}
    assert set(rows["c0"]) == {"custom_id", "calls"} and rows["text"]["calls"] is None
    for cid in ("c0", "c1"):
        call = answers[cid]["response"]["body"]["choices"][0]["message"]["tool_calls"][0]
        expected = {"name": "get_order", "arguments": json.loads(call["function"]["arguments"])}
        assert json.loads(rows[cid]["calls"]) == [expected]


# -- 5: post votes on a call ---------------------------------------------------------------------


def test_post_votes_vote_on_the_tool_call(tmp_path, mock_server):
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    tool_requests(requests, 2, n=3)
    assert exec_cli(requests, out, "--url", mock_server(), "-q").returncode == 0
    answers = read_results(out)
    votes = tmp_path / "votes.jsonl"
    assert "tool:PATH" in cli("post", "votes", "--help").stdout  # a newcomer finds it
    proc = cli("post", "votes", str(out), "--extract", "tool:name", "-o", str(votes))
    assert proc.returncode == 0, proc.stderr
    lines = {x["id"]: x for x in map(orjson.loads, votes.read_bytes().splitlines())}
    assert {i: (x["answer"], x["votes"], x["total"]) for i, x in lines.items()} == {
        "c0": ("get_order", 3, 3), "c1": ("get_order", 3, 3)}  # fmt: skip
    proc = cli("post", "votes", str(out), "--extract", "tool:arguments.order_id",
               "--normalize", "none", "-o", str(votes))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = {x["id"]: x for x in map(orjson.loads, votes.read_bytes().splitlines())}
    for cid, line in lines.items():
        said = [json.loads(c["message"]["tool_calls"][0]["function"]["arguments"])["order_id"]
                for c in answers[cid]["response"]["body"]["choices"]]  # fmt: skip
        assert "[invalid]" not in line["tally"]
        assert sorted(line["tally"].items()) == sorted({a: said.count(a) for a in said}.items())
    assert cli("post", "votes", str(out), "--extract", "tool:order_id", "-o",
               str(votes)).returncode == 2  # fmt: skip


# -- 6: the contract holds a call to its tool's schema ------------------------------------------

ANSWER_SCHEMA = {"type": "object", "properties": {"status": {"type": "string"}},
                 "required": ["status"], "additionalProperties": False}  # fmt: skip


def contract_server(first_arguments: dict, hold: threading.Event | None = None):
    """A server that calls get_order with `first_arguments`, with {"order_id": "A17"} once a
    tool message answered a call, and with the final JSON answer after a tool's real result;
    the bodies it got are kept. With `hold` set, a feedback ask is held unanswered (for a
    kill -9 while it is in flight)."""
    import asyncio

    from aiohttp import web

    bodies: list[dict] = []

    async def answer(request: web.Request) -> web.Response:
        body = await request.json()
        bodies.append(body)
        last = body["messages"][-1]
        while hold is not None and hold.is_set() and last["role"] == "tool":
            await asyncio.sleep(0.05)
        if last["role"] == "tool" and last["content"].startswith("shipped"):
            message = {"role": "assistant", "content": '{"status": "shipped"}'}
            finish = "stop"
        else:
            arguments = {"order_id": "A17"} if last["role"] == "tool" else first_arguments
            call = {
                "id": f"call_{len(bodies)}",
                "type": "function",
                "function": {"name": "get_order", "arguments": json.dumps(arguments)},
            }
            message, finish = {"role": "assistant", "content": None, "tool_calls": [call]}, \
                "tool_calls"  # fmt: skip
        return web.json_response({
            "id": f"chatcmpl-{len(bodies)}", "object": "chat.completion", "model": "mock",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}})  # fmt: skip

    url, stop = odd_server(answer)
    return url, stop, bodies


def contract_requests(path: Path, messages: list[dict] | None = None) -> None:
    from jsonlbatch.answer_contract.schema_forms import with_schema

    body = {"model": "mock", "tools": [ORDER_TOOL],
            "messages": messages or [{"role": "user", "content": "where is A17?"}]}  # fmt: skip
    line = {"custom_id": "c0", "method": "POST", "url": CHAT_URL,
            "body": with_schema(CHAT_URL, body, ANSWER_SCHEMA)}  # fmt: skip
    write_lines(path, [line])


def test_a_valid_call_is_checked_against_its_tool_not_the_answer_schema(tmp_path):
    url, stop, bodies = contract_server({"order_id": "A17", "count": 2})
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    contract_requests(requests)
    try:
        proc = exec_cli(requests, out, "--url", url, "-q", "--reask", "2")
    finally:
        stop()
    assert proc.returncode == 0, proc.stderr
    record = read_results(out)["c0"]["metrics"]["contract"]
    assert record["valid"] is True and record["asks"] == 1 and len(bodies) == 1


def test_a_call_that_breaks_its_tool_is_re_asked_with_a_tool_message(tmp_path):
    url, stop, bodies = contract_server({"order_id": 17})  # an integer: the tool wants a string
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    contract_requests(requests)
    try:
        proc = exec_cli(requests, out, "--url", url, "-q", "--reask", "1", "--reask-feedback")
    finally:
        stop()
    assert proc.returncode == 0, proc.stderr
    line = read_results(out)["c0"]
    record = line["metrics"]["contract"]
    assert record["valid"] is True and record["asks"] == 2 and len(bodies) == 2
    feedback = bodies[1]["messages"]
    assert feedback[1]["tool_calls"][0]["id"] == "call_1"
    assert feedback[2]["role"] == "tool" and feedback[2]["tool_call_id"] == "call_1"
    assert "call 1 to get_order" in feedback[2]["content"] and "order_id" in feedback[2]["content"]
    assert bodies[1]["tools"] == [ORDER_TOOL]
    call = line["response"]["body"]["choices"][0]["message"]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"order_id": "A17"}


def test_without_re_asks_a_broken_call_fails_naming_the_tool(tmp_path):
    url, stop, _ = contract_server({"count": 1})  # order_id is required
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    contract_requests(requests)
    try:
        proc = exec_cli(requests, out, "--url", url, "-q")
    finally:
        stop()
    assert proc.returncode == 3, proc.stderr
    line = read_results(out)["c0"]
    assert line["error"]["code"] == "schema_invalid"
    assert (
        "call 1 to get_order" in line["error"]["message"] and "order_id" in line["error"]["message"]
    )


def test_the_final_answer_still_holds_the_answer_schema(tmp_path):
    url, stop, _ = contract_server({"order_id": "A17"})
    messages = answered_call("call_0", "shipped on Monday")
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    contract_requests(requests, messages)
    try:
        proc = exec_cli(requests, out, "--url", url, "-q")
    finally:
        stop()
    assert proc.returncode == 0, proc.stderr
    record = read_results(out)["c0"]["metrics"]["contract"]
    assert record["valid"] is True and record["choices"][0]["value"] == {"status": "shipped"}


def test_a_tools_unusable_schema_stops_the_run_before_sending(tmp_path):
    from jsonlbatch.answer_contract.schema_forms import with_schema

    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}
    body = {"model": "mock", "tools": [ORDER_TOOL, bad],
            "messages": [{"role": "user", "content": "x"}]}  # fmt: skip
    requests = tmp_path / "in.jsonl"
    write_lines(requests, [{"custom_id": "c0", "method": "POST", "url": CHAT_URL,
                            "body": with_schema(CHAT_URL, body, ANSWER_SCHEMA)}])  # fmt: skip
    proc = cli("validate", str(requests))
    assert proc.returncode == 1 and "body.tools[1].function.parameters" in proc.stdout + proc.stderr


# -- 7: report counts calls per tool and turns per conversation -----------------------------------


def test_report_counts_calls_per_tool_and_turns_per_conversation(tmp_path, mock_server):
    lookup = {"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}}}}  # fmt: skip
    turns = {"a": 1, "b": 3, "c": 3, "d": 2}  # conversation -> its turns
    lines = []
    for conv, count in turns.items():
        for t in range(1, count + 1):
            last = t == count  # the last turn answers in text; the others call a tool
            tool = ORDER_TOOL if t % 2 else lookup
            body = {"model": "mock", "messages": [{"role": "user", "content": f"{conv} {t}"}]}
            if not last:
                body |= {"tools": [tool], "tool_choice": "required"}
            lines.append({"custom_id": f"{conv}#t{t}", "method": "POST", "url": CHAT_URL,
                          "body": body})  # fmt: skip
    lines.append({"custom_id": "b#t2.ask1", "method": "POST", "url": CHAT_URL,
                  "body": {"model": "mock", "messages": [{"role": "user", "content": "?"}]}})  # fmt: skip
    requests, calls = tmp_path / "in.jsonl", tmp_path / "conv.calls.jsonl"
    write_lines(requests, lines)
    assert exec_cli(requests, calls, "--url", mock_server(), "-q").returncode == 0
    proc = cli("report", str(calls), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    run = orjson.loads(proc.stdout)["runs"][0]
    # calls: b t1 get_order, b t2 lookup, c t1 get_order, c t2 lookup, d t1 get_order
    assert run["tool_calls"] == {"get_order": 3, "lookup": 2}
    assert run["turns"] == {"1": 1, "2": 1, "3": 2} and run["conversations"] == 4
    assert run["asks"] == 1
    text = cli("report", str(calls))
    assert text.returncode == 0, text.stderr
    assert "Tool calls (by tool name)" in text.stdout and "get_order" in text.stdout
    assert "conversations of 3 turns" in text.stdout
    assert "turns per conversation, max" in text.stdout


def test_report_counts_made_up_tool_names_within_bounds(tmp_path):
    """Names read from hermes text are the model's own words: a model that makes up a name per
    call (or writes a 20 KB one) gets a report of bounded size, the rest counted together."""
    from jsonlbatch.report.conversations import MAX_TOOL_NAMES, OTHER_TOOLS

    calls = [{"id": f"c{i}", "type": "function",
              "function": {"name": f"get_order_{i}", "arguments": "{}"}} for i in range(500)]  # fmt: skip
    calls.insert(0, {"id": "x", "type": "function", "function": {"name": "n" * 20_000}})
    out = calls_file(tmp_path / "out.jsonl", calls)
    proc = cli("report", str(out), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    counted = orjson.loads(proc.stdout)["runs"][0]["tool_calls"]
    assert len(counted) == MAX_TOOL_NAMES + 1 and sum(counted.values()) == 501
    assert counted[OTHER_TOOLS] == 501 - MAX_TOOL_NAMES
    assert max(len(name) for name in counted) <= 100


def test_turns_per_conversation_from_turn_counts():
    from collections import Counter

    from jsonlbatch.report.conversations import turn_figures, turns_per_conversation

    # four conversations of 1, 2, 3 and 3 turns, numbered from 0
    histogram = turns_per_conversation(Counter({0: 4, 1: 3, 2: 2}))
    assert histogram == {1: 1, 2: 1, 3: 2}
    assert turn_figures(histogram) == {"mean": 2.25, "p50": 2, "p90": 3, "max": 3}


# -- 8: the viewer shows a conversation as a thread -------------------------------------------------


def thread_files(tmp_path: Path, url: str) -> tuple[Path, Path]:
    """A two-call conversation (a call, its result, a second turn that calls again) sent to the
    mock: its request and response files."""
    messages = answered_call()
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_lines(requests, [{"custom_id": "conv#t2", "method": "POST", "url": CHAT_URL,
                            "body": {"model": "mock", "messages": messages, "tools": [ORDER_TOOL],
                                     "tool_choice": "required"}}])  # fmt: skip
    assert exec_cli(requests, out, "--url", url, "-q").returncode == 0
    return requests, out


def test_the_viewer_shows_calls_and_results_with_their_ids(tmp_path, mock_server):
    import urllib.request

    from viewutil import ViewProcess

    requests, out = thread_files(tmp_path, mock_server())
    answer = read_results(out)["conv#t2"]["response"]["body"]["choices"][0]["message"]
    proc = ViewProcess(str(out), "--requests", str(requests))
    try:
        with urllib.request.urlopen(proc.url + "api/line?row=0", timeout=30) as response:
            line = json.loads(response.read())
    finally:
        proc.close()
    user, assistant, tool = line["prompt"]
    assert [user["role"], assistant["role"], tool["role"]] == ["user", "assistant", "tool"]
    assert assistant["calls"] == [{"id": "call_abc", "name": "get_order",
                                   "arguments": '{\n  "order_id": "A17"\n}'}]  # fmt: skip
    assert tool["tool_call_id"] == "call_abc" and tool["name"] == "get_order"
    assert tool["text"] == "shipped Monday"
    assert [(c["custom_id"], c["turn"]) for c in line["conversation"]] == [("conv#t2", 2)]
    assert line["conversation"][0]["summary"] == "calls get_order"
    made = line["choices"][0]["calls"]
    assert [(c["id"], c["name"]) for c in made] == [(answer["tool_calls"][0]["id"], "get_order")]
    assert json.loads(made[0]["arguments"]) == json.loads(
        answer["tool_calls"][0]["function"]["arguments"]
    )


def test_hermes_calls_are_parsed_before_the_contract_checks_them(tmp_path, mock_server):
    """The parser runs first: the contract sees the call (held to its tool's schema), not the
    text (which would break the answer schema)."""
    url = mock_server(tool_call_format="hermes")
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    contract_requests(requests)
    line = orjson.loads(requests.read_bytes())
    line["body"]["tool_choice"] = "required"
    write_lines(requests, [line])
    proc = exec_cli(requests, out, "--url", url, "-q", "--parse-tool-calls", "hermes")
    assert proc.returncode == 0, proc.stderr
    result = read_results(out)["c0"]
    assert result["metrics"]["contract"]["valid"] is True
    assert result["metrics"]["tool_parser"]["calls"] == 1
    # without the parser the same text is an answer, and breaks the answer schema
    proc = exec_cli(requests, tmp_path / "raw.jsonl", "--url", url, "-q")
    assert proc.returncode == 3
    assert read_results(tmp_path / "raw.jsonl")["c0"]["error"]["code"] == "schema_invalid"


@pytest.mark.slow
def test_kill_9_during_a_tool_feedback_re_ask_resumes_at_that_ask(tmp_path):
    """exec killed while the re-ask of a broken call is in flight: the same command sends that
    re-ask (the call and its tool message) again, never the first ask, and ends with one line."""
    hold = threading.Event()
    hold.set()
    url, stop, bodies = contract_server({"order_id": 17}, hold)
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    contract_requests(requests)
    args = ("--url", url, "-q", "--reask", "2", "--reask-feedback")
    try:
        proc = start_exec(requests, out, *args)
        deadline = time.monotonic() + 60
        while len(bodies) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert len(bodies) == 2, proc.stderr.read() if proc.poll() is not None else bodies
        proc.kill()
        proc.wait(10)
        hold.clear()
        done = exec_cli(requests, out, *args)
    finally:
        hold.clear()
        stop()
    assert done.returncode == 0, done.stderr
    assert len(bodies) == 3  # the first ask once; the re-ask twice (in flight at the kill)
    assert bodies[2]["messages"] == bodies[1]["messages"]
    assert bodies[2]["messages"][-1]["role"] == "tool"
    line = read_results(out)["c0"]
    assert line["metrics"]["contract"]["valid"] is True and line["metrics"]["contract"]["asks"] == 2


def test_a_tool_feedback_re_ask_resumes_from_the_journal(tmp_path):
    """A run killed after journaling a re-ask of a broken call goes on with the same feedback
    turns: the journal keeps the turn's calls, not only its text."""
    from jsonlbatch.batch_format.records import Request
    from jsonlbatch.exec.hooks.contract_check import AnswerChecker, journal_path

    contract_requests(tmp_path / "in.jsonl")
    line = orjson.loads((tmp_path / "in.jsonl").read_bytes())
    out = tmp_path / "out.jsonl"
    turn = answered_call("call_x")[1]
    entry = {"custom_id": "c0", "fingerprint": "f", "asks": 1, "attempts": 1, "answer": turn,
             "error": "call 1 to get_order: at $.order_id: 17 is not of type 'string'"}  # fmt: skip
    Path(journal_path(str(out))).write_bytes(orjson.dumps(entry) + b"\n")
    checker = AnswerChecker(str(out), reask=2, feedback=True)
    sent = checker.begin(Request("c0", CHAT_URL, line["body"], 1, fingerprint="f"))
    *_, assistant, tool = sent.body["messages"]
    assert assistant["tool_calls"] == turn["tool_calls"]
    assert tool["role"] == "tool" and tool["tool_call_id"] == "call_x"
    assert "17 is not of type 'string'" in tool["content"]


def test_odd_tool_calls_in_a_response_file_break_no_reader(tmp_path):
    """A response file from elsewhere with tool calls of every wrong shape: export, votes,
    report and the viewer read it without a traceback."""
    from viewutil import ViewProcess

    odd = [1, {"function": 5}, {"id": 3, "function": {"name": 7, "arguments": {"a": 1}}},
           {"function": {"name": "f", "arguments": "{not json"}}]  # fmt: skip
    out = calls_file(tmp_path / "out.jsonl", odd, "q#t1")
    for args in (("export", str(out), "-o", str(tmp_path / "t.jsonl")),
                 ("post", "votes", str(out), "--extract", "tool:arguments.a",
                  "-o", str(tmp_path / "v.jsonl")),
                 ("report", str(out))):  # fmt: skip
        proc = cli(*args)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.stderr)
    row = orjson.loads((tmp_path / "t.jsonl").read_bytes())
    assert json.loads(row["tool_calls"])[-1] == {"name": "f", "arguments": "{not json"}
    proc = ViewProcess(str(out))
    try:
        import urllib.request

        with urllib.request.urlopen(proc.url + "api/line?row=0", timeout=30) as response:
            line = json.loads(response.read())
    finally:
        proc.close()
    assert [c["name"] for c in line["choices"][0]["calls"]] == [None, None, "f"]


def test_a_conversation_listing_is_bounded():
    from jsonlbatch.view.thread import MAX_LINES, conversation_lines

    class Index:  # every turn and ask exists: the listing still ends
        lookups = 0

        def find(self, custom_id: str) -> list[int]:
            Index.lookups += 1
            return [0]

        def read(self, row: int) -> bytes:
            return b"{}"

    assert len(conversation_lines(Index(), "c#t5")) == MAX_LINES
    Index.lookups = 0
    assert conversation_lines(Index(), "c#t999999")[0]["turn"] == 999999 - MAX_LINES
    assert Index.lookups <= MAX_LINES + 1
    assert conversation_lines(Index(), "plain-id") == []


def test_tool_extractors_are_bounded_on_hostile_arguments():
    """A model writes any text as arguments: nested past what Python's json reads or writes
    back, a `tool:` extractor finds no field there (the next one is tried), never a traceback."""
    from jsonlbatch.post.extract import extract_answer

    for depth in (100_000, 980, 995):
        deep = '{"a": ' + "[" * depth + "]" * depth + "}"
        calls = [{"function": {"name": "f", "arguments": deep}}]
        assert extract_answer("the text", ["tool:arguments.a", "full"], calls=calls) in (
            "the text", "[" * depth + "]" * depth)  # fmt: skip
        assert extract_answer("", ["tool:name"], calls=calls) == "f"

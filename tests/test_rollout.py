"""`jsonlbatch rollout` and `jsonlbatch.rollout`: conversations with tools against the mock
over 127.0.0.1 (issue 43, items 1-5)."""

from __future__ import annotations

import asyncio
import json
import os
import types

import pytest

import jsonlbatch
from jsonlbatch.mock.content import compose
from tests.rollout_helpers import TOOLS, TOOLS_PY, by_id, cli, lines, write_requests, write_tools


@pytest.fixture
def log_env(tmp_path, monkeypatch):
    log = tmp_path / "ran.log"
    monkeypatch.setenv("ROLLOUT_TEST_LOG", str(log))
    return log


def test_the_command_runs_conversations_with_tools_asks_and_a_calls_file(
    tmp_path, mock_server, log_env
):
    url = mock_server(tool_rate=0.6)
    requests = write_requests(tmp_path / "req.jsonl", 24)
    tools = write_tools(tmp_path)
    out = tmp_path / "conv.jsonl"
    done = cli("rollout", str(requests), "-o", str(out), "--tools", str(tools), "--url", url,
               "-q", env={**os.environ, "ROLLOUT_TEST_LOG": str(log_env)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    conversations = by_id(out)
    assert sorted(conversations) == sorted(f"c{i}" for i in range(24))
    calls = by_id(tmp_path / "conv.calls.jsonl")
    used = [c for c in conversations.values() if c["tool_calls"]]
    assert used, "a tool rate of 0.6 calls tools"
    for conv in conversations.values():
        assert conv["status"] == "completed"
        assert conv["messages"][-1]["role"] == "assistant"
        assert "tool_calls" not in conv["messages"][-1]
        assert conv["turns"] == sum(m["role"] == "assistant" for m in conv["messages"])
        for turn in range(1, conv["turns"] + 1):  # every turn is a response line of its own
            assert calls[f"{conv['custom_id']}#t{turn}"]["response"]["status_code"] == 200
        for i, message in enumerate(conv["messages"]):
            for call in message.get("tool_calls", []):  # each call answered by its id
                assert conv["messages"][i + 1]["tool_call_id"] == call["id"]
    asks = [cid for cid in calls if ".ask" in cid]
    assert asks and all(cid.split("#t")[0] in conversations for cid in asks)
    assert len(calls) == sum(c["turns"] for c in conversations.values()) + len(asks)
    tool_lines = log_env.read_text().splitlines()
    assert len(tool_lines) == sum(c["tool_calls"] for c in conversations.values())
    report = cli("report", str(tmp_path / "conv.calls.jsonl"))  # any exec output's reader
    assert report.returncode == 0, report.stderr


def test_the_library_takes_a_dict_or_a_module_and_exec_option_names(tmp_path, mock_server):
    url = mock_server(tool_rate=0.8)
    requests = write_requests(tmp_path / "req.jsonl", 6, tools=TOOLS[:1])
    seen = []

    def lookup(q):
        conv = jsonlbatch.current_conversation()
        seen.append((conv.id, conv.turn, q))
        return f"result for {q}"

    summary = jsonlbatch.rollout(requests, tmp_path / "a.jsonl", tools={"lookup": lookup},
                                 urls=[url], concurrency=4, quiet=True, max_turns=3)  # fmt: skip
    assert summary.conversations == 6 and summary.tool_calls == len(seen) > 0
    module = types.ModuleType("my_tools")
    module.lookup = lookup
    lookup.__module__ = "my_tools"
    out = tmp_path / "b.jsonl"
    summary = asyncio.run(jsonlbatch.arollout(requests, out, tools=module, url=url, quiet=True,
                                              max_turns=3))  # fmt: skip
    assert summary.ended == 6
    first = {c["custom_id"]: c["messages"] for c in lines(tmp_path / "a.jsonl")}
    assert {c["custom_id"]: c["messages"] for c in lines(out)} == first  # same conversations
    with pytest.raises(jsonlbatch.UsageError, match="unknown option 'concurrencyy'"):
        jsonlbatch.rollout(requests, tmp_path / "c.jsonl", tools={"lookup": lookup}, url=url,
                           concurrencyy=3)  # fmt: skip


def test_no_barrier_a_fast_conversation_goes_on_while_a_slow_tool_runs(tmp_path, mock_server):
    url = mock_server(tool_rate=1.0)
    requests = write_requests(tmp_path / "req.jsonl", 2, tools=TOOLS[:1])

    async def lookup(q):
        if jsonlbatch.current_conversation().id == "c0":
            await asyncio.sleep(1.5)
        return q

    jsonlbatch.rollout(requests, tmp_path / "conv.jsonl", tools={"lookup": lookup}, urls=[url],
                       quiet=True, max_turns=4)  # fmt: skip
    order = [line["custom_id"] for line in lines(tmp_path / "conv.calls.jsonl")]
    # c1 made all its turns while c0's first tool still ran: a per-turn barrier cannot do that
    assert order.index("c1#t4") < order.index("c0#t2")
    statuses = {c["custom_id"]: c["status"] for c in lines(tmp_path / "conv.jsonl")}
    assert statuses == {"c0": "max_turns", "c1": "max_turns"}


def test_state_per_conversation_and_final_state_user_turn(tmp_path, mock_server):
    url = mock_server(tool_rate=0.7)
    requests = write_requests(tmp_path / "req.jsonl", 5, tools=TOOLS[:1])
    text = """
import jsonlbatch

def new_state(line):
    return {"id": line["custom_id"], "lookups": []}

def lookup(q):
    state = jsonlbatch.current_conversation().state
    state["lookups"].append(q)
    return len(state["lookups"])

def user_turn(messages):
    asked = sum(m["role"] == "user" for m in messages)
    return "and then?" if asked < 3 else None

def final_state(state):
    return state
"""
    tools = write_tools(tmp_path, text)
    summary = jsonlbatch.rollout(requests, tmp_path / "conv.jsonl", tools=tools, urls=[url],
                                 quiet=True)  # fmt: skip
    assert summary.statuses["completed"] == 5
    for conv in lines(tmp_path / "conv.jsonl"):
        final = conv["final_state"]
        assert final["id"] == conv["custom_id"]  # its own state, not another's
        assert len(final["lookups"]) == conv["tool_calls"]
        assert sum(m["role"] == "user" for m in conv["messages"]) == 3  # two simulated turns


def test_max_turns_ends_a_model_that_never_stops_calling_tools(tmp_path, mock_server):
    url = mock_server()
    requests = write_requests(tmp_path / "req.jsonl", 3, tools=TOOLS[:1], tool_choice="required")
    summary = jsonlbatch.rollout(requests, tmp_path / "conv.jsonl", tools={"lookup": lambda q: q},
                                 urls=[url], quiet=True, max_turns=3)  # fmt: skip
    assert summary.statuses == {"max_turns": 3}
    for conv in lines(tmp_path / "conv.jsonl"):
        assert conv["status"] == "max_turns" and conv["turns"] == 3
        assert conv["messages"][-1]["role"] == "assistant"  # its calls are not run


def test_tool_failures_become_error_messages_and_are_counted(tmp_path, mock_server):
    url = mock_server(tool_rate=1.0)
    schema = {"type": "object", "properties": {"x": {"type": "string"}}}
    names = ["raises", "missing", "hangs", "not_json", "asks_nobody", "absent"]
    tools = [{"type": "function", "function": {"name": n, "parameters": schema}} for n in names]
    requests = write_requests(tmp_path / "req.jsonl", 24, tools=tools)
    text = """
import asyncio
import json
import jsonlbatch

def raises(x=None):
    raise ValueError("no such order")

def missing(x, order_id):
    return "unreachable"

async def hangs(x=None):
    await asyncio.sleep(60)

def not_json(x=None):
    return object()

async def asks_nobody(x=None):
    conv = jsonlbatch.current_conversation()
    await conv.ask({"model": "nobody-serves-this", "messages": [{"role": "user", "content": "?"}]})
"""
    out = tmp_path / "conv.jsonl"
    done = cli("rollout", str(requests), "-o", str(out), "--tools",
               str(write_tools(tmp_path, text)), "--url", url, "--tool-timeout", "0.3",
               "--max-turns", "2", "-c", "24")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    contents = [m["content"] for c in lines(out) for m in c["messages"] if m["role"] == "tool"]
    expected = {
        "raises": "raises raised ValueError: no such order",
        "missing": "missing a required argument: 'order_id'",
        "hangs": "hangs timed out after 0.3s",
        "not_json": "not_json returned a object, which is not JSON",
        "asks_nobody": "nobody-serves-this",
        "absent": "unknown tool 'absent'",
    }
    for name, text in expected.items():
        assert any(text in c for c in contents), (name, contents)
    assert all(c.startswith("error: ") for c in contents)
    total = sum(c["tool_errors"] for c in lines(out))
    assert total == len(contents) and f"({total} tool errors)" in done.stderr


def test_a_tools_file_that_does_not_import_is_a_clean_error(tmp_path, mock_server):
    requests = write_requests(tmp_path / "req.jsonl", 2)
    tools = write_tools(tmp_path, "import os\n\ndef f():\n    pass\n\nraise RuntimeError('boom')\n")
    out = tmp_path / "conv.jsonl"
    done = cli("rollout", str(requests), "-o", str(out), "--tools", str(tools), "--url",
               mock_server())  # fmt: skip
    assert done.returncode == 1
    assert "does not import: RuntimeError: boom (line 6)" in done.stderr
    assert str(tools) in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()


def test_an_edited_first_turn_is_refused_as_exec_refuses_an_edited_request(tmp_path, mock_server):
    url = mock_server(tool_rate=0.5)
    requests = write_requests(tmp_path / "req.jsonl", 4, tools=TOOLS[:1])
    out = tmp_path / "conv.jsonl"
    jsonlbatch.rollout(requests, out, tools={"lookup": lambda q: q}, urls=[url], quiet=True)
    before = out.read_bytes()
    text = requests.read_text().replace("task 2", "task two")
    requests.write_text(text)
    done = cli("rollout", str(requests), "-o", str(out), "--tools",
               str(write_tools(tmp_path, "def lookup(q):\n    return q\n")), "--url", url)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "1 conversation changed since" in done.stderr and "(c2)" in done.stderr
    assert out.read_bytes() == before


def test_options_a_rollout_cannot_honour_are_refused(tmp_path, mock_server):
    requests = write_requests(tmp_path / "req.jsonl", 1)
    tools = write_tools(tmp_path, "def lookup(q):\n    return q\n")
    for extra in (["--dry-run"], ["--retry-failed"], ["--changed", "resend"]):
        done = cli("rollout", str(requests), "-o", str(tmp_path / "c.jsonl"), "--tools",
                   str(tools), "--url", mock_server(), *extra)  # fmt: skip
        assert done.returncode == 2, (extra, done.stderr)
        assert "does not go with rollout" in done.stderr


def test_a_budget_stops_conversations_cleanly_and_the_next_run_goes_on(tmp_path, mock_server):
    url = mock_server(tool_rate=0.8)
    requests = write_requests(tmp_path / "req.jsonl", 8, tools=TOOLS[:1])
    tools = write_tools(tmp_path, "def lookup(q):\n    return q\n")
    out = tmp_path / "conv.jsonl"
    args = ["rollout", str(requests), "-o", str(out), "--tools", str(tools), "--url", url,
            "--price", "in=1000,out=1000", "-c", "2"]  # fmt: skip
    done = cli(*args, "--max-cost", "0.15")
    assert done.returncode == 4, done.stderr
    assert "unfinished (run again to go on)" in done.stderr
    ended = lines(out) if out.exists() else []
    assert len(ended) < 8 and all(c["status"] == "completed" for c in ended)
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    assert sorted(c["custom_id"] for c in lines(out)) == sorted(f"c{i}" for i in range(8))


def test_the_mock_calls_a_tool_under_auto_at_its_rate_and_deterministically():
    body = {"model": "m", "tools": TOOLS, "messages": [{"role": "user", "content": "x"}]}
    calls = 0
    for i in range(400):
        b = {**body, "messages": [{"role": "user", "content": f"q{i}"}]}
        reply = compose(b, tool_rate=0.3)
        assert (reply.tool_call is None) == (compose(b, tool_rate=0.3).tool_call is None)
        calls += reply.tool_call is not None
        assert compose(b).tool_call is None  # the default: text, as before
        assert compose({**b, "tool_choice": "none"}, tool_rate=1.0).tool_call is None
    assert 80 < calls < 160


def test_arguments_that_are_not_a_json_object_are_the_models_error_not_the_runs():
    from jsonlbatch.rollouts.tools import call_tool, load_tools

    box = load_tools({"lookup": lambda q: q})
    bad = asyncio.run(call_tool(box, "lookup", '{"q": ', None))
    assert bad.error and bad.content.startswith("error: the arguments of lookup are not JSON")
    listed = asyncio.run(call_tool(box, "lookup", "[1, 2]", None))
    assert listed.error and "must be a JSON object" in listed.content
    good = asyncio.run(call_tool(box, "lookup", '{"q": "x"}', None))
    assert (good.content, good.error) == ("x", False)


def test_a_hook_that_raises_fails_its_conversation_naming_the_hook(tmp_path, mock_server):
    requests = write_requests(tmp_path / "req.jsonl", 2, tools=TOOLS[:1])
    text = "def new_state(line):\n    raise KeyError('db')\n\ndef lookup(q):\n    return q\n"
    out = tmp_path / "conv.jsonl"
    done = cli("rollout", str(requests), "-o", str(out), "--tools",
               str(write_tools(tmp_path, text)), "--url", mock_server())  # fmt: skip
    assert done.returncode == 3 and "Traceback" not in done.stderr
    for conv in lines(out):
        assert conv["status"] == "failed"
        assert conv["error"]["message"] == "new_state raised KeyError: 'db'"


def test_a_request_line_that_is_not_a_chat_request_is_refused_naming_its_line(
    tmp_path, mock_server
):
    requests = write_requests(tmp_path / "req.jsonl", 3)
    text = requests.read_text().splitlines()
    text[1] = text[1].replace('"url": "/v1/chat/completions"', '"url": "/v1/embeddings"')
    text[1] = text[1].replace('"body": {', '"body": {"input": "x", ')
    requests.write_text("\n".join(text) + "\n")
    out = tmp_path / "conv.jsonl"
    done = cli("rollout", str(requests), "-o", str(out), "--tools",
               str(write_tools(tmp_path, "def lookup(q):\n    return q\n")), "--url", mock_server())  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert f"{requests}:2: url: a rollout runs chat conversations" in done.stderr
    assert not out.exists()


def test_asks_are_routed_by_model_through_the_same_run(tmp_path, mock_server):
    """An agent and an expert model on servers of their own (`--endpoints`): the agent's
    turns go to one, the tool's asks to the other, in one run."""
    agent = mock_server(served_models=("agent",), tool_rate=1.0)
    expert = mock_server(served_models=("expert",))
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps({"agent": {"urls": [agent]}, "expert": {"urls": [expert]}}))
    requests = write_requests(tmp_path / "req.jsonl", 5, tools=TOOLS[1:], model="agent")
    tools = write_tools(tmp_path, TOOLS_PY.replace('"model": "mock"', '"model": "expert"'))
    out = tmp_path / "conv.jsonl"
    done = cli("rollout", str(requests), "-o", str(out), "--tools", str(tools), "--endpoints",
               str(endpoints), "--max-turns", "2", "-q",
               env={**os.environ, "ROLLOUT_TEST_LOG": str(tmp_path / "ran.log")})  # fmt: skip
    assert done.returncode == 0, done.stderr
    calls = by_id(tmp_path / "conv.calls.jsonl")
    asks = {cid: line for cid, line in calls.items() if ".ask" in cid}
    assert len(asks) == 5 and all(a["response"]["body"]["model"] == "expert" for a in asks.values())
    turns = [line for cid, line in calls.items() if ".ask" not in cid]
    assert all(t["response"]["body"]["model"] == "agent" for t in turns)
    for conv in lines(out):  # each expert's answer went back to the agent as the tool result
        tool_message = next(m for m in conv["messages"] if m["role"] == "tool")
        assert tool_message["content"].startswith("mock-")


def test_an_ask_to_a_model_no_pool_serves_is_the_tools_error_not_the_runs_end(
    tmp_path, mock_server
):
    agent = mock_server(served_models=("agent",), tool_rate=1.0)
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps({"agent": {"urls": [agent]}}))
    requests = write_requests(tmp_path / "req.jsonl", 3, tools=TOOLS[1:], model="agent")
    tools = write_tools(tmp_path, TOOLS_PY.replace('"model": "mock"', '"model": "expert"'))
    out = tmp_path / "conv.jsonl"
    done = cli("rollout", str(requests), "-o", str(out), "--tools", str(tools), "--endpoints",
               str(endpoints), "--max-turns", "2", "-q",
               env={**os.environ, "ROLLOUT_TEST_LOG": str(tmp_path / "ran.log")})  # fmt: skip
    assert done.returncode == 0, done.stderr
    for conv in lines(out):
        tool_message = next(m for m in conv["messages"] if m["role"] == "tool")
        assert "model 'expert' is unavailable" in tool_message["content"]
        assert conv["tool_errors"] >= 1
    asks = [line for line in lines(tmp_path / "conv.calls.jsonl") if ".ask" in line["custom_id"]]
    assert len(asks) == 3 and all(a["error"]["code"] == "model_unavailable" for a in asks)


def test_a_plain_tool_that_never_returns_does_not_hold_the_command_open(tmp_path, mock_server):
    """A sync tool past --tool-timeout keeps its thread (Python cannot stop one), but the
    command still ends with its summary: the thread is not joined at exit."""
    text = "import threading\n\ndef stuck(**kw):\n    threading.Event().wait()\n"
    contents = _one_tool_run(tmp_path, mock_server, "stuck", text, "--tool-timeout", "0.3")
    assert contents == ["error: stuck timed out after 0.3s (--tool-timeout)"] * 2


def _one_tool_run(tmp_path, mock_server, name: str, text: str, *options: str) -> list[str]:
    """Two conversations whose model calls tool `name` (defined by `text`) at each of their two
    turns; the tool messages, after checking the command ended well (within 30 s)."""
    url = mock_server(tool_rate=1.0)
    tools = [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}]
    requests = write_requests(tmp_path / "req.jsonl", 2, tools=tools)
    out = tmp_path / "conv.jsonl"
    done = cli("rollout", str(requests), "-o", str(out), "--tools",
               str(write_tools(tmp_path, text)), "--url", url, "--max-turns", "2", *options,
               timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [m["content"] for c in lines(out) for m in c["messages"] if m["role"] == "tool"]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "import os\n\ndef f():\n    pass\n\nraise RuntimeError('boom')\n",
            "RuntimeError: boom (line 6)",
        ),
        ("def f(x):\n    return (\n", "SyntaxError: '(' was never closed (line 2)"),
    ],
)
def test_a_tools_file_given_by_a_relative_path_names_its_line_once(
    tmp_path, monkeypatch, text, said
):
    from jsonlbatch.errors import InputError
    from jsonlbatch.rollouts import load_tools

    write_tools(tmp_path, text)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as raised:
        load_tools("tools.py")
    assert str(raised.value) == f"tools.py does not import: {said}"


def test_a_request_asking_several_choices_is_refused_naming_its_line(tmp_path, mock_server):
    """A conversation follows one answer per turn: `n: 2` would be paid for and the second
    choice silently dropped, so it is refused before anything is sent."""
    url = mock_server(record_bodies=10)
    requests = write_requests(tmp_path / "req.jsonl", 3)
    text = requests.read_text().splitlines()
    text[2] = text[2].replace('"body": {', '"body": {"n": 2, ')
    requests.write_text("\n".join(text) + "\n")
    out = tmp_path / "conv.jsonl"
    done = cli("rollout", str(requests), "-o", str(out), "--tools",
               str(write_tools(tmp_path, "def lookup(q):\n    return q\n")), "--url", url)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert f"{requests}:3: body.n: a rollout follows one answer per turn" in done.stderr
    assert not out.exists()


def test_a_tools_dict_entry_that_is_not_a_function_is_refused_naming_it():
    """A dict says what it means: an entry that cannot be called is the caller's mistake, not
    a tool silently left out (the model would be told it does not exist)."""
    from jsonlbatch.errors import UsageError
    from jsonlbatch.rollouts import load_tools

    with pytest.raises(UsageError, match="the tools dict: 'lookup' is a str, not a function"):
        load_tools({"expert": lambda topic: topic, "lookup": "lookup"})


def test_a_tool_returning_text_that_is_not_utf8_is_its_error_not_the_runs_end(
    tmp_path, mock_server
):
    """Text decoded with surrogateescape (a subprocess's output, a file) holds lone surrogates,
    which no JSON line can: the model is told, the run goes on."""
    text = "def cat(**kw):\n    return b'caf\\xe9'.decode('utf-8', 'surrogateescape')\n"
    contents = _one_tool_run(tmp_path, mock_server, "cat", text)
    said = "error: cat returned text that is not UTF-8 (surrogates not allowed at character 3)"
    assert contents == [said] * 2


def test_a_checker_still_judges_the_answer_of_the_last_turn(tmp_path, mock_server):
    """With --max-turns N, the N-th answer is checked too: a checker that passes it ends the
    conversation `completed` (its final state says so); one that would go on ends it as
    `max_turns`, with the last answer last (what it would say is not sent)."""
    url = mock_server()  # answers text: every turn goes to the checker
    requests = write_requests(tmp_path / "req.jsonl", 2, tools=TOOLS[:1])
    text = """
import jsonlbatch

def new_state(line):
    return {"checked": 0}

def user_turn(messages):
    conv = jsonlbatch.current_conversation()
    conv.state["checked"] += 1
    passes = conv.id == "c0" and conv.turn == 2
    return None if passes else "that fails; fix it"

def final_state(state):
    return state

def lookup(q):
    return q
"""
    out = tmp_path / "conv.jsonl"
    jsonlbatch.rollout(requests, out, tools=write_tools(tmp_path, text), urls=[url], quiet=True,
                       max_turns=2)  # fmt: skip
    convs = by_id(out)
    assert (convs["c0"]["status"], convs["c0"]["final_state"]) == ("completed", {"checked": 2})
    assert (convs["c1"]["status"], convs["c1"]["final_state"]) == ("max_turns", {"checked": 2})
    for conv in convs.values():
        assert conv["turns"] == 2 and conv["messages"][-1]["role"] == "assistant"


def test_a_tool_or_hook_calling_sys_exit_is_its_error_not_the_runs_end(tmp_path, mock_server):
    """`sys.exit()` in a tool (a script turned into a tool, argparse) raises SystemExit, which
    is no Exception: it is the tool's error message (or the hook's failure), not the end of
    the run with a traceback."""
    url = mock_server(tool_rate=1.0)
    requests = write_requests(tmp_path / "req.jsonl", 2, tools=TOOLS)
    text = """
import sys

def lookup(q):
    sys.exit(3)

async def expert(topic="none"):
    sys.exit("bye")

def final_state(state):
    sys.exit(0)
"""
    out = tmp_path / "conv.jsonl"
    done = cli("rollout", str(requests), "-o", str(out), "--tools",
               str(write_tools(tmp_path, text)), "--url", url, "--max-turns", "2")  # fmt: skip
    assert done.returncode == 3, done.stderr  # the conversations failed in final_state
    assert "Traceback" not in done.stderr
    contents = {m["content"] for c in lines(out) for m in c["messages"] if m["role"] == "tool"}
    assert contents <= {
        "error: lookup raised SystemExit: 3",
        "error: expert raised SystemExit: bye",
    }
    assert contents
    for conv in lines(out):
        assert conv["error"]["message"] == "final_state raised SystemExit: 0"


def test_a_slow_plain_user_turn_holds_no_other_conversation_up(tmp_path, mock_server):
    """A checker that runs the model's code for seconds is a plain function: it runs in a
    thread, as a tool does, so the other conversations go on meanwhile (no barrier)."""
    url = mock_server()  # answers text: each turn goes to user_turn
    requests = write_requests(tmp_path / "req.jsonl", 2, tools=TOOLS[:1])
    text = """
import time
import jsonlbatch

def user_turn(messages):
    conv = jsonlbatch.current_conversation()
    if conv.id == "c0":
        time.sleep(1.5)
        return None
    return "again" if conv.turn < 4 else None

def lookup(q):
    return q
"""
    out = tmp_path / "conv.jsonl"
    jsonlbatch.rollout(requests, out, tools=write_tools(tmp_path, text), urls=[url], quiet=True)
    assert [(c["custom_id"], c["turns"]) for c in lines(out)] == [("c1", 4), ("c0", 1)]


def test_an_ask_from_a_plain_tool_is_its_error_at_once_not_a_hang(tmp_path, mock_server):
    """A plain tool runs in a worker thread: `asyncio.run(conv.ask(...))` there would wait on
    another event loop than the run's until --tool-timeout. It is refused at once, saying why."""
    text = """
import asyncio
import jsonlbatch

def lookup(**kw):
    conv = jsonlbatch.current_conversation()
    body = {"model": "mock", "messages": [{"role": "user", "content": "?"}]}
    return asyncio.run(conv.ask(body)).text
"""
    contents = _one_tool_run(tmp_path, mock_server, "lookup", text, "--tool-timeout", "10")
    said = "error: lookup raised AskFailed: ask() must be awaited in an async tool or hook"
    assert len(contents) == 2 and all(c.startswith(said) for c in contents), contents

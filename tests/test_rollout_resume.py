"""A rollout resumes at its turn: no answered call sent again, no tool run again (or, with
`new_state`, replayed and checked), conversations as an uninterrupted run's (issue 43, item 4)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import jsonlbatch
from jsonlbatch.mock import BackgroundMock, MockConfig
from tests.rollout_helpers import TOOLS, TOOLS_PY, by_id, lines, write_requests, write_tools

STATEFUL = """
import os
import jsonlbatch

LOG = os.environ["ROLLOUT_TEST_LOG"]

def new_state(line):
    return {"lookups": 0}

def lookup(q):
    conv = jsonlbatch.current_conversation()
    conv.state["lookups"] += 1
    with open(LOG, "a") as f:
        f.write(f"{conv.id} {conv.turn} lookup {q}\\n")
    return {"q": q, "n": conv.state["lookups"]}

async def expert(topic="none"):
    conv = jsonlbatch.current_conversation()
    answer = await conv.ask({"model": "mock", "max_tokens": 4,
                             "messages": [{"role": "user", "content": topic}]})
    return answer.text

def final_state(state):
    return state
"""


def _comparable(path: Path) -> dict[str, dict]:
    """Conversations by id, without the calls' timings (the only thing a rerun changes)."""
    return {cid: {k: v for k, v in c.items() if k != "time_s"} for cid, c in by_id(path).items()}


def _requests_at(mock: BackgroundMock) -> int:
    return mock.stats.requests["/v1/chat/completions"]


def _cut_after(path: Path, keep: int) -> None:
    """Keep the first `keep` lines of a file, and a torn piece of the next (a kill mid-write)."""
    text = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(text[:keep]) + (text[keep][:7] if keep < len(text) else b""))


@pytest.mark.parametrize("tools_text", [TOOLS_PY, STATEFUL], ids=["plain", "new_state"])
def test_a_resume_from_journals_sends_nothing_answered_and_reruns_no_tool(
    tmp_path, monkeypatch, tools_text
):
    log = tmp_path / "ran.log"
    monkeypatch.setenv("ROLLOUT_TEST_LOG", str(log))
    requests = write_requests(tmp_path / "req.jsonl", 16)
    tools = write_tools(tmp_path, tools_text)
    with BackgroundMock(MockConfig(tool_rate=0.7)) as mock:
        whole = tmp_path / "whole.jsonl"
        jsonlbatch.rollout(requests, whole, tools=tools, urls=[mock.url], quiet=True)
        first_log = log.read_text().splitlines()
        log.unlink()
        out = tmp_path / "conv.jsonl"
        jsonlbatch.rollout(requests, out, tools=tools, urls=[mock.url], quiet=True)
        assert _comparable(out) == _comparable(whole)
        log.unlink()
        # as a kill leaves it: few conversations ended, half the calls and tool results kept
        calls, journal = tmp_path / "conv.calls.jsonl", tmp_path / "conv.tools.jsonl"
        n_calls, n_tools = len(lines(calls)), len(lines(journal))
        _cut_after(out, 3)
        _cut_after(calls, n_calls // 2)
        _cut_after(journal, n_tools // 2)
        _drop_later_than_calls(journal, calls)
        kept_tools = {(e["custom_id"], e["turn"], e["i"]) for e in lines_whole(journal)}
        sent_before = _requests_at(mock)
        summary = jsonlbatch.rollout(requests, out, tools=tools, urls=[mock.url], quiet=True)
        sent = _requests_at(mock) - sent_before
    assert _comparable(out) == _comparable(whole)  # final states included
    assert len(lines(out)) == 16
    # exactly the calls the cut removed were sent again: none that the file still answered
    assert sent == n_calls - n_calls // 2 == len(lines(calls)) - n_calls // 2
    assert summary.replayed >= n_calls // 2 - 3 * 4
    rerun = log.read_text().splitlines() if log.exists() else []
    journaled = [e for e in lines(journal) if (e["custom_id"], e["turn"], e["i"]) in kept_tools]
    if tools_text is STATEFUL:  # every tool of an unfinished conversation replayed, checked
        assert len(rerun) >= sum(e["name"] == "lookup" for e in journaled)
    else:  # no journaled tool ran again
        ran = {tuple(line.split()[:2]) for line in rerun}
        assert not ran & {(e["custom_id"], str(e["turn"])) for e in journaled}
        assert len(rerun) + sum(1 for e in journaled) >= len(first_log) - 3 * 4


def test_a_replay_that_gives_another_result_fails_the_conversation(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLOUT_TEST_LOG", str(tmp_path / "ran.log"))
    requests = write_requests(tmp_path / "req.jsonl", 4, tools=TOOLS[:1])
    tools = write_tools(tmp_path, STATEFUL)
    out = tmp_path / "conv.jsonl"
    with BackgroundMock(MockConfig(tool_rate=1.0)) as mock:
        jsonlbatch.rollout(requests, out, tools=tools, urls=[mock.url], quiet=True, max_turns=3)
        out.write_text("")  # every conversation rebuilt from its journals
        write_tools(tmp_path, STATEFUL.replace('"n": conv.state', '"m": conv.state'))
        jsonlbatch.rollout(requests, out, tools=tools, urls=[mock.url], quiet=True, max_turns=3)
    for conv in lines(out):
        assert conv["status"] == "failed"
        assert "replaying lookup of turn 1" in conv["error"]["message"]


@pytest.mark.slow
def test_kill_9_mid_rollout_then_the_same_command_ends_as_an_uninterrupted_run(
    tmp_path, monkeypatch
):
    log = tmp_path / "ran.log"
    monkeypatch.setenv("ROLLOUT_TEST_LOG", str(log))
    env = {**os.environ, "ROLLOUT_TEST_LOG": str(log)}
    requests = write_requests(tmp_path / "req.jsonl", 40)
    tools = write_tools(tmp_path)
    with BackgroundMock(MockConfig(tool_rate=0.75, latency=0.05)) as mock:
        whole = tmp_path / "whole.jsonl"
        jsonlbatch.rollout(requests, whole, tools=tools, urls=[mock.url], quiet=True,
                           concurrency=8, max_turns=8)  # fmt: skip
        log.unlink()
        out = tmp_path / "conv.jsonl"
        calls, journal = tmp_path / "conv.calls.jsonl", tmp_path / "conv.tools.jsonl"
        command = [sys.executable, "-m", "jsonlbatch", "rollout", str(requests), "-o", str(out),
                   "--tools", str(tools), "--url", mock.url, "-c", "8", "--max-turns", "8", "-q"]  # fmt: skip
        child = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and child.poll() is None:
            if calls.exists() and calls.read_bytes().count(b"\n") >= 40:
                break
            time.sleep(0.02)
        assert child.poll() is None, "the run ended before the kill"
        child.send_signal(signal.SIGKILL)
        child.wait()
        time.sleep(0.3)  # the calls in flight reach the server
        before = _requests_at(mock)
        calls_before = calls.read_bytes().count(b"\n")  # whole lines: a torn one is cut
        journaled = {(e["custom_id"], e["turn"], e["i"]) for e in lines_whole(journal)}
        ran_before = log.read_text().splitlines()
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        sent_again = _requests_at(mock) - before
    assert _comparable(out) == _comparable(whole)
    assert sent_again == calls.read_bytes().count(b"\n") - calls_before  # nothing answered re-sent
    ran = log.read_text().splitlines()
    again = ran[len(ran_before) :]
    journaled_turns = {(conv, str(turn)) for conv, turn, _ in journaled}
    for line in again:  # no tool whose result was journaled ran again
        assert tuple(line.split()[:2]) not in journaled_turns, line
    # those run twice were running at the kill: run, not yet journaled
    running = {line for line in ran_before if tuple(line.split()[:2]) not in journaled_turns}
    assert set(again) & set(ran_before) <= running
    assert len(ran) - len(running) == sum(c["tool_calls"] for c in lines(out))


def _drop_later_than_calls(journal: Path, calls: Path) -> None:
    """Keep the journal as a kill leaves it with these calls: a tool's result is journaled
    after the lines of the asks it made, so a result whose ask has no line goes too."""
    answered = {line["custom_id"] for line in lines_whole(calls)}
    kept = [
        e for e in lines_whole(journal)
        if all(f"{e['custom_id']}#t{e['turn']}.ask{k}" in answered for k in range(1, e["asks"] + 1))
    ]  # fmt: skip
    journal.write_text("".join(json.dumps(e) + "\n" for e in kept))


def lines_whole(path: Path) -> list[dict]:
    """The whole lines of a file a kill may have torn."""
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def test_a_rerun_tool_whose_ask_differs_from_the_recorded_one_fails_not_misanswers(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("ROLLOUT_TEST_LOG", str(tmp_path / "ran.log"))
    requests = write_requests(tmp_path / "req.jsonl", 6, tools=TOOLS[1:])
    tools = write_tools(tmp_path)
    out = tmp_path / "conv.jsonl"
    with BackgroundMock(MockConfig(tool_rate=1.0)) as mock:
        jsonlbatch.rollout(requests, out, tools=tools, urls=[mock.url], quiet=True, max_turns=2)
        out.write_text("")  # rebuilt from the journals ...
        (tmp_path / "conv.tools.jsonl").write_text("")  # ... as if every tool was running
        write_tools(tmp_path, TOOLS_PY.replace("[{\"role\": \"user\", \"content\": topic}]",
                                               "[{\"role\": \"user\", \"content\": 'new'}]"))  # fmt: skip
        sent = _requests_at(mock)
        jsonlbatch.rollout(requests, out, tools=tools, urls=[mock.url], quiet=True, max_turns=2)
        assert _requests_at(mock) == sent  # the recorded ask was not answered by a new one
    for conv in lines(out):
        assert conv["status"] == "failed"
        assert "#t1.ask1 asks other than what" in conv["error"]["message"]


@pytest.mark.parametrize(
    ("field", "value"), [("turn", None), ("i", "0"), ("content", 3), ("error", "no")]
)
def test_a_damaged_tool_journal_entry_is_a_clean_error_naming_its_line(
    tmp_path, monkeypatch, field, value
):
    """The tool journal is read back as hostile input: an entry edited by hand stops the run
    with its file, line and field (exit 1), not a traceback, and nothing is sent."""
    monkeypatch.setenv("ROLLOUT_TEST_LOG", str(tmp_path / "ran.log"))
    requests = write_requests(tmp_path / "req.jsonl", 2, tools=TOOLS[:1])
    tools = write_tools(tmp_path, TOOLS_PY)
    out = tmp_path / "conv.jsonl"
    journal = tmp_path / "conv.tools.jsonl"
    with BackgroundMock(MockConfig(tool_rate=1.0)) as mock:
        jsonlbatch.rollout(requests, out, tools=tools, urls=[mock.url], quiet=True, max_turns=2)
        out.write_text("")  # both conversations rebuilt from their journals
        entries = lines(journal)
        if value is None:
            del entries[1][field]
        else:
            entries[1][field] = value
        journal.write_text("".join(json.dumps(e) + "\n" for e in entries))
        sent = _requests_at(mock)
        done = subprocess.run(
            [sys.executable, "-m", "jsonlbatch", "rollout", str(requests), "-o", str(out),
             "--tools", str(tools), "--url", mock.url, "--max-turns", "2"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert _requests_at(mock) == sent
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert f"{journal}:2: {field}:" in done.stderr


def test_a_damaged_calls_line_read_back_is_a_clean_error(tmp_path, monkeypatch):
    """exec's scan checks a response line's response and error; the metrics a resume reads
    back (the fingerprint) are checked where they are read: an edit there is no traceback."""
    monkeypatch.setenv("ROLLOUT_TEST_LOG", str(tmp_path / "ran.log"))
    requests = write_requests(tmp_path / "req.jsonl", 2, tools=TOOLS[:1])
    tools = write_tools(tmp_path, TOOLS_PY)
    out, calls = tmp_path / "conv.jsonl", tmp_path / "conv.calls.jsonl"
    with BackgroundMock(MockConfig(tool_rate=1.0)) as mock:
        jsonlbatch.rollout(requests, out, tools=tools, urls=[mock.url], quiet=True, max_turns=2)
        out.write_text("")
        entries = lines(calls)
        damaged = next(e for e in entries if e["custom_id"].endswith("#t2"))
        damaged["metrics"] = ["not", "an", "object"]
        calls.write_text("".join(json.dumps(e) + "\n" for e in entries))
        done = subprocess.run(
            [sys.executable, "-m", "jsonlbatch", "rollout", str(requests), "-o", str(out),
             "--tools", str(tools), "--url", mock.url, "--max-turns", "2"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert f"the line of {damaged['custom_id']}: metrics: not an object" in done.stderr


def test_a_conversation_failed_by_the_server_runs_again_once_its_line_is_removed(
    tmp_path, monkeypatch
):
    """What the refusal of --retry-failed tells the user to do: remove the failed
    conversation's line. Its failed turn is then sent again, not read back as the answer."""
    monkeypatch.setenv("ROLLOUT_TEST_LOG", str(tmp_path / "ran.log"))
    requests = write_requests(tmp_path / "req.jsonl", 3, tools=TOOLS[:1])
    tools = write_tools(tmp_path, TOOLS_PY)
    out = tmp_path / "conv.jsonl"
    with BackgroundMock(MockConfig(fail_rate=1.0)) as down:
        failed = jsonlbatch.rollout(requests, out, tools=tools, urls=[down.url], quiet=True,
                                    max_retries=0)  # fmt: skip
    assert failed.statuses == {"failed": 3}
    kept = [c for c in lines(out) if c["custom_id"] != "c1"]
    out.write_text("".join(json.dumps(c) + "\n" for c in kept))
    with BackgroundMock(MockConfig(tool_rate=0.0)) as up:
        again = jsonlbatch.rollout(requests, out, tools=tools, urls=[up.url], quiet=True)
        assert _requests_at(up) == 1
    assert again.statuses == {"completed": 1}
    assert {c["custom_id"]: c["status"] for c in lines(out)} == {
        "c0": "failed", "c2": "failed", "c1": "completed"
    }  # fmt: skip


def test_the_resume_note_counts_finished_conversations(tmp_path, monkeypatch, capsys):
    """It said "2 of 3 requests already have a result in conv.calls.jsonl": what it counts is
    the conversations finished in the conversations file."""
    monkeypatch.setenv("ROLLOUT_TEST_LOG", str(tmp_path / "ran.log"))
    requests = write_requests(tmp_path / "req.jsonl", 3, tools=TOOLS[:1])
    tools = write_tools(tmp_path, TOOLS_PY)
    out = tmp_path / "conv.jsonl"
    with BackgroundMock(MockConfig(tool_rate=0.0)) as mock:
        jsonlbatch.rollout(requests, out, tools=tools, urls=[mock.url], quiet=True)
        kept = [c for c in lines(out) if c["custom_id"] != "c1"]
        out.write_text("".join(json.dumps(c) + "\n" for c in kept))
        capsys.readouterr()
        jsonlbatch.rollout(requests, out, tools=tools, urls=[mock.url], quiet=False)
    err = capsys.readouterr().err
    assert f"resuming: 2 of 3 conversations already finished in {out}" in err, err
    assert "requests already have a result" not in err


def test_a_finished_rollout_says_nothing_to_send_in_conversations(tmp_path, monkeypatch, capsys):
    """It said "nothing to send: all 3 requests have a result": a rollout counts conversations
    finished in the conversations file, as its resume note does."""
    monkeypatch.setenv("ROLLOUT_TEST_LOG", str(tmp_path / "ran.log"))
    requests = write_requests(tmp_path / "req.jsonl", 3, tools=TOOLS[:1])
    tools = write_tools(tmp_path, TOOLS_PY)
    out = tmp_path / "conv.jsonl"
    with BackgroundMock(MockConfig(tool_rate=0.0)) as mock:
        jsonlbatch.rollout(requests, out, tools=tools, urls=[mock.url], quiet=True)
        sent = _requests_at(mock)
        capsys.readouterr()
        jsonlbatch.rollout(requests, out, tools=tools, urls=[mock.url], quiet=False)
        assert _requests_at(mock) == sent
    err = capsys.readouterr().err
    assert f"nothing to send: all 3 conversations already finished in {out}" in err, err
    assert "requests have a result" not in err


def test_the_progress_bar_is_labelled_rollout(tmp_path, monkeypatch, capsys):
    """The bar of a rollout said "exec:", the command the user did not run."""
    monkeypatch.setenv("ROLLOUT_TEST_LOG", str(tmp_path / "ran.log"))
    requests = write_requests(tmp_path / "req.jsonl", 3, tools=TOOLS[:1])
    tools = write_tools(tmp_path, TOOLS_PY)
    with BackgroundMock(MockConfig(tool_rate=0.0)) as mock:
        jsonlbatch.rollout(requests, tmp_path / "conv.jsonl", tools=tools, urls=[mock.url])
    err = capsys.readouterr().err
    assert "rollout:" in err, err
    assert "exec:" not in err

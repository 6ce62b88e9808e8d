"""The rollout examples run as their docstrings say, on `--serve mock` (issue 43, item 7)."""

from __future__ import annotations

from pathlib import Path

from tests.rollout_helpers import cli, lines

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "rollout"


def test_the_retail_example_runs_with_state_refunds_and_an_expert(tmp_path):
    out = tmp_path / "conv.jsonl"
    done = cli("rollout", str(EXAMPLES / "retail" / "tasks.jsonl"), "-o", str(out), "--tools",
               str(EXAMPLES / "retail" / "tools.py"), "--serve", "mock",
               "--server-arg=--tool-rate=0.75", "-q")  # fmt: skip
    assert done.returncode == 0, done.stderr
    conversations = lines(out)
    assert len(conversations) == 6 and all(c["status"] == "completed" for c in conversations)
    assert all(len(c["final_state"]["db_hash"]) == 16 for c in conversations)
    names = {
        call["function"]["name"]
        for c in conversations
        for m in c["messages"]
        for call in m.get("tool_calls", [])
    }
    assert names == {"get_order", "refund_order", "ask_expert"}
    refunded = [c for c in conversations if c["final_state"]["refunds"]]
    assert refunded  # a write tool changed that conversation's database, and only its own
    assert len({c["final_state"]["db_hash"] for c in conversations}) >= 2
    calls = [line["custom_id"] for line in lines(tmp_path / "conv.calls.jsonl")]
    assert any(".ask" in cid for cid in calls)


def test_the_code_feedback_example_feeds_errors_back_for_its_rounds(tmp_path):
    out = tmp_path / "conv.jsonl"
    args = ("rollout", str(EXAMPLES / "code_feedback" / "tasks.jsonl"), "-o", str(out),
            "--tools", str(EXAMPLES / "code_feedback" / "tools.py"), "--serve", "mock", "-q")  # fmt: skip
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    first = lines(out)
    for conv in first:
        assert conv["turns"] == 3 and conv["final_state"]["rounds"] == 3
        assert not conv["final_state"]["passed"]  # the mock writes words, not Python
        feedback = [m["content"] for m in conv["messages"][2:] if m["role"] == "user"]
        assert len(feedback) == 2 and all("SyntaxError" in text for text in feedback)
    out.write_text("")  # rebuilt from the journals: the checker replayed, nothing sent
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    assert sorted(map(str, lines(out))) == sorted(map(str, first))

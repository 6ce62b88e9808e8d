"""A code-feedback loop for `jsonlbatch rollout`: the model's Python runs in post's sandbox
(`jsonlbatch.post.sandbox`, as `post files --run` runs scripts), and the error goes back to
the model as the next user turn, for up to MAX_ROUNDS rounds (as the GDPVal runner's
subprocess mode does). No tools: `user_turn` is the checker.

    jsonlbatch rollout examples/rollout/code_feedback/tasks.jsonl -o conv.jsonl \\
        --tools examples/rollout/code_feedback/tools.py --serve mock

The mock answers words, not Python, so every round fails and each conversation ends after
MAX_ROUNDS rounds with `final_state.passed` false; a real model's answers pass or fail on
their merits.
"""

from __future__ import annotations

import re

import jsonlbatch
from jsonlbatch.post.sandbox import RunLimits, run_script

MAX_ROUNDS = 3
_FENCE = re.compile(r"```(?:python)?\n(.*?)```", re.S)
#: The run's temporary folder in tracebacks: left out, so a rerun says the same (a resume
#: replays this checker against a fresh state and compares).
_WORKDIR = re.compile(r"[^\s\"']*jsonlbatch-run-[^/\s]+/")


def new_state(request_line: dict) -> dict:
    return {"rounds": 0, "passed": False, "last_error": None}


def user_turn(messages: list) -> str | None:
    """Run the code of the last answer; on an error, say so (the next round), else end."""
    state = jsonlbatch.current_conversation().state
    answer = messages[-1].get("content") or ""
    found = _FENCE.search(answer)
    code = found.group(1) if found else answer
    state["rounds"] += 1
    result = run_script(
        "main.py", {"main.py": code.encode()}, RunLimits(timeout=10, isolation="launcher")
    )
    if result.ok:
        state["passed"], state["last_error"] = True, None
        return None
    reason = _WORKDIR.sub("", result.reason)
    state["last_error"] = reason[-300:]
    if state["rounds"] >= MAX_ROUNDS:
        return None
    return (
        f"Running your code failed ({reason[-600:]}). Fix it and answer with the whole "
        "program in one ```python block."
    )


def final_state(state: dict) -> dict:
    return state

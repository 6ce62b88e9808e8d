"""Shared by the tool-call tests: a conversation in which the model called a tool and got its
result, as chat messages."""

from __future__ import annotations


def answered_call(call_id: str = "call_abc", result: str = "shipped Monday") -> list[dict]:
    """A user question, the assistant's call to get_order, and the tool's `result` for it."""
    call = {"id": call_id, "type": "function",
            "function": {"name": "get_order", "arguments": '{"order_id": "A17"}'}}  # fmt: skip
    return [{"role": "user", "content": "where is A17?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": result}]  # fmt: skip

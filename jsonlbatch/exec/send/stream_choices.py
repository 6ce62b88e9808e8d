"""How a streamed choice adds up: text, reasoning, tool-call and logprob deltas merged in order.

`streaming.StreamReader` splits the events and keeps the timings; each choice index it sees gets
a `ChoiceDeltas` here, which turns its deltas back into the `message` (or `text`) a non-streamed
request would have got.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ToolCallDeltas:
    index: int
    id: str | None = None
    type: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)

    def merge(self, delta: dict[str, Any]) -> None:
        if delta.get("id") and not self.id:
            self.id = delta["id"]
        if delta.get("type"):
            self.type = delta["type"]
        function = delta.get("function")
        if isinstance(function, dict):
            name = function.get("name")
            if name.__class__ is str and name and name != self.name:
                self.name += name  # a name sent in pieces; a repeated whole name is kept once
            arguments = function.get("arguments")
            if arguments.__class__ is str and arguments:
                self.arguments.append(arguments)

    def as_dict(self) -> dict[str, Any]:
        function = {"name": self.name, "arguments": "".join(self.arguments)}
        return {"id": self.id, "type": self.type or "function", "function": function}


@dataclass(slots=True)
class ChoiceDeltas:
    """One choice being rebuilt: text fields by name (content, reasoning, ...), tool calls."""

    index: int
    role: str = "assistant"
    texts: dict[str, list[str]] = field(default_factory=dict)
    tools: dict[int, ToolCallDeltas] = field(default_factory=dict)
    function_call: ToolCallDeltas | None = None
    finish_reason: str | None = None
    stop_reason: Any = None
    logprobs: dict[str, Any] | None = None

    def add_text(self, key: str, text: str) -> None:
        parts = self.texts.get(key)
        if parts is None:
            self.texts[key] = [text]
        else:
            parts.append(text)

    def add_tool_calls(self, deltas: list[Any]) -> None:
        for position, delta in enumerate(deltas):
            if not isinstance(delta, dict):
                continue
            index = delta.get("index")
            if not isinstance(index, int):  # servers that omit it send one call per delta
                index = position
            call = self.tools.get(index)
            if call is None:
                call = self.tools[index] = ToolCallDeltas(index)
            call.merge(delta)

    def add_function_call(self, delta: dict[str, Any]) -> None:
        """The legacy single `function_call`, merged like a tool call."""
        if self.function_call is None:
            self.function_call = ToolCallDeltas(0)
        self.function_call.merge({"function": delta})

    def add_logprobs(self, logprobs: Any) -> None:
        if not isinstance(logprobs, dict):
            return
        if self.logprobs is None:
            self.logprobs = {k: list(v) if isinstance(v, list) else v for k, v in logprobs.items()}
            return
        for key, value in logprobs.items():
            kept = self.logprobs.get(key)
            if isinstance(value, list) and isinstance(kept, list):
                kept.extend(value)
            elif value is not None:
                self.logprobs[key] = value

    def text(self, key: str) -> str | None:
        parts = self.texts.get(key)
        if parts is None:
            return None
        return "".join(parts) or None  # as servers say it unstreamed: null, not ""

    def chat_choice(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": self.text("content")}
        for key in self.texts:
            if key != "content":
                message[key] = self.text(key)
        if self.tools:
            message["tool_calls"] = [self.tools[i].as_dict() for i in sorted(self.tools)]
        if self.function_call is not None:
            message["function_call"] = self.function_call.as_dict()["function"]
        return self._choice("message", message)

    def text_choice(self) -> dict[str, Any]:
        return self._choice("text", "".join(self.texts.get("text", ())))

    def _choice(self, key: str, value: Any) -> dict[str, Any]:
        out = {
            "index": self.index,
            key: value,
            "logprobs": self.logprobs,
            "finish_reason": self.finish_reason,
        }
        if self.stop_reason is not None:
            out["stop_reason"] = self.stop_reason
        return out

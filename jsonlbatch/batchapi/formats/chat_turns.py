"""A chat-completion request's messages read once for every translation to another provider's
shape: the system text apart, the user and assistant turns as text, and what has no place in
a text-only translation (tool calls and results, images, unknown roles) as located problems."""

from __future__ import annotations

from typing import Any

Problems = list[tuple[str, str]]


def _text(content: Any, where: str, target: str, problems: Problems) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                texts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                problems.append(
                    (f"{where}.{i}", f"a {kind!s} part is not translated to {target} (text only)")
                )
        return "".join(texts)
    problems.append((where, "must be text or a list of text parts"))
    return None


def chat_turns(
    body: dict[str, Any], target: str, problems: Problems
) -> tuple[list[str], list[tuple[str, str]]]:
    """(system texts, [(role, text)] of user and assistant turns) of a chat body; whatever
    `target` (a provider's name, for the messages) cannot take is added to `problems`."""
    system: list[str] = []
    turns: list[tuple[str, str]] = []
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        problems.append(("body.messages", f"a chat request with messages is needed for {target}"))
        return system, turns
    for i, message in enumerate(messages):
        where = f"body.messages.{i}"
        if not isinstance(message, dict):
            problems.append((where, "must be an object"))
            continue
        role = message.get("role")
        if message.get("tool_calls") or role in ("tool", "function"):
            problems.append((where, f"tool calls and tool results are not translated to {target}"))
            continue
        text = _text(message.get("content"), f"{where}.content", target, problems)
        if text is None:
            continue
        if role in ("system", "developer"):
            system.append(text)
        elif role in ("user", "assistant"):
            turns.append((role, text))
        else:
            problems.append((f"{where}.role", f"role {role!r} is not translated to {target}"))
    return system, turns

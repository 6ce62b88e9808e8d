"""A chat-completion request's messages read once for every translation to another provider's
shape: the system text apart, the user and assistant turns as text and media parts, and what
has no place in a translation (tool calls and results, unknown part types and roles) as
located problems."""

from __future__ import annotations

from typing import Any

from jsonlbatch.batchapi.formats.media_parts import Media, Problems, media_of_part

#: A turn's content: text pieces and media, in order.
Parts = list[str | Media]


def _parts(content: Any, where: str, target: str, problems: Problems) -> Parts | None:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        out: Parts = []
        for i, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind == "text" and isinstance(part.get("text"), str):
                out.append(part["text"])
            elif kind in ("image_url", "file"):
                media = media_of_part(part, f"{where}.{i}", problems)
                if media is not None:
                    out.append(media)
            else:
                problems.append((f"{where}.{i}", f"a {kind!s} part is not translated to {target}"))
        return out
    problems.append((where, "must be text or a list of parts"))
    return None


def text_of(parts: Parts) -> str | None:
    """The turn as one string when it holds text only (None when it holds media)."""
    if any(isinstance(p, Media) for p in parts):
        return None
    return "".join(parts)  # type: ignore[arg-type]


def chat_turns(
    body: dict[str, Any], target: str, problems: Problems
) -> tuple[list[str], list[tuple[str, Parts]]]:
    """(system texts, [(role, parts)] of user and assistant turns) of a chat body; whatever
    `target` (a provider's name, for the messages) cannot take is added to `problems`.
    Images and files are taken in user turns only."""
    system: list[str] = []
    turns: list[tuple[str, Parts]] = []
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
        parts = _parts(message.get("content"), f"{where}.content", target, problems)
        if parts is None:
            continue
        text = text_of(parts)
        if role != "user" and text is None:
            problems.append((f"{where}.content", f"{target} takes images and files in user "
                             "turns only"))  # fmt: skip
            continue
        if role in ("system", "developer"):
            system.append(text or "")
        elif role in ("user", "assistant"):
            turns.append((role, parts))
        else:
            problems.append((f"{where}.role", f"role {role!r} is not translated to {target}"))
    return system, turns

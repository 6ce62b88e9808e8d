"""Chat completions as Anthropic Messages bodies, so one request file moves between OpenAI,
Anthropic and Gemini batch APIs by changing the URL (and the model).

What has a Messages equivalent is translated: system and developer messages to `system`, user
and assistant turns (text; images and PDF files in user turns as `image` / `document` blocks,
base64 from a `data:` URL or a `url` source for an http(s) URL: `media_parts.py`), `max_tokens` / `max_completion_tokens` (required by Anthropic),
`stop`, `temperature`, `top_p`, `top_k`, `response_format` `json_schema` (to
`output_config.format`). What has none (tool calls, `n > 1`, `seed`, penalties,
`logprobs`, `json_object`, ...) is refused, field by field, before anything is submitted.
The answers come back as Messages bodies, which every later stage reads.
"""

from __future__ import annotations

from typing import Any

from jsonlbatch.batchapi.formats.chat_turns import Parts, Problems, chat_turns, text_of
from jsonlbatch.batchapi.formats.media_parts import anthropic_block

_SAME = ("temperature", "top_p", "top_k")
_IGNORED = frozenset({"model", "user", "metadata", "store", "stream_options"})


def chat_to_messages(body: dict[str, Any]) -> tuple[dict[str, Any], Problems]:
    """A chat-completion body as a Messages body, and what could not be translated."""
    problems: Problems = []
    out: dict[str, Any] = {"model": body.get("model")}
    system, pairs = chat_turns(body, "Messages", problems)
    turns = [{"role": role, "content": _content(parts, problems)} for role, parts in pairs]
    if not turns:
        problems.append(("body.messages", "a chat request with user messages is needed"))
    out["messages"] = turns
    if system:
        out["system"] = "\n\n".join(system)
    cap = body.get("max_completion_tokens", body.get("max_tokens"))
    if cap is None:
        problems.append(
            ("body.max_tokens", "Anthropic needs a cap on output tokens (gen --max-tokens)")
        )
    else:
        out["max_tokens"] = cap
    for key, value in body.items():
        if key in ("messages", "max_tokens", "max_completion_tokens", *_IGNORED):
            continue
        if key in _SAME:
            out[key] = value
        elif key == "stop":
            out["stop_sequences"] = [value] if isinstance(value, str) else value
        elif key == "n":
            if value not in (None, 1):
                problems.append(("body.n", "Anthropic has no n: write one request line per sample"))
        elif key == "stream":
            if value:
                problems.append(("body.stream", "a batch answers whole: leave out stream"))
        elif key == "response_format":
            kind = value.get("type") if isinstance(value, dict) else None
            if kind == "json_schema" and isinstance(value.get("json_schema"), dict):
                schema = value["json_schema"].get("schema", {})
                out["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
            elif kind != "text":
                problems.append(
                    ("body.response_format", f"type {kind!r} is not translated to Messages")
                )
        else:
            problems.append((f"body.{key}", "not translated to Anthropic's Messages"))
    return out, problems


def _content(parts: Parts, problems: Problems) -> str | list[dict[str, Any]]:
    """A turn's Messages content: its text as one string, or blocks when it holds media."""
    text = text_of(parts)
    if text is not None:
        return text
    blocks: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, str):
            if part:
                blocks.append({"type": "text", "text": part})
            continue
        block = anthropic_block(part, problems)
        if block is not None:
            blocks.append(block)
    return blocks

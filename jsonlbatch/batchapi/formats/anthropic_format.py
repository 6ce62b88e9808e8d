"""Chat completions as Anthropic Messages bodies, so one request file moves between OpenAI,
Anthropic and Gemini batch APIs by changing the URL (and the model).

What has a Messages equivalent is translated: system and developer messages to `system`, user
and assistant turns (text), `max_tokens` / `max_completion_tokens` (required by Anthropic),
`stop`, `temperature`, `top_p`, `top_k`, `response_format` `json_schema` (to
`output_config.format`). What has none (tool calls, images, `n > 1`, `seed`, penalties,
`logprobs`, `json_object`, ...) is refused, field by field, before anything is submitted.
The answers come back as Messages bodies, which every later stage reads.
"""

from __future__ import annotations

from typing import Any

from jsonlbatch.batchapi.formats.chat_turns import Problems, chat_turns

_SAME = ("temperature", "top_p", "top_k")
_IGNORED = frozenset({"model", "user", "metadata", "store", "stream_options"})


def chat_to_messages(body: dict[str, Any]) -> tuple[dict[str, Any], Problems]:
    """A chat-completion body as a Messages body, and what could not be translated."""
    problems: Problems = []
    out: dict[str, Any] = {"model": body.get("model")}
    system, pairs = chat_turns(body, "Messages", problems)
    turns = [{"role": role, "content": text} for role, text in pairs]
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

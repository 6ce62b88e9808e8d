"""Chat completions and Gemini's `generateContent`, each in the other's shape.

exec's Gemini batches send chat-completion request lines: `chat_to_gemini` translates a body
(images and files as `inlineData`, see `media_parts.py`; and says, field by field, what it cannot translate, so a file is refused before anything is
submitted) and `gemini_to_chat_response` turns each answer back into a `chat.completion`, so
`post`, `report` and `export` read Gemini's answers like any other. The two inverse functions
are what `serve --batch-api` needs to run Gemini batches on an OpenAI-compatible backend.
"""

from __future__ import annotations

from typing import Any

import orjson

from jsonlbatch.batchapi.formats.batch_objects import new_id, now
from jsonlbatch.batchapi.formats.chat_turns import Parts, Problems, chat_turns, text_of
from jsonlbatch.batchapi.formats.media_parts import gemini_part, gemini_to_part

#: Sampling fields: chat name -> Gemini `generationConfig` name.
_CONFIG = {
    "temperature": "temperature",
    "top_p": "topP",
    "top_k": "topK",
    "max_tokens": "maxOutputTokens",
    "max_completion_tokens": "maxOutputTokens",
    "n": "candidateCount",
    "seed": "seed",
    "presence_penalty": "presencePenalty",
    "frequency_penalty": "frequencyPenalty",
}
#: Fields that do not change the answer, or that the batch itself carries (the model).
_IGNORED = frozenset({"model", "user", "metadata", "store", "stream_options"})
_FINISH = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
}
_REASONS = {v: k for k, v in _FINISH.items() if k in ("STOP", "MAX_TOKENS", "SAFETY")}


def chat_to_gemini(body: dict[str, Any]) -> tuple[dict[str, Any], Problems]:
    """A chat-completion body as a `GenerateContentRequest`, and what could not be translated
    (`(field, reason)` pairs; the request must not be sent when there are any)."""
    problems: Problems = []
    request: dict[str, Any] = {}
    system, turns = chat_turns(body, "Gemini", problems)
    contents = [
        {"role": "user" if role == "user" else "model", "parts": _parts(parts, problems)}
        for role, parts in turns
    ]
    request["contents"] = contents
    if system:
        request["systemInstruction"] = {"parts": [{"text": "\n\n".join(system)}]}
    config: dict[str, Any] = {}
    for key, value in body.items():
        if key in ("messages", *_IGNORED):
            continue
        if key in _CONFIG:
            config[_CONFIG[key]] = value
        elif key == "stop":
            config["stopSequences"] = [value] if isinstance(value, str) else value
        elif key == "stream":
            if value:
                problems.append(("body.stream", "a batch answers whole: leave out stream"))
        elif key == "response_format":
            _response_format(value, config, problems)
        else:
            problems.append((f"body.{key}", "not translated to Gemini's generateContent"))
    if config:
        request["generationConfig"] = config
    return request, problems


def _parts(parts: Parts, problems: Problems) -> list[dict[str, Any]]:
    """A turn's Gemini parts: one text part, or text and media parts in order (images and
    files as `inlineData`, or `fileData` for a URI Gemini reads)."""
    text = text_of(parts)
    if text is not None:
        return [{"text": text}]
    out: list[dict[str, Any]] = []
    for part in parts:
        made = (
            ({"text": part} if part else None)
            if isinstance(part, str)
            else gemini_part(part, problems)
        )
        if made is not None:
            out.append(made)
    return out


def _response_format(value: Any, config: dict[str, Any], problems: Problems) -> None:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return
    if kind == "json_object":
        config["responseMimeType"] = "application/json"
    elif kind == "json_schema" and isinstance(value.get("json_schema"), dict):
        config["responseMimeType"] = "application/json"
        config["responseJsonSchema"] = value["json_schema"].get("schema", {})
    else:
        problems.append(("body.response_format", f"type {kind!r} is not translated to Gemini"))


def gemini_to_chat_response(response: dict[str, Any], model: str) -> dict[str, Any]:
    """A `GenerateContentResponse` as a `chat.completion` body (thought parts as reasoning;
    thinking tokens counted in the completion, cached prompt tokens in the details)."""
    choices = []
    for i, candidate in enumerate(response.get("candidates") or []):
        if not isinstance(candidate, dict):
            continue
        parts = (candidate.get("content") or {}).get("parts") or []
        text = "".join(
            p.get("text", "") for p in parts if isinstance(p, dict) and not p.get("thought")
        )
        thought = "".join(
            p.get("text", "") for p in parts if isinstance(p, dict) and p.get("thought")
        )
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if thought:
            message["reasoning_content"] = thought
        reason = candidate.get("finishReason")
        choices.append({
            "index": candidate.get("index", i),
            "message": message,
            "finish_reason": _FINISH.get(str(reason), str(reason).lower()) if reason else None,
        })  # fmt: skip
    meta = response.get("usageMetadata") or {}
    prompt = int(meta.get("promptTokenCount") or 0)
    thoughts = int(meta.get("thoughtsTokenCount") or 0)
    output = int(meta.get("candidatesTokenCount") or 0) + thoughts
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": output,
                             "total_tokens": prompt + output}  # fmt: skip
    if meta.get("cachedContentTokenCount"):
        usage["prompt_tokens_details"] = {"cached_tokens": int(meta["cachedContentTokenCount"])}
    if thoughts:
        usage["completion_tokens_details"] = {"reasoning_tokens": thoughts}
    return {
        "id": "chatcmpl-" + str(response.get("responseId") or new_id("")),
        "object": "chat.completion",
        "created": now(),
        "model": response.get("modelVersion") or model,
        "choices": choices,
        "usage": usage,
    }


# -- the other way, for serve --batch-api -----------------------------------------------------

_CHAT = {v: k for k, v in _CONFIG.items() if k != "max_completion_tokens"}


def gemini_to_chat(request: dict[str, Any], model: str) -> dict[str, Any]:
    """A `GenerateContentRequest` as a chat-completion body for `model`."""
    messages: list[dict[str, Any]] = []
    system = request.get("systemInstruction") or request.get("system_instruction")
    if isinstance(system, dict):
        messages.append({"role": "system", "content": _parts_text(system.get("parts"))})
    for content in request.get("contents") or []:
        if isinstance(content, dict):
            role = "assistant" if content.get("role") == "model" else "user"
            messages.append({"role": role, "content": _chat_content(content.get("parts"))})
    body: dict[str, Any] = {"model": model, "messages": messages}
    config = request.get("generationConfig") or request.get("generation_config") or {}
    for key, value in config.items():
        if key in _CHAT:
            body[_CHAT[key]] = value
        elif key == "stopSequences":
            body["stop"] = value
        elif key == "responseMimeType" and value == "application/json":
            schema = config.get("responseJsonSchema") or config.get("responseSchema")
            body["response_format"] = (
                {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
                if isinstance(schema, dict)
                else {"type": "json_object"}
            )
    return body


def _chat_content(parts: Any) -> str | list[dict[str, Any]]:
    """Gemini parts as chat content: one string for text only, else chat parts (media as
    `image_url` / `file` parts with `data:` URLs)."""
    if not isinstance(parts, list):
        return ""
    if not any(isinstance(p, dict) and "text" not in p for p in parts):
        return _parts_text(parts)
    out: list[dict[str, Any]] = []
    for part in parts:
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("text"), str):
            out.append({"type": "text", "text": part["text"]})
        else:
            made = gemini_to_part(part)
            if made is not None:
                out.append(made)
    return out


def _parts_text(parts: Any) -> str:
    if not isinstance(parts, list):
        return ""
    return "".join(p.get("text", "") for p in parts if isinstance(p, dict))


def chat_to_gemini_response(body: dict[str, Any]) -> dict[str, Any]:
    """A `chat.completion` body as a `GenerateContentResponse`."""
    candidates = []
    for i, choice in enumerate(body.get("choices") or []):
        message = choice.get("message") or {}
        parts = []
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            parts.append({"text": reasoning, "thought": True})
        parts.append({"text": message.get("content") or ""})
        reason = choice.get("finish_reason")
        candidates.append({
            "content": {"role": "model", "parts": parts},
            "finishReason": _REASONS.get(reason, "OTHER") if reason else "STOP",
            "index": choice.get("index", i),
        })  # fmt: skip
    usage = body.get("usage") or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    output = int(usage.get("completion_tokens") or 0)
    meta: dict[str, Any] = {"promptTokenCount": prompt, "candidatesTokenCount": output,
                            "totalTokenCount": prompt + output}  # fmt: skip
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached:
        meta["cachedContentTokenCount"] = cached
    return {
        "candidates": candidates,
        "usageMetadata": meta,
        "modelVersion": body.get("model"),
        "responseId": str(body.get("id") or new_id("")).removeprefix("chatcmpl-"),
    }


def error_status(status: int | None, message: str) -> dict[str, Any]:
    """A google.rpc `Status` for a request that failed."""
    names = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
             404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}  # fmt: skip
    code = status if isinstance(status, int) else 500
    return {"code": code, "message": message, "status": names.get(code, "INTERNAL")}


def dumps_line(obj: Any) -> bytes:
    return orjson.dumps(obj) + b"\n"

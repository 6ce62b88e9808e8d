"""Token estimates and prices: what a request may cost before it is sent.

Shared by exec (pacing by tokens per minute, `--max-cost`, `--dry-run`) and report (`--price`).
The estimate counts the text a request sends: about four characters a token, as OpenAI's own
rule of thumb says, or tiktoken's count when it is installed and asked for (`--dry-run`). Images
are counted as billed, from the size their header gives (`media.image_size`): OpenAI's tiles by
`detail` for every model but Claude's, Anthropic's width x height / 750 for those. An image given
by URL cannot be sized without fetching it, and a file part (a PDF) is billed by its pages: both
are counted as 0 and reported as not counted (`PromptEstimate`), never silently.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jsonlbatch.batch_format.media import Base64Bytes, image_size, image_source, media_parts
from jsonlbatch.errors import UsageError

#: Output tokens assumed for a request that sets no cap on them, when a cap is needed (the
#: `--max-cost` reservation); the real usage replaces it when the answer arrives.
UNCAPPED_OUTPUT_TOKENS = 1024
_CHARS_PER_TOKEN = 4
_PER_MESSAGE = 4  # role and separators: what chat templates add around each message
_OUTPUT_KEYS = ("max_completion_tokens", "max_output_tokens", "max_tokens")
_TEXT_KEYS = ("messages", "prompt", "input", "system", "instructions")


@dataclass(frozen=True)
class Price:
    """Dollars per million tokens, input (prompt) and output (completion, reasoning included);
    optionally input read from a cache and written to one (else as input), and what batch
    results cost as a share of these (`prices.bill` applies them to an answer's usage)."""

    input_per_m: float = 0.0
    output_per_m: float = 0.0
    cached_input_per_m: float | None = None
    cache_write_per_m: float | None = None
    batch_share: float = 0.5  # every provider here bills batch results at half price
    batch_cached_share: float = 0.5  # Gemini bills cache hits in batches as live: 1.0

    def of(self, prompt: float, completion: float) -> float:
        """Dollars for these token counts."""
        return (prompt * self.input_per_m + completion * self.output_per_m) / 1e6


def parse_price(text: str | None) -> Price | None:
    """`in=0.15,out=0.60[,cached=0.015][,write=0.19]` (dollars per million tokens) -> Price; a
    missing side costs 0 (a missing cached or write price: as input)."""
    if text is None:
        return None
    sides: dict[str, float | None] = {"in": 0.0, "out": 0.0, "cached": None, "write": None}
    aliases = {"in": "in", "input": "in", "prompt": "in", "out": "out", "output": "out",
               "cached": "cached", "cache_read": "cached", "write": "write", "cache_write": "write"}  # fmt: skip
    for part in text.split(","):
        key, sep, value = part.partition("=")
        side = aliases.get(key.strip().lower())
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not sep or side is None or not math.isfinite(number) or number < 0:
            raise UsageError(
                f"--price wants in=DOLLARS,out=DOLLARS per million tokens (and optionally "
                f"cached=, write=), got {text!r}"
            )
        sides[side] = number
    return Price(sides["in"] or 0.0, sides["out"] or 0.0, sides["cached"], sides["write"])


def max_output_tokens(body: dict[str, Any]) -> int | None:
    """The request's cap on output tokens, whichever endpoint's name it uses, times `n`."""
    for key in _OUTPUT_KEYS:
        value = body.get(key)
        if type(value) is int and value > 0:
            n = body.get("n")
            return value * (n if type(n) is int and n > 1 else 1)
    return None


def _texts(value: Any, out: list[str]) -> None:
    """Collect the strings of a prompt, message list or content-part list (not image data)."""
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, list):
        for item in value:
            _texts(item, out)
    elif isinstance(value, dict):
        for key in ("content", "text", "input", "arguments"):
            if key in value:
                _texts(value[key], out)
        tool_calls = value.get("tool_calls")
        if tool_calls:
            _texts([call.get("function") for call in tool_calls if isinstance(call, dict)], out)


def prompt_texts(body: dict[str, Any]) -> tuple[list[str], int]:
    """The prompt's strings and its message count (for per-message overhead)."""
    out: list[str] = []
    for key in _TEXT_KEYS:
        if key in body:
            _texts(body[key], out)
    messages = body.get("messages")
    return out, len(messages) if isinstance(messages, list) else 0


@dataclass(frozen=True)
class PromptEstimate:
    """A request's prompt tokens: its text's, its images' as billed, and the media parts that
    could not be counted (an image by URL or with an unreadable header; a file part)."""

    text: int = 0
    images: int = 0
    uncounted_images: int = 0
    uncounted_files: int = 0

    @property
    def tokens(self) -> int:
        return self.text + self.images


def estimate_prompt(
    body: dict[str, Any], counter: Callable[[str], int] | None = None, model: str | None = None
) -> PromptEstimate:
    """Prompt tokens of a request body: `counter` per text (tiktoken) or characters / 4, plus
    its images by the rule of `model` (the body's model when not given)."""
    texts, messages = prompt_texts(body)
    if counter is None:
        chars = sum(map(len, texts))
        tokens = -(-chars // _CHARS_PER_TOKEN)
    else:
        tokens = sum(map(counter, texts))
    images, uncounted, files = image_tokens(body, model)
    return PromptEstimate(tokens + _PER_MESSAGE * messages, images, uncounted, files)


def estimate_prompt_tokens(
    body: dict[str, Any], counter: Callable[[str], int] | None = None, model: str | None = None
) -> int:
    """Prompt tokens of a request body, text and images (`estimate_prompt`)."""
    return estimate_prompt(body, counter, model).tokens


def image_tokens(body: dict[str, Any], model: str | None = None) -> tuple[int, int, int]:
    """(tokens, images not counted, file parts not counted) of a body's media parts."""
    if model is None:
        model = body.get("model") if isinstance(body.get("model"), str) else None
    claude = model is not None and "claude" in model.lower()
    tokens = uncounted = files = 0
    for kind, part in media_parts(body):
        if kind == "file":
            files += 1
            continue
        _, payload, detail = image_source(part)
        size = image_size(Base64Bytes(payload)) if payload else None
        if size is None:
            uncounted += 1
        elif claude:
            tokens += anthropic_image_tokens(*size)
        else:
            tokens += openai_image_tokens(*size, detail)
    return tokens, uncounted, files


def openai_image_tokens(width: int, height: int, detail: str | None = None) -> int:
    """OpenAI's published rule (GPT-4o class): `low` is 85 tokens; `high` and `auto` fit the
    picture in 2048 x 2048, scale its short side down to 768, and add 170 per 512-px tile."""
    if detail == "low":
        return 85
    w, h = float(width), float(height)
    if max(w, h) > 2048:
        scale = 2048 / max(w, h)
        w, h = w * scale, h * scale
    if min(w, h) > 768:
        scale = 768 / min(w, h)
        w, h = w * scale, h * scale
    tiles = math.ceil(int(w) / 512) * math.ceil(int(h) / 512)
    return 85 + 170 * max(tiles, 1)


#: Anthropic scales a picture down (keeping its shape) until its long edge is at most 1568 px
#: and it is at most about 1,600 tokens (some 1.15 megapixels: 1092 x 1092 is its largest
#: square sent as it is), so no image costs more than that.
_ANTHROPIC_LONG_EDGE = 1568
_ANTHROPIC_MAX_TOKENS = 1600


def anthropic_image_tokens(width: int, height: int) -> int:
    """Anthropic's published rule: width x height / 750, after the picture is scaled down to a
    long edge of 1568 px and to about 1,600 tokens, as Anthropic does before billing it."""
    w, h = float(width), float(height)
    if max(w, h) > _ANTHROPIC_LONG_EDGE:
        scale = _ANTHROPIC_LONG_EDGE / max(w, h)
        w, h = w * scale, h * scale
    return max(1, min(_ANTHROPIC_MAX_TOKENS, math.ceil(int(w) * int(h) / 750)))


def tiktoken_counter(model: str | None = None) -> Callable[[str], int] | None:
    """A tiktoken count for `model` (o200k_base when the model is not one it knows), or None
    when tiktoken is not installed or has no encoding at hand (`tiktoken_unavailable` says
    why)."""
    return _tiktoken(model)[0]


def tiktoken_unavailable(model: str | None = None) -> str | None:
    """Why tiktoken cannot count for `model` (not installed; no encoding offline), or None."""
    return _tiktoken(model)[1]


def _tiktoken(model: str | None) -> tuple[Callable[[str], int] | None, str | None]:
    try:
        import tiktoken
    except ImportError:
        return None, "tiktoken is not installed (pip install 'jsonlbatch[tokens]')"
    try:
        try:
            encoding = tiktoken.encoding_for_model(model or "")
        except KeyError:
            encoding = tiktoken.get_encoding("o200k_base")
    except Exception as exc:  # tiktoken downloads an encoding once: offline, that fails
        return None, (
            f"tiktoken could not load an encoding for {model or 'the model'} "
            f"({type(exc).__name__}: it downloads each encoding once, so offline it needs a "
            "copy in TIKTOKEN_CACHE_DIR)"
        )

    def count(text: str) -> int:
        return len(encoding.encode(text, disallowed_special=()))

    return count, None

"""Deterministic replies of the mock server.

A reply depends only on what a request means (model, messages or prompt, tools, token budget,
choice index), never on transport details (`stream`, `stream_options`, `n`) or key order. A test
can therefore recompute the expected content of any request line with `reply_text` and prove
that each response belongs to its request.

Tokens are whitespace-separated words throughout: replies are built from words, and prompts and
usage are counted in words, so every count the server reports can be checked by hand.

The wire shapes of a reply (chat message, stream events, usage) live here too, next to the
token pieces they are cut from, so a streamed and a whole answer cannot drift apart.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from jsonlbatch.answer_contract.contract import SchemaError
from jsonlbatch.answer_contract.schema_forms import declared_schema
from jsonlbatch.batch_format.records import CHAT_URL
from jsonlbatch.pricing.cost import image_tokens

#: Completion length in words when a request sets no token budget (`MockConfig` default).
DEFAULT_MAX_TOKENS = 16
#: Embedding size when a request does not ask for `dimensions`.
EMBEDDING_DIM = 8

_VOCAB = (  # noqa: SIM905 - a word list reads better as prose
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
    "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu amber "
    "birch cedar dune ember fern glade harbor iris jade kelp lagoon maple nectar opal pine "
    "quartz reef sage thorn umber vale willow yarrow zephyr acorn brook cliff dawn elm frost "
    "grove heath isle knoll marsh nova orbit"
).split()
assert len(_VOCAB) == 64
_SPACED = tuple(" " + word for word in _VOCAB)
_PIECE = re.compile(r"\S+\s*")


@dataclass(slots=True)
class ToolCall:
    """The one function call a choice makes when the request forces a tool."""

    id: str
    name: str
    arguments: str
    pieces: list[str]  # `arguments` split into streamed pieces; one token each


@dataclass(slots=True)
class Reply:
    """One choice's reply as token pieces: `"".join(pieces)` is the text, `len(pieces)` its
    token count, and streaming sends one piece per chunk."""

    reasoning: list[str]
    content: list[str]
    tool_call: ToolCall | None
    finish_reason: str

    @property
    def completion_tokens(self) -> int:
        tool_tokens = len(self.tool_call.pieces) if self.tool_call else 0
        return len(self.reasoning) + len(self.content) + tool_tokens


def token_budget(body: dict[str, Any]) -> int | None:
    """The request's cap on output tokens (`max_completion_tokens` wins over `max_tokens`)."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is not None:
            return value if isinstance(value, int) and not isinstance(value, bool) else None
    return None


def compose(
    body: dict[str, Any],
    index: int = 0,
    *,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    reasoning: bool = False,
    break_json: float = 0.0,
    tool_rate: float = 0.0,
) -> Reply:
    """The reply for choice `index` of a chat or completions request.

    A reply's natural length is `default_max_tokens` words; with `reasoning` the first half of
    them are reasoning. A smaller token budget cuts reasoning first, then content, exactly as a
    thinking model runs out of budget (finish_reason "length"). A forced tool call is never cut.
    A request that declares a JSON schema gets a JSON answer that holds it (`json_answer`), as
    long as it is, broken at the rate `break_json`. With `tool_rate`, that share of requests
    offering tools without forcing one (`tool_choice` "auto" or absent) calls one of them,
    drawn from the request's meaning: the same conversation takes the same path every run,
    and a longer one ends by itself (each turn draws anew).
    """
    seed = _choice_seed(body, index)
    natural = default_max_tokens
    budget = token_budget(body)
    total = natural if budget is None else min(budget, natural)
    thinking = min(natural // 2 if reasoning else 0, total)
    reasoning_pieces = _words(seed + b"r", thinking, "reason-")
    tool = _forced_tool(body) or _chosen_tool(body, seed, tool_rate)
    if tool is not None:
        return Reply(reasoning_pieces, [], _tool_call(tool, seed), "tool_calls")
    schema = _schema(body)
    if schema is not None:
        pieces = _PIECE.findall(json_answer(schema, body, index, break_json))
        room = len(pieces) if budget is None else max(0, budget - thinking)
        finish = "length" if room < len(pieces) else "stop"
        return Reply(reasoning_pieces, pieces[:room], None, finish)
    content = _words(seed + b"c", total - thinking, "mock-")
    finish = "length" if budget is not None and budget < natural else "stop"
    return Reply(reasoning_pieces, content, None, finish)


# -- answers under a JSON schema --------------------------------------------------------------

#: How `json_answer` breaks an answer, in turn: the first two only wrap valid JSON (the
#: stripping rules of `jsonlbatch.answer_contract.contract` recover it), the others break the contract.
BREAKS = ("fence", "prose", "missing", "wrong-type", "truncated", "trailing")
_FORMATS = {"date-time": "2026-01-01T00:00:00Z", "date": "2026-01-01", "time": "12:00:00Z",
            "email": "mock@example.com", "uri": "https://example.com/mock",
            "uuid": "00000000-0000-4000-8000-000000000000", "ipv4": "127.0.0.1",
            "hostname": "example.com", "duration": "P1D", "ipv6": "::1"}  # fmt: skip


def _schema(body: dict[str, Any]) -> dict[str, Any] | None:
    try:
        found = declared_schema(CHAT_URL, body)
    except SchemaError:
        return None
    return found.schema if found is not None else None


def json_answer(
    schema: dict[str, Any], body: dict[str, Any], index: int = 0, break_json: float = 0.0
) -> str:
    """The mock's answer to a request declaring `schema`: JSON that holds it, its values drawn
    from the request's meaning and its `seed` (so a re-ask with a new seed draws anew). With
    `break_json`, that share of answers (drawn the same way) is broken in one of `BREAKS`.
    """
    meaning = _digest(["json", body.get("model"), body.get("messages", body.get("prompt")),
                       index, body.get("seed")])  # fmt: skip
    values = iter(b for block in _stream(meaning + b"v", 256) for b in block)
    value = _fill(schema, values, schema)
    text = json.dumps(value)
    draw = int.from_bytes(hashlib.blake2b(meaning + b"break", digest_size=8).digest(), "big")
    if break_json <= 0 or draw / 2**64 >= break_json:
        return text
    return _broken(BREAKS[meaning[0] % len(BREAKS)], value, text, schema)


def _broken(kind: str, value: Any, text: str, schema: dict[str, Any]) -> str:
    if kind == "fence":
        return f"```json\n{text}\n```"
    if kind == "prose":
        return f"Here is the JSON you asked for:\n{text}"
    if kind == "trailing":
        return f"{text}\n\nI hope this helps!"
    if isinstance(value, dict) and value:
        required = [k for k in schema.get("required") or () if k in value]
        if kind == "missing" and required:
            return json.dumps({k: v for k, v in value.items() if k != required[0]})
        if kind in ("missing", "wrong-type"):
            first = required[0] if required else next(iter(value))
            wrong = 12345 if isinstance(value[first], str) else "not-a-number"
            return json.dumps({**value, first: wrong})
    return text[: max(1, len(text) // 2)]  # truncated


def reply_text(
    body: dict[str, Any],
    index: int = 0,
    *,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    reasoning: bool = False,
) -> str:
    """The content the mock answers for choice `index` of `body` ("" when it calls a tool).

    Pass the server's `default_max_tokens` and `reasoning` if they are not the defaults.
    """
    reply = compose(body, index, default_max_tokens=default_max_tokens, reasoning=reasoning)
    return "".join(reply.content)


def reasoning_text(body: dict[str, Any], index: int = 0, **settings: int) -> str:
    """The reasoning the mock sends for choice `index` when started with `reasoning=True`
    (`settings`: the server's `default_max_tokens`, if not the default)."""
    return "".join(compose(body, index, reasoning=True, **settings).reasoning)


def count_words(text: Any) -> int:
    """Tokens in a prompt-like value: words of a string, ids of a token list, summed over lists
    of either."""
    if isinstance(text, str):
        return len(text.split())
    if isinstance(text, list):
        return sum(1 if isinstance(item, int) else count_words(item) for item in text)
    return 0


def prompt_tokens(body: dict[str, Any]) -> int:
    """Input tokens of a chat (text of every message, and images as billed: the rule exec's
    estimate uses, so reports and prices agree with --dry-run), completions or embeddings
    request."""
    messages = body.get("messages")
    if messages is None:
        return count_words(body.get("prompt", body.get("input")))
    total = image_tokens(body)[0]
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            total += len(content.split())
        elif isinstance(content, list):
            total += sum(
                count_words(part.get("text")) for part in content if part.get("type") == "text"
            )
    return total


def prompt_items(value: Any) -> list[Any]:
    """The separate prompts (or embedding inputs) of a value: one string or token list, or a
    list of them."""
    if isinstance(value, list) and value and not isinstance(value[0], int):
        return value
    return [value]


def embedding(model: Any, item: Any, dimensions: int = EMBEDDING_DIM) -> list[float]:
    """A deterministic unit vector for one input: equal inputs embed equally."""
    raw = b"".join(_stream(_digest(["embedding", model, item]), 2 * dimensions))
    values = [(b - 32768) / 32768 for b in struct.unpack(f"<{dimensions}H", raw[: 2 * dimensions])]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def embedding_base64(vector: list[float]) -> str:
    """The `encoding_format: "base64"` form: little-endian float32, as OpenAI sends it."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


# -- wire shapes: a reply as a chat message, as stream events, as usage ----------------------


def usage(prompt: int, replies: list[Reply]) -> dict[str, int]:
    """Usage of a whole response: completion tokens summed over its choices."""
    completion = sum(r.completion_tokens for r in replies)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}  # fmt: skip


def chat_message(reply: Reply, reasoning: bool) -> dict[str, Any]:
    """The `message` of a chat choice. Reasoning goes under both names vLLM has used; content is
    null when a tool is called or reasoning used up the budget."""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(reply.content) or None}
    if reasoning:
        thought = "".join(reply.reasoning) or None
        message["reasoning_content"] = thought
        message["reasoning"] = thought
    call = reply.tool_call
    if call is not None:
        function = {"name": call.name, "arguments": call.arguments}
        message["tool_calls"] = [{"id": call.id, "type": "function", "function": function}]
    return message


def chat_events(reply: Reply) -> list[dict[str, Any]]:
    """One streamed chat choice as choice objects (without index): role, reasoning, content or
    tool call, finish."""
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    deltas += [{"reasoning_content": piece} for piece in reply.reasoning]
    deltas += [{"content": piece} for piece in reply.content]
    call = reply.tool_call
    if call is not None:
        function = {"name": call.name, "arguments": ""}
        deltas.append({"tool_calls": [{"index": 0, "id": call.id, "type": "function",
                                       "function": function}]})  # fmt: skip
        deltas += [
            {"tool_calls": [{"index": 0, "function": {"arguments": p}}]} for p in call.pieces
        ]
    events: list[dict[str, Any]] = [
        {"delta": d, "logprobs": None, "finish_reason": None} for d in deltas
    ]
    events.append({"delta": {}, "logprobs": None, "finish_reason": reply.finish_reason})
    return events


def text_events(reply: Reply) -> list[dict[str, Any]]:
    """One streamed completions choice: a text piece per event, then the finish."""
    events = [{"text": piece, "logprobs": None, "finish_reason": None} for piece in reply.content]
    events.append({"text": "", "logprobs": None, "finish_reason": reply.finish_reason})
    return events


def sse_steps(head: bytes, events: list[list[dict[str, Any]]]) -> list[bytes]:
    """SSE steps: step t carries event t of every choice still going (as a server decodes all
    sequences of a request together); a choice's finish rides with its last token."""
    per_choice = []
    for index, choice_events in enumerate(events):
        chunks = [head + orjson.dumps([{"index": index, **e}]) + b"}\n\n" for e in choice_events]
        if len(chunks) >= 2:
            chunks[-2:] = [chunks[-2] + chunks[-1]]
        per_choice.append(chunks)
    longest = max(len(c) for c in per_choice)
    return [b"".join(c[t] for c in per_choice if t < len(c)) for t in range(longest)]


# ---------------------------------------------------------------------------------------------


def _digest(value: Any) -> bytes:
    return hashlib.blake2b(
        orjson.dumps(value, option=orjson.OPT_SORT_KEYS), digest_size=32
    ).digest()


def _choice_seed(body: dict[str, Any], index: int) -> bytes:
    if "messages" in body:
        meaning = ["chat", body.get("model"), body["messages"], index]
    else:
        meaning = ["text", body.get("model"), body.get("prompt"), index]
    return _digest(meaning)


def _stream(seed: bytes, count: int) -> Iterator[bytes]:
    """`count` pseudo-random bytes or more, in blocks, chained from `seed`."""
    block = seed
    produced = 0
    while produced < count:
        block = hashlib.blake2b(block, digest_size=64).digest()
        produced += len(block)
        yield block


def _words(seed: bytes, count: int, tag: str) -> list[str]:
    """`count` token pieces: a recognizable `tag<hex>` first, then vocabulary words."""
    if count <= 0:
        return []
    head = tag + hashlib.blake2b(seed, digest_size=4).hexdigest()
    out = [head]
    for block in _stream(seed, count - 1):
        out.extend(_SPACED[b & 63] for b in block[: count - len(out)])
    return out


def function_name(obj: Any) -> Any:
    """The `function.name` of a tool or a named `tool_choice` (None if it has none)."""
    function = obj.get("function") if isinstance(obj, dict) else None
    return function.get("name") if isinstance(function, dict) else None


def _forced_tool(body: dict[str, Any]) -> dict[str, Any] | None:
    """The function a request forces (`tool_choice` "required" or a named function), if any."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not isinstance(tools, list):
        return None
    functions = [t["function"] for t in tools if function_name(t) is not None]
    if not functions:
        return None
    if choice == "required":
        return functions[0]
    if isinstance(choice, dict):
        name = function_name(choice)
        return next((f for f in functions if f.get("name") == name), None)
    return None


def _chosen_tool(body: dict[str, Any], seed: bytes, rate: float) -> dict[str, Any] | None:
    """The function an "auto" request calls at `rate` (`--tool-rate`), if any."""
    tools, choice = body.get("tools"), body.get("tool_choice", "auto")
    if rate <= 0 or choice != "auto" or not isinstance(tools, list):
        return None
    functions = [t["function"] for t in tools if function_name(t) is not None]
    draw = int.from_bytes(hashlib.blake2b(seed + b"auto", digest_size=8).digest(), "big")
    if not functions or draw / 2**64 >= rate:
        return None
    return functions[draw % len(functions)]


def _tool_call(function: dict[str, Any], seed: bytes) -> ToolCall:
    values = iter(b for block in _stream(seed + b"t", 64) for b in block)
    arguments = json.dumps(_fill(function.get("parameters"), values))
    call_id = "call_" + hashlib.blake2b(seed + b"id", digest_size=12).hexdigest()
    return ToolCall(call_id, str(function.get("name")), arguments, _PIECE.findall(arguments))


def _number(schema: dict[str, Any], integer: bool, draw: int) -> int | float:
    """A number from `draw` (0..255) within the schema's `minimum`/`maximum` and their
    exclusive forms: a schema's "confidence between 0 and 1" must get one, or every answer to
    it breaks its contract and a test cannot tell the mock's fault from the tool's."""
    low, high = (
        _bound(schema, "minimum", "exclusiveMinimum", max),
        _bound(schema, "maximum", "exclusiveMaximum", min),
    )
    if integer:
        lo = None if low is None else math.floor(low[0]) + 1 if low[1] else math.ceil(low[0])
        hi = None if high is None else math.ceil(high[0]) - 1 if high[1] else math.floor(high[0])
        if lo is not None and hi is not None:
            return lo + draw % (hi - lo + 1) if hi >= lo else lo  # an empty range: no answer
        return lo + draw if lo is not None else hi - draw if hi is not None else draw
    if low is not None and high is not None:  # strictly inside: both forms hold
        return low[0] + (high[0] - low[0]) * (draw + 0.5) / 256
    if low is not None:
        return low[0] + (draw + 1) / 4
    return high[0] - (draw + 1) / 4 if high is not None else draw / 4


def _bound(
    schema: dict[str, Any], inclusive: str, exclusive: str, tighter: Callable[..., Any]
) -> tuple[float, bool] | None:
    """The tighter of a schema's inclusive and exclusive bound on one side, as (value,
    exclusive); None when it sets neither (a boolean is no bound: draft 4's boolean
    `exclusiveMinimum` is read as making `minimum` exclusive)."""
    found: list[tuple[float, bool]] = []
    value = schema.get(inclusive)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        found.append((value, schema.get(exclusive) is True))
    value = schema.get(exclusive)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        found.append((value, True))
    if not found:
        return None
    return tighter(found, key=lambda bound: (bound[0], bound[1] == (tighter is max)))


def _fill(schema: Any, values: Iterator[int], root: Any = None, depth: int = 0) -> Any:
    """A deterministic value matching a JSON schema (types, enum, const, local `$ref`, unions,
    common formats, numeric bounds; not patterns or lengths); properties in sorted order so the
    tool's key order does not matter."""
    if not isinstance(schema, dict) or depth > 8:
        return _VOCAB[next(values, 0) & 63]
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/") and isinstance(root, dict):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, dict) else None
        return _fill(target, values, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][next(values, 0) % len(schema["enum"])]
    for union in ("anyOf", "oneOf"):
        options = schema.get(union)
        if isinstance(options, list) and options:  # the first option that is not null
            pick = next((o for o in options if not (isinstance(o, dict)
                                                    and o.get("type") == "null")), options[0])  # fmt: skip
            return _fill(pick, values, root, depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties")
        if not isinstance(props, dict):
            return {}
        return {name: _fill(props[name], values, root, depth + 1) for name in sorted(props)}
    if kind == "array":
        count = (
            max(1, schema.get("minItems") or 1) if isinstance(schema.get("minItems"), int) else 1
        )
        return [_fill(schema.get("items"), values, root, depth + 1) for _ in range(count)]
    if kind == "string" and schema.get("format") in _FORMATS:
        return _FORMATS[schema["format"]]
    if kind in ("integer", "number"):
        return _number(schema, kind == "integer", next(values, 0))
    if kind == "boolean":
        return next(values, 0) % 2 == 0
    if kind == "null":
        return None
    return _VOCAB[next(values, 0) & 63]

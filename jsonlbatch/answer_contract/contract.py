"""The answer contract: a JSON Schema per request, checked on each answer's arrival.

Where a request declares its schema, in each endpoint's form, is `schema_forms`'s.
This module checks answers against it. An answer's text is read by the rules in
`strip_json` (documented in docs/exec.md): a reasoning block, code fences and leading
prose are what models wrap JSON in and are taken off; text after a complete JSON value
means the model broke the contract, and the answer is invalid.

Validators are compiled once per distinct schema (`compile_schema`, keyed by the
schema's canonical JSON), so checking costs one dictionary lookup plus the validation
itself; `check_choice` gives each choice its verdict, and `recorded` reads it back.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import orjson

from jsonlbatch.answer_contract.bounded_check import CheckTimeout, bounded_validator, deadline
from jsonlbatch.answer_contract.schema_bounds import (
    ENV_VAR,
    SchemaBoundError,
    Shape,
    check_bounds,
    fast_validator,
    limits,
)
from jsonlbatch.batch_format.samples import hosted_choices, split_think

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\r?\n(.*?)```", re.DOTALL)
_MAX_STARTS = 32  # candidate starts of a JSON value after leading prose


class SchemaError(ValueError):
    """A schema that cannot be used: `field` names where it sits in the request body."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


# -- compiling ----------------------------------------------------------------------------------


class Contract:
    """One compiled schema: `check(value)` returns the validator's message, or None.

    jsonschema is the authority. With fastjsonschema installed (the `fast` extra), a schema made
    only of keywords both read alike (`schema_bounds.fast_safe`), and small and simple enough
    (`schema_bounds.Shape.fast`: its compiled code cannot be stopped, and grows with the
    schema), is first checked by its compiled code, about ten times quicker; only an answer
    that fails it is checked again by jsonschema, which words the message (and has the last
    word). A check that takes longer than the limit (`schema_bounds`) fails that answer.
    """

    __slots__ = ("_fast", "_validator", "schema", "seconds")

    def __init__(
        self, schema: dict[str, Any], *, fast: bool = True, shape: Shape | None = None
    ) -> None:
        import jsonschema  # a dependency; imported here so readers without schemas skip it
        from referencing import Registry

        if shape is None:  # not through compile_schema: bounded here
            shape = _bounded(schema, _canonical(schema))
        self.schema = schema
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        try:
            cls.check_schema(schema)
        except jsonschema.SchemaError as exc:
            where = "/".join(str(p) for p in exc.absolute_path)
            raise SchemaError("", f"not a valid JSON Schema{f' (at {where})' if where else ''}: "
                                  f"{exc.message}") from None  # fmt: skip
        except RecursionError:  # `check_bounds` keeps schemas well below this
            raise SchemaError("", "the schema nests too deeply to be checked") from None
        # an empty registry: a $ref outside the schema is never fetched (check_bounds refuses
        # one anyway); every keyword checks the clock, patterns run where they can be stopped
        self._validator = bounded_validator(cls)(
            schema, format_checker=cls.FORMAT_CHECKER, registry=Registry()
        )
        self._fast = fast_validator(schema) if fast and shape.fast else None
        self.seconds = limits().seconds  # one answer's check, all its choices (check_choices)

    def check(self, value: Any) -> str | None:
        if self._fast is not None:
            try:
                self._fast(value)
                return None
            except Exception:  # any doubt goes to jsonschema below
                pass
        from jsonschema.exceptions import best_match
        from referencing.exceptions import Unresolvable

        try:
            with deadline(self.seconds):
                error = best_match(self._validator.iter_errors(value))
        except Unresolvable as exc:
            return f"the schema has a reference that cannot be resolved: {exc}"
        except CheckTimeout:
            return (f"the check did not finish within {self.seconds:g} s (a pattern or "
                    f"schema too slow on this answer; {ENV_VAR}=seconds=N raises it)")  # fmt: skip
        except RecursionError:
            return "the answer nests too deeply for this schema to be checked"
        if error is None:
            return None
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        message = error.message if len(error.message) <= 300 else error.message[:300] + "..."
        return f"at ${path}: {message}"


_COMPILED: dict[bytes, Contract] = {}
_MAX_COMPILED = 4096  # distinct schemas kept; a per-row schema file rarely has more
_MAX_COMPILED_BYTES = 64 << 20  # and their JSON at most this, all together
_compiled_bytes = 0


def compile_schema(schema: dict[str, Any]) -> Contract:
    """The compiled `Contract` of `schema`, once per distinct schema (canonical JSON as key).
    Raises `SchemaError` for a schema that is not valid JSON Schema, or past the limits of
    `schema_bounds` (checked once, when it is first compiled)."""
    global _compiled_bytes
    key = _canonical(schema)
    found = _COMPILED.get(key)
    if found is None:
        found = Contract(schema, shape=_bounded(schema, key))
        if len(_COMPILED) >= _MAX_COMPILED or _compiled_bytes + len(key) > _MAX_COMPILED_BYTES:
            _COMPILED.clear()
            _compiled_bytes = 0
        _COMPILED[key] = found
        _compiled_bytes += len(key)
    return found


def _canonical(schema: dict[str, Any]) -> bytes:
    """`schema` as sorted JSON (the compiled schemas' key); `SchemaError` if it cannot be."""
    try:
        return orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError as exc:  # nested past orjson's 254 levels
        _bounded(schema, b"")  # says so, as the depth limit
        raise SchemaError("", f"the schema cannot be read: {exc}") from None


def _bounded(schema: dict[str, Any], raw: bytes) -> Shape:
    try:
        return check_bounds(schema, len(raw))
    except SchemaBoundError as exc:
        raise SchemaError("", str(exc)) from None


# -- reading an answer --------------------------------------------------------------------------


class NoJson(ValueError):
    """Why an answer's text holds no JSON value by the rules of `strip_json`."""


def strip_json(text: str, root: str | None = None) -> Any:
    """The JSON value an answer's text holds, by these rules, in order:

    1. A reasoning block is dropped: everything up to `</think>`; an unclosed `<think>` is
       reasoning cut short, with no answer.
    2. Surrounding whitespace is dropped; text that is one JSON value is that value.
    3. A Markdown code fence (```json or ```): its content is the answer; prose before the
       fence is dropped, text after it breaks the contract.
    4. Leading prose: the value starts at the first `{` (or `[`, or either, after `root`'s type)
       that begins a JSON value.
    5. Text after a complete JSON value breaks the contract: invalid, never cut off.

    Raises `NoJson` saying why when no value can be read.
    """
    if "<think>" in text or "</think>" in text:
        reasoning, text = split_think(text)
        if not text and reasoning:
            raise NoJson("the answer is only reasoning (no closing </think>)")
    text = text.strip()
    if not text:
        raise NoJson("the answer is empty")
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    fence = _FENCE.search(text)
    if fence is not None:
        after = text[fence.end() :].strip()
        if after:
            raise NoJson(f"text after the JSON code block: {_quote(after)}")
        inner = fence[2].strip()
        try:
            return orjson.loads(inner)
        except orjson.JSONDecodeError:
            text = inner  # read it by the rules below, for a precise message
    return _after_prose(text, root)


def _after_prose(text: str, root: str | None) -> Any:
    opens = "{" if root == "object" else "[" if root == "array" else "{["
    starts = [i for i, c in enumerate(text) if c in opens][:_MAX_STARTS]
    if not starts:
        raise NoJson(f"no JSON value in the answer: {_quote(text)}")
    decoder = json.JSONDecoder()
    first_error: str | None = None
    for start in starts:
        try:
            value, end = decoder.raw_decode(text, start)
        except RecursionError:  # json's scanner recurses per level: an answer is hostile too
            raise NoJson("the JSON value nests too deeply to be read") from None
        except json.JSONDecodeError as exc:
            if first_error is None:
                short = "Unterminated" in exc.msg or exc.pos >= len(text) - 1
                cut = " (cut short?)" if short else ""
                first_error = f"not valid JSON{cut}: {exc.msg} (character {exc.pos})"
            continue
        rest = text[end:].strip()
        if rest:
            raise NoJson(f"text after the JSON value: {_quote(rest)}")
        return value
    raise NoJson(first_error or "no JSON value in the answer")


def _quote(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


@dataclass(frozen=True, slots=True)
class ChoiceVerdict:
    """The verdict on one choice: valid or not, the message saying why not, and the value read
    (None when no JSON could be read)."""

    valid: bool
    error: str | None = None
    value: Any = None

    def as_json(self) -> dict[str, Any]:
        return {"valid": self.valid, "error": self.error, "value": self.value}


def answer_texts(body: Any, tool: str | None = None) -> list[str | Any]:
    """Per choice, what holds the answer: its text, or (a tool-form schema, or a choice that
    only calls one tool) the tool call's arguments."""
    if not isinstance(body, dict):
        return []
    choices = body.get("choices")
    if not isinstance(choices, list):
        choices = hosted_choices(body) or []
    out: list[Any] = []
    for choice in choices:
        choice = choice if isinstance(choice, dict) else {}
        message = choice.get("message")
        if not isinstance(message, dict):
            text = choice.get("text")
            out.append(text if isinstance(text, str) else "")
            continue
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(
                p.get("text", "")
                for p in content
                if isinstance(p, dict) and p.get("type") == "text"
            )
        calls = message.get("tool_calls")
        if (tool is not None or not content) and isinstance(calls, list) and len(calls) == 1:
            function = calls[0].get("function") if isinstance(calls[0], dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if isinstance(arguments, (str, dict)):
                out.append(arguments)
                continue
        out.append(content if isinstance(content, str) else "")
    return out


def check_choice(contract: Contract, answer: str | Any) -> ChoiceVerdict:
    """The verdict on one choice's answer (its text, or an already decoded tool input)."""
    if isinstance(answer, str):
        root = contract.schema.get("type")
        try:
            value = strip_json(answer, root if isinstance(root, str) else None)
        except NoJson as exc:
            return ChoiceVerdict(False, str(exc))
    else:
        value = answer
    error = contract.check(value)
    return ChoiceVerdict(error is None, error, value)


def check_choices(contract: Contract, body: Any, tool: str | None = None) -> list[ChoiceVerdict]:
    """The verdict on every choice of a usable answer's body."""
    texts = answer_texts(body, tool)
    if not texts:
        return [ChoiceVerdict(False, "the answer has no choices")]
    with deadline(contract.seconds):  # one limit for all the choices (n=100: not 100 limits)
        return [check_choice(contract, text) for text in texts]


# -- what later stages read ---------------------------------------------------------------------


def recorded(metrics: Any) -> dict[str, Any] | None:
    """The contract record exec wrote into a response line's `metrics`, or None."""
    found = metrics.get("contract") if isinstance(metrics, dict) else None
    return found if isinstance(found, dict) else None


def recorded_value(metrics: Any, index: int = 0) -> tuple[bool, Any]:
    """(whether choice `index` held its schema, the value read from it) from a line's metrics."""
    record = recorded(metrics)
    choices = record.get("choices") if record else None
    if not isinstance(choices, list) or not 0 <= index < len(choices):
        return False, None
    choice = choices[index]
    if not isinstance(choice, dict):
        return False, None
    return choice.get("valid") is True, choice.get("value")

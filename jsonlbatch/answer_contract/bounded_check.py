"""Checking one answer against its schema within a time limit (`answer_contract/schema_bounds.py` bounds the
schema itself, once).

jsonschema is pure Python, and a schema can make it slow without end (`$ref`s that fan out,
`anyOf` over them): every keyword of the validators `bounded_validator` makes looks at the
clock first (`tick`) and raises `CheckTimeout` past the deadline of the check in progress
(`deadline`). Two things happen inside one keyword, out of the clock's sight, and are replaced:
patterns, which jsonschema runs in Python's `re` (it backtracks without end on `^(a|aa)+$`,
holding the interpreter: not even a signal is handled), run in the `regex` engine with the time
left as its timeout (`search`); and `uniqueItems`, which jsonschema compares pairwise when the
items are objects (hours for an answer of 50,000 of them), is one pass with a set.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any


class CheckTimeout(Exception):
    """Checking one answer took longer than its limit (`SchemaLimits.seconds`)."""


class _Clock(threading.local):
    at: float | None = None  # when the check running in this thread must end


_clock = _Clock()


class deadline:
    """`with deadline(seconds):` bounds the answer check inside (`tick`, `search`). Inside
    another, the outer one holds: every choice of one answer shares the answer's time."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._outer = False

    def __enter__(self) -> None:
        self._outer = _clock.at is None
        if self._outer:
            _clock.at = time.monotonic() + self.seconds

    def __exit__(self, *exc: object) -> None:
        if self._outer:
            _clock.at = None


def tick() -> None:
    """Raise `CheckTimeout` when the current check is past its deadline."""
    at = _clock.at
    if at is not None and time.monotonic() > at:
        raise CheckTimeout


@functools.lru_cache(maxsize=1024)
def compiled(pattern: str) -> Any:
    """`pattern` compiled by `regex` (Python's `re` syntax; a match can be given a timeout)."""
    import regex

    return regex.compile(pattern)


def search(pattern: str, text: str) -> bool:
    """Whether `pattern` matches somewhere in `text`, within the current check's time left."""
    tick()
    at = _clock.at
    left = None if at is None else max(at - time.monotonic(), 0.001)
    try:
        return compiled(pattern).search(text, timeout=left) is not None
    except TimeoutError:
        raise CheckTimeout from None


@functools.cache
def bounded_validator(cls: Any) -> Any:
    """`cls` (a jsonschema validator class) whose every keyword looks at the clock first
    (`tick`), and whose patterns run in `regex` within the time left (`search`): jsonschema's
    own run in Python's `re`, which cannot be stopped."""
    from jsonschema import validators

    own = cls.VALIDATORS

    def pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Any:
        from jsonschema.exceptions import ValidationError

        if validator.is_type(instance, "string") and not search(patrn, instance):
            yield ValidationError(f"{instance!r} does not match {patrn!r}")

    def pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Any:
        if not validator.is_type(instance, "object"):
            return
        for patrn, subschema in patterns.items():
            for name, value in instance.items():
                if search(patrn, name):
                    yield from validator.descend(value, subschema, path=name, schema_path=patrn)

    def additional_properties(validator: Any, extra: Any, instance: Any, schema: Any) -> Any:
        """jsonschema's, given the properties no pattern matched and no patterns."""
        patterns = schema.get("patternProperties") if isinstance(schema, dict) else None
        if not patterns or not validator.is_type(instance, "object"):
            return own["additionalProperties"](validator, extra, instance, schema)
        rest = {k: v for k, v in instance.items() if not any(search(p, k) for p in patterns)}
        plain = {k: v for k, v in schema.items() if k != "patternProperties"}
        return own["additionalProperties"](validator, extra, rest, plain)

    def unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Any:
        from jsonschema.exceptions import ValidationError

        if unique and validator.is_type(instance, "array"):
            seen: set[Any] = set()
            for item in instance:
                key = _hashable(item)
                if key in seen:
                    yield ValidationError(f"{instance!r} has non-unique elements")
                    return
                seen.add(key)

    def ticking(keyword: Any) -> Any:
        def checked(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
            tick()
            return keyword(validator, value, instance, schema)

        return checked

    mine = {"pattern": pattern, "patternProperties": pattern_properties,
            "additionalProperties": additional_properties, "uniqueItems": unique_items}  # fmt: skip
    return validators.extend(cls, {k: ticking(mine.get(k, f)) for k, f in own.items()})


def _hashable(value: Any) -> Any:
    """`value` as a hashable that equals another's exactly when JSON Schema calls the two
    equal: 1 and 1.0 alike, `true` not 1, objects whatever their key order."""
    if isinstance(value, bool) or value is None:
        return ("b", value)
    if isinstance(value, (int, float)):
        return ("n", value)
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, list):
        return ("l", tuple(_hashable(v) for v in value))
    if isinstance(value, dict):
        return ("d", frozenset((k, _hashable(v)) for k, v in value.items()))
    return ("o", repr(value))

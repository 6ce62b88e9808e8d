"""Values given from Python (`jsonlbatch.execute(..., url=..., timeout=...)`) checked for their
type before click converts them.

click converts what a command line gives, strings, and takes much else without a word: `True`
as a timeout is 1 second, `5` as a URL an `AttributeError` deep in the run, `123` as a model
"must not be empty". Here each value must have a Python type the option can mean: its command
line form (a string) or the Python form the library documents (a number, a bool for a flag, a
path, a list for an option that repeats, a mapping for `headers`, ...); anything else is a
`UsageError` naming the option and what it takes. `ExecOptions` fields that have no option
(`grace`, `backoff_cap`) are checked against their own types.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

import click

from jsonlbatch.cli.params import ByteSize, CacheDir, CountOrAuto, HttpUrl
from jsonlbatch.errors import UsageError
from jsonlbatch.pricing.cost import Price

_TEXT = ((str,), "a string")
_PATH = ((str, os.PathLike), "a path (str or os.PathLike)")
#: Parameters whose Python form is more than their command line's (cli/library.py's `_value`).
_FORMS: dict[str, tuple[tuple[type, ...], str]] = {
    "headers": ((str,), "a mapping of header: value, or KEY=VALUE strings"),
    "rate_limits": ((bool, str), "True/False (or 'on'/'off')"),
    "shard": ((tuple, str), "a (k, n) pair (or 'K/N')"),
    "price": ((Price, str), "a cost.Price (or 'in=$,out=$')"),
    "view_address": ((tuple, str), "a (host, port) pair (or 'HOST:PORT')"),
    "batch_metadata": ((str,), "a mapping of key: value, or KEY=VALUE strings"),
}
#: Options that repeat KEY=VALUE items and take a mapping from Python.
_MAPPINGS = frozenset({"headers", "batch_metadata"})
#: Options that take a pair from Python (`shard=(0, 4)`, `view_address=("::1", 8765)`).
_PAIRS = frozenset({"shard", "view_address"})


def expected(param: click.Parameter) -> tuple[tuple[type, ...], str]:
    """The Python types one value of `param` may have, and how a message says them."""
    if param.name in _FORMS:
        return _FORMS[str(param.name)]
    if isinstance(param, click.Option) and param.is_flag:
        return (bool,), "True or False"
    kind = param.type
    if isinstance(kind, HttpUrl):
        return (str,), "a URL (a string)"
    if isinstance(kind, (CacheDir, click.Path)):
        return _PATH
    if isinstance(kind, (CountOrAuto, ByteSize)):
        return (int, str), f"an integer or a string ({kind.name})"
    if isinstance(kind, (click.IntRange, click.types.IntParamType)):
        return (int, str), "an integer"
    if isinstance(kind, (click.FloatRange, click.types.FloatParamType)):
        return (int, float, str), "a number"
    return _TEXT


def _fits(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False  # True is an int to Python, never a count or a number of seconds here
    return isinstance(value, types)


def check_value(name: str, param: click.Parameter, value: Any) -> None:
    """Raise `UsageError` when `value` (given as `name=`) is no value `param` can take."""
    types, words = expected(param)
    if param.name in _MAPPINGS and isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str) or not isinstance(item, str):
                raise UsageError(f"option {name!r} wants a mapping of strings to strings")
        return
    if param.name in _PAIRS and isinstance(value, tuple) and len(value) != 2:
        raise UsageError(f"option {name!r} wants {words}, got a tuple of {len(value)}")
    if param.multiple and isinstance(value, (list, tuple)):
        bad = [item for item in value if not _fits(item, types)]
        if bad:
            raise UsageError(
                f"option {name!r} wants {words} or a list of them, got a "
                f"{type(value).__name__} holding {type(bad[0]).__name__}"
            )
        return
    if not _fits(value, types):
        more = " or a list of them" if param.multiple else ""
        raise UsageError(f"option {name!r} wants {words}{more}, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"option {name!r} wants a finite number, got {value!r}")


def check_field(field: dataclasses.Field[Any], value: Any) -> None:
    """Raise `UsageError` when `value` is no value of the `ExecOptions` field `field` (one
    with no command line option: `grace`, `backoff_cap`)."""
    hint = str(field.type)
    if value is None and "None" in hint:
        return
    if "float" in hint or "int" in hint:
        if not _fits(value, (int, float)) or not math.isfinite(value):
            raise UsageError(f"option {field.name!r} wants a finite number, got "
                             f"{type(value).__name__}")  # fmt: skip
    elif "bool" in hint and not isinstance(value, bool):
        raise UsageError(f"option {field.name!r} wants True or False, got {type(value).__name__}")
    elif hint.startswith("str") and not isinstance(value, str):
        raise UsageError(f"option {field.name!r} wants a string, got {type(value).__name__}")

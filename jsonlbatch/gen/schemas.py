"""Where a request's answer schema comes from: a JSON Schema file, a Pydantic model, a data column.

Whatever the source, the result is a plain JSON Schema (a dict), checked once per distinct
schema (`contract.compile_schema`) so that an invalid schema stops `gen` before anything is
written, and written into each request in its endpoint's form by `schema_forms.with_schema`.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from typing import Any

import orjson

from jsonlbatch.answer_contract.contract import SchemaError, compile_schema
from jsonlbatch.answer_contract.schema_bounds import ENV_VAR, limits
from jsonlbatch.errors import InputError, UsageError
from jsonlbatch.extras import require

#: What may be given as a schema: a JSON Schema, or a Pydantic model class.
SchemaLike = Any


def load_schema(spec: str) -> dict[str, Any]:
    """The schema `spec` names: a `.json` file holding a JSON Schema, or `module:Model`, a
    Pydantic model (needs pydantic). Raises `InputError` / `UsageError` saying what is wrong."""
    if os.path.exists(spec) or spec.endswith(".json") or ":" not in spec:
        most = limits().bytes * 4  # a file may be pretty-printed: the limit is on compact JSON
        try:
            with open(spec, "rb") as f:
                raw = f.read(most + 1)
            if len(raw) > most:
                raise InputError(f"schema file {spec} is over {most:,} bytes: too big for a "
                                 f"schema ({ENV_VAR}=bytes=N raises the limit)")  # fmt: skip
            schema = orjson.loads(raw)
        except OSError as exc:
            raise InputError(f"cannot read schema file {spec}: {exc.strerror}") from None
        except orjson.JSONDecodeError as exc:
            raise InputError(f"schema file {spec} is not JSON: {exc}") from None
        return checked_schema(schema, spec)
    module, _, name = spec.partition(":")
    require("pydantic", extra="contract", for_what=f"--schema {spec} (a Pydantic model)")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # `models:Answer` finds ./models.py, as `python -m` does
    try:
        target = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise UsageError(f"--schema {spec}: cannot load it: {exc}") from None
    return checked_schema(as_schema(target, spec), spec)


def as_schema(value: SchemaLike, where: str = "schema") -> dict[str, Any]:
    """A JSON Schema from a mapping or a Pydantic model class (its `model_json_schema()`)."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, type) and hasattr(value, "model_json_schema"):
        return value.model_json_schema()
    if isinstance(value, type):
        require("pydantic", extra="contract", for_what=f"{where}: a class as a schema")
    raise UsageError(f"{where}: not a JSON Schema or a Pydantic model (got {type(value).__name__})")


def checked_schema(schema: Any, where: str) -> dict[str, Any]:
    """`schema` when it is an object and a valid JSON Schema; else `InputError` naming `where`."""
    if not isinstance(schema, dict):
        raise InputError(f"{where}: a JSON Schema must be an object")
    try:
        compile_schema(schema)
    except SchemaError as exc:
        raise InputError(f"{where}: {exc}") from None
    return schema


def row_schema(value: Any) -> dict[str, Any]:
    """A data column's schema: an object, or a JSON string of one (CSV). `SchemaError` if not."""
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise SchemaError("schema", f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise SchemaError("schema", "a JSON Schema must be an object")
    compile_schema(value)
    return value


def strict_ok(schema: Any) -> bool:
    """Whether `schema` meets OpenAI's strict mode (every object closed with
    `additionalProperties: false` and all its properties required), so `strict: true` may be
    asked without a 400. Pydantic models are not, unless configured `extra="forbid"`."""
    if isinstance(schema, list):
        return all(strict_ok(item) for item in schema)
    if not isinstance(schema, dict):
        return True
    props = schema.get("properties")
    if isinstance(props, dict) or schema.get("type") == "object":
        if schema.get("additionalProperties") is not False:
            return False
        if isinstance(props, dict) and set(schema.get("required") or ()) != set(props):
            return False
    return all(strict_ok(v) for k, v in schema.items() if k not in ("enum", "const", "default"))

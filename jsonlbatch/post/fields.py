"""Typed table columns from answers under a schema: `jsonlbatch export --fields`.

exec records, per choice, the JSON value read from an answer and whether it held its request's
schema, and the schema itself (`metrics.contract`, see `jsonlbatch.answer_contract.contract`). The columns are
the schemas' top-level properties, typed from the schemas (not guessed from values): string,
integer, number and boolean become typed columns, an array of strings a list of strings,
anything else (objects, other arrays, unions of types) a column of JSON text. Only values that held their schema fill a row; an invalid answer
leaves its fields empty.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from jsonlbatch.answer_contract.contract import recorded, recorded_value
from jsonlbatch.batch_format.samples import Sample
from jsonlbatch.errors import UsageError
from jsonlbatch.file_io.jsonl import iter_lines

_TYPES: dict[str, type] = {"string": str, "integer": int, "number": float, "boolean": bool}
_JSON = object  # marks a column of JSON text
_MAX_SCHEMAS = 1000  # distinct schemas read for the column list


@dataclass
class FieldColumns:
    """Column name -> (the top-level field it holds, its type; `_JSON` for JSON text)."""

    columns: dict[str, tuple[str, Any]] = field(default_factory=dict)
    clashes: list[str] = field(default_factory=list)  # how each name clash was resolved, said

    @property
    def types(self) -> dict[str, type]:
        return {name: str if kind is _JSON else kind for name, (_, kind) in self.columns.items()}

    def values(self, sample: Sample) -> dict[str, Any]:
        """The row's field columns from the sample's recorded value (empty unless valid)."""
        valid, value = recorded_value(sample.metrics, sample.index)
        if not (valid and isinstance(value, dict)):
            return dict.fromkeys(self.columns)
        return {name: _cell(value.get(key), kind) for name, (key, kind) in self.columns.items()}


def field_columns(
    paths: Sequence[str], specs: Sequence[str] | None, taken: Iterable[str] = ()
) -> FieldColumns:
    """The field columns for the response files `paths`: `specs` (`NAME` or `COLUMN=NAME`) or,
    when None, every top-level property of the schemas recorded there. A field named like a
    result column in `taken` becomes `json_<name>`; a column named in `specs` wins over a result
    column of that name. Either way `clashes` says so, naming both."""
    types = _field_types(paths)
    taken = set(taken)
    out = FieldColumns()
    if specs is None:
        for key, kind in types.items():
            column = f"json_{key}" if key in taken else key
            out.columns[column] = (key, kind)
            if key in taken:
                out.clashes.append(f"schema field {key!r} is the column {column!r} (the result "
                                   f"column {key!r} keeps its name; --fields {key}={key} to "
                                   "replace it)")  # fmt: skip
        return out
    for spec in specs:
        for part in filter(None, (p.strip() for p in spec.split(","))):
            column, _, key = part.partition("=")
            key = key or column
            if key not in types:
                known = ", ".join(types) or "none: no line holds a schema"
                raise UsageError(f"--fields {part!r}: no top-level field {key!r} in the recorded "
                                 f"schemas (known: {known})")  # fmt: skip
            out.columns[column] = (key, types[key])
            if column in taken:
                out.clashes.append(f"--fields {part}: the schema field {key!r} replaces the result "
                                   f"column {column!r}")  # fmt: skip
    return out


def _field_types(paths: Sequence[str]) -> dict[str, Any]:
    """Top-level property -> type, over the distinct schemas recorded in the files (a field that
    two schemas type differently becomes JSON text)."""
    seen: set[bytes] = set()
    types: dict[str, Any] = {}
    for path in paths:
        for _, raw in iter_lines(path):
            if b'"contract":' not in raw or len(seen) >= _MAX_SCHEMAS:
                continue
            try:
                record = recorded(orjson.loads(raw).get("metrics"))
            except (orjson.JSONDecodeError, AttributeError):
                continue
            schema = record.get("schema") if record else None
            key = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
            if not isinstance(schema, dict) or key in seen:
                continue
            seen.add(key)
            for name, kind in _properties(schema).items():
                types[name] = kind if types.get(name, kind) == kind else _JSON
    return types


def _properties(schema: dict[str, Any]) -> dict[str, Any]:
    props = _resolve(schema, schema).get("properties")
    if not isinstance(props, dict):
        return {}
    return {name: _type_of(_resolve(sub, schema), schema) for name, sub in props.items()}


def _resolve(schema: Any, root: dict[str, Any]) -> dict[str, Any]:
    """A local `$ref` (`#/$defs/X`) followed, a few levels deep."""
    for _ in range(8):
        ref = schema.get("$ref") if isinstance(schema, dict) else None
        if not (isinstance(ref, str) and ref.startswith("#")):
            break
        target: Any = root
        for part in filter(None, ref[1:].split("/")):
            target = target.get(part) if isinstance(target, dict) else None
        schema = target
    return schema if isinstance(schema, dict) else {}


def _type_of(schema: dict[str, Any], root: dict[str, Any]) -> Any:
    kinds = schema.get("type")
    options = schema.get("anyOf") or schema.get("oneOf")
    if kinds is None and isinstance(options, list):
        kinds = [_resolve(o, root).get("type") for o in options]
        if any(not isinstance(k, str) for k in kinds):
            return _JSON
    if isinstance(kinds, list):
        kinds = [k for k in kinds if k != "null"]
        kinds = kinds[0] if len(kinds) == 1 else None
    if kinds is None and isinstance(schema.get("enum"), list):
        values = [v for v in schema["enum"] if v is not None]
        if values and all(isinstance(v, str) for v in values):
            kinds = "string"
    if kinds == "array" and _resolve(schema.get("items"), root).get("type") == "string":
        return list  # a list of strings: Parquet's list<string>
    return _TYPES.get(kinds, _JSON) if isinstance(kinds, str) else _JSON


def _cell(value: Any, kind: Any) -> Any:
    if value is None:
        return None
    if kind is _JSON:
        return orjson.dumps(value).decode()
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if kind is list:
        return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None
    if isinstance(value, bool) != (kind is bool):
        return None
    return value if isinstance(value, kind) else None

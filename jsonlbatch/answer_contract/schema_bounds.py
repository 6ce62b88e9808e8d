"""Bounds on the JSON Schemas requests declare for their answers: a schema is hostile input.

A request file comes from anywhere, and its schemas are compiled and run against every answer:
one schema could otherwise hang exec (a `pattern` that backtracks without end), take gigabytes
(a huge `enum` compiled to code), reach out to the network (a remote `$ref`), or end in a
RecursionError traceback (a `$ref` loop, deep nesting) after the requests were paid for. So each
distinct schema is checked once, up front, by `check_bounds` (`contract.compile_schema` calls
it: exec's input scan, `validate` and `gen` alike), and refused with a `SchemaError` saying
where and which limit before anything is sent:

- its JSON at most `bytes` long, objects and arrays at most `depth` deep, an `enum` at most
  `enum` entries, a `pattern` (or a `patternProperties` key) at most `pattern` characters, and
  one that compiles;
- every `$ref` inside the schema itself (`#...`): a remote one is never fetched, nor looked
  for (the validators are given an empty registry); one that points nowhere is refused;
- no `$ref` loop that comes back to a schema without going down into the answer (`{"$ref": "#"}`
  at the root; a recursive schema that descends, a tree, is fine);
- `unevaluatedProperties` not with `patternProperties` (jsonschema would run those patterns with
  Python's own engine, which cannot be stopped).

Checking one answer is bounded too (`answer_contract/bounded_check.py`): a check that cannot finish within
`seconds` is that answer's failure, never a hang.

The limits are `LIMITS`, raised with one environment variable,
`JSONLBATCH_SCHEMA_LIMITS="enum=200000,seconds=5"` (names as in `SchemaLimits`).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, fields, replace
from typing import Any
from urllib.parse import unquote

from jsonlbatch.answer_contract.bounded_check import compiled
from jsonlbatch.errors import UsageError

#: The environment variable that raises (or lowers) the limits.
ENV_VAR = "JSONLBATCH_SCHEMA_LIMITS"


@dataclass(frozen=True, slots=True)
class SchemaLimits:
    """What one schema may be, and how long checking one answer may take."""

    bytes: int = 4 << 20  # the schema as compact JSON
    depth: int = 48  # objects and arrays inside each other
    enum: int = 100_000  # entries of one enum
    pattern: int = 1_000  # characters of one pattern
    seconds: float = 2.0  # checking one answer


LIMITS = SchemaLimits()
#: The fast validator (fastjsonschema: compiled Python code, which cannot be stopped and grows
#: with the schema: 10,000 enum entries took 84 MB and 2.5 s to compile) only takes schemas this
#: small, with no pattern, no recursion and at most `_FAST_EXPANDED` schemas once `$ref`s are
#: followed; jsonschema checks the others.
_FAST_BYTES = 32 << 10
_FAST_ENUM = 512
_FAST_EXPANDED = 4096

# keywords whose value is one subschema, a list of them, or an object of them
_ONE = ("additionalProperties", "additionalItems", "items", "contains", "propertyNames", "not",
        "if", "then", "else", "unevaluatedItems", "unevaluatedProperties", "contentSchema")  # fmt: skip
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
        "dependencies")  # fmt: skip
# those applied to the same instance (not to a part of it): a loop through them never ends
_SAME = frozenset({"allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas",
                   "dependencies"})  # fmt: skip
_NOT_APPLIED = frozenset({"$defs", "definitions"})  # reached through a $ref only
_REFS = ("$ref", "$dynamicRef", "$recursiveRef")


class SchemaBoundError(ValueError):
    """A schema past a limit, or with a remote `$ref`, a `$ref` loop: `where` in the schema."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{message} (at {where})" if where else message)


@dataclass(frozen=True, slots=True)
class Shape:
    """What `check_bounds` learned of a schema: whether the fast validator may take it."""

    fast: bool


def limits() -> SchemaLimits:
    """The limits in force: `LIMITS`, changed by `$JSONLBATCH_SCHEMA_LIMITS`."""
    return parse_limits(os.environ.get(ENV_VAR, ""))


@functools.lru_cache(maxsize=8)
def parse_limits(text: str) -> SchemaLimits:
    """`LIMITS` changed by `text` ("enum=200000,seconds=5"); `UsageError` if it is not that."""
    changes: dict[str, Any] = {}
    names = {f.name: f.type for f in fields(SchemaLimits)}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        name = name.strip()
        try:
            number = float(value) if name == "seconds" else int(value)
        except ValueError:
            number = -1
        if name not in names or not 0 < number < float("inf"):  # nan, inf: no limit at all
            raise UsageError(
                f"{ENV_VAR}={text!r}: give name=number pairs, comma-separated, of "
                f"{', '.join(names)} (a positive number each)"
            )
        changes[name] = number
    return replace(LIMITS, **changes)


def check_bounds(schema: Any, size: int, bounds: SchemaLimits | None = None) -> Shape:
    """Raise `SchemaBoundError` unless `schema` (`size` bytes as JSON) is within `bounds` (see
    the module doc). Walks the schema without recursion, so any depth is reported, not a
    RecursionError."""
    bounds = bounds or limits()
    if size > bounds.bytes:
        raise SchemaBoundError("", f"the schema is {size:,} bytes as JSON, more than the "
                                   f"{bounds.bytes:,} allowed ({_raise('bytes')})")  # fmt: skip
    walk = _Walk(schema, bounds)
    walk.run()
    if walk.unevaluated and walk.pattern_properties:
        raise SchemaBoundError("", "unevaluatedProperties together with patternProperties is "
                               "not supported: jsonschema would run those patterns in Python's "
                               "own engine, where a check cannot be stopped")  # fmt: skip
    walk.refs_resolved()
    looping = walk.cycle(same_only=True)
    if looping is not None:
        raise SchemaBoundError(walk.where.get(looping, "#"), "a $ref loop: this schema comes "
                               "back to itself without going down into the answer")  # fmt: skip
    recursive = walk.cycle(same_only=False) is not None
    fast = (
        size <= _FAST_BYTES
        and walk.enum_entries <= _FAST_ENUM
        and not walk.patterns
        and not recursive
        and walk.expanded() <= _FAST_EXPANDED
    )
    return Shape(fast=fast)


class _Walk:
    """One pass over a schema: bounds checked, and the graph of its subschemas and `$ref`s
    (nodes are the dicts' ids) built for `cycle` and `expanded`."""

    def __init__(self, schema: Any, bounds: SchemaLimits) -> None:
        self.root, self.bounds = schema, bounds
        self.where: dict[int, str] = {}  # node -> its JSON pointer, for messages
        self.edges: dict[int, list[tuple[int, bool]]] = {}  # node -> (child, same instance)
        self.refs: list[tuple[int, str, Any, str]] = []  # (node, keyword, value, base pointer)
        self.bases: dict[str, Any] = {"": schema}  # resource pointer -> its schema
        self.anchors: dict[str, Any] = {}
        self.enum_entries = 0
        self.patterns = 0
        self.unevaluated = self.pattern_properties = False
        self.order: list[int] = []  # schemas, children first (`cycle`), for `expanded`

    def run(self) -> None:
        # (value, pointer, depth, is a schema, its resource's pointer)
        stack: list[tuple[Any, str, int, bool, str]] = [(self.root, "", 1, True, "")]
        while stack:
            value, at, depth, is_schema, base = stack.pop()
            if depth > self.bounds.depth:
                where = "#" + (at if len(at) < 80 else at[:80] + "...")
                raise SchemaBoundError(where, f"the schema nests more than {self.bounds.depth} "
                                       f"levels of objects and arrays ({_raise('depth')})")  # fmt: skip
            if isinstance(value, list):  # data: only what nests is looked into
                stack.extend((v, f"{at}/{i}", depth + 1, False, base)
                             for i, v in enumerate(value) if isinstance(v, (dict, list)))  # fmt: skip
            elif not isinstance(value, dict):
                continue
            elif not is_schema:
                stack.extend((v, f"{at}/{_esc(k)}", depth + 1, False, base)
                             for k, v in value.items() if isinstance(v, (dict, list)))  # fmt: skip
            else:
                base = self._schema(value, at, base)
                for key, child in value.items():
                    kinds = self._children(key, child)
                    child_at = f"{at}/{_esc(key)}"
                    if kinds is None:
                        stack.append((child, child_at, depth + 1, False, base))
                        continue
                    if isinstance(child, (dict, list)) and kinds != "one":
                        inner = child.items() if isinstance(child, dict) else enumerate(child)
                        for name, sub in inner:
                            self._edge(value, key, sub)
                            stack.append((sub, f"{child_at}/{_esc(name)}", depth + 2, True, base))
                    else:
                        self._edge(value, key, child)
                        stack.append((child, child_at, depth + 1, True, base))

    def _children(self, key: str, child: Any) -> str | None:
        """How `key`'s value holds subschemas: "one", "list", "map", or None (data)."""
        if key in _ONE and isinstance(child, (dict, bool)):
            return "one"
        if key in _LIST and isinstance(child, list):
            return "list"
        if key in _MAP and isinstance(child, dict):
            return "map"
        return None

    def _edge(self, parent: dict[str, Any], key: str, child: Any) -> None:
        if isinstance(child, dict) and key not in _NOT_APPLIED:
            self.edges.setdefault(id(parent), []).append((id(child), key in _SAME))

    def _schema(self, node: dict[str, Any], at: str, base: str) -> str:
        """Note what one schema object holds; the pointer of the resource it is in."""
        self.where[id(node)] = "#" + at
        self.edges.setdefault(id(node), [])
        ident = node.get("$id")
        if isinstance(ident, str) and at:
            if ident.startswith("#"):  # draft 7: a plain-name fragment, an anchor
                self.anchors[ident[1:]] = node
            else:
                base = at
                self.bases[base] = node
        for key in ("$anchor", "$dynamicAnchor"):
            if isinstance(node.get(key), str):
                self.anchors[node[key]] = node
        for key in _REFS:
            if key in node:
                self.refs.append((id(node), key, node[key], base))
        enum = node.get("enum")
        if isinstance(enum, list):
            if len(enum) > self.bounds.enum:
                raise SchemaBoundError("#" + at, f"an enum of {len(enum):,} entries, more than "
                                       f"the {self.bounds.enum:,} allowed ({_raise('enum')})")  # fmt: skip
            self.enum_entries += len(enum)
        if "pattern" in node and isinstance(node["pattern"], str):
            self._pattern(node["pattern"], f"{at}/pattern")
        props = node.get("patternProperties")
        if isinstance(props, dict):
            for name in props:
                self._pattern(name, f"{at}/patternProperties")
            self.pattern_properties |= bool(props)
        self.unevaluated |= "unevaluatedProperties" in node
        return base

    def _pattern(self, pattern: str, at: str) -> None:
        self.patterns += 1
        if len(pattern) > self.bounds.pattern:
            raise SchemaBoundError("#" + at, f"a pattern of {len(pattern):,} characters, more "
                                   f"than the {self.bounds.pattern:,} allowed "
                                   f"({_raise('pattern')})")  # fmt: skip
        try:
            compiled(pattern)
        except Exception as exc:  # regex.error, and whatever a hostile pattern raises
            raise SchemaBoundError("#" + at, f"not a valid pattern: {exc}") from None

    def refs_resolved(self) -> None:
        """Every `$ref` points inside the schema: an edge to what it points at."""
        for node, key, ref, base in self.refs:
            if not isinstance(ref, str):
                continue  # not a reference: the metaschema check says so
            at = self.where[node]
            if not ref.startswith("#"):
                raise SchemaBoundError(at, f"{key} {ref[:100]!r} points outside the schema: "
                                       "only references inside it (#...) are allowed, and "
                                       "nothing is ever fetched")  # fmt: skip
            target = self._resolve(ref, base)
            if target is _NOWHERE:
                raise SchemaBoundError(at, f"{key} {ref[:100]!r} points nowhere in the schema")
            if isinstance(target, dict):
                self.edges[node].append((id(target), True))

    def _resolve(self, ref: str, base: str) -> Any:
        fragment = unquote(ref[1:])
        if fragment and not fragment.startswith("/"):
            return self.anchors.get(fragment, _NOWHERE)
        target = self.bases.get(base, self.root)
        for part in fragment.split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                return _NOWHERE
        return target

    def cycle(self, same_only: bool) -> int | None:
        """A schema on a loop of the graph (of its same-instance edges only, with
        `same_only`), or None; without `same_only`, `order` is left children first.
        Depth-first, without recursion."""
        state: dict[int, int] = {}  # 1: on the path, 2: done
        order: list[int] = []
        for start in self.edges:
            if start in state:
                continue
            state[start] = 1
            stack = [(start, iter(self.edges[start]))]
            while stack:
                node, children = stack[-1]
                step = next(children, None)
                if step is None:
                    stack.pop()
                    state[node] = 2
                    order.append(node)
                    continue
                child, same = step
                if same_only and not same:
                    continue
                if state.get(child) == 1:
                    return child
                if child not in state:
                    state[child] = 1
                    stack.append((child, iter(self.edges.get(child, ()))))
        if not same_only:
            self.order = order
        return None

    def expanded(self) -> int:
        """How many schemas checking one value may visit, `$ref`s followed (for a schema that
        is not recursive; capped just past `_FAST_EXPANDED`)."""
        size: dict[int, int] = {}
        for node in self.order:
            total = 1 + sum(size.get(child, 1) for child, _ in self.edges.get(node, ()))
            size[node] = min(total, _FAST_EXPANDED + 1)
        return size.get(id(self.root), 1)


_NOWHERE = object()


def _raise(name: str) -> str:
    return f"{ENV_VAR}={name}=N raises it"


def _esc(key: Any) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


# -- the fast validator --------------------------------------------------------------------


#: Keywords that mean the same to fastjsonschema (draft 7) and to jsonschema (2020-12).
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment",
                          "readOnly", "writeOnly", "deprecated"})  # fmt: skip
_SAFE = _ANNOTATIONS | {
    "type", "properties", "required", "additionalProperties", "items", "enum", "const", "anyOf",
    "oneOf", "allOf", "not", "$ref", "$defs", "definitions", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength", "pattern",
    "minItems", "maxItems", "uniqueItems", "minProperties", "maxProperties",
    "patternProperties", "propertyNames", "$schema",
}  # fmt: skip


def fast_safe(schema: Any) -> bool:
    """Whether `schema` uses only keywords draft 7 and 2020-12 read alike: no `format` (whose
    checks differ by installed libraries), `items` as one schema, numeric exclusive bounds,
    `enum`/`const` of strings (Python's `1 == True` would blur the rest), local `$ref` alone."""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict) or not schema.keys() <= _SAFE:
        return False
    ref = schema.get("$ref")
    if ref is not None and (
        not str(ref).startswith("#") or not schema.keys() - {"$ref"} <= _ANNOTATIONS
    ):
        return False
    if not isinstance(schema.get("items", {}), (dict, bool)):
        return False
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        if isinstance(schema.get(key), bool):
            return False
    values = [schema["const"]] if "const" in schema else schema.get("enum", [])
    if not isinstance(values, list) or not all(isinstance(v, str) or v is None for v in values):
        return False
    subs: list[Any] = [schema.get(k) for k in ("items", "additionalProperties", "not",
                                                "propertyNames") if k in schema]  # fmt: skip
    for key in ("properties", "patternProperties", "$defs", "definitions"):
        found = schema.get(key, {})
        if not isinstance(found, dict):
            return False
        subs += found.values()
    for key in ("anyOf", "oneOf", "allOf"):
        found = schema.get(key, [])
        if not isinstance(found, list):
            return False
        subs += found
    return all(fast_safe(sub) for sub in subs)


def fast_validator(schema: dict[str, Any]) -> Any:
    """fastjsonschema's compiled check of `schema`, when installed and safe; else None."""
    try:
        import fastjsonschema
    except ImportError:
        return None
    if not fast_safe(schema):
        return None
    try:
        return fastjsonschema.compile({k: v for k, v in schema.items() if k != "$schema"})
    except Exception:  # a schema it cannot compile is left to jsonschema
        return None

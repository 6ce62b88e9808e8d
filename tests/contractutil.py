"""Shared by the answer-contract tests: one schema with what real ones have (an enum, a number,
an array, a nested object through `$ref`, a nullable field) and an answer that holds it."""

from __future__ import annotations

SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": ["pos", "neg"]},
        "score": {"type": "number"},
        "who": {"$ref": "#/$defs/Person"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["label", "score", "who", "tags"],
    "additionalProperties": False,
    "$defs": {
        "Person": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            },
            "required": ["name", "age"],
            "additionalProperties": False,
        }
    },
}
GOOD = {"label": "pos", "score": 0.5, "who": {"name": "Ada", "age": None}, "tags": []}

"""Deliverables rendered from JSON specs: the model describes a file, one fixed renderer makes it.

To compare models on tasks whose deliverables are office files, the model writes a JSON
description of each file (`{"files": [{"path": "budget.xlsx", "spec": {...}}]}`) and the same
code turns every model's description into the real file, so the comparison measures what the
model understood rather than how well it writes openpyxl code.

The spec language is a versioned JSON Schema (`schema-1.json` beside this file, printed by
`jsonlbatch post render-schema`, documented in docs/post.md) so it can be put into prompts.
Specs are untrusted model output: each is validated against the schema and counted against
`RenderLimits` before anything is drawn, and a file is rendered to memory first, so a bad spec is
refused with its reason and never leaves a half-written file.

The office libraries (openpyxl, python-docx, python-pptx, fpdf2) are the optional
`render` extra.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jsonlbatch.extras import require

SCHEMA_VERSION = 1
FORMATS = ("xlsx", "docx", "pdf", "pptx", "csv", "md")
_SCHEMA_FILE = Path(__file__).with_name(f"schema-{SCHEMA_VERSION}.json")
#: the import names of the `render` extra
_NEEDS = ("jsonschema", "openpyxl", "docx", "pptx", "fpdf")


class SpecError(ValueError):
    """A spec that cannot be rendered; the message says why (it goes into the manifest)."""


@dataclass(frozen=True)
class RenderLimits:
    """Caps beyond the schema's own (which bounds each list): totals over one file."""

    max_cells: int = 200_000  # table and sheet cells together
    max_text_chars: int = 2_000_000


def schema() -> dict[str, Any]:
    """The published JSON Schema of one entry of `files` (version `SCHEMA_VERSION`)."""
    return json.loads(_SCHEMA_FILE.read_text(encoding="utf-8"))


def require_libraries() -> None:
    """Fail up front, naming the extra, rather than refusing every file one by one."""
    require(*_NEEDS, extra="render", for_what="--render")


def format_of(path: str, declared: Any = None) -> str:
    """The format asked for: `format` when given, else the path's suffix."""
    if declared is not None:
        if declared not in FORMATS:
            raise SpecError(f"unknown format {declared!r} (known: {', '.join(FORMATS)})")
        return str(declared)
    suffix = os.path.splitext(path)[1].lower().lstrip(".")
    if suffix == "markdown":
        suffix = "md"
    if suffix not in FORMATS:
        raise SpecError(
            f"cannot tell the format of {path!r}: name it .{', .'.join(FORMATS)} or give 'format'"
        )
    return suffix


def render(path: str, spec: Any, declared: Any = None, limits: RenderLimits | None = None) -> bytes:
    """The file's bytes, or `SpecError` saying why the spec cannot be rendered."""
    fmt = format_of(path, declared)
    # The totals first: one linear pass, where the schema's validator (pure Python) takes
    # seconds on a spec of a few hundred thousand cells, which an answer may hold.
    _check_totals(spec, limits or RenderLimits())
    _validate(fmt, spec)
    from jsonlbatch.post.render import formats

    logging.getLogger("fpdf").setLevel(logging.ERROR)  # missing glyphs are not the user's error

    try:
        return formats.RENDERERS[fmt](spec)
    except SpecError:
        raise
    except Exception as exc:  # a library refusing a value the schema let through
        raise SpecError(f"{fmt} renderer refused the spec: {type(exc).__name__}: {exc}") from None


@functools.cache
def _validator(fmt: str) -> Any:
    from jsonschema import Draft202012Validator

    defs = schema()["$defs"]
    return Draft202012Validator({"$ref": f"#/$defs/{fmt}", "$defs": defs})


def _validate(fmt: str, spec: Any) -> None:
    from jsonschema.exceptions import best_match

    error = best_match(_validator(fmt).iter_errors(spec))
    while error is not None and error.validator == "oneOf" and error.context:
        # a block of a known type: report what is wrong inside it, not "valid under none"
        kind = error.instance.get("type") if isinstance(error.instance, dict) else None
        inner = [e for e in error.context if e.relative_schema_path[0] == _branch(error, kind)]
        if not inner:
            kinds = ", ".join(_branch_kinds(error))
            raise SpecError(f"{_where(error)}: 'type' must be one of {kinds}")
        error = best_match(inner)
    if error is not None:
        message = error.message if len(error.message) <= 200 else error.message[:200] + "..."
        raise SpecError(f"{_where(error)}: {message} (schema {fmt}, version {SCHEMA_VERSION})")


def _where(error: Any) -> str:
    return "spec" + "".join(
        f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path
    )


def _branch_kinds(error: Any) -> list[str]:
    return [b["properties"]["type"]["const"] for b in error.schema["oneOf"]]


def _branch(error: Any, kind: Any) -> int | None:
    kinds = _branch_kinds(error)
    return kinds.index(kind) if kind in kinds else None


def _check_totals(spec: Any, limits: RenderLimits) -> None:
    cells = chars = 0
    stack = [spec]
    while stack:  # iterative: a spec is untrusted and may be deep
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            if value and all(isinstance(row, list) for row in value):
                cells += sum(len(row) for row in value)
            stack.extend(value)
        elif isinstance(value, str):
            chars += len(value)
    if cells > limits.max_cells:
        raise SpecError(f"{cells} cells, over the limit of {limits.max_cells}")
    if chars > limits.max_text_chars:
        raise SpecError(f"{chars} characters of text, over the limit of {limits.max_text_chars}")


__all__ = [
    "FORMATS",
    "SCHEMA_VERSION",
    "RenderLimits",
    "SpecError",
    "format_of",
    "render",
    "require_libraries",
    "schema",
]

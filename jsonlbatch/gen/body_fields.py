"""The body fields every request starts from: a `--body-file`, `--param KEY=JSON` patches, and
the JSON Merge Patch (RFC 7386) that lays one over the other (and `RequestWriter`'s own
defaults over both)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from jsonlbatch.errors import InputError, UsageError
from jsonlbatch.file_io.filecheck import read_json


def merge_patch(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`target` updated by `patch` as in JSON Merge Patch (RFC 7386): objects merge key by key,
    `None` removes a key, anything else replaces. `target` is not modified."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_patch(out[key], value)
        else:
            out[key] = value
    return out


def parse_param(text: str) -> dict[str, Any]:
    """`key=JSON` as a merge patch; a dotted key reaches into objects
    (`chat_template_kwargs.enable_thinking=false`); a value that is not JSON is a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise UsageError(f"--param wants KEY=JSON, got {text!r}")
    try:
        value: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        value = raw
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def load_body_file(path: str) -> dict[str, Any]:
    """A JSON object of body fields to start every request from."""
    body = read_json(path, "body file")
    if not isinstance(body, dict):
        raise InputError(f"body file {path} must hold a JSON object")
    return body

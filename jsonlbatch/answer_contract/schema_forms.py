"""A request's answer schema in the form its endpoint expects, read and written (so gen,
exec, the mock and the readers agree):

- chat and completions (OpenAI, vLLM, SGLang): ``response_format`` of type
  ``json_schema`` (``json_schema.schema``), or ``json_object`` (any object); vLLM's
  ``structured_outputs.json`` and its removed ``guided_json`` (ignored by vLLM 0.32,
  which then answers unconstrained: all the more reason to check);
- the Responses API: ``text.format`` of type ``json_schema`` (``schema``) or
  ``json_object``;
- Anthropic's Messages API: ``output_config.format`` of type ``json_schema``; and the
  older tool form, one tool forced by ``tool_choice`` whose ``input_schema`` is the
  schema (the answer is the tool call's input).

Checking answers against the schema found here is `contract`'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from jsonlbatch.answer_contract.contract import SchemaError, compile_schema
from jsonlbatch.batch_format.records import (
    CHAT_URL,
    COMPLETIONS_URL,
    MESSAGES_URL,
    RESPONSES_URL,
    json_object,
)

#: The endpoints a schema can be declared for.
SCHEMA_URLS = (CHAT_URL, COMPLETIONS_URL, RESPONSES_URL, MESSAGES_URL)
#: The `name` written into forms that need one (OpenAI: [a-zA-Z0-9_-], at most 64 characters).
DEFAULT_NAME = "answer"
#: Stands for "any JSON object" (`json_object` response formats).
ANY_OBJECT: dict[str, Any] = {"type": "object"}

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True)
class Declared:
    """A schema found in a request body: where it was (`field`, for messages) and its form."""

    schema: dict[str, Any]
    field: str
    tool: str | None = None  # the forced tool's name (Anthropic's tool form)


# -- reading and writing the declaration ---------------------------------------------------------


def declared_schema(url: str, body: Any) -> Declared | None:
    """The schema a request body declares for its answer, in whichever form, or None.

    Raises `SchemaError` for a declaration that is malformed (a schema that is not an object).
    """
    if not isinstance(body, dict):
        return None
    if url == RESPONSES_URL:
        text = body.get("text")
        fmt = text.get("format") if isinstance(text, dict) else None
        return _from_format(fmt, "body.text.format", "schema")
    if url == MESSAGES_URL:
        config = body.get("output_config")
        fmt = config.get("format") if isinstance(config, dict) else None
        found = _from_format(fmt, "body.output_config.format", "schema")
        return found if found is not None else _forced_tool(body)
    if url not in (CHAT_URL, COMPLETIONS_URL):
        return None
    found = _from_format(body.get("response_format"), "body.response_format", "json_schema")
    if found is not None:
        return found
    outputs = body.get("structured_outputs")
    if isinstance(outputs, dict) and outputs.get("json") is not None:
        return Declared(_schema_value(outputs["json"], "body.structured_outputs.json"),
                        "body.structured_outputs.json")  # fmt: skip
    if body.get("guided_json") is not None:
        return Declared(_schema_value(body["guided_json"], "body.guided_json"), "body.guided_json")
    return None


#: Body fields that may declare the answer's schema: a body without any needs no look.
SCHEMA_KEYS = frozenset(
    {"response_format", "text", "output_config", "structured_outputs", "guided_json", "tools"}
)


def check_declared(url: Any, body: Any) -> list[tuple[str, str]]:
    """Problems with the schema a request declares, as (field, message) pairs: it must be a
    valid JSON Schema, since exec checks every answer against it (compiled once per distinct
    schema). exec's input scan (so `validate` too) and gen's writer call it beside
    `records.check_request`, so a bad schema stops them before anything is sent or written."""
    if not isinstance(body, dict) or SCHEMA_KEYS.isdisjoint(body) or not isinstance(url, str):
        return []
    field_name = "body"
    try:
        found = declared_schema(url, body)
        if found is not None:
            field_name = found.field
            compile_schema(found.schema)
    except SchemaError as exc:
        return [(exc.field or field_name, str(exc))]
    return []


def _from_format(fmt: Any, where: str, key: str) -> Declared | None:
    if not isinstance(fmt, dict):
        return None
    kind = fmt.get("type")
    if kind == "json_object":
        return Declared(ANY_OBJECT, where)
    if kind != "json_schema":
        return None
    holder: Any = fmt
    if key == "json_schema":
        holder = fmt.get(key)
        if not isinstance(holder, dict):
            raise SchemaError(f"{where}.json_schema", "missing or not an object")
        where = f"{where}.json_schema"
    return Declared(_schema_value(holder.get("schema"), f"{where}.schema"), f"{where}.schema")


def _forced_tool(body: dict[str, Any]) -> Declared | None:
    choice, tools = body.get("tool_choice"), body.get("tools")
    if not (isinstance(choice, dict) and choice.get("type") == "tool" and isinstance(tools, list)):
        return None
    for i, tool in enumerate(tools):
        if isinstance(tool, dict) and tool.get("name") == choice.get("name"):
            where = f"body.tools[{i}].input_schema"
            return Declared(_schema_value(tool.get("input_schema"), where), where, tool["name"])
    return None


def _schema_value(value: Any, where: str) -> dict[str, Any]:
    if isinstance(value, str):  # vLLM takes a schema as a JSON string too
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise SchemaError(where, f"not JSON: {exc}") from None
    if isinstance(value, bool):  # `true` accepts anything; `false` nothing: both are schemas
        return {} if value else {"not": {}}
    if not isinstance(value, dict):
        raise SchemaError(where, "a JSON Schema must be an object")
    return value


def with_schema(
    url: str,
    body: dict[str, Any],
    schema: dict[str, Any],
    *,
    name: str = DEFAULT_NAME,
    strict: bool = True,
) -> dict[str, Any]:
    """`body` with `schema` declared in the form `url` expects (a new dict; `strict` where the
    form has it). Raises `SchemaError` for a URL that takes no schema or a bad name."""
    if not _NAME.match(name):
        raise SchemaError("name", f"{name!r}: use 1 to 64 of a-z, A-Z, 0-9, _ and -")
    if url in (CHAT_URL, COMPLETIONS_URL):
        form: dict[str, Any] = {"type": "json_schema", "json_schema": {"name": name, "schema": schema,
                                                       "strict": strict}}  # fmt: skip
        return {**body, "response_format": form}
    if url == RESPONSES_URL:
        text = json_object(body.get("text"))
        form = {"type": "json_schema", "name": name, "schema": schema, "strict": strict}
        return {**body, "text": {**text, "format": form}}
    if url == MESSAGES_URL:
        config = json_object(body.get("output_config"))
        form = {"type": "json_schema", "schema": schema}
        return {**body, "output_config": {**config, "format": form}}
    raise SchemaError("url", f"{url} takes no response schema (only {', '.join(SCHEMA_URLS)})")

"""The answer contract when the model may call tools: a call is held to its tool's schema.

A chat request that declares an answer schema (`response_format`) and offers `tools` has two
kinds of answer: the final one, which must hold the answer schema, and a tool-call turn, whose
calls must each hold the `parameters` schema of the tool they name. A call's arguments are never
checked against the answer schema (they would break it, and be re-asked until they did):

- each call names a tool of the request (an unknown name is invalid) and its arguments (a JSON
  string) decode to a value its tool's `parameters` accept (a tool without `parameters`
  accepts any object);
- a turn is valid when every call is; the verdict's message names the call and the tool;
- an invalid turn is re-asked as any broken answer (`--reask`); with `--reask-feedback` the
  follow-up is the assistant's turn with its calls, then one `role: "tool"` message per call
  saying what was wrong (`tool_feedback`): what an agent loop tells a model that called a tool
  wrongly, and a conversation a server accepts (every call answered).

The tools' schemas are checked up front by exec's input scan (`check_tool_schemas`), as the
answer schema is: an unusable one stops the run naming file, line and field.
"""

from __future__ import annotations

from typing import Any

import orjson

from jsonlbatch.answer_contract.bounded_check import deadline
from jsonlbatch.answer_contract.contract import (
    ChoiceVerdict,
    Contract,
    SchemaError,
    answer_texts,
    check_choice,
    check_choices,
    compile_schema,
)
from jsonlbatch.answer_contract.schema_forms import Declared, declared_schema
from jsonlbatch.batch_format.records import CHAT_URL

#: What the tool message of a feedback re-ask says; {error} is the validator's message.
TOOL_FEEDBACK = (
    "Error: this call was not run: {error}. Call the tool again with arguments that match its "
    "parameters schema."
)


def tool_schemas(url: str, body: Any) -> dict[str, tuple[str, Any]]:
    """`name -> (field, parameters schema)` of the functions a chat body offers; empty for
    another endpoint or a body without tools."""
    tools = body.get("tools") if url == CHAT_URL and isinstance(body, dict) else None
    if not isinstance(tools, list):
        return {}
    out: dict[str, tuple[str, Any]] = {}
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            where = f"body.tools[{i}].function.parameters"
            out.setdefault(function["name"], (where, function.get("parameters")))
    return out


def check_tool_schemas(url: str, body: Any) -> list[tuple[str, str]]:
    """Problems with the tools' `parameters` of a body under a schema contract (the only case
    where exec checks calls against them), as (field, message) pairs."""
    try:
        if declared_schema(url, body) is None:
            return []
    except SchemaError:
        return []  # `check_declared` says so
    problems = []
    for where, schema in tool_schemas(url, body).values():
        if schema is None:
            continue
        if not isinstance(schema, dict):
            problems.append((where, "a JSON Schema must be an object"))
            continue
        try:
            compile_schema(schema)
        except SchemaError as exc:
            problems.append((where, str(exc)))
    return problems


def check_answer_choices(
    url: str, request_body: Any, declared: Declared, body: Any
) -> list[ChoiceVerdict]:
    """The verdict on every choice of an answer: a turn that calls tools against the tools'
    schemas, any other against the answer schema (`contract.check_choices`)."""
    contract = compile_schema(declared.schema)
    tools = tool_schemas(url, request_body) if declared.tool is None else {}
    choices = body.get("choices") if isinstance(body, dict) else None
    if not tools or not isinstance(choices, list) or not choices:
        return check_choices(contract, body, declared.tool)
    texts = answer_texts(body)
    with deadline(contract.seconds):
        return [
            _check_tool_choice(contract, tools, c, t) for c, t in zip(choices, texts, strict=False)
        ]


def broken_turn(body: Any, tool: str | None, verdicts: list[ChoiceVerdict]) -> Any:
    """What the first invalid choice said, for a re-ask's feedback and its journal: the
    assistant message of a turn that called tools, else its text (`answer_texts`)."""
    texts = answer_texts(body, tool)
    choices = body.get("choices") if isinstance(body, dict) else None
    for i, (text, verdict) in enumerate(zip(texts, verdicts, strict=False)):
        if verdict.valid:
            continue
        message = _calls_message(choices[i] if isinstance(choices, list) else None)
        return message if message is not None else text
    return ""


def tool_feedback(turn: dict[str, Any], error: str) -> list[dict[str, Any]]:
    """The follow-up turns of a re-ask after a turn whose calls broke their tools' schemas:
    the turn itself, then one tool message per call saying why it was not run."""
    calls = [c for c in turn.get("tool_calls", ()) if isinstance(c, dict)]
    note = TOOL_FEEDBACK.format(error=error)
    assistant = {"role": "assistant", "content": turn.get("content"), "tool_calls": calls}
    return [assistant, *({"role": "tool", "tool_call_id": c.get("id"), "content": note}
                         for c in calls)]  # fmt: skip


def _calls_message(choice: Any) -> dict[str, Any] | None:
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict) or not isinstance(message.get("tool_calls"), list):
        return None
    if not message["tool_calls"]:
        return None
    return {"role": "assistant", "content": message.get("content"),
            "tool_calls": message["tool_calls"]}  # fmt: skip


def _check_tool_choice(
    contract: Contract, tools: dict[str, tuple[str, Any]], choice: Any, text: Any
) -> ChoiceVerdict:
    message = _calls_message(choice)
    if message is None:
        return check_choice(contract, text)
    for k, call in enumerate(message["tool_calls"], 1):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if name not in tools:
            return ChoiceVerdict(False, f"call {k} names no tool of the request: {name!r}")
        assert isinstance(function, dict)
        arguments = function.get("arguments")
        try:
            value = orjson.loads(arguments) if isinstance(arguments, str) else arguments
        except orjson.JSONDecodeError as exc:
            return ChoiceVerdict(False, f"call {k} to {name}: the arguments are not JSON: {exc}")
        schema = tools[name][1]
        try:
            checker = compile_schema(schema if schema is not None else {"type": "object"})
        except (SchemaError, AttributeError, TypeError):  # the input scan refuses these first
            return ChoiceVerdict(False, f"call {k} to {name}: the tool's parameters schema "
                                        "cannot be used")  # fmt: skip
        error = checker.check(value)
        if error is not None:
            return ChoiceVerdict(False, f"call {k} to {name}: {error}")
    return ChoiceVerdict(True)

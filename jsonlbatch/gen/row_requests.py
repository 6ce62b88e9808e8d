"""A source's rows made into requests through a `RequestWriter`: one prompt per row, its
custom_id (a template, the row's natural key, or its index), its schema, model and carried
tools; every error names the row (file, line, field), and a repeated id names the earlier row."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from jsonlbatch.batch_format.records import CHAT_URL
from jsonlbatch.errors import InputError, UsageError
from jsonlbatch.gen.sources import Row
from jsonlbatch.gen.templates import Prompt, RowTemplate
from jsonlbatch.gen.writer import CHAT_LIKE, RequestError, RequestWriter


def write_requests(
    rows: Iterable[Row],
    writer: RequestWriter,
    prompt: Prompt,
    *,
    custom_id: RowTemplate | None = None,
    schema_field: str | None = None,
    model: RowTemplate | None = None,
    extra: Callable[[Row], Mapping[str, Any]] | None = None,
) -> None:
    """One prompt per row into `writer`; errors name the row. The id is the rendered
    `custom_id` template, else the row's natural key (a response's id), else its index.
    `schema_field` names the column holding each row's answer schema (an empty cell: the
    writer's schema, if any). `model` renders each row's model (`--model "{{ model }}"`): one
    request file for a fleet, instead of a `gen` per model joined with `cat`. `extra(row)` gives
    more of the row's body (an experiment's code interpreter tool with the row's files)."""
    check_prompt(prompt, writer.url)  # a usage error up front, not one per row
    first = writer.summary.prompts
    row_of_prompt = array("q")  # 8 bytes a row: names the earlier row of a repeated id
    for row in rows:
        cid = row_custom_id(row, custom_id)
        content = prompt.build(row)
        schema = None
        if schema_field is not None:
            if schema_field not in row.data:
                raise InputError(
                    "no schema column",
                    [row.problem(schema_field, f"has no field {schema_field!r} (--schema-field)")],
                )
            schema = row.data[schema_field] if row.data[schema_field] not in ("", None) else None
        # the tools of a continued conversation, unless the writer sets its own (--param)
        per_row = {k: v for k, v in prompt.carried(row).items() if k not in writer.defaults}
        if model is not None:
            name = model.render(row).strip()
            if not name:
                raise InputError("no model", [row.problem(None, "--model renders empty here")])
            per_row["model"] = name
        if extra is not None:
            per_row.update(extra(row))
        try:
            writer.add(cid, content, schema=schema, **per_row)
        except RequestError as exc:
            fields = exc.fields
            if schema_field is not None:  # a row's schema: name its column
                fields = [(schema_field if f == "schema" else f, m) for f, m in fields]
            if exc.repeats is not None and exc.repeats >= first:
                earlier = row_of_prompt[exc.repeats - first]
                fields = [("custom_id", f"{exc.custom_id!r} repeats the id of row {earlier}")]
            raise InputError(
                "cannot write the request of a row", [row.problem(f, m) for f, m in fields]
            ) from None
        row_of_prompt.append(row.index)


def check_prompt(prompt: Prompt, url: str) -> None:
    """Refuse chat-only prompt parts (a system text, a messages template) for the endpoints
    that take a plain prompt, before any row is read (the Responses and Messages APIs take
    messages too)."""
    if url in CHAT_LIKE or (prompt.system is None and prompt.messages is None):
        return
    what = "--system" if prompt.system is not None else "--messages"
    raise UsageError(
        f"{what} builds chat messages, but {url} takes a prompt string: use --template or "
        f"--prompt alone, or --url {CHAT_URL}"
    )


def row_custom_id(row: Row, custom_id: RowTemplate | None = None) -> str:
    """A row's custom_id: the rendered `custom_id` template, else the row's natural key (a
    response's id), else its index in its source."""
    if custom_id is not None:
        cid = custom_id.render(row).strip()
    else:
        cid = row.key if row.key is not None else str(row.index)
    if not cid:
        raise InputError("empty custom_id", [row.problem("custom_id", "the id rendered empty")])
    return cid

"""Saved responses as a data source: a second turn, a self-check, a judge or a repair prompt.

Each response line (or each choice of it, `per="choice"`) becomes a `Row` whose fields a
template reads like any data field:

| field | value |
| --- | --- |
| `custom_id` | the response's id (per choice: the choice's sample id, `id[k]`, when there are several) |
| `group`, `sample` | the id split as `post` splits it (`q7|2` -> `q7`, `2`; no separator: the id, null) |
| `answer`, `reasoning` | the answer text and the reasoning, as `post` extracts them (`<think>` split off) |
| `answers` | per request: the answer of every choice |
| `choice`, `choices` | the choice's index and how many the response had |
| `finish_reason`, `usage`, `model`, `tool_calls` | from the response body |
| `prompt_tokens`, `completion_tokens`, `reasoning_tokens` | where `answers` says the endpoint puts them (numbers only; null when absent) |
| `json`, `valid` | answers under a schema: the JSON value exec read and validated (null unless valid), and whether it held (null without a schema) |
| `failed`, `error` | whether the request failed (or its 2xx body holds no usable answer, by `answers`' rules), and why |
| `messages`, `prompt`, `body` | with `requests=`: the request's messages (chat) or prompt, and its whole body |
| `conversation` | with `requests=` (chat): the messages plus the assistant's answer (its `tool_calls` kept), ready to continue |
| `data` + its fields | with `join=` and `on=`: the original data row whose `on` field equals the group |

A joined row's fields are also offered at the top level where they do not clash with the fields
above, so the first turn's template (`{{ question }}`) reads the same in the second.

Memory: the response file streams; `requests=` keeps one byte offset per request id and reads a
request line when its response comes; `join=` holds the joined data file's rows (a dataset, not a
run's output).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import IO, Any

import orjson

from jsonlbatch.answer_contract.contract import recorded, recorded_value
from jsonlbatch.batch_format.answers import unusable_reason, usage_metrics
from jsonlbatch.batch_format.records import CHAT_URL, check_response
from jsonlbatch.batch_format.samples import (
    DEFAULT_SEPARATORS,
    Sample,
    hosted_url,
    samples_of,
    split_id,
)
from jsonlbatch.errors import InputError, Problem, UsageError
from jsonlbatch.file_io.jsonl import iter_lines, iter_lines_at, read_lines_at
from jsonlbatch.gen.sources import Row, iter_rows

PER = ("request", "choice")
#: Token counts offered as fields, found where `answers` says each endpoint puts them.
TOKEN_FIELDS = ("prompt_tokens", "completion_tokens", "reasoning_tokens")


def looks_like_responses(path: str) -> bool:
    """Whether the first line of a JSONL file is a response line (`custom_id` and `response` or
    `error`, no request `body`): how `gen --data` tells a run's output from a dataset."""
    if path == "-" or not os.path.isfile(path):
        return False
    try:
        for _, raw in iter_lines(path):
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                return False
            return (
                isinstance(obj, dict)
                and "custom_id" in obj
                and ("response" in obj or "error" in obj)
                and "body" not in obj
            )
    except (OSError, InputError):  # unreadable, or a JSON array (a .json dataset)
        return False
    return False


class RequestIndex:
    """custom_id -> request line, by byte offset: the request file is read twice, held never."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: IO[bytes] | None = None
        self._offsets: dict[str, int] = {}
        for lineno, start, raw in iter_lines_at(path):
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise InputError(
                    "bad request file", [Problem.bad_json(path, lineno, exc)]
                ) from None
            cid = obj.get("custom_id") if isinstance(obj, dict) else None
            if not isinstance(cid, str) or not isinstance(obj.get("body"), dict):
                raise InputError(
                    "bad request file",
                    [Problem(path, lineno, "custom_id", "not a request line (custom_id, body)")],
                )
            self._offsets[cid] = start

    def get(self, custom_id: str) -> dict[str, Any] | None:
        start = self._offsets.get(custom_id)
        if start is None:
            return None
        if self._file is None:
            # one handle, small buffer: a seek + readline per response, not a fresh 1 MiB read
            self._file = open(self.path, "rb")  # noqa: SIM115 - closed by close()
        self._file.seek(start)
        return orjson.loads(self._file.readline())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> RequestIndex:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class DataIndex:
    """The rows of a data file by the text of one field (`row_index` when the rows lack it)."""

    def __init__(self, path: str, on: str) -> None:
        self.path, self.on = path, on
        self._rows: dict[str, dict[str, Any]] = {}
        for row in iter_rows(path):
            value = row.data.get(on, row.index if on == "row_index" else None)
            if value is None:
                raise InputError(
                    f"cannot join on {on!r}", [row.problem(on, "the row has no such field")]
                )
            self._rows.setdefault(str(value), row.data)

    def get(self, *keys: str) -> dict[str, Any] | None:
        for key in keys:
            if key in self._rows:
                return self._rows[key]
        return None


def response_rows(
    path: str,
    *,
    requests: str | None = None,
    join: str | None = None,
    on: str | None = None,
    per: str = "request",
    separators: Sequence[str] = DEFAULT_SEPARATORS,
) -> Iterator[Row]:
    """Stream the rows of a response file (see the module docstring for the fields)."""
    if per not in PER:
        raise UsageError(f"per must be one of {', '.join(PER)}, got {per!r}")
    if (join is None) != (on is None):
        raise UsageError("--join FILE and --on FIELD go together")
    index = RequestIndex(requests) if requests else None
    data = DataIndex(join, on) if join and on else None
    try:
        yield from _rows(path, index, data, per, separators)
    finally:
        if index is not None:
            index.close()


def _rows(
    path: str,
    index: RequestIndex | None,
    data: DataIndex | None,
    per: str,
    separators: Sequence[str],
) -> Iterator[Row]:
    count = 0
    for lineno, start, raw in iter_lines_at(path):
        where = Problem(path, lineno, None, "")
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            torn = " (a torn last line: let exec finish first)" if _is_last(path, start) else ""
            problem = _at(where, None, f"bad JSON: {exc}{torn}")
            raise InputError("bad response file", [problem]) from None
        problems = check_response(obj)
        if problems:
            raise InputError("bad response file", [_at(where, f, m) for f, m in problems])
        base = _request_fields(index, obj["custom_id"], where)
        samples, tokens = _samples(obj, base.pop("url", CHAT_URL), path, lineno)
        group, sample = split_id(obj["custom_id"], separators)
        if data is not None:
            joined = data.get(group, obj["custom_id"])
            if joined is None:
                raise InputError(
                    f"cannot join {path} with {data.path}",
                    [_at(where, "custom_id", f"no row of {data.path} has {data.on} == {group!r}")],
                )
            base = {**joined, "data": joined, **base}
        base |= {"custom_id": obj["custom_id"], "group": group, "sample": _sample(sample)}
        chosen = samples if per == "choice" else samples[:1]
        for s in chosen:
            fields = {**base, **_sample_fields(s), **tokens}
            if per == "choice":
                fields["custom_id"] = s.sample_id
            else:
                fields["answers"] = [x.text for x in samples]
            if "messages" in base and isinstance(base["messages"], list) and not s.failed:
                fields["conversation"] = [*base["messages"], _assistant_turn(s)]
            yield Row(path, count, lineno, fields, key=fields["custom_id"])
            count += 1


def _samples(
    obj: dict[str, Any], url: str, path: str, line: int
) -> tuple[list[Sample], dict[str, Any]]:
    """The line's samples, judged by the endpoint's rules in `answers` (the request's URL, else
    chat's): a 2xx body with no usable answer is a failure, as exec records it; the token
    counts are the ones `answers` finds for that endpoint (numbers only)."""
    samples = samples_of(obj, path=path, line=line)
    response = obj.get("response")
    body = response.get("body") if isinstance(response, dict) else None
    url = hosted_url(body) or url  # a provider batch's answer to a chat line, in its own form
    if not samples[0].failed:
        why = unusable_reason(url, body)
        if why is not None:
            unusable = Sample(
                obj["custom_id"], error=f"unusable answer: {why}", path=path, line=line
            )
            return [unusable], dict.fromkeys(TOKEN_FIELDS)
    tokens = usage_metrics(url, body)
    return samples, {k: tokens.get(k) for k in TOKEN_FIELDS}


def _assistant_turn(s: Sample) -> dict[str, Any]:
    """The answer as the next request's assistant message: its text, and its tool calls as
    they came (ids, names, arguments), so their `role: tool` results can answer them; the
    content of a turn that only calls tools is null, as the API writes it."""
    if not s.tool_calls:
        return {"role": "assistant", "content": s.text}
    return {"role": "assistant", "content": s.text or None, "tool_calls": s.tool_calls}


def _sample_fields(s: Sample) -> dict[str, Any]:
    valid, value = recorded_value(s.metrics, s.index)
    return {
        "answer": s.text,
        # answers under a schema: the value exec read and validated (answer_contract/contract.py), for a judge
        # or a repair prompt; `valid` is null for an answer exec checked against no schema
        "json": value if valid else None,
        "valid": valid if recorded(s.metrics) is not None else None,
        "reasoning": s.reasoning,
        "finish_reason": s.finish_reason,
        "usage": s.usage,
        "model": s.model,
        "tool_calls": s.tool_calls,
        "failed": s.failed,
        "error": s.error,
        "choice": s.index,
        "choices": s.choices,
    }


def _request_fields(index: RequestIndex | None, custom_id: str, where: Problem) -> dict[str, Any]:
    if index is None:
        return {}
    request = index.get(custom_id)
    if request is None:
        raise InputError(
            f"a response has no request in {index.path}",
            [_at(where, "custom_id", f"{custom_id!r} is not in {index.path}")],
        )
    body = request["body"]
    fields: dict[str, Any] = {"body": body, "messages": body.get("messages"), "url": request["url"]}
    if "prompt" in body:
        fields["prompt"] = body["prompt"]
    return fields


def _sample(suffix: str | None) -> int | str | None:
    return int(suffix) if suffix is not None and suffix.isdigit() else suffix


def _at(where: Problem, field: str | None, message: str) -> Problem:
    return Problem(where.path, where.line, field, message)


def _is_last(path: str, start: int) -> bool:
    lines = read_lines_at(path, [start], strip=False)
    try:
        return not next(lines, b"").endswith(b"\n")
    finally:
        lines.close()

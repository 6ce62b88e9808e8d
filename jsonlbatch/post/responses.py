"""The one reader of saved response files, and the grouping of samples.

Reads the OpenAI Batch output of `jsonlbatch exec`, of `vllm run-batch` (error in the top-level
`error`, body null) and of the OpenAI Batch API (error JSON in `response.body` with a 4xx/5xx
status, or lines of its separate error file, passed as one more input). Each choice of each
response becomes a `Sample`; failed requests become a sample with `error` set so that they are
counted, never silently lost. Lines `{"custom_id", "answer"}` (answers computed elsewhere, e.g.
by running a model's code) are read too, so they can be pooled into a vote.

Grouping (samples of one question or one SWE-bench instance) streams: a first pass counts the
lines of each group, a second pass yields a group as soon as its last line has been read. Memory
is bounded by the largest group in files written in request order (jsonlbatch, vLLM), and stays
correct for files in any order (the OpenAI Batch API).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from jsonlbatch.errors import InputError, Problem, UsageError
from jsonlbatch.jsonl import iter_lines, iter_lines_at, read_lines_at
from jsonlbatch.post.summary import TORN, Unused
from jsonlbatch.records import check_response, is_failure

#: Separators of `<group><sep><sample>` custom_ids: Agentless `id|3`, `id#3`, `id__pass3`.
DEFAULT_SEPARATORS: tuple[str, ...] = ("|", "#", "__pass")

KeyFunc = Callable[[str], str]


@dataclass(slots=True)
class Sample:
    """One choice of one response (or one failed request)."""

    custom_id: str
    index: int = 0
    text: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    model: str | None = None
    error: str | None = None  # why the request failed; None when it succeeded
    answer: str | None = None  # given by an answer line, not extracted from text
    choices: int = 1  # how many choices its response had
    path: str = ""
    line: int = 0
    source: int = 0  # position of its file among the inputs

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    @property
    def sample_id(self) -> str:
        """The custom_id, plus the choice index when the response had several."""
        return self.custom_id if self.choices == 1 else f"{self.custom_id}[{self.index}]"


@dataclass(slots=True)
class Group:
    """The samples of one group, ordered by custom_id (numbers compared as numbers), then choice."""

    key: str
    samples: list[Sample]


def split_think(text: str) -> tuple[str, str]:
    """Split `<think>...</think>` reasoning out of content: (reasoning, answer).

    Also handles templates that put `<think>` in the prompt (only `</think>` in the output) and
    an unclosed `<think>` (truncated while thinking: all reasoning, no answer).
    """
    end = text.find("</think>")
    if end >= 0:
        reasoning = text[:end].strip()
        if reasoning.startswith("<think>"):
            reasoning = reasoning[len("<think>") :].strip()
        return reasoning, text[end + len("</think>") :].strip()
    stripped = text.lstrip()
    if stripped.startswith("<think>"):
        return stripped[len("<think>") :].strip(), ""
    return "", text


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _failure_reason(obj: dict[str, Any]) -> str:
    error = obj.get("error")
    response = obj.get("response") if isinstance(obj.get("response"), dict) else {}
    status = response.get("status_code")
    message: Any = None
    if isinstance(error, dict):
        message = error.get("message") or error.get("code")
        if isinstance(error.get("code"), str) and error.get("message"):
            message = f"{error['code']}: {error['message']}"
    elif error:
        message = error
    body = response.get("body")
    if message is None and isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else inner
    parts = [f"HTTP {status}"] if isinstance(status, int) else []
    if message:
        parts.append(str(message)[:200])
    return ": ".join(parts) or "failed"


def _is_answer_line(obj: dict[str, Any]) -> bool:
    return "answer" in obj and "response" not in obj


def samples_of(
    obj: dict[str, Any], *, path: str = "", line: int = 0, source: int = 0
) -> list[Sample]:
    """The samples of one decoded response line."""
    cid = obj["custom_id"]
    where = {"path": path, "line": line, "source": source}
    if _is_answer_line(obj):
        value = obj["answer"]
        if value is None:
            return [Sample(cid, error="answer is null", **where)]
        return [Sample(cid, text=as_text(value), answer=as_text(value), **where)]
    if is_failure(obj):
        return [Sample(cid, error=_failure_reason(obj), **where)]
    body = obj["response"]["body"]
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices:
        return [Sample(cid, error="response body has no choices", **where)]
    model = body.get("model") if isinstance(body.get("model"), str) else None
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else None
    out = []
    for pos, choice in enumerate(choices):
        choice = choice if isinstance(choice, dict) else {}
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        text = _content_text(message.get("content") if message else choice.get("text"))
        reasoning = message.get("reasoning") or message.get("reasoning_content") or ""
        if not isinstance(reasoning, str) or not reasoning:
            reasoning, text = split_think(text)
        calls = message.get("tool_calls")
        index = choice.get("index")
        out.append(
            Sample(
                cid,
                index=index if isinstance(index, int) else pos,
                text=text,
                reasoning=reasoning,
                finish_reason=choice.get("finish_reason"),
                tool_calls=[c for c in calls if isinstance(c, dict)]
                if isinstance(calls, list)
                else [],
                usage=usage,
                model=model,
                choices=len(choices),
                **where,
            )
        )
    return out


def json_lines(path: str, problems: list[Problem]) -> Iterator[tuple[int, Any]]:
    """(line number, decoded value) of each non-blank line; undecodable lines go to `problems`."""
    for lineno, raw in iter_lines(path):
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            problems.append(Problem(path, lineno, None, f"bad JSON: {exc}"))
            continue
        yield lineno, obj


def as_text(value: Any) -> str:
    """A JSON value as a string: strings as they are, anything else as compact JSON."""
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _lines(paths: Sequence[str]) -> Iterator[tuple[int, str, int, dict[str, Any] | Problem]]:
    """(source, path, line number, decoded line or its problem) for every non-blank line.

    A last line without its newline that does not decode is a torn write: reported as
    `Problem` with field "torn" so callers can skip it instead of failing.
    """
    for source, path in enumerate(paths):
        for lineno, start, raw in iter_lines_at(path):  # shared BOM handling and read errors
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                torn = _torn(path, start, raw)
                yield (
                    source,
                    path,
                    lineno,
                    Problem(path, lineno, "torn" if torn else None, f"bad JSON: {exc}"),
                )
                continue
            if isinstance(obj, dict) and _is_answer_line(obj):
                ok = isinstance(obj.get("custom_id"), str) and obj["custom_id"]
                problems = [] if ok else [("custom_id", "missing or not a non-empty string")]
            else:
                problems = check_response(obj)
            if problems:
                for fld, msg in problems:
                    yield source, path, lineno, Problem(path, lineno, fld, msg)
                continue
            yield source, path, lineno, obj


def _torn(path: str, start: int, raw: bytes) -> bool:
    """Whether the line read as `raw` at byte `start` was a torn write: it had no newline yet
    (it is the last line), or it has grown since (a writer was finishing it)."""
    lines = read_lines_at(path, [start])
    try:
        physical = next(lines, b"")
    except OSError:  # gone since: cannot tell, so it is reported as bad
        return False
    finally:
        lines.close()
    return not physical.endswith(b"\n") or physical.strip() != raw


def read_responses(paths: str | Sequence[str], unused: Unused | None = None) -> Iterator[Sample]:
    """Stream the samples of response files in file order.

    Raises `InputError` at the first malformed line; a torn last line is skipped (and
    counted in `unused`).
    """
    paths = [paths] if isinstance(paths, str) else list(paths)
    for source, path, lineno, item in _lines(paths):
        if isinstance(item, Problem):
            if item.field == "torn":
                if unused is not None:
                    unused.add(TORN, f"{path}:{lineno}")
                continue
            raise InputError("malformed response file", [item])
        yield from samples_of(item, path=path, line=lineno, source=source)


def split_key(separators: Sequence[str] = DEFAULT_SEPARATORS) -> KeyFunc:
    """Group by the custom_id up to its last separator (`django__django-11099|3` -> the id)."""
    seps = [s for s in separators if s]

    def key(custom_id: str) -> str:
        cut = max((custom_id.rfind(s) for s in seps), default=-1)
        return custom_id[:cut] if cut > 0 else custom_id

    return key


def request_field_key(requests_path: str, field_path: str) -> KeyFunc:
    """Group by a field of the request line (dotted, e.g. `body.metadata.instance_id`).

    Keeps one value per custom_id in memory: the request file may be in any order.
    """
    values: dict[str, str] = {}
    problems: list[Problem] = []
    for lineno, obj in json_lines(requests_path, problems):
        cid = obj.get("custom_id") if isinstance(obj, dict) else None
        value = lookup(obj, field_path)
        if not isinstance(cid, str):
            problems.append(Problem(requests_path, lineno, "custom_id", "missing"))
        elif value is None:
            problems.append(Problem(requests_path, lineno, field_path, "missing"))
        else:
            values[cid] = as_text(value)
    if problems:
        raise InputError(f"cannot group by {field_path}", problems)

    def key(custom_id: str) -> str:
        try:
            return values[custom_id]
        except KeyError:
            raise InputError(f"custom_id {custom_id!r} is not in {requests_path}") from None

    return key


def lookup(obj: Any, dotted: str) -> Any:
    """`obj["a"]["b"][0]` for `a.b.0`; None when any step is missing."""
    for part in dotted.split("."):
        if isinstance(obj, dict):
            obj = obj.get(part)
        elif (
            isinstance(obj, list)
            and re.fullmatch(r"-?\d+", part)
            and -len(obj) <= int(part) < len(obj)
        ):
            obj = obj[int(part)]
        else:
            return None
    return obj


def make_key(
    separators: Sequence[str] | None = None,
    requests: str | None = None,
    group_field: str | None = None,
) -> KeyFunc:
    """The grouping the CLI options ask for."""
    if group_field:
        if not requests:
            raise UsageError("--group-field needs --requests (the request file)")
        return request_field_key(requests, group_field)
    return split_key(DEFAULT_SEPARATORS if separators is None else separators)


def _order(sample: Sample) -> tuple[Any, ...]:
    natural = tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part)
        for part in re.split(r"(\d+)", sample.custom_id)
        if part
    )
    return (sample.source, natural, sample.index)


@dataclass
class _Scan:
    """What a first pass over the inputs learned."""

    sizes: dict[str, int] = field(default_factory=dict)  # lines per group key
    last_line: dict[int, int] = field(default_factory=dict)  # per input
    torn: set[tuple[int, int]] = field(default_factory=set)  # (input, line)


def _scan(paths: Sequence[str], key: KeyFunc | None, unused: Unused | None) -> _Scan:
    scan = _Scan()
    problems: list[Problem] = []
    for source, path, lineno, item in _lines(paths):
        scan.last_line[source] = lineno
        if isinstance(item, Problem):
            if item.field == "torn":
                scan.torn.add((source, lineno))
                if unused is not None:
                    unused.add(TORN, f"{path}:{lineno}")
            else:
                problems.append(item)
        elif key is not None:
            k = key(item["custom_id"])
            scan.sizes[k] = scan.sizes.get(k, 0) + 1
    if problems:
        raise InputError(f"malformed response file ({len(problems)} problems)", problems)
    return scan


def check_responses(paths: str | Sequence[str]) -> None:
    """Raise `InputError` listing every malformed line of the inputs (a torn last line is fine).

    For readers that stream with `read_responses` but must not start writing on bad input.
    """
    _scan([paths] if isinstance(paths, str) else list(paths), None, None)


def iter_groups(
    paths: str | Sequence[str], key: KeyFunc | None = None, unused: Unused | None = None
) -> Iterator[Group]:
    """Stream the groups of response files (see the module docstring for memory bounds).

    Raises `InputError` listing every malformed line before yielding anything. When a custom_id
    occurs twice in one file (a retried request), a success replaces a failure, else the later
    line wins.
    """
    paths = [paths] if isinstance(paths, str) else list(paths)
    key = key or split_key()
    scan = _scan(paths, key, unused)
    remaining, last_line, torn = scan.sizes, scan.last_line, scan.torn
    pending: dict[str, dict[tuple[int, str], list[Sample]]] = {}
    for source, path, lineno, item in _lines(paths):
        # Lines appended since the first pass (a file still being written) wait for the next run.
        if (
            isinstance(item, Problem)
            or lineno > last_line.get(source, 0)
            or (source, lineno) in torn
        ):
            continue
        k = key(item["custom_id"])
        by_id = pending.setdefault(k, {})
        samples = samples_of(item, path=path, line=lineno, source=source)
        previous = by_id.get((source, item["custom_id"]))
        if previous is None or previous[0].failed or not samples[0].failed:
            by_id[(source, item["custom_id"])] = samples
        remaining[k] -= 1
        if remaining[k] == 0:
            del pending[k], remaining[k]
            yield Group(k, sorted((s for ss in by_id.values() for s in ss), key=_order))

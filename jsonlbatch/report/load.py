"""Reading response files into compact per-run data for the report.

A response file can hold millions of lines with large bodies, so it is read line by line and
only what the statistics need is kept: counters, and one `array` of floats per per-request
number (latencies, tokens) of the successful requests, NaN where a line lacks it. Failed lines
count in the counters but never in the latency or token columns.

Lines of `vllm run-batch` or the OpenAI Batch API (no `metrics`) are read too: they count,
their tokens come from `usage`, they just have no timings.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from math import isnan
from typing import Any

import orjson

from jsonlbatch.batch_format.call_ids import companions, turn_of
from jsonlbatch.batch_format.records import (
    check_response,
    is_failure,
    json_object,
    reasoning_tokens,
)
from jsonlbatch.batch_format.samples import chat_usage, hosted_choices, load_line
from jsonlbatch.errors import InputError, Problem, UsageError
from jsonlbatch.file_io.jsonl import ends_with_newline, iter_lines
from jsonlbatch.pricing.prices import Tokens, tokens_of
from jsonlbatch.report.conversations import count_tool_names, superseded_failures, tool_names

#: Per-request columns, each an `array('d')` aligned with the successful requests.
COLUMNS = ("e2e", "ttft", "decode", "tpot", "itl", "prompt", "completion", "reasoning", "end")

#: `--by` keys read from the response lines themselves; anything else is a request field.
BUILTIN_KEYS = ("endpoint", "model", "status")

UNKNOWN = "(unknown)"
MAX_GROUPS = 1000  # per --by key: more is a field with per-request values, not a breakdown
MAX_PROBLEMS = 1000  # stop reading a file that is plainly not a response file
_MODEL_FIELD = "body.model"
_NAN = math.nan
_NO_TOKENS = Tokens()


@dataclass(slots=True)
class _Line:
    """What the report keeps of one response line."""

    ok: bool
    status: str
    error: str | None
    attempts: int | None
    start: float
    latency: float
    ttft: float
    tpot: float
    itl: float
    chunks: int
    prompt: float
    completion: float
    reasoning: float
    finish_reasons: list[str]
    run: str | None = None  # exec's mark of the run that wrote the line (metrics.run)
    cached: bool = False  # answered from exec's answer cache (`metrics.cache` "hit")
    contract: tuple[bool, int] | None = None  # answers under a schema: (held it, asks)
    model: str | None = None  # the answer's model, which prices it
    billed: Tokens = _NO_TOKENS  # its usage as billed (cached input apart)
    batch: bool = False  # a batch API's result (`metrics.batch_id`): billed at the batch share
    tool_names: list[str] = field(default_factory=list)  # the calls the answer made, by name
    turn: tuple[int, bool] | None = None  # a calls file's line: (turn, an ask?) (conversations.py)
    files: tuple[int, int] = (0, 0)  # files `exec --files-dir` collected: count, bytes


@dataclass
class RunData:
    """Counters and per-request columns of one response file, or of one group of its lines."""

    label: str
    lines: int = 0
    succeeded: int = 0
    failed: int = 0
    status_codes: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    finish_reasons: Counter[str] = field(default_factory=Counter)
    retries: int = 0
    retried: int = 0
    max_attempts: int = 0
    schema_valid: int = 0  # requests whose answer held its schema
    schema_invalid: int = 0  # requests under a schema whose last answer did not
    reasked: int = 0  # requests asked again because an answer broke its schema
    reasks: int = 0  # those extra asks
    untimed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    first_start: float = math.inf
    last_end: float = -math.inf
    #: exec's run mark (None: unmarked lines) -> [first attempt start, last attempt end]
    run_windows: dict[str | None, list[float]] = field(default_factory=dict)
    itl_gap_sum: float = 0.0
    itl_gaps: int = 0
    torn_tail: bool = False
    cache_hits: int = 0  # lines answered from exec's answer cache: not sent, not paid for
    files: int = 0  # files `exec --files-dir` collected (`metrics.files`), and their bytes
    file_bytes: int = 0
    cache_prompt_tokens: int = 0
    cache_completion_tokens: int = 0
    #: (model, batch result?) -> tokens as billed, of the lines this run paid for
    billing: dict[tuple[str | None, bool], Tokens] = field(default_factory=dict)
    columns: dict[str, array] = field(default_factory=lambda: {c: array("d") for c in COLUMNS})
    #: (end, output tokens) of every timed line, failed ones too: the output tokens/s chart,
    #: whose mean is the headline's (which counts every sent line's tokens)
    token_ends: array = field(default_factory=lambda: array("d"))
    token_counts: array = field(default_factory=lambda: array("d"))
    groups: dict[str, dict[str, RunData]] = field(default_factory=dict)
    tool_calls: Counter[str] = field(default_factory=Counter)  # calls per tool name
    turn_lines: Counter[int] = field(default_factory=Counter)  # a calls file: lines per turn
    asks: int = 0  # a calls file: asks made during turns (`#t<N>.ask<K>`)

    def add(self, line: _Line) -> None:
        self.lines += 1
        if line.turn is not None:
            turn, ask = line.turn
            if ask:
                self.asks += 1
            else:
                self.turn_lines[turn] += 1
        self.status_codes[line.status] += 1
        self.files += line.files[0]
        self.file_bytes += line.files[1]
        if line.attempts is not None:
            self.retries += max(0, line.attempts - 1)
            self.retried += line.attempts > 1
            self.max_attempts = max(self.max_attempts, line.attempts)
        if line.contract is not None:
            held, asks = line.contract
            self.schema_valid += held
            self.schema_invalid += not held
            self.reasked += asks > 1
            self.reasks += max(0, asks - 1)
        end = line.start + line.latency
        if line.cached:
            self.cache_hits += 1
            self.cache_prompt_tokens += 0 if isnan(line.prompt) else int(line.prompt)
            self.cache_completion_tokens += 0 if isnan(line.completion) else int(line.completion)
        if isnan(end):
            self.untimed += not line.cached  # a hit has no timings of its own: not "untimed"
        else:
            if line.start < self.first_start:
                self.first_start = line.start
            if end > self.last_end:
                self.last_end = end
            self.token_ends.append(end)
            self.token_counts.append(0.0 if isnan(line.completion) else line.completion)
            window = self.run_windows.get(line.run)
            if window is None:
                self.run_windows[line.run] = [line.start, end]
            else:
                window[0] = min(window[0], line.start)
                window[1] = max(window[1], end)
        if not isnan(line.prompt):
            self.prompt_tokens += int(line.prompt)
        if not isnan(line.completion):
            self.completion_tokens += int(line.completion)
        if not isnan(line.reasoning):
            self.reasoning_tokens += int(line.reasoning)
        if not line.ok:
            self.failed += 1
            self.errors[line.error or UNKNOWN] += 1
            return
        self.succeeded += 1
        if not line.cached:
            key = (line.model, line.batch)
            self.billing[key] = self.billing.get(key, Tokens()) + line.billed
        self.finish_reasons.update(line.finish_reasons)
        count_tool_names(self.tool_calls, line.tool_names)
        if line.chunks > 1 and not isnan(line.itl):
            self.itl_gap_sum += line.itl * (line.chunks - 1)
            self.itl_gaps += line.chunks - 1
        cols = self.columns
        cols["e2e"].append(line.latency)
        cols["ttft"].append(line.ttft)
        cols["decode"].append(line.latency - line.ttft)  # NaN without a TTFT
        cols["tpot"].append(line.tpot)
        cols["itl"].append(line.itl)
        cols["prompt"].append(line.prompt)
        cols["completion"].append(line.completion)
        cols["reasoning"].append(line.reasoning)
        cols["end"].append(end)


def load_run(
    path: str,
    *,
    by: Sequence[str] = (),
    requests: dict[str, tuple[str, ...]] | None = None,
    request_fields: Sequence[str] = (),
    label: str | None = None,
) -> RunData:
    """Read one response file; group its lines by each `--by` key as they stream past.

    `requests` maps custom_id to the values of `request_fields` (see `load_request_fields`),
    needed for any `--by` key that is not one of `BUILTIN_KEYS`.
    """
    for key in by:
        if key not in BUILTIN_KEYS and key not in request_fields:
            raise UsageError(
                f"--by {key}: not one of {', '.join(BUILTIN_KEYS)}, so it is a request field: "
                "give the request file with --requests"
            )
    data = RunData(label or path)
    problems: list[Problem] = []
    lines = _JsonLines(path, problems, "response", allow_torn=True)
    replaced: set[int] | None = None  # a calls file's failed lines a later line replaces
    for number, obj in lines:
        if data.lines == 0 and not problems:
            _refuse_request_file(obj, path)
        if replaced is None:
            cid = obj.get("custom_id") if isinstance(obj, dict) else None
            replaced = superseded_failures(path) if isinstance(cid, str) and turn_of(cid) else set()
        if number in replaced:
            continue
        line = _parse(obj, path, number, problems)
        if line is not None:
            data.add(line)
            for key in by:
                value = _group_value(key, obj, line, requests, request_fields)
                _group(data, key, value).add(line)
    data.torn_tail = lines.torn
    if problems:
        raise InputError(f"{path}: {len(problems)} malformed response line(s)", problems)
    if data.lines == 0:
        raise InputError(f"{path}: no response lines")
    return data


def load_request_fields(paths: Iterable[str], fields: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """custom_id -> the value (as text) of each field of its request line.

    A dotted field such as `body.temperature` is looked up in the request line as written, then
    under `body`, then under `body.metadata`, so `--by temperature` or `--by task` work too.
    """
    out: dict[str, tuple[str, ...]] = {}
    for path in paths:
        problems: list[Problem] = []
        for number, obj in _JsonLines(path, problems, "request", allow_torn=False):
            cid = obj.get("custom_id") if isinstance(obj, dict) else None
            if not isinstance(cid, str) or not cid:
                problems.append(Problem(path, number, "custom_id", "missing or not a string"))
                continue
            out[cid] = tuple(_field_text(obj, name) for name in fields)
        if problems:
            raise InputError(f"{path}: {len(problems)} malformed request line(s)", problems)
    return out


def request_fields_for(by: Sequence[str]) -> list[str]:
    """The request fields a set of `--by` keys needs (the model, for failed lines, included)."""
    fields = [key for key in by if key not in BUILTIN_KEYS]
    if "model" in by and _MODEL_FIELD not in fields:
        fields.append(_MODEL_FIELD)
    return fields


class _JsonLines:
    """(line number, decoded value) of each line of a JSONL file; bad JSON goes to `problems`.

    With `allow_torn`, an undecodable last line without its newline (a run still writing, or a
    crash mid-write) is skipped and `torn` set, instead of being a problem.
    """

    def __init__(self, path: str, problems: list[Problem], kind: str, *, allow_torn: bool) -> None:
        self.path, self.problems, self.kind, self.allow_torn = path, problems, kind, allow_torn
        self.torn = False

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        pending: Problem | None = None  # bad JSON on the line read last: torn if it is the end
        for number, raw in iter_lines(self.path):
            if pending is not None:
                self.problems.append(pending)
                pending = None
            if len(self.problems) >= MAX_PROBLEMS:
                raise InputError(
                    f"{self.path}: stopped after {MAX_PROBLEMS} malformed lines; is it a "
                    f"{self.kind} file?",
                    self.problems,
                )
            try:
                obj = load_line(raw)
            except orjson.JSONDecodeError as exc:
                pending = Problem.bad_json(self.path, number, exc)
            else:
                yield number, obj
        if pending is not None:
            if self.allow_torn and not ends_with_newline(self.path):
                self.torn = True
            else:
                self.problems.append(pending)


# ---------------------------------------------------------------------------------------------


def _refuse_request_file(obj: Any, path: str) -> None:
    if isinstance(obj, dict) and "body" in obj and "url" in obj and "response" not in obj:
        raise InputError(
            f"{path} holds requests, not responses: report reads the output of "
            "`jsonlbatch exec` (pass requests with --requests)"
        )
    if isinstance(obj, dict) and "messages" in obj and "status" in obj and "response" not in obj:
        raise InputError(
            f"{path} is a rollout's conversations file (its lines have `messages` and `status`), "
            f"not responses: report reads its calls file, {companions(path)[0]}, where every model "
            "call of the rollout is a response line"
        )


def _parse(obj: Any, path: str, number: int, problems: list[Problem]) -> _Line | None:
    found = check_response(obj)
    metrics = obj.get("metrics") if isinstance(obj, dict) else None
    if metrics is not None and not isinstance(metrics, dict):
        found.append(("metrics", "must be an object"))
    if found:
        problems.extend(Problem(path, number, f, m) for f, m in found)
        return None
    metrics = metrics or {}
    response = json_object(obj.get("response"))
    body = response.get("body")
    body = body if isinstance(body, dict) else {}
    usage = chat_usage(body.get("usage")) or {}

    def num(key: str) -> float:
        value = metrics.get(key)
        if value is None:
            return _NAN
        if (type(value) is float or type(value) is int) and value >= 0:
            return float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            problems.append(
                Problem(path, number, f"metrics.{key}", "must be a non-negative number")
            )
            return _NAN
        return float(value)

    ok = not is_failure(obj)
    latency, ttft = num("latency_s"), num("ttft_s")
    completion = _usage_number(num("completion_tokens"), usage.get("completion_tokens"))
    chunks = num("chunks")
    tpot = num("tpot_s")
    if math.isnan(tpot) and completion > 1 and not math.isnan(ttft + latency):
        tpot = (latency - ttft) / (completion - 1)  # written by another tool: derive it
    attempts = num("attempts")
    status = response.get("status_code")
    error = obj.get("error")
    reasons = []
    names: list[str] = []
    if ok:
        choices = body.get("choices")
        if choices is None:
            choices = hosted_choices(body)
        for choice in choices if isinstance(choices, list) else ():
            if isinstance(choice, dict):
                reasons.append(str(choice.get("finish_reason") or "(none)"))
        names = tool_names(choices)
    cid = obj.get("custom_id")
    model = body.get("model")
    return _Line(
        model=model if isinstance(model, str) else None,
        billed=tokens_of(body.get("usage")),
        batch=isinstance(metrics.get("batch_id"), str),
        ok=ok,
        status=str(status) if isinstance(status, int) else "no response",
        error=(
            str(error.get("code") or error.get("type") or UNKNOWN)
            if isinstance(error, dict)
            else (f"http_{status}" if not ok and isinstance(status, int) else None)
        ),
        attempts=None if math.isnan(attempts) else int(attempts),
        start=num("start_time"),
        latency=latency,
        ttft=ttft,
        tpot=tpot,
        itl=num("itl_mean_s"),
        chunks=0 if math.isnan(chunks) else int(chunks),
        prompt=_usage_number(num("prompt_tokens"), usage.get("prompt_tokens")),
        completion=completion,
        reasoning=_usage_number(num("reasoning_tokens"), reasoning_tokens(usage)),
        finish_reasons=reasons,
        run=str(metrics["run"]) if isinstance(metrics.get("run"), str) else None,
        cached=ok and metrics.get("cache") == "hit",
        contract=_contract(metrics),
        tool_names=names,
        turn=turn_of(cid) if isinstance(cid, str) else None,
        files=_files(metrics.get("files")),
    )


def _files(records: Any) -> tuple[int, int]:
    """How many files a line's `metrics.files` lists, and their bytes (`exec --files-dir`)."""
    if not isinstance(records, list):
        return 0, 0
    sizes = [r.get("bytes") for r in records if isinstance(r, dict)]
    return len(sizes), sum(b for b in sizes if type(b) is int and b > 0)


def _contract(metrics: dict[str, Any]) -> tuple[bool, int] | None:
    record = metrics.get("contract")
    if not isinstance(record, dict):
        return None
    asks = record.get("asks")
    return record.get("valid") is True, asks if type(asks) is int and asks > 0 else 1


def _usage_number(from_metrics: float, from_usage: Any) -> float:
    if not math.isnan(from_metrics):
        return from_metrics
    if isinstance(from_usage, (int, float)) and not isinstance(from_usage, bool):
        return float(from_usage)
    return _NAN


def _group_value(
    key: str,
    obj: dict[str, Any],
    line: _Line,
    requests: dict[str, tuple[str, ...]] | None,
    request_fields: Sequence[str],
) -> str:
    if key == "status":
        return line.status
    if key == "endpoint":
        metrics = obj.get("metrics") or {}
        return str(metrics.get("endpoint") or UNKNOWN)
    if key == "model":
        body = (obj.get("response") or {}).get("body")
        model = body.get("model") if isinstance(body, dict) else None
        if model:
            return str(model)
        key = _MODEL_FIELD
    if requests is None or key not in request_fields:
        return UNKNOWN
    values = requests.get(obj["custom_id"])
    return values[request_fields.index(key)] if values is not None else "(not in requests)"


def _group(data: RunData, key: str, value: str) -> RunData:
    groups = data.groups.setdefault(key, {})
    found = groups.get(value)
    if found is None:
        if len(groups) >= MAX_GROUPS:
            raise UsageError(
                f"--by {key}: more than {MAX_GROUPS} distinct values; pick a field with "
                "fewer values"
            )
        found = groups[value] = RunData(value)
    return found


def _field_text(obj: dict[str, Any], name: str) -> str:
    for prefix in ("", "body.", "body.metadata."):
        found, value = _lookup(obj, prefix + name)
        if found:
            return value if isinstance(value, str) else orjson.dumps(value).decode()
    return "(none)"


def _lookup(obj: Any, dotted: str) -> tuple[bool, Any]:
    for part in dotted.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return False, None
        obj = obj[part]
    return True, obj

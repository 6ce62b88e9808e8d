"""Cutting what OUT still lacks into batch parts, after checking every line fits the provider.

Each part holds one endpoint and one model, within the provider's limits (requests and bytes
per batch). Beside each part's lines, a marks file lists for each request its custom_id, the id
it is sent under (providers with a restricted alphabet get `providers.safe_id`) and exec's
fingerprint of the line as the file asks it; merging maps the results back through it, so the
mapping survives any crash for as long as the part is unmerged.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import orjson

from jsonlbatch.answer_contract.schema_forms import SCHEMA_KEYS
from jsonlbatch.batch_format.records import fingerprint
from jsonlbatch.batchapi.client.providers import Provider, safe_id
from jsonlbatch.batchapi.client.submit_state import Part
from jsonlbatch.errors import InputError, Problem, UsageError
from jsonlbatch.file_io.jsonl import iter_lines, iter_lines_at, read_lines_at

#: Problems listed before the check stops reading (the first ones say what to fix).
MAX_PROBLEMS = 50


def check_part_limits(provider: Provider, max_requests: int | None, max_bytes: int | None) -> None:
    """Refuse part limits above what the provider takes in one batch: such a part would be
    refused after its upload. The options make parts smaller, never larger."""
    for flag, given, cap, unit in (
        ("--batch-max-requests", max_requests, provider.max_requests, "requests"),
        ("--batch-max-bytes", max_bytes, provider.max_bytes, "bytes"),
    ):
        if given is not None and given > cap:
            raise UsageError(
                f"{flag} {given:,} is over the {provider.name} batch API's limit of {cap:,} "
                f"{unit} a batch: leave it out for the limit itself"
            )


def check_lines(
    requests: str, pending: Sequence[int], provider: Provider, max_bytes: int | None = None
) -> None:
    """Refuse the run, before anything is submitted, when a pending line holds what the
    provider cannot take, or is larger than one request may be (the provider's cap) or than
    a part may be (`max_bytes`: a part cannot be cut smaller than one line): file, line,
    field for each."""
    if not pending:
        return
    caps = [(max_bytes, "the limit on a part (--batch-max-bytes, or the provider's on a batch)")]
    if provider.max_request_bytes is not None:
        caps.append((provider.max_request_bytes, f"the {provider.name} API's limit on a request"))
    cap, why = (
        min((c, w) for c, w in caps if c is not None) if any(c for c, _ in caps) else (None, "")
    )
    parse = provider.check is not None or bool(provider.translated)
    if not parse and (cap is None or os.path.getsize(requests) <= cap):
        return  # no line to translate, and none can be over the cap: not read at all
    problems: list[Problem] = []
    for number, offset, raw in iter_lines_at(requests):
        at = bisect_left(pending, offset)
        if at >= len(pending) or pending[at] != offset:
            continue
        size = len(raw.rstrip(b"\r\n"))
        if cap is not None and size > cap:
            message = (
                f"a request of {size:,} bytes is over {why} ({cap:,} bytes): make its images "
                "smaller (gen's data_url filter can downscale them) or send it another way"
            )
            problems.append(Problem(requests, number, None, message))
        if parse:
            obj = orjson.loads(raw)
            for field, message in provider.problems(obj["url"], obj.get("body") or {}):
                problems.append(Problem(requests, number, field, message))
        if len(problems) >= MAX_PROBLEMS:
            break
    if problems:
        raise InputError(
            f"{requests}: {len(problems)}{'+' if len(problems) >= MAX_PROBLEMS else ''} request(s) "
            f"cannot go to the {provider.name} batch API as they are; nothing was submitted",
            problems,
        )


def write_parts(
    requests: str,
    pending: Sequence[int],
    folder: Path,
    tag: str,
    provider: Provider,
    *,
    max_requests: int,
    max_bytes: int,
    model: str | None,
    rewrite: Callable[[dict[str, Any]], bytes] | None,
) -> list[Part]:
    """Write the pending lines into part files (with their marks files) and return the parts."""
    open_parts: dict[tuple[str, str], tuple[Part, IO[bytes], IO[bytes]]] = {}
    parts: list[Part] = []
    try:
        for raw in read_lines_at(requests, pending):
            obj = orjson.loads(raw)
            key = (obj["url"], model or obj["body"].get("model") or "")
            # as exec marks its lines: the request as the file asks it, before any rewrite
            mark = fingerprint(raw, obj["url"], obj["body"])
            cid = obj["custom_id"]
            sent = safe_id(cid) if provider.safe_ids else cid
            changed = sent != cid or obj["url"] in provider.translated
            if changed:
                obj["custom_id"] = sent
            if obj["url"] in provider.translated:  # checked by check_lines: no problems left
                url, translate = provider.translated[obj["url"]]
                obj["url"], obj["body"] = url, translate(obj["body"])[0]
            # what its answer is checked against when it comes back (batchapi/client/batch_result_check.py):
            # the request as sent, since the provider answers in that endpoint's form
            asked = {"url": obj["url"], **declares(obj["body"])}
            if rewrite is not None or changed:
                line = rewrite(obj) if rewrite else orjson.dumps(obj) + b"\n"
            else:
                line = raw.rstrip(b"\r\n") + b"\n"
            current = open_parts.get(key)
            if current is not None and (
                current[0].count >= max_requests or current[0].bytes + len(line) > max_bytes
            ):
                current[1].close()
                current[2].close()
                current = None
            if current is None:
                index = len(parts)
                part = Part(tag, index, f"part-{tag}-{index:04d}.jsonl", obj["url"], 0, 0)
                current = (
                    part,
                    open(folder / part.path, "wb"),  # noqa: SIM115 - closed below
                    open(folder / marks_path(part), "wb"),  # noqa: SIM115
                )
                open_parts[key] = current
                parts.append(part)
            current[1].write(line)
            current[2].write(
                orjson.dumps({"custom_id": cid, "sent_as": sent, "fingerprint": mark, **asked})
                + b"\n"
            )
            current[0].count += 1
            current[0].bytes += len(line)
    finally:
        for _, lines, marks in open_parts.values():
            lines.close()
            marks.close()
    return parts


def marks_path(part: Part) -> str:
    """The file beside a part's lines listing each request's custom_id and fingerprint."""
    return part.path.removesuffix(".jsonl") + ".marks.jsonl"


def declares(body: Any) -> dict[str, Any]:
    """The fields of a request body that declare its answer's schema (`schema_forms.SCHEMA_KEYS`,
    and the tool a forced tool call names), as `{"declares": {...}}`; {} for a body without:
    what a results line is checked against, without keeping the prompt."""
    if not isinstance(body, dict) or SCHEMA_KEYS.isdisjoint(body):
        return {}
    return {"declares": {k: body[k] for k in (*SCHEMA_KEYS, "tool_choice") if k in body}}


def read_asked(
    folder: Path, part: Part, requests: str, provider: Provider
) -> dict[str, tuple[str, dict[str, Any]]]:
    """custom_id -> (its endpoint URL as sent, the body fields that declare its schema), for a
    part's requests. Marks written before these were kept name only the ids: those requests
    are read again from the request file (translated as they were sent), so their answers take
    the same checks."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    unknown = set()
    for _, raw in iter_lines(folder / marks_path(part)):
        mark = orjson.loads(raw)
        if isinstance(mark.get("url"), str):
            out[mark["custom_id"]] = (mark["url"], mark.get("declares") or {})
        else:
            unknown.add(mark["custom_id"])
    if unknown:
        out.update(_asked_in_file(requests, unknown, provider))
    return out


def _asked_in_file(
    requests: str, ids: set[str], provider: Provider
) -> dict[str, tuple[str, dict[str, Any]]]:
    """What `write_parts` would have marked for `ids`, read from the request file."""
    out = {}
    for _, raw in iter_lines(requests):
        obj = _object(raw)
        cid = obj.get("custom_id") if obj is not None else None
        if obj is None or cid not in ids or not isinstance(obj.get("url"), str):
            continue
        url, body = obj["url"], obj.get("body")
        if url in provider.translated and isinstance(body, dict):
            url, body = provider.translated[url][0], provider.translated[url][1](body)[0]
        out[cid] = (url, declares(body).get("declares", {}))
    return out


def _object(raw: bytes) -> dict[str, Any] | None:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def read_marks(folder: Path, part: Part) -> dict[str, tuple[str, str]]:
    """id as sent -> (custom_id, fingerprint), for a part's requests."""
    out = {}
    for _, raw in iter_lines(folder / marks_path(part)):
        mark = orjson.loads(raw)
        out[mark.get("sent_as") or mark["custom_id"]] = (mark["custom_id"], mark["fingerprint"])
    return out

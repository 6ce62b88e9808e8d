"""What a run gives a Python caller back: its summary, and its answers by custom_id.

`RunOutcome.results` reads the output file on use, so a caller never parses lines by hand:

    outcome = jsonlbatch.execute("in.jsonl", "out.jsonl", serve="mock", reask=2)
    answer = outcome.results["q-17"]
    answer.ok, answer.text, answer.value, answer.valid, answer.error, answer.usage

An `Answer` is one line, read through the same reader `post`, `report` and `export` use
(`samples.samples_of`): the text of each choice, the value the answer contract read under the
request's schema, its verdict, the failure, the token counts. Iterating costs memory for one
line at a time; looking an id up indexes the file's line offsets once (about 100 bytes a line),
and again, or on from where it ended, when another process changed the file (`Results`).
"""

from __future__ import annotations

import html
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import orjson

from jsonlbatch.batch_format.samples import Sample, samples_of
from jsonlbatch.errors import InputError, OutputError
from jsonlbatch.exec.output.result_display import (
    CELL_CHARS,
    COUNT_UP_TO,
    HTML_ROWS,
    TEXT_CHARS,
    cut,
    table,
)
from jsonlbatch.file_io.jsonl import BOM, iter_lines_at, read_lines_at, refuse_non_jsonl
from jsonlbatch.stats import plural


@dataclass(frozen=True, repr=False)
class Answer:
    """One response line, typed: what a caller of `execute` reads instead of the JSON.
    Prints as one line (its id, the first words or the failure); a small table in a notebook."""

    custom_id: str
    ok: bool
    #: Each choice's text (the answer's, reasoning left out); [] for a failure.
    texts: list[str] = field(default_factory=list)
    #: Under a schema: each choice's value as the contract read it (None where it broke it).
    values: list[Any] = field(default_factory=list)
    #: Under a schema: whether every choice held it; None without a schema (or unchecked).
    valid: bool | None = None
    error: dict[str, Any] | None = None  # the failure (`code`, `message`); None when ok
    status_code: int | None = None
    usage: dict[str, Any] = field(default_factory=dict)  # prompt_tokens, completion_tokens, ...
    cached: bool = False  # answered from the answer cache, not sent
    body: Any = None  # the server's response body, as written
    metrics: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        if not self.ok:
            return f"<Answer {self.custom_id} failed {self.failure}>"
        extra = " (cached)" if self.cached else ""
        if self.values and self.value is not None:
            shown = f"value={cut(repr(self.value), TEXT_CHARS)}"
        else:
            shown = repr(cut(self.text or "", TEXT_CHARS))
        more = f" +{len(self.texts) - 1} choices" if len(self.texts) > 1 else ""
        return f"<Answer {self.custom_id} ok{extra}: {shown}{more}>"

    def _repr_html_(self) -> str:
        rows: list[tuple[str, Any]] = [("custom_id", self.custom_id), ("ok", self.ok)]
        if self.ok:
            rows.append(("text", cut(self.text or "", CELL_CHARS)))
            if self.values:
                rows.append(("value", cut(repr(self.value), CELL_CHARS)))
            if self.valid is not None:
                rows.append(("schema held", self.valid))
        else:
            rows.append(("error", self.failure))
        if self.usage:
            rows.append(("usage", ", ".join(f"{k} {v}" for k, v in self.usage.items())))
        if self.cached:
            rows.append(("cached", True))
        return table(rows)

    @property
    def failure(self) -> str:
        """The failure in a few words: its code and message, cut ("" when ok)."""
        if self.ok:
            return ""
        error = self.error or {}
        code = error.get("code") or (f"http_{self.status_code}" if self.status_code else "failed")
        message = error.get("message")
        return f"{code}: {cut(message, TEXT_CHARS)}" if message else str(code)

    @property
    def text(self) -> str | None:
        """The first choice's text (None for a failure)."""
        return self.texts[0] if self.texts else None

    @property
    def value(self) -> Any:
        """The first choice's value under the request's schema (None without one)."""
        return self.values[0] if self.values else None

    @classmethod
    def of_line(cls, obj: dict[str, Any]) -> Answer:
        """The typed form of one decoded response line."""
        got = obj.get("response")
        response: dict[str, Any] | None = got if isinstance(got, dict) else None
        got = obj.get("metrics")
        metrics: dict[str, Any] = got if isinstance(got, dict) else {}
        error = obj.get("error")
        if isinstance(error, str):  # vLLM's run-batch writes a bare message
            error = {"code": "error", "message": error}
        status = response.get("status_code") if response is not None else None
        ok = error is None and isinstance(status, int) and 200 <= status < 300
        samples: list[Sample] = samples_of(obj) if ok else []
        contract = metrics.get("contract") if isinstance(metrics.get("contract"), dict) else None
        values: list[Any] = []
        if contract is not None and isinstance(contract.get("choices"), list):
            values = [c.get("value") if isinstance(c, dict) else None for c in contract["choices"]]
        usage: dict[str, Any] = {k: metrics[k] for k in ("prompt_tokens", "completion_tokens",
                                                        "reasoning_tokens")
                 if k in metrics}  # fmt: skip
        return cls(
            custom_id=str(obj.get("custom_id")),
            ok=ok,
            texts=[s.text for s in samples if not s.failed],
            values=values,
            valid=contract.get("valid") if contract is not None else None,
            error=error if isinstance(error, dict) else None,
            status_code=status if isinstance(status, int) else None,
            usage=usage,
            cached=metrics.get("cache") == "hit",
            body=response.get("body") if response is not None else None,
            metrics=metrics,
        )


class Results(Mapping[str, Answer]):
    """An output file's answers by custom_id, read on use (see the module doc). The last line
    of an id wins, as for every reader of a resumed file.

    The file may change under it: a resumed run appends, `exec --retry-failed` (or `merge`)
    replaces it atomically. Each use compares the file with the one indexed (device, inode,
    size, modification time): lines appended since are indexed on from where the index ended, a
    file replaced or shrunk is indexed again, and a lookup checks that the line at the offset is
    the id asked for (indexing again once when it is not) before it answers.
    """

    def __init__(self, output: str) -> None:
        self.output = output
        self._offsets: dict[str, int] | None = None
        self._stamp: tuple[int, int, int, int] = (0, 0, 0, 0)  # dev, inode, size, mtime
        self._indexed_to = 0  # where the last complete line indexed ends

    def _index(self) -> dict[str, int]:
        try:
            st = os.stat(self.output)
        except OSError as exc:
            raise InputError(f"cannot read {self.output}: {exc.strerror}") from None
        stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if self._offsets is not None and stamp == self._stamp:
            return self._offsets
        same_file = stamp[:2] == self._stamp[:2] and st.st_size >= self._stamp[2]
        if self._offsets is None or not same_file:
            self._offsets, self._indexed_to = {}, 0
        self._scan(self._offsets)
        self._stamp = stamp
        return self._offsets

    def __repr__(self) -> str:
        try:
            size = os.path.getsize(self.output)
        except OSError:
            return f"<Results {self.output}: no such file yet>"
        if size <= COUNT_UP_TO or self._offsets is not None:
            return f"<Results {self.output}: {plural(len(self), 'answer')}>"
        return f"<Results {self.output}: {size / (1 << 20):,.0f} MiB; look answers up by custom_id>"

    def _repr_html_(self) -> str:
        rows = []
        for a in islice(self.answers(), HTML_ROWS):
            what = cut(a.text or "", CELL_CHARS) if a.ok else a.failure
            value = cut(repr(a.value), CELL_CHARS) if a.ok and a.values else ""
            rows.append((a.custom_id, "ok" if a.ok else "failed", what, value))
        shown = table(rows, ("custom_id", "", "text / error", "value"))
        return f"<p>{html.escape(repr(self))}</p>{shown}"

    def _scan(self, offsets: dict[str, int]) -> None:
        """Index the lines from `_indexed_to` on. A last line without its newline (being
        written, or a torn tail) is indexed when it parses but scanned again next time."""
        try:
            f = open(self.output, "rb")  # noqa: SIM115 - closed by the with below
        except OSError as exc:
            raise InputError(f"cannot read {self.output}: {exc.strerror}") from None
        with f:
            if self._indexed_to == 0:
                refuse_non_jsonl(f, self.output, InputError)
            f.seek(self._indexed_to)
            offset = self._indexed_to
            for raw in f:
                start = offset
                offset += len(raw)
                if start == 0 and raw.startswith(BOM):  # as iter_lines_at reads it
                    raw, start = raw[len(BOM) :], len(BOM)
                cid = _custom_id(raw)
                if cid is not None:
                    offsets[cid] = start
                if raw.endswith(b"\n"):
                    self._indexed_to = offset

    def __getitem__(self, custom_id: str) -> Answer:
        for _ in range(2):
            offset = self._index()[custom_id]
            (raw,) = read_lines_at(self.output, [offset])
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                obj = None
            if isinstance(obj, dict) and obj.get("custom_id") == custom_id:
                return Answer.of_line(obj)
            self._offsets = None  # rewritten in place since it was indexed: index it again
        raise OutputError(
            f"{self.output} changed while {custom_id!r} was being read (is another process "
            "rewriting it?); read the results again once it is done"
        )

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._index()))

    def __len__(self) -> int:
        return len(self._index())

    def answers(self) -> Iterator[Answer]:
        """Every line's answer in file order (one line in memory at a time)."""
        for _, _, raw in iter_lines_at(self.output):
            try:
                yield Answer.of_line(orjson.loads(raw))
            except (orjson.JSONDecodeError, AttributeError):
                continue


def _custom_id(raw: bytes) -> str | None:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None  # a torn last line: the next run repairs it
    cid = obj.get("custom_id") if isinstance(obj, dict) else None
    return cid if isinstance(cid, str) else None


@dataclass
class RunOutcome:
    """What a started run gives back: its summary (None for a dry run), the dry run's count
    (`exec.prepare.dry_run.DryRunReport`), and the answers (`results`, read from the output on use)."""

    output: str
    summary: Any = None  # RunSummary, or a Batch API's SubmitSummary
    dry: Any = None

    @property
    def results(self) -> Results:
        return Results(self.output)

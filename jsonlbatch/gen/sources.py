"""Data rows for the generator: JSONL, a JSON list, CSV or Parquet, from a file or stdin.

Rows stream: each reader holds one row (or one Parquet batch, or one read buffer of a JSON
list) at a time, so a million-row dataset costs no more memory than a ten-row one. Selection
keeps that promise: `--sample K` is a reservoir of K rows, never the whole file.
"""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import json
import os
import random
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

import orjson

from jsonlbatch.errors import InputError, Problem, UsageError
from jsonlbatch.extras import require
from jsonlbatch.file_io.jsonl import BOM

#: The formats `iter_rows` reads, by the name `--format` takes.
FORMATS = ("jsonl", "json", "csv", "parquet")

_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv"}
_SUFFIXES |= {".parquet": "parquet", ".pq": "parquet"}
_CHUNK = 1 << 20
_JSON_SPACE = " \t\r\n"

# Prompts kept in CSV cells (code, documents) outgrow the module's 128 KiB default.
csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))


@dataclass(frozen=True, slots=True)
class Row:
    """One record of a data source.

    `index` counts every record of the source from 0, before any filter, so it identifies the
    row stably; `line` is the 1-based line where the record sits, when the format has lines;
    `key` is a natural id when the source has one (a response's custom_id). The default
    custom_id of its request is `key`, else `index`.
    """

    source: str
    index: int
    line: int | None
    data: dict[str, Any]
    key: str | None = None

    def problem(self, field: str | None, message: str) -> Problem:
        """A `Problem` located at this row, for errors the user fixes in the data or template."""
        return Problem(self.source, self.line, field, f"row {self.index}: {message}")


def detect_format(path: str) -> str:
    """The format a path's suffix names (stdin, `-`, is JSONL unless told otherwise)."""
    if path == "-":
        return "jsonl"
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in _SUFFIXES:
        raise UsageError(
            f"cannot tell the format of {path!r} from its suffix; pass --format "
            f"({', '.join(FORMATS)})"
        )
    return _SUFFIXES[suffix]


def iter_rows(path: str | os.PathLike[str], format: str | None = None) -> Iterator[Row]:
    """Stream the rows of `path` (`-` for stdin); every row is a JSON-like dict."""
    path = os.fspath(path)
    fmt = format or detect_format(path)
    if fmt not in FORMATS:
        raise UsageError(f"unknown data format {fmt!r} (known: {', '.join(FORMATS)})")
    if fmt == "parquet":  # checked now, before the caller writes anything
        require("pyarrow.parquet", extra="parquet", for_what="reading Parquet")
        return _parquet_rows(path)
    return _text_rows(path, fmt)


def select(
    rows: Iterable[Row],
    *,
    where: Callable[[Row], bool] | None = None,
    limit: int | None = None,
    sample: int | None = None,
    seed: int = 0,
) -> Iterator[Row]:
    """Filter, then cap, then sample, in that order: `limit` stops reading the source early
    (a quick trial run), `sample` draws `sample` rows of what is left, reproducibly per seed,
    and gives them back in source order."""
    if limit is not None and limit < 0:
        raise UsageError(f"limit must be >= 0, got {limit}")
    if sample is not None and sample < 1:
        raise UsageError(f"sample must be >= 1, got {sample}")
    selected: Iterator[Row] = iter(rows)
    if where is not None:
        selected = filter(where, selected)
    if limit is not None:
        selected = itertools.islice(selected, limit)
    if sample is not None:
        selected = iter(reservoir_sample(selected, sample, seed))
    return selected


def reservoir_sample(rows: Iterable[Row], k: int, seed: int) -> list[Row]:
    """K rows drawn uniformly (Algorithm R) in one pass, holding only K rows; source order."""
    rng = random.Random(seed)
    kept: list[Row] = []
    for seen, row in enumerate(rows):
        if seen < k:
            kept.append(row)
        else:
            slot = rng.randrange(seen + 1)
            if slot < k:
                kept[slot] = row
    kept.sort(key=lambda r: r.index)
    return kept


# ---------------------------------------------------------------------------------------------
# Readers


@contextlib.contextmanager
def _opened(path: str, *, text: bool) -> Iterator[IO[Any]]:
    """The file (or stdin) to read; stdin is left open for whoever owns it."""
    if path == "-":
        raw = sys.stdin.buffer
        stream: IO[Any] = io.TextIOWrapper(raw, "utf-8-sig", newline="") if text else raw
        try:
            yield stream
        finally:
            if isinstance(stream, io.TextIOWrapper):
                stream.detach()
        return
    try:
        f = open(path, encoding="utf-8-sig", newline="") if text else open(path, "rb")  # noqa: SIM115
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    with f:
        yield f


def _text_rows(path: str, fmt: str) -> Iterator[Row]:
    readers: dict[str, Callable[[Any, str], Iterator[Row]]] = {
        "jsonl": _jsonl_rows,
        "json": _json_list_rows,
        "csv": _csv_rows,
    }
    with _opened(path, text=fmt != "jsonl") as stream:
        try:
            yield from readers[fmt](stream, path)
        except UnicodeDecodeError as exc:
            raise InputError(f"cannot read {path}: not UTF-8 text ({exc.reason})") from None


def _jsonl_rows(stream: IO[bytes], path: str) -> Iterator[Row]:
    index = 0
    for number, raw in enumerate(stream, 1):
        if number == 1 and raw.startswith(BOM):  # files saved by Windows editors
            raw = raw[len(BOM) :]
        if not raw.strip():
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise InputError("bad data row", [Problem.bad_json(path, number, exc)]) from None
        yield _checked(Row(path, index, number, obj))
        index += 1


def _csv_rows(stream: IO[str], path: str) -> Iterator[Row]:
    reader = csv.DictReader(stream)
    index = 0
    try:
        _check_columns(reader.fieldnames or [], path, "CSV header", 1)
        for record in reader:
            row = Row(path, index, reader.line_num, record)
            if None in record:
                raise InputError("bad data row", [row.problem(None, "more cells than the header")])
            missing = [k for k, v in record.items() if v is None]
            if missing:
                raise InputError(
                    "bad data row", [row.problem(missing[0], "fewer cells than the header")]
                )
            yield row
            index += 1
    except csv.Error as exc:
        raise InputError("bad CSV", [Problem(path, reader.line_num, None, str(exc))]) from None


def _check_columns(names: Sequence[str], path: str, what: str, line: int | None) -> None:
    """A repeated column name would silently lose a column (a row's dict keeps the last)."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InputError(
                f"bad {what}",
                [Problem(path, line, name, f"column {name!r} appears more than once")],
            )
        seen.add(name)


def _json_list_rows(stream: IO[str], path: str) -> Iterator[Row]:
    for index, (line, obj) in enumerate(_JsonListReader(stream, path)):
        yield _checked(Row(path, index, line, obj))


def _checked(row: Row) -> Row:
    if not isinstance(row.data, dict):
        kind = type(row.data).__name__
        raise InputError("bad data row", [row.problem(None, f"must be a JSON object, got {kind}")])
    return row


def _parquet_rows(path: str) -> Iterator[Row]:
    if path == "-":
        raise UsageError(
            "Parquet cannot be read from stdin (it needs a seekable file); pass a path"
        )
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        _check_columns(parquet.schema_arrow.names, path, "Parquet schema", None)
        batches = parquet.iter_batches(batch_size=1024)
        index = 0
        for batch in batches:
            for record in batch.to_pylist():
                yield Row(path, index, None, record)
                index += 1
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"cannot read {path} as Parquet: {exc}") from None


class _JsonListReader:
    """Decode the elements of a top-level JSON list one at a time from a text stream.

    The stdlib decoder's `raw_decode` parses one value at an offset; the buffer holds the unread
    tail plus one read chunk, so memory is bounded by the largest element, not the file.
    """

    def __init__(self, stream: IO[str], path: str) -> None:
        self.stream, self.path = stream, path
        self.decoder = json.JSONDecoder()
        self.buf, self.pos = "", 0
        self.counted, self.line = 0, 1  # `line` is the line number at offset `counted`

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        if self._peek() != "[":
            raise self._error(self.pos, "a .json data file must hold a list of objects")
        self.pos += 1
        if self._peek() == "]":
            self.pos += 1
        else:
            while True:
                self._peek()
                yield self._line_at(self.pos), self._value()
                sep = self._peek()
                if sep not in (",", "]"):
                    raise self._error(self.pos, "expected ',' or ']' after a list element")
                self.pos += 1
                if sep == "]":
                    break
        if self._peek():
            raise self._error(self.pos, "unexpected data after the end of the list")

    def _value(self) -> Any:
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self._cut_short(exc) and self._more():
                    continue
                raise self._error(exc.pos, f"bad JSON: {exc.msg}") from None
            # A number cut by the chunk boundary decodes fine but short: make sure it is whole.
            if end == len(self.buf) and self._more():
                continue
            self.pos = end
            return value

    def _cut_short(self, exc: json.JSONDecodeError) -> bool:
        """Whether the error may only mean the buffer ends mid-value. Real errors elsewhere
        are reported at once rather than after reading the rest of the file."""
        return exc.pos >= len(self.buf) - 6 or exc.msg.startswith("Unterminated string")

    def _peek(self) -> str:
        """The next non-space character, reading on as needed ('' at the end of the stream)."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in _JSON_SPACE:
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._more():
                return ""

    def _more(self) -> bool:
        """Append a chunk, dropping what is consumed; False at the end of the stream."""
        chunk = self.stream.read(_CHUNK)
        if not chunk:
            return False
        self._line_at(self.pos)
        self.buf = self.buf[self.pos :] + chunk
        self.counted -= self.pos
        self.pos = 0
        return True

    def _line_at(self, offset: int) -> int:
        self.line += self.buf.count("\n", self.counted, offset)
        self.counted = offset
        return self.line

    def _error(self, offset: int, message: str) -> InputError:
        line = self.line + self.buf.count("\n", self.counted, offset)
        return InputError("bad JSON data file", [Problem(self.path, line, None, message)])

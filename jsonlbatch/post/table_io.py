"""Tables in and out, streamed: Parquet (pyarrow, the `parquet` extra), CSV and JSONL.

Rows are dicts; a writer buffers them into row groups so memory stays bounded by the group size,
and writes through `outputs.replacing`, so a failed export leaves the previous file in place.
"""

from __future__ import annotations

import contextlib
import csv
import os
from collections.abc import Iterator
from types import TracebackType
from typing import IO, Any

import orjson

from jsonlbatch.errors import InputError, Problem, UsageError
from jsonlbatch.extras import load
from jsonlbatch.post.outputs import replacing

TABLE_FORMATS = ("parquet", "csv", "jsonl")
_SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "jsonl"}
ROW_GROUP = 8192


def table_format(path: str, fmt: str | None = None) -> str:
    """The format asked for, else the one the suffix names."""
    if fmt is not None:
        if fmt not in TABLE_FORMATS:
            raise UsageError(f"unknown table format {fmt!r} (known: {', '.join(TABLE_FORMATS)})")
        return fmt
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in _SUFFIXES:
        raise UsageError(
            f"cannot tell the table format of {path!r}: name it .parquet, .csv or .jsonl"
        )
    return _SUFFIXES[suffix]


def _arrow(module: str = "pyarrow") -> Any:
    return load(module, extra="parquet", for_what="Parquet")


def arrow_type(kind: type) -> Any:
    pa = _arrow()
    return {
        str: pa.string(),
        int: pa.int64(),
        float: pa.float64(),
        bool: pa.bool_(),
        list: pa.list_(pa.string()),
    }[kind]


class TableWriter:
    """Write dict rows with the given columns; `arrow_types` fixes Parquet types of columns that
    came from another table (a dataset joined into), the others follow `columns`."""

    def __init__(
        self,
        path: str,
        fmt: str,
        columns: dict[str, type | None],
        arrow_types: dict[str, Any] | None = None,
        csv_escape: bool = True,
    ) -> None:
        self.path, self.fmt, self.columns = path, fmt, list(columns)
        self._escape = csv_escape
        self._kinds = columns
        self._arrow_types = arrow_types or {}
        self._stack = contextlib.ExitStack()
        self._buffer: list[dict[str, Any]] = []
        self._fh: IO[Any] | None = None
        self._csv: Any = None
        self._parquet: Any = None
        self.rows = 0

    def __enter__(self) -> TableWriter:
        tmp = self._stack.enter_context(replacing(self.path))
        if self.fmt == "parquet":
            pq = _arrow("pyarrow.parquet")
            fields = [
                (name, self._arrow_types.get(name) or arrow_type(kind or str))
                for name, kind in self._kinds.items()
            ]
            self._schema = _arrow().schema(fields)
            self._parquet = self._stack.enter_context(pq.ParquetWriter(tmp, self._schema))
        elif self.fmt == "csv":
            self._fh = self._stack.enter_context(open(tmp, "w", newline="", encoding="utf-8"))
            self._csv = csv.writer(self._fh)
            self._csv.writerow(self.columns)
        else:
            self._fh = self._stack.enter_context(open(tmp, "wb"))
        return self

    def write(self, row: dict[str, Any]) -> None:
        self.rows += 1
        if self._parquet is not None:
            self._buffer.append(row)
            if len(self._buffer) >= ROW_GROUP:
                self._flush()
        elif self._csv is not None:
            self._csv.writerow([_csv_value(row.get(c), self._escape) for c in self.columns])
        else:
            assert self._fh is not None
            self._fh.write(orjson.dumps({c: row.get(c) for c in self.columns}, default=str) + b"\n")

    def _flush(self) -> None:
        if self._buffer:
            table = _arrow().Table.from_pylist(self._buffer, schema=self._schema)
            self._parquet.write_table(table)
            self._buffer = []

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:  # the previous output stays, the temporary file goes
            self._stack.__exit__(exc_type, exc, tb)
            return
        with self._stack:
            self._flush()


#: What a spreadsheet takes for a formula at the start of a cell (OWASP's CSV injection list).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _csv_value(value: Any, escape: bool = True) -> Any:
    """A cell: a model's answer `=HYPERLINK(...)` would run as a formula when the CSV is opened
    in a spreadsheet, so a text cell starting with = + - @ (or a tab, CR) gets a `'` first,
    which spreadsheets show as text (`--csv-raw` keeps cells as they are)."""
    if value is None:
        return ""
    if isinstance(value, list | dict):
        value = orjson.dumps(value).decode()
    if escape and isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def open_table(path: str) -> tuple[dict[str, Any], Iterator[list[dict[str, Any]]]]:
    """(column -> arrow type, batches of rows) of a dataset table; Parquet and CSV are streamed,
    JSONL is read whole by pyarrow."""
    pa = _arrow()
    fmt = table_format(path)
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            source = pq.ParquetFile(path)
            schema = source.schema_arrow
            batches = source.iter_batches(batch_size=ROW_GROUP)
        elif fmt == "csv":
            import pyarrow.csv as pacsv

            reader = pacsv.open_csv(path)
            schema, batches = reader.schema, iter(reader)
        else:
            import pyarrow.json as pajson

            table = pajson.read_json(path)
            schema, batches = table.schema, iter(table.to_batches(ROW_GROUP))
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"cannot read the dataset table {path}: {exc}") from None
    names = [f.name for f in schema]
    if len(set(names)) != len(names):  # a row's dict would keep only the last of them
        name = next(n for i, n in enumerate(names) if n in names[:i])
        line = 1 if fmt == "csv" else None
        raise InputError(
            "bad dataset table",
            [Problem(path, line, name, f"column {name!r} appears more than once")],
        )
    types = {f.name: f.type for f in schema}
    return types, (batch.to_pylist() for batch in batches)

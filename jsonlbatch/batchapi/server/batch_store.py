"""The server's memory: files and batches in SQLite (standard library) beside the files' bytes.

Every change is one committed transaction, so a `kill -9` leaves either the old or the new
state; the bytes of a file are written to a temp name and renamed before its row exists, so a
listed file always has its content. Objects are kept as the JSON the API returns, with the
columns needed to select and order them beside it.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from jsonlbatch.errors import OutputError
from jsonlbatch.file_io.output_guard import OutputLock

#: Seconds a change waits for another process's lock on the database (a backup, a `sqlite3`
#: shell in a transaction) before it gives up: SQLite's own default of 5 s made the runner die.
BUSY_TIMEOUT = 30.0
#: Names of half-written files: an upload (`*.upload`) or a result split (`*.tmp`) that a
#: `kill -9` cut short. No row points at them; they are removed when a server starts.
_TEMP_SUFFIXES = (".upload", ".tmp")


class StoreError(OutputError):
    """The database refused a change (locked past `BUSY_TIMEOUT`, disk full, ...): the call is
    refused whole, and the runner tries again."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    purpose TEXT NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0,
    object TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    status TEXT NOT NULL,
    object TEXT NOT NULL
);
"""


class Store:
    """Files and batches of one `serve --batch-api` directory."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.files_dir = self.dir / "files"
        self.work_dir = self.dir / "work"
        for d in (self.files_dir, self.work_dir):
            d.mkdir(parents=True, exist_ok=True)
        # one server per directory: a second one would run the same batches, and the stale
        # temp files removed below could be another server's uploads under way
        self._dir_lock = OutputLock(self.dir / "server")
        try:
            self._dir_lock.acquire()
        except OutputError:
            raise OutputError(
                f"{self.dir} is in use by another `serve --batch-api`; give each its own "
                "--batch-dir"
            ) from None
        try:
            self.removed_temps = self._remove_temps()
            self._db = sqlite3.connect(
                self.dir / "batches.sqlite3", timeout=BUSY_TIMEOUT, check_same_thread=False
            )
            with self._errors():
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
                self._db.executescript(_SCHEMA)
        except BaseException:
            self._dir_lock.release()
            raise
        self._lock = threading.Lock()

    def close(self) -> None:
        self._db.close()
        self._dir_lock.release()

    def _remove_temps(self) -> int:
        """Remove what a killed server left half-written (a 157 MB upload stayed forever)."""
        removed = 0
        for folder in (self.files_dir, self.work_dir):
            for path in folder.iterdir():
                if path.suffix in _TEMP_SUFFIXES and path.is_file():
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                        removed += 1
        return removed

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """sqlite3's errors as the package's own: a server's call answers 503, the runner
        logs and tries again."""
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreError(f"the batch store {self.dir} refused a change: {exc}") from None

    # -- files ---------------------------------------------------------------------------------

    def file_path(self, file_id: str) -> Path:
        return self.files_dir / file_id

    def put_file(self, obj: dict[str, Any]) -> None:
        """Register a file whose bytes are already at `file_path(obj["id"])` (or replace it)."""
        with self._lock, self._errors(), self._db:
            self._db.execute(
                "INSERT INTO files (id, purpose, object) VALUES (?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET object = excluded.object, deleted = 0",
                (obj["id"], obj["purpose"], orjson.dumps(obj).decode()),
            )

    def get_file(self, file_id: str) -> dict[str, Any] | None:
        row = self._one("SELECT object FROM files WHERE id = ? AND deleted = 0", (file_id,))
        return orjson.loads(row[0]) if row else None

    def delete_file(self, file_id: str) -> bool:
        with self._lock, self._errors(), self._db:
            cur = self._db.execute(
                "UPDATE files SET deleted = 1 WHERE id = ? AND deleted = 0", (file_id,)
            )
        return cur.rowcount > 0

    def file_in_use(self, file_id: str) -> bool:
        """Whether a batch that is not finished reads this file."""
        return any(
            b["input_file_id"] == file_id
            for b in self.batches_where(
                "status NOT IN ('completed', 'failed', 'expired', 'cancelled')"
            )
        )

    def deleted_files(self) -> list[str]:
        return [r[0] for r in self._all("SELECT id FROM files WHERE deleted = 1", ())]

    def list_files(
        self, *, purpose: str | None, after: str | None, limit: int, ascending: bool
    ) -> tuple[list[dict[str, Any]], bool]:
        where, args = ["deleted = 0"], []
        if purpose:
            where.append("purpose = ?")
            args.append(purpose)
        return self._page("files", where, args, after=after, limit=limit, ascending=ascending)

    # -- batches -------------------------------------------------------------------------------

    def put_batch(self, obj: dict[str, Any]) -> None:
        with self._lock, self._errors(), self._db:
            self._db.execute(
                "INSERT INTO batches (id, status, object) VALUES (?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET status = excluded.status, object = excluded.object",
                (obj["id"], obj["status"], orjson.dumps(obj).decode()),
            )

    def get_batch(self, batch_id: str) -> dict[str, Any] | None:
        row = self._one("SELECT object FROM batches WHERE id = ?", (batch_id,))
        return orjson.loads(row[0]) if row else None

    def batches_where(self, condition: str) -> Iterator[dict[str, Any]]:
        """Batches matching a fixed SQL condition on `status`, oldest first."""
        for row in self._all(f"SELECT object FROM batches WHERE {condition} ORDER BY seq", ()):
            yield orjson.loads(row[0])

    def list_batches(self, *, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
        return self._page("batches", [], [], after=after, limit=limit, ascending=False)

    # -- helpers -------------------------------------------------------------------------------

    def _page(
        self,
        table: str,
        where: list[str],
        args: list[Any],
        *,
        after: str | None,
        limit: int,
        ascending: bool,
    ) -> tuple[list[dict[str, Any]], bool]:
        """One page in `seq` order after the object `after` (a cursor, as OpenAI's lists)."""
        where, args = list(where), list(args)
        if after:
            row = self._one(f"SELECT seq FROM {table} WHERE id = ?", (after,))
            if row is not None:
                where.append("seq > ?" if ascending else "seq < ?")
                args.append(row[0])
        sql = f"SELECT object FROM {table}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY seq {'ASC' if ascending else 'DESC'} LIMIT ?"
        rows = self._all(sql, (*args, limit + 1))
        return [orjson.loads(r[0]) for r in rows[:limit]], len(rows) > limit

    def _one(self, sql: str, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        with self._lock, self._errors():
            return self._db.execute(sql, args).fetchone()

    def _all(self, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with self._lock, self._errors():
            return self._db.execute(sql, args).fetchall()

"""Output files of the post-processors, replaced atomically.

Post-processing is re-run freely; a crash or a `--strict` failure midway must leave either
the previous output or the new one, never a half-written file that looks complete.
"""

from __future__ import annotations

import os
import sys
from types import TracebackType
from typing import IO, Any

import orjson

from jsonlbatch.errors import OutputError


class JsonlWriter:
    """Write JSON lines to `path` (or stdout for `-`) via a temporary file renamed on success."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._tmp = f"{path}.tmp-{os.getpid()}"
        self._fh: IO[bytes] | None = None
        self.count = 0

    def __enter__(self) -> JsonlWriter:
        if self.path == "-":
            self._fh = sys.stdout.buffer
            return self
        folder = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(folder, exist_ok=True)
            self._fh = open(self._tmp, "wb")
        except OSError as exc:
            raise OutputError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        return self

    def write(self, obj: Any) -> None:
        assert self._fh is not None, "use JsonlWriter as a context manager"
        self._fh.write(orjson.dumps(obj) + b"\n")
        self.count += 1

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._fh is None or self.path == "-":
            if self._fh is not None:
                self._fh.flush()
            return
        self._fh.close()
        if exc_type is None:
            os.replace(self._tmp, self.path)
        else:
            os.unlink(self._tmp)

"""Output files of the post-processors, replaced atomically.

Post-processing is re-run freely; a crash or a `--strict` failure midway must leave either
the previous output or the new one, never a half-written file that looks complete.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from types import TracebackType
from typing import IO, Any

import orjson

from jsonlbatch.errors import OutputError


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def replacing(path: str) -> Iterator[str]:
    """A unique temporary path beside `path`, renamed onto `path` when the block succeeds and
    removed when it fails: for writers (pyarrow's, say) that want a path rather than a handle."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
        os.close(fd)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; open() would not
        os.replace(tmp, path)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


class JsonlWriter:
    """Write JSON lines to `path` (or stdout for `-`) via a temporary file renamed on success.

    The temporary file has a unique name beside `path`, so two writers never share one (two
    writers to one path: the last to finish wins, whole), and is fsynced before the rename.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._tmp = ""
        self._fh: IO[bytes] | None = None
        self.count = 0

    def __enter__(self) -> JsonlWriter:
        if self.path == "-":
            self._fh = sys.stdout.buffer
            return self
        folder = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(folder, exist_ok=True)
            fd, self._tmp = tempfile.mkstemp(
                prefix=f".{os.path.basename(self.path)}.", suffix=".tmp", dir=folder
            )
            self._fh = os.fdopen(fd, "wb")
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
        fh, self._fh = self._fh, None
        if exc_type is not None:  # keep the previous output
            with contextlib.suppress(OSError):
                fh.close()
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)
            return
        try:
            fh.flush()
            os.fsync(fh.fileno())
            fh.close()
            os.chmod(self._tmp, 0o666 & ~_umask())  # mkstemp makes 0600; open() would not
            os.replace(self._tmp, self.path)
        except OSError as error:
            with contextlib.suppress(OSError):
                fh.close()
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)
            raise OutputError(f"cannot write {self.path}: {error.strerror or error}") from None

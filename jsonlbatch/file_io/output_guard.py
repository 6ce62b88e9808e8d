"""Which output a command may write: never one of its inputs, never one a running exec
holds.

`check_output` is the one guard every command with inputs and `-o` calls (exec, merge,
gen, export, post votes/patches, report, serve --fleet --endpoints-out): an output that
is an input (by path, symbolic or hard link: `same_file`) or that a running exec holds
is refused. `OutputLock` is that hold: one exec per output, by advisory `flock`s the
kernel drops when the process dies, so there is no stale lock to clean up.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from jsonlbatch.errors import OutputError, UsageError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths name one file, through symbolic and hard links alike."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_output(
    output: str | os.PathLike[str],
    inputs: Iterable[str | os.PathLike[str] | None] = (),
    *,
    exec_lock: bool = True,
) -> None:
    """The one guard of every command that reads files and writes `-o`: refuse an output that
    is one of its inputs (by path, symbolic or hard link: `export R -o R` replaced the
    responses with the table), and one that a running `exec` holds the lock on (its remaining
    results would go into an unlinked file). `-` (stdout) is never an input. `exec_lock=False`
    is for the commands that take that lock themselves (exec, merge)."""
    if os.fspath(output) == "-":
        return
    for given in inputs:
        if given is not None and os.fspath(given) != "-" and same_file(output, given):
            raise UsageError(
                f"the output {os.fspath(output)} is also an input ({os.fspath(given)}): writing "
                "it would destroy what is read; choose another output"
            )
    if exec_lock and (holder := OutputLock.holder(output)) is not None:
        raise UsageError(
            f"{os.fspath(output)} is being written by a jsonlbatch exec (pid {holder}); wait "
            "for it to finish, or choose another output"
        )


class OutputLock:
    """Keeps two runs from writing one output at once (they would both send the same
    requests). Advisory `flock`s, which the kernel drops when the process dies, however it dies,
    so there is no stale lock to clean up:

    - on a hidden file beside the output's real path (links resolved), which exists before the
      output does: `-o out.jsonl` and `-o link-to-out.jsonl` take the same one;
    - on the output file itself, once it exists (`hold_output`, again after it is replaced): a
      hard link under another name has another lock file but the same inode.

    The lock file is opened without following links and must be a plain file of one link whose
    content is a pid (a lock file): anything else planted at its name is refused, never
    truncated.
    """

    def __init__(self, output: str | os.PathLike[str]) -> None:
        self.output = os.fspath(output)
        real = Path(os.path.realpath(output))
        self.path = real.parent / f".{real.name}.lock"
        self._fd = -1
        self._held = -1  # the output itself, flocked

    def acquire(self) -> None:
        try:
            import fcntl
        except ImportError:  # no flock (Windows): run unguarded
            return
        try:
            os.makedirs(self.path.parent, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise OutputError(
                    f"{self.path} is a symbolic link, not a lock file; remove it"
                ) from None
            raise OutputError(f"cannot write beside {self.path.parent}: {exc.strerror}") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            raise OutputError(
                f"{self.path} is not a lock file jsonlbatch made (not a plain file, or a link to "
                "another file); remove it"
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise self._busy(holder) from None
        try:
            same = os.stat(self.path, follow_symlinks=False).st_ino == st.st_ino
        except FileNotFoundError:
            same = False
        if not same:  # the holder released and removed it between our open and flock: retry
            os.close(fd)
            return self.acquire()
        content = os.read(fd, 64)
        if content.strip() and not content.strip().isdigit():
            os.close(fd)
            raise OutputError(f"{self.path} is not a lock file jsonlbatch made; remove it")
        self._fd = fd
        try:
            self.hold_output()
        except BaseException:
            self.release()
            raise
        with contextlib.suppress(OSError):  # the pid is for messages only
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)

    @staticmethod
    def holder(output: str | os.PathLike[str]) -> str | None:
        """The pid (or `?`) of the run holding `output`'s lock now, else None. Looks at the lock
        file beside the real path and at the file itself (a hard link shares its inode), with
        shared, non-blocking locks that are dropped at once."""
        try:
            import fcntl
        except ImportError:
            return None
        real = Path(os.path.realpath(output))
        for path in (real.parent / f".{real.name}.lock", real):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW)
            except OSError:
                continue
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except OSError as exc:
                    if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                        pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
                        return pid if pid.isdigit() else "?"
            finally:
                os.close(fd)
        return None

    def hold_output(self) -> None:
        """Lock the output file itself, if it exists: call again once it is created or replaced
        (a lock on a file renamed away guards nothing)."""
        if self._fd < 0:
            return
        import fcntl

        try:
            fd = os.open(self.output, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return  # missing (made later), or unreadable: the scan says why
        try:
            st = os.fstat(fd)
            if self._held >= 0 and _same_inode(os.fstat(self._held), st):
                os.close(fd)  # held already (a second flock of ours would conflict with it)
                return
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, "not a regular file")  # the scan refuses it
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise self._busy("?") from None
            return
        if self._held >= 0:
            os.close(self._held)
        self._held = fd

    def _busy(self, holder: str) -> OutputError:
        return OutputError(
            f"{self.output} is being written by another jsonlbatch run (pid {holder}); wait for "
            "it, or stop it, before running again"
        )

    def release(self) -> None:
        """Remove the lock file (no clutter) and drop the locks; a run that opened the file
        meanwhile sees it gone after its flock and tries again, so two never both hold it."""
        if self._held >= 0:
            os.close(self._held)
            self._held = -1
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                self.path.unlink()
            os.close(self._fd)
            self._fd = -1


def _same_inode(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)

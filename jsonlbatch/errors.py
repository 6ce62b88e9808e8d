"""The exceptions jsonlbatch raises.

Every error a user can cause (bad input, a wrong option, a server that never came up) is a
`JsonlbatchError`; the CLI turns these into one clean message and an exit code in one place
(`jsonlbatch.cli`). Anything else escaping is a bug and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jsonlbatch.redact import redact


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one line of a file, located precisely enough to fix it."""

    path: str
    line: int | None
    field: str | None
    message: str

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return (
            f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"
        )

    @classmethod
    def bad_json(
        cls, path: str, line: int | None, exc: Exception, field: str | None = None
    ) -> Problem:
        """A line that does not decode: the one wording every reader of a file uses."""
        return cls(path, line, field, f"bad JSON: {exc}")


#: Stop collecting after this many problems: the user fixes the pattern, not each line.
MAX_PROBLEMS = 1000


def count_problems(n: int) -> str:
    """`n`, with a `+` when collecting stopped at `MAX_PROBLEMS` (there may be more)."""
    return f"{n}{'+' if n >= MAX_PROBLEMS else ''}"


def problems_text(problems: Sequence[Problem]) -> str:
    """ "3 problems", "1 problem", "1000+ problems": for a one-line message."""
    n = len(problems)
    return f"{count_problems(n)} problem{'s' if n != 1 else ''}"


class JsonlbatchError(Exception):
    """Base class of every error jsonlbatch raises on purpose. Its text is masked (`redact`):
    messages quote servers, URLs and input lines, and a library user may log them as they are."""

    exit_code: int = 1

    def __str__(self) -> str:
        return redact(super().__str__())


class UsageError(JsonlbatchError):
    """Options that cannot work together, or a value out of range."""

    exit_code = 2


class InputError(JsonlbatchError):
    """A file the user gave us is unreadable or malformed.

    `problems` lists every located problem found (not just the first), so one run of the
    user's fix-and-retry loop can fix them all.
    """

    def __init__(
        self, message: str, problems: Sequence[Problem] = (), hint: str | None = None
    ) -> None:
        super().__init__(message)
        self.problems = list(problems)
        self.hint = hint  # what the file looks like and what to do, after the list

    def __str__(self) -> str:
        lines = [self.args[0]]
        shown = self.problems[:20]
        lines += [f"  {p}" for p in shown]
        if len(self.problems) > len(shown):
            more = len(self.problems) - len(shown)
            plus = "+" if len(self.problems) >= MAX_PROBLEMS else ""
            lines.append(f"  ... and {more}{plus} more")
        if self.hint:
            lines.append(f"hint: {self.hint}")
        return redact("\n".join(lines))


class OutputError(JsonlbatchError):
    """The output file cannot be used safely (not ours, corrupt mid-file, not writable)."""


class ServerError(JsonlbatchError):
    """A server misbehaved in a way that makes continuing pointless."""


class AuthenticationError(ServerError):
    """The server rejected our credentials (HTTP 401/403). Retrying cannot help."""


class ModelNotServedError(ServerError):
    """The requests name a model the server does not serve."""


class ServerUnavailableError(ServerError):
    """No endpoint answered within the ready timeout."""


class LaunchError(ServerError):
    """A server we launched failed to start or died and could not be restarted."""


class Interrupted(JsonlbatchError):
    """The run was stopped by SIGINT/SIGTERM; the output is valid and re-running resumes."""

    exit_code = 130

    def __init__(self, message: str, summary: object = None) -> None:
        super().__init__(message)
        self.summary = summary

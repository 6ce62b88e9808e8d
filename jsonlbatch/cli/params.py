"""Option types of every command: each bad value is a clean usage error (exit 2), never a
traceback and never a run that fails on every request.

click's own `float` takes `inf` and `nan`, `FloatRange` takes `inf` when it has no upper bound,
and a plain string option takes `''`: the types here close those gaps once for all commands.
"""

from __future__ import annotations

import math
import shlex
from typing import Any, ClassVar

import click

from jsonlbatch.errors import UsageError


class Finite(click.FloatRange):
    """A finite float within an optional range (`inf`, `-inf` and `nan` are refused)."""

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


class NonEmpty(click.ParamType):
    """A string with something in it besides blanks (`--model ''` would fail every request)."""

    name = "text"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str) or not value.strip():
            self.fail("must not be empty.", param, ctx)
        return value


class ShellWords(click.ParamType):
    """A command line fragment split as a shell would (`--server-arg "--x 'a b'"`); unbalanced
    quotes are refused here instead of failing as the server starts."""

    name = "words"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            shlex.split(value)
        except ValueError as exc:
            self.fail(f"{value!r}: {exc}", param, ctx)
        return value


class ByteSize(click.ParamType):
    """A size in bytes: `67108864`, `64MiB`, `500KB`, `1G` (K/M/G are powers of 1024 with or
    without `iB`, of 1000 with `B` alone), at least 1 KiB and at most 1 TiB."""

    name = "size"
    _UNITS: ClassVar[dict[str, int]] = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "kib": 1 << 10, "mib": 1 << 20,
              "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9}  # fmt: skip

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            size = value  # a number from a settings file or a default: checked all the same
        else:
            text = str(value).strip().lower()
            number = text.rstrip("kmgib")
            unit = text[len(number) :]
            try:
                size = int(float(number) * self._UNITS[unit])
            except (ValueError, KeyError, OverflowError):
                self.fail(f"{value!r} is not a size such as 64MiB or 1048576.", param, ctx)
        if not (1 << 10) <= size <= (1 << 40):
            self.fail(f"{value!r} must be between 1KiB and 1TiB.", param, ctx)
        return size

    @staticmethod
    def text(size: int) -> str:
        """`size` as written back in a help (`64MiB`), so a default is written once, in bytes."""
        for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if size % scale == 0:
                return f"{size // scale}{unit}"
        return str(size)


class CacheDir(click.Path):
    """An answer cache folder, or `off`: no cache, whatever `$JSONLBATCH_CACHE` says (a folder
    named off is written `./off`)."""

    OFF = "off"

    def __init__(self) -> None:
        super().__init__(file_okay=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value == self.OFF:
            return value
        return super().convert(value, param, ctx)

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        # click 8.1 (the floor) calls get_metavar(param); 8.2 and later pass ctx too.
        return "DIR|off"


class HttpUrl(click.ParamType):
    """An http(s) base URL that `jsonlbatch.exec.route.endpoints.parse_endpoint` accepts (a port in
    range, brackets that close, a host)."""

    name = "url"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        # imported here: building a command's options must not import the executor
        from jsonlbatch.exec.route.endpoints import parse_endpoint

        try:
            parse_endpoint(value)
        except UsageError as exc:
            self.fail(str(exc).removeprefix("--url "), param, ctx)
        return value


#: The longest wait we take (about 115 days): beyond, a timeout no longer fits every timer and
#: resource limit it feeds (`RLIMIT_CPU`, the event loop's clock).
_MAX_SECONDS = 1e7
#: Seconds of a timeout or a delay: positive and finite.
SECONDS = Finite(min=0, min_open=True, max=_MAX_SECONDS)
#: Seconds that may be zero (a ready timeout of 0: do not wait).
SECONDS_OR_ZERO = Finite(min=0, max=_MAX_SECONDS)
#: Sizes in MB, fractions allowed.
MEGABYTES = Finite(min=0, min_open=True)
#: A weight of an input in a vote.
WEIGHT = Finite(min=0)
#: Megabytes of memory, up to what `setrlimit` takes.
MEMORY_MB = click.IntRange(min=1, max=1 << 30)
COUNT = click.IntRange(min=1)
COUNT_OR_ZERO = click.IntRange(min=0)
#: Bytes, with a unit if wished (`64MiB`).
BYTES = ByteSize()


class CountOrAuto(click.ParamType):
    """A count of at least 1, or `auto`."""

    name = "N|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        try:
            count = int(value)
        except (TypeError, ValueError):
            count = 0
        if count < 1:  # not "is not a valid integer range": auto is as good an answer
            self.fail(f"{value!r}: give a number of at least 1, or auto", param, ctx)
        return count


COUNT_OR_AUTO = CountOrAuto()

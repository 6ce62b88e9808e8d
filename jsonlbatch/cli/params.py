"""Option types of every command: each bad value is a clean usage error (exit 2), never a
traceback and never a run that fails on every request.

click's own `float` takes `inf` and `nan`, `FloatRange` takes `inf` when it has no upper bound,
and a plain string option takes `''`: the types here close those gaps once for all commands.
"""

from __future__ import annotations

import math
import shlex
from typing import Any

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


class HttpUrl(click.ParamType):
    """An http(s) base URL that `jsonlbatch.exec.endpoints.parse_endpoint` accepts (a port in
    range, brackets that close, a host)."""

    name = "url"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        # imported here: building a command's options must not import the executor
        from jsonlbatch.exec.endpoints import parse_endpoint

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

"""Waiting for launched servers: until every one serves, showing why the others do not yet.

Shared by one model's servers (`Servers.wait_ready`) and a fleet's (every model at once, some
starting later when the fleet file staggers them).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

from jsonlbatch.errors import Interrupted, LaunchError
from jsonlbatch.redact import redact

_STATUS_EVERY = 15.0  # seconds between status lines when stderr is not a terminal


class _Process(Protocol):
    """One launched server as the wait sees it (`launch.ServerProcess` is one). Protocols
    here, so this module does not import `launch`, which imports it."""

    @property
    def label(self) -> str: ...

    def poll(self) -> int | None: ...

    def probe(self) -> str | None: ...

    def describe_failure(self, what: str) -> str: ...


class _Options(Protocol):
    @property
    def ready_timeout(self) -> float: ...


class _Group(Protocol):
    """One model's servers (`launch.Servers` is one)."""

    start_delay: float

    @property
    def processes(self) -> Sequence[_Process]: ...

    @property
    def options(self) -> _Options: ...

    def start(self) -> None: ...

    def rebind(self, process: Any, /) -> bool: ...


def wait_all(
    groups: Sequence[_Group], *, quiet: bool = False, stop: threading.Event | None = None
) -> None:
    """Block until every server of every group serves; LaunchError if one dies or times out.

    `stop`, set from another thread (a cancelled `aexecute`), ends the wait at once with
    `Interrupted`, as Ctrl-C does in the main thread: the caller tears the servers down.

    Groups (a fleet's models) may start later than others: a group's `start_delay` seconds
    after the call, it is started here. Each group's servers get its own `--ready-timeout`,
    counted from its start.
    """
    began = time.monotonic()
    waiting = [g for g in groups if g.start_delay > 0]
    started = {id(g): began for g in groups if g.start_delay <= 0}
    pending = [p for g in groups if g.start_delay <= 0 for p in g.processes]
    group_of = {id(p): g for g in groups for p in g.processes}
    total = sum(len(g.processes) for g in groups)
    reasons: dict[int, str] = {}
    status = StatusLine(quiet=quiet)
    delay = 0.1
    try:
        while pending or waiting:
            if stop is not None and stop.is_set():
                raise Interrupted("stopped while the server(s) started; they were stopped")
            now = time.monotonic()
            for g in [g for g in waiting if now - began >= g.start_delay]:
                waiting.remove(g)
                g.start()
                started[id(g)] = time.monotonic()
                pending += g.processes
            for p in list(pending):
                code = p.poll()
                if code is not None and group_of[id(p)].rebind(p):
                    continue  # its port was taken meanwhile: started again on another
                if code is not None:
                    raise LaunchError(
                        p.describe_failure(f"exited with status {code} before it was ready")
                    )
                reason = p.probe()
                if reason is None:
                    pending.remove(p)
                else:
                    reasons[id(p)] = reason
            if not pending and not waiting:
                break
            now = time.monotonic()
            for p in pending:
                timeout = group_of[id(p)].options.ready_timeout
                if now - started[id(group_of[id(p)])] > timeout:
                    why = f"not ready within --ready-timeout {timeout:g}s ({reasons[id(p)]})"
                    raise LaunchError(p.describe_failure(why))
            later = sum(len(g.processes) for g in waiting)
            ready = total - len(pending) - later
            why = "; ".join(f"{p.label}: {reasons[id(p)]}" for p in pending[:3] if id(p) in reasons)
            if later:
                why = f"{later} starting later (stagger); {why}"
            limit = max(g.options.ready_timeout for g in groups)
            status.show(
                f"waiting for server ({now - began:.0f}s of {limit:g}s, {ready}/{total} ready) {why}"
            )
            if stop is not None:
                stop.wait(delay)
            else:
                time.sleep(delay)
            delay = min(delay * 1.5, 1.0)
    finally:
        status.close()


class StatusLine:
    """ "waiting for server ..." on stderr: rewritten in place on a terminal, else every 15 s."""

    def __init__(self, *, quiet: bool) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self._since = time.monotonic()
        self._last = float("-inf")
        self._shown = False

    def show(self, text: str) -> None:
        now = time.monotonic()
        if self.quiet or now - self._since < 2.0:  # a quick start needs no status
            return
        if self.tty:
            sys.stderr.write("\r\x1b[K" + redact(text)[:200])
        elif now - self._last >= _STATUS_EVERY:
            sys.stderr.write(redact(text) + "\n")
            self._last = now
        else:
            return
        self._shown = True
        sys.stderr.flush()

    def close(self) -> None:
        if self._shown and self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()

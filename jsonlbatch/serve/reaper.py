"""`python -m jsonlbatch.serve.reaper [--grace S] -- CMD...`: run a server so it cannot outlive us.

(Standard library only: jsonlbatch runs this file as `python -I .../reaper.py`, without
importing the package.)

Inference servers spawn workers that keep holding GPUs when only the launcher is killed, and a
parent killed with SIGKILL runs no cleanup at all. So each server runs under this small process,
started by jsonlbatch in a new session: the reaper leads the process group, runs CMD inside it,
and takes the whole group down (SIGTERM, a grace, then SIGKILL) when

* its stdin reaches EOF: only jsonlbatch holds the pipe's write end, so EOF means jsonlbatch is
  gone, however it ended;
* it receives SIGTERM (jsonlbatch's normal teardown signals the whole group: the server got the
  same signal, so it is not sent again, only escalated after the grace);
* CMD exits by itself: workers it leaves behind would keep the GPU and the port.

If the reaper itself is SIGKILLed (Ray, for one, SIGKILLs the children of an actor that ends),
the server is not orphaned either: it is started with the kernel's parent-death signal set to
SIGTERM (Linux), so it shuts down, with its workers, as on a normal stop.

The server's output is passed through line by line with secrets masked (SGLang logs its API key
with its arguments); the secrets come in the environment variable named by `SECRETS_ENV`, which
the server does not inherit. The reaper exits with CMD's exit status.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

SECRETS_ENV = "JSONLBATCH_REAPER_SECRETS"
DEFAULT_GRACE = 15.0
_TAG = b"[jsonlbatch.serve.reaper] "


def _term_when_orphaned() -> None:
    """In the child before exec: SIGTERM it when the reaper dies, however (Linux prctl)."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group `pgid`.

    Zombies are left out: an orphan is reaped by init, which may be slow in a container, and a
    zombie holds neither GPU memory nor ports.
    """
    if not os.path.isdir("/proc/self"):  # not Linux: ask the kernel whether anything is left
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) == pgid:
            pids.append(int(entry))
    return pids


def wait_group_gone(pgid: int, timeout: float, *, ignore: int | None = None) -> bool:
    """Wait up to `timeout` s until no process of the group is left (except `ignore`)."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        left = [p for p in group_pids(pgid) if p != ignore]
        if not left:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.25)


def main(argv: Sequence[str] | None = None) -> int:
    grace, cmd = _parse(list(sys.argv[1:] if argv is None else argv))
    secrets = [s.encode() for s in os.environ.pop(SECRETS_ENV, "").split("\n") if s]
    wake = threading.Event()
    why: list[str] = []

    def on_sigterm(signum: int, frame: object) -> None:
        why.append("SIGTERM")
        wake.set()

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only jsonlbatch decides; it sends SIGTERM
    try:
        child = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=_term_when_orphaned,  # no thread runs yet: a fork-safe moment
        )
    except OSError as exc:
        _say(f"cannot start {cmd[0]}: {exc.strerror or exc}")
        return 127

    # Threads use raw descriptors: a daemon thread blocked in a buffered read makes the
    # interpreter abort at exit.
    def watch_parent() -> None:
        while os.read(0, 65536):
            pass
        why.append("jsonlbatch is gone")
        wake.set()

    def watch_child() -> None:
        child.wait()
        wake.set()

    def pump() -> None:  # ends when every writer (workers included) has closed the pipe
        assert child.stdout is not None
        fd, pending = child.stdout.fileno(), b""
        while chunk := os.read(fd, 65536):
            pending += chunk
            cut = max(pending.rfind(b"\n"), pending.rfind(b"\r")) + 1  # whole lines only
            if cut == 0 and len(pending) >= 65536:
                cut = len(pending)
            if cut:
                _write(_mask(pending[:cut], secrets))
                pending = pending[cut:]
        _write(_mask(pending, secrets))

    pumping = threading.Thread(target=pump, daemon=True)
    pumping.start()
    for target in (watch_parent, watch_child):
        threading.Thread(target=target, daemon=True).start()
    while not wake.wait(1.0):
        pass
    pgid, me = os.getpgrp(), os.getpid()
    if child.poll() is None:
        _say(f"stopping the server ({why[0] if why else 'stop'})")
        if why and why[0] != "SIGTERM":  # on SIGTERM the whole group got it already
            _signal_group(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(grace)
    code = child.poll()
    if code is not None:
        # Workers left behind by a server hold the GPU and the port: stop them too.
        if not wait_group_gone(pgid, 0.5, ignore=me):
            _signal_group(pgid, signal.SIGTERM)
        if wait_group_gone(pgid, grace, ignore=me):
            pumping.join(timeout=1.0)
            if code != 0:
                _say(f"server exited with status {code}")
            return code if code >= 0 else 128 - code
    _say(f"the server did not stop within {grace:g}s: SIGKILL to its process group")
    _signal_group(pgid, signal.SIGKILL)  # the reaper ends here too
    return 137


def _parse(args: list[str]) -> tuple[float, list[str]]:
    grace = DEFAULT_GRACE
    if args[:1] == ["--grace"] and len(args) >= 2:
        grace = float(args[1])
        args = args[2:]
    if args[:1] != ["--"] or len(args) < 2:
        sys.stderr.write("usage: python -m jsonlbatch.serve.reaper [--grace S] -- CMD [ARGS...]\n")
        raise SystemExit(2)
    return grace, args[1:]


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _say(message: str) -> None:
    _write(_TAG + message.encode() + b"\n")


def _write(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def _mask(data: bytes, secrets: list[bytes]) -> bytes:
    for secret in secrets:
        data = data.replace(secret, b"***")
    return data


if __name__ == "__main__":
    sys.exit(main())

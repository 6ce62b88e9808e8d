"""A server whose port was taken between the pick and the bind: started again on another.

Ports are picked before anything starts (`gpus.pick_ports`: free and bound by nobody), but each
server binds its port only once it runs (vLLM as it begins to load), and on a busy machine
another process can take the port in between. Such a server exits at once with "address already
in use"; rather than failing the run, it is started again on another free port, a few times at
most. This holds until the server is first ready: after that exec sends to its URL, so a restart
keeps its port (`Servers.check`).

While it loads, the port it could not bind may already answer: the process that took it may be
another server of the same model name. Readiness therefore also asks whose socket listens on
the port (`answered_elsewhere`, from /proc on Linux), so that server is never taken for ours.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
from typing import Protocol
from urllib.parse import urlsplit

from jsonlbatch.serve.backends import Command
from jsonlbatch.serve.reaper import group_pids


class ServerProcess(Protocol):
    """What a move reads and changes of a launched server (`launch.ServerProcess` is one): a
    protocol here, so this module does not import `launch`, which imports it."""

    moves: int
    url: str
    command: Command

    def log_tail(self) -> str: ...


#: Moves per server: a port taken three times over says more than bad luck.
MAX_MOVES = 3
# What servers say when their port is taken: Python's OSError (uvicorn, aiohttp), libuv, Go.
_IN_USE = re.compile(r"address already in use|EADDRINUSE|\[Errno 98\]", re.IGNORECASE)


def lost_its_port(server: ServerProcess) -> bool:
    """Whether `server` (which exited before it was ready) could not bind its port, and may
    move once more. Its own words in its log are the evidence."""
    return server.moves < MAX_MOVES and bool(_IN_USE.search(server.log_tail()))


_GIVEN: set[int] = set()  # ports this process handed out for moves: never twice
_LOCK = threading.Lock()


def fresh_port(host: str) -> int:
    """A port for a server that must move: one the kernel deems free (an ephemeral one, away
    from the crowded default ports every launcher starts from) and not handed out before by
    this process, so the servers of two groups (a fleet's models) cannot move onto one port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with _LOCK:
        while True:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((host.strip("[]"), 0))
                port = int(sock.getsockname()[1])
            if port not in _GIVEN:
                _GIVEN.add(port)
                return port


def port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None, url
    return port


def move(server: ServerProcess, port: int) -> int:
    """Point `server`'s command line (`--port`) and URL at `port`; the old port."""
    old = port_of(server.url)
    argv = list(server.command.argv)
    at = argv.index("--port") + 1  # the one the backend put there; --server-arg ones come after
    argv[at] = str(port)
    server.command = Command(tuple(argv), server.command.env)
    parts = urlsplit(server.url)
    host = parts.netloc.rsplit(":", 1)[0]
    server.url = parts._replace(netloc=f"{host}:{port}").geturl()
    server.moves += 1
    return old


def answered_elsewhere(pgid: int, port: int) -> str | None:
    """Who else listens on `port` ("pid 123 (python3)"), when a process outside the server's
    process group `pgid` does; None when only the server does, nothing listens yet, or this
    cannot be told (no /proc: not Linux).

    A server whose port another process took between the pick and its bind is still loading
    when the launcher first probes the port, and the probe reaches the other process. If that
    one serves a model of the same name (another user's server, another test's), the launcher
    would take it for ours and exec would write its answers as our results; ours would then
    exit with "address already in use", too late. So readiness also asks who holds the port.
    """
    inodes = _listening(port)
    if not inodes:
        return None
    for pid in group_pids(pgid):
        inodes -= _sockets_of(pid)
    if not inodes:
        return None
    for entry in os.listdir("/proc"):  # who it is, for the message (best effort)
        if entry.isdigit() and _sockets_of(int(entry)) & inodes:
            return f"pid {entry} ({_name(int(entry))})"
    return "another process"


def _listening(port: int) -> set[str]:
    """The socket inodes listening on TCP `port` (IPv4 and IPv6), as /proc/net/tcp* lists
    them; empty without /proc."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()  # sl local_address rem_address st ... uid timeout inode
            if len(fields) > 9 and fields[3] == _LISTEN and fields[1].endswith(f":{port:04X}"):
                found.add(fields[9])
    found.discard("0")
    return found


_LISTEN = "0A"


def _sockets_of(pid: int) -> set[str]:
    """The socket inodes process `pid` holds open (none if it is gone or not ours to read)."""
    out: set[str] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                out.add(target[8:-1])
    return out


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"

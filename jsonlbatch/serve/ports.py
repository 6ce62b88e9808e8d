"""A server whose port was taken between the pick and the bind: started again on another.

Ports are picked before anything starts (`gpus.pick_ports`: free and bound by nobody), but each
server binds its port only once it runs (vLLM as it begins to load), and on a busy machine
another process can take the port in between. Such a server exits at once with "address already
in use"; rather than failing the run, it is started again on another free port, a few times at
most. This holds until the server is first ready: after that exec sends to its URL, so a restart
keeps its port (`Servers.check`).
"""

from __future__ import annotations

import re
import socket
import threading
from typing import Protocol
from urllib.parse import urlsplit

from jsonlbatch.serve.backends import Command


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

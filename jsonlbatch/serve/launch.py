"""Launch inference servers for a run, wait until they serve, and always take them down.

    with serving(ServeOptions("vllm", model_path="/ckpt/m", tp_size=2, dp_size=4,
                              dp_mode="replicas")) as servers:
        jsonlbatch.execute("in.jsonl", "out.jsonl", urls=servers.urls, watchdog=servers.check)

Everything that can be checked before a server spends minutes loading (options, GPU fit, free
ports) is checked first. Each server runs under `jsonlbatch.serve.reaper` in its own process group, so
nothing survives us: not on an error, not on Ctrl-C or SIGTERM, not even on SIGKILL.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from jsonlbatch.errors import Interrupted, LaunchError, UsageError
from jsonlbatch.exec.route.endpoints import model_ids
from jsonlbatch.redact import redact
from jsonlbatch.serve import reaper
from jsonlbatch.serve.backends import (
    BACKENDS,
    CACHE_VARS,
    MOCK_NAME,
    Command,
    ServeOptions,
    build_command,
    instance_env,
)
from jsonlbatch.serve.gpus import (
    describe_holders,
    gpu_groups,
    gpu_holders,
    pick_ports,
    visible_gpus,
)
from jsonlbatch.serve.ports import answered_elsewhere, fresh_port, lost_its_port, move, port_of
from jsonlbatch.serve.readiness import wait_all
from jsonlbatch.serve.reaper import SECRETS_ENV, group_pids, wait_group_gone

__all__ = ["STOP_GRACE", "ServeOptions", "ServerProcess", "Servers", "plan_servers"]

#: Seconds a server gets between SIGTERM and SIGKILL (vLLM and SGLang free GPU memory on exit).
STOP_GRACE = reaper.DEFAULT_GRACE
LOG_TAIL_LINES = 40
_PROBE_TIMEOUT = 10.0  # SGLang's /health can be slow under load; a slow answer is not death
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # our servers are local
# The reaper runs as a plain stdlib script in isolated mode (-I: neither its folder nor the
# working directory on sys.path), which saves a package import per server.


class ServerProcess:
    """One server under its reaper. It can be started again, on the same port, after it died."""

    def __init__(
        self,
        index: int,
        command: Command,
        url: str,
        log_path: str,
        *,
        served_name: str,
        api_key: str | None = None,
        gpus: tuple[str, ...] | None = None,
        grace: float = STOP_GRACE,
    ) -> None:
        self.index = index
        self.command = command
        self.url = url
        self.log_path = log_path
        self.served_name = served_name
        self.api_key = api_key
        self.gpus = gpus  # the GPUs it is pinned to (CUDA_VISIBLE_DEVICES); None: not pinned
        self.grace = grace
        self.starts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._pipe: int | None = None  # write end of the reaper's stdin: EOF = we are gone
        self._log_offset = 0

    model: str | None = None  # in a fleet, the model it serves: messages name it
    moves = 0  # starts again on another port because its own was taken (serve/ports.py)

    def __repr__(self) -> str:
        return f"<server {self.label} {self.url} pid={self.pid}>"

    @property
    def label(self) -> str:
        """How messages name it: its index, or `model/index` in a fleet."""
        return f"{self.model}/{self.index}" if self.model else str(self.index)

    @property
    def pid(self) -> int | None:
        """The reaper's pid, which is also the process group of the whole server."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Start (or start again) under a reaper in a new session, output to the log file."""
        Path(self.log_path).parent.mkdir(parents=True, exist_ok=True)
        for name, value in self.command.env:  # its own caches (a fleet's instances)
            if name in CACHE_VARS:
                Path(value).mkdir(parents=True, exist_ok=True)
        self.release()
        self.starts += 1
        env = {**os.environ, **dict(self.command.env), SECRETS_ENV: self.api_key or ""}
        argv = [sys.executable, "-I", reaper.__file__, "--grace", f"{self.grace:g}", "--"]
        with open(self.log_path, "ab") as log:
            self._log_offset = log.tell()
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            header = f"===== jsonlbatch {stamp}: start {self.starts}: {self.command.display()}\n"
            log.write(header.encode())
            log.flush()
            read_end, self._pipe = os.pipe()
            try:
                self._proc = subprocess.Popen(
                    argv + list(self.command.argv),
                    stdin=read_end,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            except OSError as exc:
                os.close(self._pipe)
                self._pipe = None
                raise LaunchError(f"cannot start the server: {exc.strerror or exc}") from None
            finally:
                os.close(read_end)

    def poll(self) -> int | None:
        """The exit status once the server (and so its reaper) has ended, else None."""
        return self._proc.poll() if self._proc is not None else None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines the current start wrote: the server's own words on why it failed."""
        try:
            with open(self.log_path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(self._log_offset, size - 256 * 1024))
                data = f.read()
        except OSError:
            return ""
        text = data.decode("utf-8", "replace").replace("\r", "\n")
        return redact("\n".join(text.rstrip("\n").splitlines()[-lines:]))

    def describe_failure(self, what: str) -> str:
        """`what` went wrong, followed by the end of the log: the server's own words on why."""
        return (
            f"server {self.label} ({self.url}) {what}; the last lines of its log "
            f"{self.log_path}:\n{self.log_tail()}"
        )

    def probe(self) -> str | None:
        """None once `/health` answers 200, `/v1/models` lists our model and it is this server
        that answers on its port (`ports.answered_elsewhere`); else why not."""
        reason = self._answers()
        if reason is None and self.pid is not None:
            other = answered_elsewhere(self.pid, port_of(self.url))
            if other is not None:  # its port was taken before it bound it: not ours answering
                return f"its port is answered by {other}, not by this server"
        return reason

    def _answers(self) -> str | None:
        """None once `/health` answers 200 and `/v1/models` lists our model; else why not."""
        root = self.url[: -len("/v1")] if self.url.endswith("/v1") else self.url
        status, _ = _get(f"{root}/health", self.api_key)
        if status != 200:
            return status if isinstance(status, str) else f"/health answers HTTP {status}"
        status, body = _get(f"{self.url}/models", self.api_key)
        if status in (401, 403):
            return None  # up, and guarded by a key we were not told (--server-arg): the
            # client's own preflight says whether its key is right
        if status != 200:
            return status if isinstance(status, str) else f"/v1/models answers HTTP {status}"
        ids = model_ids(body) or []
        if self.served_name not in ids:
            return f"/v1/models lists {ids}, not {self.served_name!r}"
        return None

    def kill_group(self, sig: signal.Signals) -> None:
        """Signal the whole group (not a group that is gone: its id may be reused)."""
        if self._proc is not None and (self._proc.poll() is None or group_pids(self._proc.pid)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, sig)

    def wait_gone(self, deadline: float) -> bool:
        """Wait until the reaper is reaped and its group is empty, at most until `deadline`."""
        if self._proc is None:
            return True
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(max(0.0, deadline - time.monotonic()))
        if self._proc.poll() is None:
            return False
        return wait_group_gone(self._proc.pid, max(0.0, deadline - time.monotonic()))

    def release(self) -> None:
        """Close our end of the reaper's pipe (the server is gone: nothing left to watch)."""
        if self._pipe is not None:
            os.close(self._pipe)
            self._pipe = None


def stop_all(servers: Sequence[ServerProcess], grace: float = STOP_GRACE) -> list[int]:
    """SIGTERM every server group, wait `grace`, SIGKILL what is left, wait until all are gone.

    A Ctrl-C while waiting skips the rest of the grace. Returns pids still alive at the end
    (none, unless a process escaped into a group of its own or is stuck in the kernel).
    """
    running = [s for s in servers if s.pid is not None]
    for s in running:
        s.kill_group(signal.SIGTERM)
    deadline = time.monotonic() + grace
    left = list(running)
    with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: kill now
        left = [s for s in running if not s.wait_gone(deadline)]
    for s in left:
        s.kill_group(signal.SIGKILL)
    kill_deadline = time.monotonic() + 10.0
    stuck = [s for s in left if not s.wait_gone(kill_deadline)]
    for s in running:
        s.release()
    return [pid for s in stuck if s.pid is not None for pid in group_pids(s.pid)]


class Servers:
    """The servers of one `serving` block: their URLs, and a watchdog for the executor."""

    def __init__(
        self, options: ServeOptions, processes: Sequence[ServerProcess], *, quiet: bool = False
    ) -> None:
        self.options = options
        self.processes = list(processes)
        self.quiet = quiet
        self._failure: str | None = None  # set by a restart's readiness watcher
        self.start_delay = 0.0  # seconds after the fleet's start that this group starts
        self._closing = threading.Event()

    @property
    def urls(self) -> list[str]:
        """Base URLs ending in /v1, one per server."""
        return [p.url for p in self.processes]

    @property
    def api_key(self) -> str | None:
        """The key clients must send (None: the servers accept any request)."""
        return self.options.api_key

    @property
    def log_paths(self) -> list[str]:
        return [p.log_path for p in self.processes]

    def start(self) -> None:
        for p in self.processes:
            self.note(f"starting server {p.label}: {p.command.display()} (log: {p.log_path})")
            p.start()

    def wait_ready(self, stop: threading.Event | None = None) -> None:
        """Block until every server serves its model; LaunchError if one dies or times out,
        Interrupted once `stop` is set."""
        started = time.monotonic()
        wait_all([self], quiet=self.quiet, stop=stop)
        self.note(f"ready after {time.monotonic() - started:.0f}s: {', '.join(self.urls)}")

    def check(self) -> None:
        """Restart a server that died (same port) while restarts are left; else LaunchError.

        Cheap and non-blocking: the executor calls it while it waits for endpoints, and pauses
        sending meanwhile, so a restarted server simply rejoins when it answers again.
        """
        if self._failure is not None:
            raise LaunchError(self._failure)
        for p in self.processes:
            code = p.poll()
            if code is None:
                continue
            restarts = p.starts - 1 - p.moves  # the first start (and a move) is no restart
            if restarts >= self.options.restart:
                used = f"--restart-server {self.options.restart} used up"
                raise LaunchError(
                    p.describe_failure(f"exited with status {code} while serving ({used})")
                )
            self.note(
                f"server {p.label} ({p.url}) exited with status {code}; restarting it "
                f"({restarts + 1} of {self.options.restart}); its log: {p.log_path}"
            )
            self._stop([p])  # leftovers of the dead one must free GPU and port
            p.start()
            watcher = threading.Thread(target=self._watch_restart, args=(p, p.starts), daemon=True)
            watcher.start()

    def rebind(self, p: ServerProcess) -> bool:
        """`p` exited before it was ready because its port was taken meanwhile: start it again
        on another free port (`ports`). False when it failed for another reason."""
        if not lost_its_port(p):
            return False
        port = fresh_port(self.options.host)
        self.note(f"server {p.label}: port {move(p, port)} was taken before it could bind it; "
                  f"starting it again on port {port}")  # fmt: skip
        p.start()
        return True

    def _watch_restart(self, p: ServerProcess, start: int) -> None:
        deadline = time.monotonic() + self.options.ready_timeout
        while not self._closing.is_set() and p.starts == start and p.poll() is None:
            reason = p.probe()
            if reason is None:
                self.note(f"server {p.label} ({p.url}) is serving again")
                return
            if time.monotonic() > deadline:
                timeout = self.options.ready_timeout
                self._failure = p.describe_failure(
                    f"not ready within --ready-timeout {timeout:g}s after a restart ({reason})"
                )
                return
            self._closing.wait(1.0)

    def stop(self) -> None:
        """Take every server down and wait until its processes are gone."""
        self._closing.set()
        if any(p.poll() is None for p in self.processes):
            self.note("stopping server(s)")
        stuck = self._stop(self.processes)
        if stuck:
            self.note(f"warning: processes {stuck} did not exit after SIGKILL")

    def _stop(self, processes: Sequence[ServerProcess]) -> list[int]:
        """Take `processes` down (SIGTERM, grace, SIGKILL); the pids that survived."""
        return stop_all(processes, grace=min((p.grace for p in processes), default=STOP_GRACE))

    def note(self, message: str) -> None:
        """A line on stderr for the user, unless quiet."""
        if not self.quiet:
            sys.stderr.write(redact(message) + "\n")
            sys.stderr.flush()


def plan_servers(
    options: ServeOptions, *, log_stem: str | None = None, taken: Collection[int] = ()
) -> list[ServerProcess]:
    """Decide every server's command, GPUs, port and log file; start nothing.

    Raises UsageError for anything that cannot work (TP x DP beyond the GPUs, a taken --port).
    """
    backend = BACKENDS[options.backend]
    replicas = options.dp_mode == "replicas"
    # The mock uses no GPU: only an explicit --gpus pins it (handy to try replicas out).
    gpus = visible_gpus(options.gpus, None if backend.needs_gpus else {}, detect=backend.needs_gpus)
    if gpus is None and replicas and backend.needs_gpus:
        raise UsageError(
            "--dp-mode replicas pins each server to its own GPUs: give --gpus or set "
            "CUDA_VISIBLE_DEVICES (nvidia-smi was not found to list them)"
        )
    groups = gpu_groups(gpus, options.tp_size, options.dp_size, replicas=replicas)
    ports = pick_ports(
        options.host,
        len(groups),
        options.port or backend.default_port,
        stride=backend.port_stride,
        exact=options.port is not None,
        taken=taken,
    )
    logs = log_paths(options, len(groups), log_stem)
    host = _connect_host(options.host)
    servers = []
    for i, (group, port) in enumerate(zip(groups, ports, strict=True)):
        command = build_command(
            options, port=port, data_parallel=1 if replicas else options.dp_size
        )
        env = [*command.env, *instance_env(options, i)]
        if group is not None:
            env.append(("CUDA_VISIBLE_DEVICES", ",".join(group)))
        command = Command(command.argv, tuple(env))
        servers.append(
            ServerProcess(
                i,
                command,
                f"http://{host}:{port}/v1",
                logs[i],
                served_name=(options.served_names or (MOCK_NAME,))[0],
                api_key=options.api_key,
                gpus=group,
            )
        )
    return servers


def run_log_dir(what: str) -> str:
    """A fresh directory for one `serve` run's logs, under the system's temp dir: a bare
    `serve` (no output file to put them beside, no --server-log-dir) must not litter the
    current directory."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return tempfile.mkdtemp(prefix=f"jsonlbatch-serve-{what}-{stamp}-")


def log_paths(options: ServeOptions, count: int, log_stem: str | None) -> list[str]:
    """`<stem>.server.log`, or `<stem>.server-<i>.log` per replica; in `log_dir` if given.

    The stem is the output file for `exec` (the log lies beside it), else `jsonlbatch-<backend>`.
    """
    stem = log_stem or f"jsonlbatch-{options.backend}"
    if options.log_dir:
        stem = os.path.join(options.log_dir, os.path.basename(stem))
    if count == 1:
        return [f"{stem}.server.log"]
    return [f"{stem}.server-{i}.log" for i in range(count)]


def warn_gpu_holders(servers: Servers) -> None:
    """Warn about processes already on the servers' GPUs (all GPUs when none is pinned)."""
    pinned = [gpu for p in servers.processes for gpu in p.gpus or ()]
    holders = gpu_holders(pinned or None)
    if holders:
        servers.note(describe_holders(holders))


@contextlib.contextmanager
def running(servers: Any, stop: threading.Event | None = None) -> Iterator[None]:
    """Start `servers` (a `Servers`, or anything with start, wait_ready and stop), wait until
    they serve, and stop them however the block ends; Ctrl-C and SIGTERM become Interrupted,
    and so does `stop` set from another thread while they start (a cancelled `aexecute`)."""
    previous = _set_sigterm(_interrupt, only_replacing=signal.SIG_DFL)
    try:
        servers.start()
        servers.wait_ready(stop)
        yield
    except KeyboardInterrupt:  # Ctrl-C before (or without) the caller's own signal handling
        raise Interrupted("interrupted; the server(s) were stopped") from None
    finally:
        during = _set_sigterm(signal.SIG_IGN)  # a second SIGTERM must not cut teardown short
        servers.stop()
        _set_sigterm(previous if previous is not None else during)


def _interrupt(signum: int, frame: object) -> None:
    raise Interrupted("stopped by SIGTERM; the server(s) were stopped")


def _set_sigterm(handler: Any, *, only_replacing: Any = None) -> Any:
    """Install a SIGTERM handler (main thread only; with `only_replacing`, only over that one).
    Returns the handler to restore, None where nothing was changed."""
    if handler is None or threading.current_thread() is not threading.main_thread():
        return None
    if only_replacing is not None and signal.getsignal(signal.SIGTERM) is not only_replacing:
        return None
    return signal.signal(signal.SIGTERM, handler)


def _get(url: str, api_key: str | None) -> tuple[int | str, object]:
    """GET `url`: (status, decoded JSON or None), or (reason, None) when it cannot connect."""
    request = urllib.request.Request(url)
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with _OPENER.open(request, timeout=_PROBE_TIMEOUT) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except urllib.error.URLError as exc:
        reason = exc.reason
        return f"cannot connect ({getattr(reason, 'strerror', None) or reason})", None
    except (TimeoutError, OSError, http.client.HTTPException) as exc:  # e.g. not HTTP at all
        return f"no answer ({type(exc).__name__})", None
    try:
        return status, orjson.loads(raw)
    except orjson.JSONDecodeError:
        return status, None


def _connect_host(host: str) -> str:
    """Where clients connect: a wildcard bind address is reached over loopback."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host

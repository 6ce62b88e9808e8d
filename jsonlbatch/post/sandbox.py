"""Running a model-written Python script to produce deliverable files (`post files --run`).

The "model writes code that renders the xlsx/docx/pdf" workflow: the script runs with
`sys.executable` in a fresh temporary directory holding only the sample's extracted files,
and the files it creates there are collected.

Always: a working directory of its own (HOME and TMPDIR point into it), an environment
reduced to a whitelist (PATH, locale, TZ; no variable whose name says KEY, TOKEN, SECRET,
PASSWORD or CREDENTIAL), a parent process (`launcher.py`) that itself has only that
environment, so `/proc/$PPID/environ` holds no key; limits on CPU time, address space, file
size and core dumps (`resource`, set before the launcher starts); a wall-clock timeout after
which the whole process group is killed; collection that never follows a symlink the script
made.

Where bubblewrap (`bwrap`) is installed and works, the script also runs in its sandbox: new
user, PID, network, IPC and UTS namespaces (no network, no other process visible), the system
(/usr, /etc, the Python installation) read-only, nothing else of the file system (no home, no
other projects), and only its working directory writable. The manifest says which isolation
ran (`isolation`: `bwrap` or `launcher`).

Without bwrap this is NOT a security sandbox: the script runs as the user, can read every file
the user can read, write anywhere the user can write, use the network, read the environment of
the user's other processes (jsonlbatch's own included, by pid), and a process that calls
`setsid` escapes the group kill. See docs/post.md.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from jsonlbatch.errors import UsageError
from jsonlbatch.post import launcher
from jsonlbatch.post.paths import UnsafePathError, read_inside, safe_relpath, write_inside
from jsonlbatch.redact import secret_variable

_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "SYSTEMROOT")
_TAIL = 2000


@dataclass
class RunLimits:
    """Limits of one script run. `cpu_seconds` defaults to the wall-clock timeout."""

    timeout: float = 60.0
    memory_bytes: int = 4 * 1024**3
    file_bytes: int = 64 * 1024**2
    cpu_seconds: int | None = None
    max_files: int = 100
    max_total_bytes: int = 50 * 1024**2
    #: "auto": bwrap where it works, else the launcher alone; "bwrap": bwrap or refuse;
    #: "launcher": never bwrap.
    isolation: str = "auto"


@dataclass
class RunResult:
    """What a run did: its exit status, the tail of its output, and the files it made."""

    returncode: int | None
    timed_out: bool
    output: str
    isolation: str = "launcher"
    files: dict[str, bytes] = field(default_factory=dict)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    @property
    def reason(self) -> str:
        if self.timed_out:
            return f"timed out; {self.output[-300:]}".rstrip("; ")
        if self.returncode and self.returncode < 0:
            name = signal.Signals(-self.returncode).name if -self.returncode in _SIGNALS else "?"
            return f"killed by signal {name} (a limit?); {self.output[-300:]}".rstrip("; ")
        return f"exit status {self.returncode}; {self.output[-300:]}".rstrip("; ")


_SIGNALS = {s.value for s in signal.Signals}


def safe_env(tmpdir: str) -> dict[str, str]:
    """The environment of a script: a whitelist, never anything that looks like a secret."""
    env = {k: v for k, v in os.environ.items() if k in _ENV_KEEP}
    env.update(
        HOME=tmpdir,
        TMPDIR=tmpdir,
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
        MPLBACKEND="Agg",
    )
    return {k: v for k, v in env.items() if not secret_variable(k)}


def _limiter(limits: RunLimits) -> Callable[[], None]:
    import resource

    cpu = limits.cpu_seconds or max(1, int(limits.timeout + 0.999))

    def cap(kind: int, soft: int, hard: int) -> None:
        _, current = resource.getrlimit(kind)
        if current != resource.RLIM_INFINITY:
            soft, hard = min(soft, current), min(hard, current)
        resource.setrlimit(kind, (soft, hard))

    def apply() -> None:  # runs in the child between fork and exec
        cap(resource.RLIMIT_CPU, cpu, cpu + 1)
        cap(resource.RLIMIT_AS, limits.memory_bytes, limits.memory_bytes)
        cap(resource.RLIMIT_FSIZE, limits.file_bytes, limits.file_bytes)
        cap(resource.RLIMIT_CORE, 0, 0)

    return apply


def run_script(
    script: str, files: Mapping[str, bytes], limits: RunLimits | None = None
) -> RunResult:
    """Run `script` (a path among `files`) in a fresh directory holding `files`.

    Returns the files created or changed by the run (paths relative to the directory).
    """
    if os.name != "posix":
        raise UsageError("--run needs a POSIX system (resource limits, process groups)")
    limits = limits or RunLimits()
    isolation = choose_isolation(limits.isolation)
    work = tempfile.mkdtemp(prefix="jsonlbatch-run-")
    logs = tempfile.mkdtemp(prefix="jsonlbatch-log-")
    try:
        for name, data in files.items():
            write_inside(work, safe_relpath(name), data)
        log_path = os.path.join(logs, "output")
        with open(log_path, "wb") as log:
            command = [sys.executable, safe_relpath(script)]
            if isolation == "bwrap":
                command = bwrap_command(work) + command
            proc = subprocess.Popen(
                [sys.executable, "-I", launcher.__file__, *command],
                cwd=work,
                env=safe_env(work),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_limiter(limits),
            )
            timed_out = False
            try:
                proc.wait(timeout=limits.timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc)
        result = RunResult(proc.returncode, timed_out, _tail(log_path), isolation)
        if result.ok:
            _collect(work, files, limits, result)
        return result
    finally:
        _remove(work)
        _remove(logs)


ISOLATIONS = ("auto", "bwrap", "launcher")
#: Read-only in the sandbox: the system and the Python that runs the script (a venv, its base).
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")


def choose_isolation(wanted: str) -> str:
    """ "bwrap" or "launcher" for `wanted` (see `RunLimits.isolation`)."""
    if wanted not in ISOLATIONS:
        raise UsageError(f"isolation must be one of {', '.join(ISOLATIONS)}, got {wanted!r}")
    if wanted == "launcher":
        return "launcher"
    problem = bwrap_problem()
    if problem is None:
        return "bwrap"
    if wanted == "bwrap":
        raise UsageError(f"--sandbox bwrap: {problem}")
    return "launcher"


@functools.cache
def bwrap_problem() -> str | None:
    """Why bwrap cannot be used here (None: it can). Tried once per process: a container may
    have it installed but forbid the namespaces it needs."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    try:
        probe = subprocess.run(
            [*bwrap_command(tempfile.gettempdir()), sys.executable, "-c", ""],  # as scripts run
            capture_output=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap does not run: {exc}"
    if probe.returncode != 0:
        why = probe.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"bwrap does not work here: {why[-1] if why else probe.returncode}"
    return None


def bwrap_command(work: str) -> list[str]:
    """bwrap's argv (before the command): no network, no other processes, the system read-only,
    only `work` writable, gone when its parent goes."""
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--cap-drop", "ALL"]
    pythons = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    pythons.add(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    for path in _SYSTEM:
        argv += ["--ro-bind-try", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for path in sorted(pythons):  # after the private /tmp: a venv under /tmp must show through
        argv += ["--ro-bind-try", path, path]
    argv += ["--bind", work, work, "--chdir", work]
    return [*argv, "--remount-ro", "/"]  # the sandbox's own root: no writes that vanish


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the script and everything it started in its process group, then reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _tail(path: str) -> str:
    with open(path, "rb") as fh:
        fh.seek(max(0, os.path.getsize(path) - _TAIL))
        return fh.read().decode("utf-8", "replace").strip()


def _collect(work: str, inputs: Mapping[str, bytes], limits: RunLimits, result: RunResult) -> None:
    """Read the files the run created or changed, within the count and size caps."""
    given = {safe_relpath(k): v for k, v in inputs.items()}
    total = 0
    for folder, dirs, names in os.walk(work):
        rel_folder = os.path.relpath(folder, work)
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names) + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            rel = name if rel_folder == "." else f"{rel_folder}/{name}"
            mode = os.lstat(os.path.join(folder, name)).st_mode
            if stat.S_ISLNK(mode):
                result.refused.append((rel, "the script made a symlink; not followed"))
                continue
            if not stat.S_ISREG(mode):
                continue
            try:
                data = read_inside(work, safe_relpath(rel), max_bytes=limits.file_bytes)
            except UnsafePathError as exc:
                result.refused.append((rel, str(exc)))
                continue
            if data is None or given.get(rel) == data:
                continue
            total += len(data)
            if len(result.files) >= limits.max_files or total > limits.max_total_bytes:
                why = (
                    f"over the limit of {limits.max_files} files or {limits.max_total_bytes} bytes"
                )
                result.refused.append((rel, why + "; the rest was not read"))
                return
            result.files[rel] = data


def _remove(path: str) -> None:
    """Remove a temporary tree even if the script made parts of it read-only."""
    for folder, dirs, _ in os.walk(path):
        for d in dirs:
            full = os.path.join(folder, d)
            if not os.path.islink(full):
                with contextlib.suppress(OSError):
                    os.chmod(full, 0o700)
    shutil.rmtree(path, ignore_errors=True)

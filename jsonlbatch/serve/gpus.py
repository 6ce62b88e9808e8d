"""GPUs and ports for launched servers: decided before anything starts.

A TP x DP that does not fit, a port already taken or a GPU still held by an earlier crashed job
are the usual reasons a multi-minute cold start fails at its very end; they are cheap to see up
front, so they are checked here first.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from jsonlbatch.errors import UsageError

_NVIDIA_SMI_TIMEOUT = 15.0
_MAX_PORT = 65535


@dataclass(frozen=True)
class GpuList:
    """The GPUs a launch may use, and where that list came from (for messages)."""

    ids: tuple[str, ...]
    source: str


@dataclass(frozen=True)
class GpuProcess:
    """A process that already holds memory on one of our GPUs."""

    pid: int
    name: str
    used_memory: str
    gpu: str


def visible_gpus(
    explicit: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    detect: bool = True,
) -> GpuList | None:
    """The usable GPU ids: `--gpus`, else `CUDA_VISIBLE_DEVICES`, else what nvidia-smi lists.

    None when nothing says (no option, no variable, no nvidia-smi): the server then picks for
    itself. Items may be "0,1" strings, as typed on a command line.
    """
    env = os.environ if env is None else env
    if explicit:
        return GpuList(_unique(_split_ids(explicit), "--gpus"), "--gpus")
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        ids = _split_ids((cvd,))
        return GpuList(_unique(ids, "CUDA_VISIBLE_DEVICES"), "CUDA_VISIBLE_DEVICES")
    if detect:
        rows = _nvidia_smi("--query-gpu=index", "--format=csv,noheader")
        if rows is not None:
            return GpuList(tuple(row[0] for row in rows if row), "nvidia-smi")
    return None


def gpu_groups(
    gpus: GpuList | None, tp_size: int, dp_size: int, *, replicas: bool
) -> list[tuple[str, ...] | None]:
    """The GPUs of each server: one group of TP x DP (native DP) or DP groups of TP (replicas).

    A group of None means "do not pin" (no GPU list known). Raises UsageError when TP x DP does
    not fit, so the mistake shows before a server spends minutes loading.
    """
    count = dp_size if replicas else 1
    per_server = tp_size if replicas else tp_size * dp_size
    if gpus is None:
        return [None] * count
    need = tp_size * dp_size
    if need > len(gpus.ids):
        shown = ",".join(gpus.ids) or "none"
        raise UsageError(
            f"--tp-size {tp_size} x --dp-size {dp_size} needs {need} GPUs, but {gpus.source} "
            f"gives {len(gpus.ids)} ({shown})"
        )
    return [tuple(gpus.ids[i * per_server : (i + 1) * per_server]) for i in range(count)]


def gpu_holders(gpus: Sequence[str] | None = None) -> list[GpuProcess]:
    """Processes already using our GPUs (all GPUs when `gpus` is None), per nvidia-smi.

    Empty where nvidia-smi is absent or fails: this only feeds a warning.
    """
    apps = _nvidia_smi(
        "--query-compute-apps=pid,process_name,used_memory,gpu_uuid", "--format=csv,noheader"
    )
    if not apps:
        return []
    index_of = {
        row[1]: row[0]
        for row in _nvidia_smi("--query-gpu=index,uuid", "--format=csv,noheader") or []
        if len(row) >= 2
    }
    wanted = set(gpus) if gpus is not None else None
    out = []
    for row in apps:
        if len(row) < 4 or not row[0].isdigit():
            continue
        uuid = row[3]
        index = index_of.get(uuid, uuid)
        if wanted is None or index in wanted or uuid in wanted:
            out.append(GpuProcess(int(row[0]), row[1], row[2], index))
    return out


def describe_holders(holders: Sequence[GpuProcess]) -> str:
    """A warning naming the pids, so a user can tell a leftover job from a neighbour's."""
    items = "; ".join(f"GPU {h.gpu}: pid {h.pid} {h.name} ({h.used_memory})" for h in holders)
    return (
        f"warning: {len(holders)} process(es) already use the GPUs: {items}. A leftover server "
        "can make the new one fail with out-of-memory; stop it first if it is yours."
    )


def port_is_free(host: str, port: int, *, strict: bool = False) -> bool:
    """Whether a server could bind `host:port` now (with SO_REUSEADDR, as servers do).

    With `strict`, also no other socket may be bound there at all: vLLM binds its port as it
    starts and listens only once the model is loaded (a minute or more later), and in between a
    SO_REUSEADDR bind succeeds, so a second launcher would pick the same port and probe the
    other's server. (Strict also skips ports in TIME_WAIT: fine when choosing a port.)
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        if not strict:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def pick_ports(
    host: str,
    count: int,
    start: int,
    *,
    stride: int = 1,
    exact: bool = False,
    taken: Collection[int] = (),
) -> list[int]:
    """`count` free ports from `start` on, at least `stride` apart.

    Servers open more ports beside their main one (NCCL, ZMQ, RPC), so replicas on one host
    are spread out. With `exact` (a port the user chose) the first port must be `start` itself.
    `taken`: ports already promised to servers not started yet (another model of a fleet).
    """
    ports: list[int] = []
    candidate = start
    while len(ports) < count:
        if candidate > _MAX_PORT:
            raise UsageError(f"no {count} free ports from {start} on {host}")
        # The user's own --port may be in TIME_WAIT after a restart; a port we choose must be
        # bound by nobody (see port_is_free).
        if candidate in taken:
            if exact and not ports:
                raise UsageError(f"--port {start} is given to another server of this run")
            candidate += 1
        elif port_is_free(host, candidate, strict=not (exact and not ports)):
            ports.append(candidate)
            candidate += stride
        elif exact and not ports:
            raise UsageError(
                f"--port {start} is not available on {host} (a leftover server?); choose another "
                "port or leave --port out to pick a free one"
            )
        else:
            candidate += 1
    return ports


def _split_ids(items: Iterable[str]) -> tuple[str, ...]:
    """GPU ids from "0,1"-style strings, blanks dropped."""
    return tuple(g.strip() for item in items for g in item.split(",") if g.strip())


def _unique(ids: tuple[str, ...], source: str) -> tuple[str, ...]:
    seen = set()
    for gpu in ids:
        if gpu in seen:
            raise UsageError(f"{source} names GPU {gpu} twice")
        seen.add(gpu)
    return ids


def _nvidia_smi(*args: str) -> list[list[str]] | None:
    """Rows of an nvidia-smi CSV query, or None where it is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run(
            [exe, *args],
            capture_output=True,
            text=True,
            timeout=_NVIDIA_SMI_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return [
        [c.strip() for c in line.split(",")] for line in done.stdout.splitlines() if line.strip()
    ]

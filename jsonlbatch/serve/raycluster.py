"""Server replicas placed and supervised by Ray (`--ray`, `--ray-address`).

Ray does what it is good at: it reserves each replica's tensor-parallel group of GPUs (a
placement group of one bundle, packed on one node), runs a small actor there, and restarts that
actor elsewhere if its node is lost. The actor launches the server with jsonlbatch's own launcher
(`ServerProcess`: the same command line, reaper, process-group teardown and log), so nothing about
the server changes. The driver keeps what jsonlbatch is good at: readiness, restarts within
`--restart-server`, the one exactly-once output and routing across the replica URLs.

Teardown: the driver stops every server, kills every actor and removes every placement group
however the run ends. If the driver itself is SIGKILLed, Ray ends the actors it owned (they are
not detached), and each server's reaper sees its actor's pipe close and takes the server's
process group down.

Ray is the optional `ray` extra; its import happens here only.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from jsonlbatch.errors import LaunchError, UsageError
from jsonlbatch.extras import load
from jsonlbatch.serve.backends import BACKENDS, Command, ServeOptions, build_command
from jsonlbatch.serve.gpus import pick_ports
from jsonlbatch.serve.launch import (
    STOP_GRACE,
    ServerProcess,
    Servers,
    _connect_host,
    log_paths,
    stop_all,
)
from jsonlbatch.serve.ports import MAX_MOVES, fresh_port, lost_its_port, move, port_of
from jsonlbatch.serve.rayauth import RayAuth

#: Settings of the servers themselves, forwarded from the driver to every replica's actor.
FORWARDED_PREFIXES = (
    "VLLM_",
    "SGLANG_",
    "HF_",
    "HUGGING_FACE_",
    "TRANSFORMERS_",
    "NCCL_",
    "TORCH_",
    "JSONLBATCH_",
)
#: Extra variable names to forward, comma-separated (PATH, say, on a one-machine cluster).
RAY_ENV = "JSONLBATCH_RAY_ENV"
_CALL_TIMEOUT = 60.0  # seconds for an actor call; a busy node may be slow, a hung one is dead
_LOOPBACK = ("127.", "localhost", "[::1]", "::1")


#: Ray's switch for one-machine clusters (its default on macOS): every Ray process and every
#: address it hands out stays on 127.0.0.1, as jsonlbatch's servers do unless asked otherwise.
LOOPBACK_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def _address(options: ServeOptions) -> str | None:
    return options.ray_address or os.environ.get("RAY_ADDRESS") or None


def _is_loopback(address: str | None) -> bool:
    """A new local cluster (no address) or one whose head is on this machine's loopback."""
    if not address:
        return True
    host = address.removeprefix("ray://").rsplit(":", 1)[0]
    return host.startswith(_LOOPBACK)


def _ray(loopback: bool = False) -> Any:
    if loopback and "ray" not in sys.modules:  # read once, when Ray is imported
        os.environ.setdefault(LOOPBACK_ONLY_ENV, "0")
    return load("ray", extra="ray", for_what="--ray")


def forwarded_env(environ: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, str]:
    """The driver's variables that configure servers, for the replicas' actors."""
    extra = {n.strip() for n in environ.get(RAY_ENV, "").split(",") if n.strip()}
    return {
        name: value
        for name, value in environ.items()
        if (name.startswith(FORWARDED_PREFIXES) or name in extra)
        and name != "CUDA_VISIBLE_DEVICES"  # Ray assigns each actor its own GPUs
    }


class ReplicaServer:
    """The actor: one server on the node Ray placed it on (made remote in `_actor_class`)."""

    def __init__(
        self, options: ServeOptions, index: int, log_path: str, port: int | None, node_host: bool
    ) -> None:
        import ray

        if node_host:  # a real cluster: serve on this node's address, where the driver reaches it
            options = replace(options, host=ray.util.get_node_ip_address())
        host = options.host
        if port is None:  # several actors may pick at once on one node: an ephemeral port
            port = fresh_port(host)
        replicas = options.dp_mode == "replicas"
        command = build_command(
            options, port=port, data_parallel=1 if replicas else options.dp_size
        )
        gpus = tuple(str(g) for g in ray.get_gpu_ids()) or None
        if gpus is not None:
            command = Command(
                command.argv, (*command.env, ("CUDA_VISIBLE_DEVICES", ",".join(gpus)))
            )
        self.server = ServerProcess(
            index,
            command,
            f"http://{_connect_host(host)}:{port}/v1",
            log_path,
            served_name=options.served_names[0],
            api_key=options.api_key,
            gpus=gpus,
        )
        if ray.get_runtime_context().was_current_actor_reconstructed:
            self.server.start()  # Ray restarted this actor (its node was lost): serve again

    def info(self) -> dict[str, Any]:
        s = self.server
        return {"url": s.url, "command": s.command, "gpus": s.gpus, "starts": s.starts,
                "moves": s.moves, "pid": s.pid, "node": _node_id()}  # fmt: skip

    def rebind(self) -> dict[str, Any] | None:
        """The server could not bind its port (taken meanwhile): start it again on another
        free one on this node; None: it failed for another reason."""
        s = self.server
        if not lost_its_port(s):
            return None
        port = fresh_port(urlsplit(s.url).hostname or "127.0.0.1")
        move(s, port)
        s.start()
        return self.info()

    def start(self) -> dict[str, Any]:
        self.server.start()
        return self.info()

    def poll(self) -> int | None:
        return self.server.poll()

    def log_tail(self) -> str:
        return self.server.log_tail()

    def stop(self, grace: float) -> list[int]:
        return stop_all([self.server], grace=grace)


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


_ACTOR: Any = None


def _actor_class() -> Any:
    global _ACTOR
    if _ACTOR is None:
        _ACTOR = _ray().remote(ReplicaServer)
    return _ACTOR


class RayReplica(ServerProcess):
    """The driver's view of one replica: the launcher's `ServerProcess` interface (so `Servers`
    waits, probes and restarts it unchanged), with the process living in a Ray actor."""

    def __init__(self, index: int, log_path: str, options: ServeOptions) -> None:
        super().__init__(
            index,
            Command((options.backend,), ()),
            "(not placed yet)",
            log_path,
            served_name=options.served_names[0],
            api_key=options.api_key,
        )
        self.actor: Any = None
        self.group: Any = None  # its placement group
        self.node = ""
        self._remote_pid: int | None = None

    @property
    def pid(self) -> int | None:
        return self._remote_pid

    def _call(self, method: str, *args: Any, timeout: float = _CALL_TIMEOUT) -> Any:
        ray = _ray()
        return ray.get(getattr(self.actor, method).remote(*args), timeout=timeout)

    def _update(self, info: dict[str, Any]) -> None:
        self.url, self.command, self.gpus = info["url"], info["command"], info["gpus"]
        self.starts, self._remote_pid, self.node = info["starts"], info["pid"], info["node"]
        self.moves = info["moves"]

    def start(self) -> None:
        try:
            self._update(self._call("start"))
        except Exception as exc:  # the actor is gone: nothing to start the server in
            raise LaunchError(
                f"replica {self.index}: its Ray actor failed: {_short(exc)}"
            ) from None

    def poll(self) -> int | None:
        if self.actor is None:
            return None  # not placed yet
        ray = _ray()
        try:
            code = self._call("poll")
            if code is None and self._remote_pid is not None:
                info = self._call("info")
                if info["node"] != self.node or info["starts"] != self.starts:
                    self._update(info)  # Ray restarted the actor, maybe on another node
            return code
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
            return None  # being restarted by Ray, or slow: not dead yet
        except ray.exceptions.RayActorError:
            return -1  # the actor died for good (its restarts used up)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return str(self._call("log_tail", timeout=10.0))
        except Exception:
            return "(the replica's actor is gone; its log stays on its node)"

    def stop_remote(self, grace: float) -> list[int]:
        """Stop the server inside the actor, then the actor and its placement group."""
        stuck: list[int] = []
        if self.actor is not None:
            # an actor that is gone took the pipe that kept its server alive with it
            with contextlib.suppress(Exception):
                stuck = list(self._call("stop", grace, timeout=grace + 20.0))
        return stuck

    def remove(self) -> None:
        ray = _ray()
        from ray.util.placement_group import remove_placement_group

        if self.actor is not None:
            ray.kill(self.actor, no_restart=True)
            self.actor = None
        if self.group is not None:
            remove_placement_group(self.group)
            self.group = None


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


class RayServers(Servers):
    """`Servers` whose replicas Ray places: one placement group and one actor per replica."""

    def __init__(
        self, options: ServeOptions, *, log_stem: str | None = None, quiet: bool = False
    ) -> None:
        _ray(_is_loopback(_address(options)))  # a missing extra: a usage error, before anything
        self.count = options.dp_size if options.dp_mode == "replicas" else 1
        self.stride = BACKENDS[options.backend].port_stride
        if options.port is not None and options.port + (self.count - 1) * self.stride > 65535:
            raise UsageError(f"--port {options.port} leaves no room for {self.count} replicas")
        per = options.tp_size * (1 if options.dp_mode == "replicas" else options.dp_size)
        self.gpus_per_replica = per if BACKENDS[options.backend].needs_gpus else 0
        if options.gpus is not None and not _is_loopback(_address(options)):
            raise UsageError(
                "--gpus does not go with a Ray cluster: Ray assigns each replica its GPUs"
            )
        # absolute: an actor's working folder is its Ray worker's, not the driver's
        logs = [os.path.abspath(p) for p in log_paths(options, self.count, log_stem)]
        super().__init__(options, [RayReplica(i, logs[i], options) for i in range(self.count)],
                         quiet=quiet)  # fmt: skip
        self._joined = False
        self._head: ServerProcess | None = None  # the local cluster this run started
        self._auth = RayAuth()  # token authentication: a local head's own token, or read

    @property
    def replicas(self) -> list[RayReplica]:
        return [p for p in self.processes if isinstance(p, RayReplica)]

    def start(self) -> None:
        ray = _ray()
        self._connect(ray)
        self._check_fit(ray)
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        local = self._local_cluster(ray)
        ports = self._ports(local)
        env = forwarded_env()
        bundle = {"GPU": self.gpus_per_replica} if self.gpus_per_replica else {"CPU": 0.01}
        for replica in self.replicas:
            replica.group = placement_group([bundle], strategy="STRICT_PACK")
        self._wait_placed(ray)
        actor = _actor_class()
        for replica, port in zip(self.replicas, ports, strict=True):
            replica.actor = actor.options(
                num_gpus=self.gpus_per_replica,
                num_cpus=0,
                max_restarts=self.options.restart,  # a lost node: Ray places it anew
                scheduling_strategy=PlacementGroupSchedulingStrategy(replica.group, 0),
                runtime_env={"env_vars": env} if env else None,
            ).remote(self.options, replica.index, replica.log_path, port, not local)
        for replica in self.replicas:
            replica.start()
            gpus = ",".join(replica.gpus) if replica.gpus else "no GPU"
            self.note(
                f"starting server {replica.index} on Ray node {replica.node[:12]} ({gpus}): "
                f"{replica.command.display()} (log: {replica.log_path})"
            )

    def _connect(self, ray: Any) -> None:
        if ray.is_initialized():
            return
        address = _address(self.options)
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no reports home from a batch job
        deadline = time.monotonic() + min(self.options.ready_timeout, 300.0)
        if not address:
            address = self._start_local_head()
        else:
            self._auth.join(address)
        while True:
            try:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
                break
            except Exception as exc:  # a head still starting refuses; a dead one is final
                head = self._head
                if head is not None and head.poll() is not None:
                    raise LaunchError(
                        head.describe_failure("(the local Ray head) exited")
                    ) from None
                if time.monotonic() > deadline or head is None:
                    raise LaunchError(f"cannot reach Ray at {address}: {_short(exc)}") from None
                time.sleep(1.0)
        self._joined = True

    def _start_local_head(self) -> str:
        """A laptop: a one-machine Ray cluster on the loopback address, run under jsonlbatch's
        reaper like a server, so it goes when this process goes, however it ends."""
        (port,) = pick_ports("127.0.0.1", 1, 6379, stride=1, exact=False)
        argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
                f"--port={port}", "--include-dashboard=false", "--disable-usage-stats"]  # fmt: skip
        env: list[tuple[str, str]] = [(LOOPBACK_ONLY_ENV, "0")]
        if self.options.gpus is not None:  # the GPUs this cluster may hand out
            argv.append(f"--num-gpus={len(self.options.gpus)}")
            env.append(("CUDA_VISIBLE_DEVICES", ",".join(self.options.gpus)))
        stem = self.processes[0].log_path.rsplit(".server", 1)[0]
        self._head = ServerProcess(-1, Command(tuple(argv), tuple(env)), f"ray://127.0.0.1:{port}",
                                   f"{stem}.ray.log", served_name="")  # fmt: skip
        self.note(
            f"starting a local Ray cluster (log: {self._head.log_path}; --ray-address joins one)"
        )
        self._auth.start_local()
        self._head.start()
        return f"127.0.0.1:{port}"

    def _local_cluster(self, ray: Any) -> bool:
        """Every node on this machine's loopback: servers bind 127.0.0.1 as without Ray."""
        return all(n["NodeManagerAddress"].startswith(_LOOPBACK) for n in ray.nodes() if n["Alive"])

    def _ports(self, local: bool) -> list[int | None]:
        """On a one-machine cluster, ports picked here (free, stable across actor restarts;
        `--port` is the first); on a real cluster, `--port` + i x stride on each replica's node,
        else an ephemeral one each actor picks there. A port taken before its server binds it
        moves the server to another (`rebind`)."""
        port = self.options.port
        if not local:
            return [None if port is None else port + i * self.stride for i in range(self.count)]
        first = port or BACKENDS[self.options.backend].default_port
        picked = pick_ports(self.options.host, self.count, first, stride=self.stride,
                            exact=port is not None)  # fmt: skip
        return list(picked)

    def rebind(self, p: ServerProcess) -> bool:
        """The replica's server could not bind its port: its actor starts it on another."""
        if not isinstance(p, RayReplica) or p.actor is None or p.moves >= MAX_MOVES:
            return False
        old = port_of(p.url)
        try:
            info = p._call("rebind")
        except Exception:  # the actor is gone: the usual failure report follows
            return False
        if info is None:
            return False
        p._update(info)
        self.note(f"server {p.label}: port {old} was taken before it could bind it; "
                  f"starting it again on port {port_of(p.url)}")  # fmt: skip
        return True

    def _check_fit(self, ray: Any) -> None:
        need = self.count * self.gpus_per_replica
        have = int(ray.cluster_resources().get("GPU", 0))
        if need > have:
            raise UsageError(
                f"{self.count} replica(s) x {self.gpus_per_replica} GPU(s) need {need} GPUs; "
                f"the Ray cluster has {have}"
            )

    def _wait_placed(self, ray: Any) -> None:
        """Placement may wait for GPUs to free up (or a node to join): shown, and bounded."""
        deadline = time.monotonic() + self.options.ready_timeout
        waiting = {r.group.ready(): r for r in self.replicas}
        while waiting:
            ready, _ = ray.wait(list(waiting), num_returns=len(waiting), timeout=5.0)
            for ref in ready:
                del waiting[ref]
            pending = list(waiting.values())
            if pending:
                if time.monotonic() > deadline:
                    raise LaunchError(
                        f"Ray could not place {len(pending)} replica(s) within --ready-timeout "
                        f"{self.options.ready_timeout:g}s (each needs {self.gpus_per_replica} GPUs on one node)"
                    )
                self.note(f"waiting for Ray to place {len(pending)} replica(s)")

    def _stop(self, processes: Sequence[ServerProcess]) -> list[int]:
        stuck: list[int] = []
        for p in processes:
            if isinstance(p, RayReplica):
                stuck += p.stop_remote(STOP_GRACE if p.grace is None else p.grace)
        return stuck

    def stop(self) -> None:
        """Stop every server, then remove every actor and placement group (and a local cluster
        this run started)."""
        ray = _ray()
        self._closing.set()
        try:
            placed = [r.actor for r in self.replicas if r.actor is not None]
            if placed and ray.is_initialized():
                self.note("stopping server(s)")
                # every actor stops its server at once; bounded, as a Ctrl-C may have cut a call
                # short: what is still up goes with its actor below (its reaper sees the pipe
                # close), so teardown never waits on a Ray call that will not come back
                refs = [actor.stop.remote(STOP_GRACE) for actor in placed]
                ray.wait(refs, num_returns=len(refs), timeout=STOP_GRACE + 15.0)
        finally:
            if ray.is_initialized():
                for replica in self.replicas:
                    try:
                        replica.remove()
                    except Exception as exc:
                        self.note(f"warning: replica {replica.index}: {_short(exc)}")
                if self._joined:
                    ray.shutdown()
            if self._head is not None:
                stop_all([self._head], grace=5.0)
            self._auth.close()

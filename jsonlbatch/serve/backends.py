"""Command lines for the servers jsonlbatch can launch: the built-in mock, vLLM and SGLang.

One set of options (`ServeOptions`) maps onto each server's own flag names, so a user learns one
vocabulary and can still pass any other server flag through unchanged (`server_args`). Keys go
through the environment where the server reads one there (vLLM, the mock): argv is visible to
every user of the machine in `ps`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.machinery import PathFinder

from jsonlbatch.errors import UsageError
from jsonlbatch.exec.route.credentials import clean_secret
from jsonlbatch.extras import MissingExtra
from jsonlbatch.redact import redact

BACKEND_NAMES = ("mock", "vllm", "sglang")
MOCK_NAME = "mock"  # what the mock lists in /v1/models when no --served-model-name pins one
DP_MODES = ("native", "replicas")


@dataclass
class ServeOptions:
    """What to launch. `dp_mode` "native" is one server using its own DP flag; "replicas" is
    `dp_size` servers on their own ports and GPU groups, which the executor balances over."""

    backend: str
    model_path: str | None = None
    served_model_name: tuple[str, ...] = ()
    tp_size: int = 1
    dp_size: int = 1
    dp_mode: str = "native"
    host: str = "127.0.0.1"
    port: int | None = None
    gpus: tuple[str, ...] | None = None
    api_key: str | None = None
    gpu_memory_utilization: float | None = None
    context_length: int | None = None
    chat_template: str | None = None
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    seed: int | None = None
    server_args: tuple[str, ...] = ()
    executable: str | None = None
    ready_timeout: float = 1800.0
    restart: int = 0
    log_dir: str | None = None
    ray: bool = False  # place replicas as Ray actors (see jsonlbatch.serve.ray)
    ray_address: str | None = None  # a cluster to join; None: RAY_ADDRESS, else a local one
    env: tuple[tuple[str, str], ...] = ()  # variables every server of this model gets
    cache_dir: str | None = None  # each server's own cache folders under it (see instance_env)

    def __post_init__(self) -> None:
        self.served_model_name = tuple(self.served_model_name)
        self.server_args = tuple(self.server_args)
        self.env = tuple((str(k), str(v)) for k, v in self.env)
        try:
            shlex.split(self.executable or "")  # server_args come split already
        except ValueError as exc:
            raise UsageError(f"cannot split {self.executable!r} into a command: {exc}") from None
        self.ray = self.ray or bool(self.ray_address)
        if self.backend not in BACKEND_NAMES:
            raise UsageError(f"unknown server {self.backend!r}; choose {', '.join(BACKEND_NAMES)}")
        if self.dp_mode not in DP_MODES:
            raise UsageError(
                f"--dp-mode must be one of {', '.join(DP_MODES)}, got {self.dp_mode!r}"
            )
        if self.tp_size < 1 or self.dp_size < 1:
            raise UsageError("--tp-size and --dp-size must be at least 1")
        if self.port is not None and not 1 <= self.port <= 65535:
            raise UsageError(f"--port must be within 1..65535, got {self.port}")
        if self.ready_timeout <= 0:
            raise UsageError("--ready-timeout must be positive")
        if self.restart < 0:
            raise UsageError("--restart-server must be 0 or more")
        mem = self.gpu_memory_utilization
        if mem is not None and not 0 < mem <= 1:
            raise UsageError(f"--gpu-memory-utilization must be within (0, 1], got {mem}")
        if self.backend != "mock" and not self.model_path:
            raise UsageError(f"--serve {self.backend} needs --model-path")
        if self.backend == "sglang" and len(self.served_model_name) > 1:
            raise UsageError("SGLang serves one name: give --served-model-name once")
        # a key with a newline would be refused in the first request's header, as a traceback
        self.api_key = clean_secret(
            self.api_key, "--server-api-key (or $JSONLBATCH_SERVER_API_KEY)"
        )

    @property
    def served_names(self) -> tuple[str, ...]:
        """The model names clients use: the served names, else the model path (as the servers
        themselves do)."""
        if self.served_model_name:
            return self.served_model_name
        return (self.model_path,) if self.model_path else ()


@dataclass(frozen=True)
class Command:
    """One server process to start: argv plus the environment variables to add."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    def display(self) -> str:
        """The command line as it may be shown or logged: quoted and without secrets."""
        return redact(shlex.join(self.argv))


@dataclass(frozen=True)
class Backend:
    """How one kind of server is started."""

    program: tuple[str, ...]  # default executable; `ServeOptions.executable` replaces it
    default_port: int
    port_stride: int  # distance between replicas' ports (room for the server's side ports)
    needs_gpus: bool
    flags: Callable[[ServeOptions, int, int], tuple[list[str], dict[str, str]]]

    def command(self, options: ServeOptions, *, port: int, data_parallel: int) -> Command:
        """The command for one server. `data_parallel` is the DP this process itself runs
        (`dp_size` in native mode, 1 for each replica)."""
        argv, env = self.flags(options, port, data_parallel)
        program = shlex.split(options.executable) if options.executable else list(self.program)
        env = {**dict(options.env), **env}  # the key, where it goes by env, is ours to set
        return Command(tuple(program + argv + list(options.server_args)), tuple(env.items()))

    def require(self, options: ServeOptions) -> None:
        """The server is installed where this process starts it: said now, with its extra,
        rather than as a server that dies at once. `--server-executable` names another."""
        if options.executable or options.backend == "mock":  # the mock is ours
            return
        if self.program[0] == sys.executable:  # `python -m module`: looked up, not imported,
            # where the server's interpreter will look (PYTHONPATH as it is now, then ours)
            where = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
            top = self.program[2].split(".")[0]
            found = PathFinder.find_spec(top, where + sys.path) is not None
        else:
            found = shutil.which(self.program[0]) is not None
        if not found:
            also = "or name its program with --server-executable"
            raise MissingExtra(f"--serve {options.backend}", [options.backend], options.backend,
                               also=also)  # fmt: skip


#: Cache variables each server gets a folder of its own for (see `instance_env`).
CACHE_VARS = {
    "VLLM_CACHE_ROOT": "vllm",
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    "TRITON_CACHE_DIR": "triton",
}


def instance_env(options: ServeOptions, index: int) -> list[tuple[str, str]]:
    """The cache variables of server `index` of `options`: its own folders under
    `options.cache_dir` (`<cache_dir>/<index>/vllm`, ...), unless `options.env` sets one.

    Two servers compiling into one VLLM_CACHE_ROOT or Triton cache at once can corrupt it or
    wait on each other's locks: each instance of a fleet gets its own, kept between runs.
    """
    if options.cache_dir is None:
        return []
    given = {k for k, _ in options.env}
    return [
        (var, os.path.join(options.cache_dir, str(index), sub))
        for var, sub in CACHE_VARS.items()
        if var not in given
    ]


def _vllm(opts: ServeOptions, port: int, dp: int) -> tuple[list[str], dict[str, str]]:
    assert opts.model_path is not None
    argv = ["serve", opts.model_path, "--host", opts.host, "--port", str(port)]
    if opts.served_model_name:
        argv += ["--served-model-name", *opts.served_model_name]
    argv += ["--tensor-parallel-size", str(opts.tp_size)]
    if dp > 1:
        argv += ["--data-parallel-size", str(dp)]
    argv += _flag("--gpu-memory-utilization", opts.gpu_memory_utilization)
    argv += _flag("--max-model-len", opts.context_length)
    argv += _flag("--chat-template", opts.chat_template)
    argv += _flag("--reasoning-parser", opts.reasoning_parser)
    if opts.tool_call_parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", opts.tool_call_parser]
    argv += _flag("--seed", opts.seed)
    return argv, ({"VLLM_API_KEY": opts.api_key} if opts.api_key else {})


def _sglang(opts: ServeOptions, port: int, dp: int) -> tuple[list[str], dict[str, str]]:
    assert opts.model_path is not None
    argv = ["--model-path", opts.model_path, "--host", opts.host, "--port", str(port)]
    if opts.served_model_name:
        argv += ["--served-model-name", opts.served_model_name[0]]
    argv += ["--tp-size", str(opts.tp_size)]
    if dp > 1:
        argv += ["--dp-size", str(dp)]
    argv += _flag("--api-key", opts.api_key)  # SGLang reads no key from the environment
    argv += _flag("--mem-fraction-static", opts.gpu_memory_utilization)
    argv += _flag("--context-length", opts.context_length)
    argv += _flag("--chat-template", opts.chat_template)
    argv += _flag("--reasoning-parser", opts.reasoning_parser)
    argv += _flag("--tool-call-parser", opts.tool_call_parser)
    argv += _flag("--random-seed", opts.seed)
    return argv, {}


def _mock(opts: ServeOptions, port: int, dp: int) -> tuple[list[str], dict[str, str]]:
    # imported here: naming the backends must not load the mock's web server (aiohttp.web)
    from jsonlbatch.mock.app import MOCK_API_KEY_ENV

    # Without a name to pin, the mock lists "mock" and answers whatever model a request names
    # (as `exec --serve mock` does), so generated requests run against `serve --backend mock`.
    names = opts.served_names or (MOCK_NAME,)
    argv = ["--host", opts.host, "--port", str(port), "--served-model-name", *names]
    if not opts.served_names:
        argv.append("--accept-any-model")
    return argv, ({MOCK_API_KEY_ENV: opts.api_key} if opts.api_key else {})


def _flag(name: str, value: object) -> list[str]:
    return [] if value is None else [name, str(value)]


BACKENDS = {
    "mock": Backend((sys.executable, "-m", "jsonlbatch.mock"), 8000, 1, False, _mock),
    "vllm": Backend(("vllm",), 8000, 1, True, _vllm),
    # SGLang puts its NCCL port at a random 100..1000 above --port: keep replicas beyond that.
    "sglang": Backend((sys.executable, "-m", "sglang.launch_server"), 30000, 1024, True, _sglang),
}


def build_command(options: ServeOptions, *, port: int, data_parallel: int) -> Command:
    """The command line for one server of `options.backend`."""
    return BACKENDS[options.backend].command(options, port=port, data_parallel=data_parallel)

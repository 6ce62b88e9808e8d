"""A fleet: several models served at once, described in one file, placed on disjoint GPUs.

    models:
      - {backend: vllm, model_path: Qwen/Qwen3-8B, served_model_name: agent, dp_size: 4,
         dp_mode: replicas, gpu_count: 4, tool_call_parser: hermes}
      - {backend: vllm, model_path: Qwen/Qwen3-32B-FP8, served_model_name: expert, gpus: [4, 5, 6, 7]}

An entry takes the same keys as an experiment condition's `serve:` mapping (`SERVE_KEYS`, one
converter, `serve_options`, for both), so a model moves from an experiment to a fleet unchanged.
Everything that can be decided before a server loads is decided here: GPU sets (counts placed on
the GPUs nobody named, in file order), overlaps and totals beyond the GPUs there are (errors
naming the models), names served twice, and each instance's own cache folders (two vLLMs
compiling into one `VLLM_CACHE_ROOT` at once is a known way to corrupt it).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from jsonlbatch.errors import InputError, Problem, UsageError
from jsonlbatch.file_io.filecheck import ANY, BOOL, INT, LIST, MAP, NUM, STR, STRS, FileChecker
from jsonlbatch.serve.backends import BACKENDS, ServeOptions
from jsonlbatch.serve.gpus import GpuList

#: The keys of one server, for a fleet entry and an experiment condition's `serve:` mapping alike.
SERVE_KEYS: dict[str, str] = {
    "backend": STR,
    "model_path": STR,
    "served_model_name": STRS,
    "tp_size": INT,
    "dp_size": INT,
    "dp_mode": STR,
    "gpus": ANY,  # a list of ids, or "0,1,2" (checked below)
    "gpu_count": INT,
    "gpu_memory_utilization": NUM,
    "context_length": INT,
    "chat_template": STR,
    "reasoning_parser": STR,
    "tool_call_parser": STR,
    "server_seed": INT,
    "server_args": STRS,
    "env": MAP,
    "host": STR,
    "node": STR,
    "port": INT,
    "executable": STR,
    "restart": INT,
    "ready_timeout": NUM,
    "api_key_env": STR,
    "caches": BOOL,
}
#: A fleet entry also says how many requests exec keeps in flight to the model (a client-side
#: setting: an experiment's `exec` step has its own).
ENTRY_KEYS: dict[str, str] = {**SERVE_KEYS, "concurrency": INT}
_FLEET_KEYS = {"models": LIST, "stagger": NUM, "cache_dir": STR}


@dataclass
class ServeEntry:
    """One model of a fleet (or an experiment's `serve:`): its options and where it goes."""

    options: ServeOptions
    gpu_count: int | None = None  # GPUs to place it on (None: TP x DP for a GPU backend)
    node: str | None = None  # where it runs (None: here)
    caches: bool = True  # its own cache folders
    line: int | None = None
    given: frozenset[str] = frozenset()  # the option names the file set (defaults fill the rest)
    concurrency: int | None = None  # exec's requests in flight to this model at most

    @property
    def name(self) -> str:
        """The model's name for messages and the endpoints file: its first served name."""
        return (self.options.served_names or (self.options.backend,))[0]

    def gpus_needed(self) -> int:
        """How many GPUs to place it on: its count, its list, else TP x DP (none for the mock)."""
        if self.options.gpus:
            return len(self.options.gpus)
        if self.gpu_count is not None:
            return self.gpu_count
        if BACKENDS[self.options.backend].needs_gpus:
            return self.options.tp_size * self.options.dp_size
        return 0


@dataclass
class Fleet:
    """A checked fleet file."""

    path: str
    entries: list[ServeEntry]
    stagger: float = 0.0  # seconds between one model's start and the next one's
    cache_dir: str = field(default_factory=lambda: default_cache_dir())

    def names(self) -> list[str]:
        """Every served name, in file order."""
        return [n for e in self.entries for n in e.options.served_names]


def default_cache_dir() -> str:
    """Where instances' own caches go: `$XDG_CACHE_HOME/jsonlbatch/fleet` (or ~/.cache/...).
    Created on first use; kept between runs, so a restart reuses its compiled graphs."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "jsonlbatch", "fleet")


def serve_options(mapping: Mapping[str, Any]) -> ServeEntry:
    """A `serve:` mapping (checked types) -> its options; UsageError for values that cannot
    work together. The one converter behind fleet entries and experiment conditions."""
    values = dict(mapping)
    gpus = values.pop("gpus", None)
    count = values.pop("gpu_count", None)
    if gpus is not None and count is not None:
        raise UsageError("give gpus (a list) or gpu_count, not both")
    if count is not None and count < 1:
        raise UsageError("gpu_count must be at least 1")
    key_env = values.pop("api_key_env", None)
    api_key = None
    if key_env:
        api_key = os.environ.get(key_env)
        if not api_key:
            raise UsageError(f"api_key_env: the variable {key_env} is not set")
    concurrency = values.pop("concurrency", None)
    if concurrency is not None and concurrency < 1:
        raise UsageError("concurrency must be at least 1")
    env = values.pop("env", None) or {}
    names = values.pop("served_model_name", ())
    args = values.pop("server_args", ())
    options = ServeOptions(
        backend=values.pop("backend"),
        served_model_name=(names,) if isinstance(names, str) else tuple(names),
        seed=values.pop("server_seed", None),
        # a string is split like a shell would; a list is the arguments, one item each
        server_args=tuple(_split(args) if isinstance(args, str) else args),
        gpus=_gpu_ids(gpus),
        api_key=api_key,
        env=tuple((str(k), _env_value(k, v)) for k, v in env.items()),
        **{k: v for k, v in values.items() if k not in ("node", "caches")},
    )
    if options.gpus is not None and len(options.gpus) < options.tp_size * options.dp_size:
        raise UsageError(
            f"tp_size {options.tp_size} x dp_size {options.dp_size} needs "
            f"{options.tp_size * options.dp_size} GPUs, but gpus lists {len(options.gpus)}"
        )
    if count is not None and count < options.tp_size * options.dp_size:
        raise UsageError(
            f"tp_size {options.tp_size} x dp_size {options.dp_size} needs "
            f"{options.tp_size * options.dp_size} GPUs, but gpu_count is {count}"
        )
    given = frozenset("seed" if k == "server_seed" else k for k in mapping)
    return ServeEntry(
        options,
        count,
        values.get("node"),
        values.get("caches", True),
        given=given,
        concurrency=concurrency,
    )


def check_serve(
    checker: FileChecker, value: Any, at: tuple[str, ...], schema: dict[str, str] = SERVE_KEYS
) -> ServeEntry | None:
    """Check one `serve:` mapping (or a bare backend name) in a settings file; problems are
    located in `checker`. None when it has any."""
    if isinstance(value, str):
        value = {"backend": value}
    before = len(checker.problems)
    checked = checker.keys(value, at, schema, required=("backend",))
    if isinstance(checked.get("gpus"), (list, str)) or checked.get("gpus") is None:
        checker.guard((*at, "gpus"), _gpu_ids, checked.get("gpus"))
    else:
        checker.problem((*at, "gpus"), "must be a list of GPU ids, or '0,1,...'")
    env = checked.get("env") or {}
    for key, item in env.items():
        checker.guard((*at, "env", key), _env_value, key, item)
    if len(checker.problems) > before:
        return None
    entry = checker.guard(at, serve_options, checked)
    if entry is not None:
        entry.line = checker.lines.get(at)
    return entry


def load_fleet(path: str) -> Fleet:
    """Read and check a fleet file (YAML or JSON); InputError lists every problem with its line."""
    checker = FileChecker(path)
    value = checker.load("fleet file")
    if not isinstance(value, dict):
        raise InputError("bad fleet file", [Problem(path, 1, None, "must be a mapping")])
    top = checker.keys(value, (), _FLEET_KEYS, required=("models",))
    entries = []
    for i, item in enumerate(top.get("models") or []):
        entry = check_serve(checker, item, ("models", str(i)), ENTRY_KEYS)
        if entry is not None:
            entries.append(entry)
    if "models" in top and not top.get("models"):
        checker.problem(("models",), "must list at least one model")
    seen: dict[str, tuple[int, str]] = {}
    for i, entry in enumerate(entries):
        for name in entry.options.served_names:
            if name in seen:
                checker.problem(
                    ("models", str(i), "served_model_name"),
                    f"{name!r} is served by an earlier entry too (line {seen[name][0]}): "
                    "a request names one model, so one entry serves it",
                )
            seen[name] = (entry.line or 0, name)
        if not entry.options.served_names:
            checker.problem(
                ("models", str(i)), "a mock entry needs a served_model_name (the name requests use)"
            )
    stagger = top.get("stagger") or 0.0
    if stagger < 0:
        checker.problem(("stagger",), "must be 0 or more seconds")
    checker.raise_problems("fleet file")
    cache_dir = top.get("cache_dir")
    if cache_dir:
        cache_dir = os.path.join(checker.base, os.path.expanduser(os.path.expandvars(cache_dir)))
    return Fleet(os.path.abspath(path), entries, float(stagger), cache_dir or default_cache_dir())


def place(
    fleet: Fleet, gpus: GpuList | None, *, node: str | None = None, ray: bool = False
) -> list[ServeEntry]:
    """The entries that run on `node` (None: the ones without a node), with their GPU lists
    and cache folders decided. UsageError, naming the models, for overlaps and shortfalls.

    Entries with a `gpus` list keep it; entries with a count (or TP x DP) get the next GPUs that
    no entry named, in file order. With Ray, every entry is placed by Ray on the cluster (each
    replica a placement group of TP GPUs): nodes and GPU lists are Ray's to decide.
    """
    here = list(fleet.entries) if ray else [e for e in fleet.entries if e.node == node]
    if not here:
        nodes = sorted({e.node for e in fleet.entries if e.node is not None})
        if node is None:
            raise UsageError(
                f"every model of the fleet names a node ({', '.join(nodes)}): start each node's "
                "models there with --node NAME"
            )
        raise UsageError(f"no model of the fleet runs on node {node!r} (nodes: {', '.join(nodes)})")
    placed = []
    owner: dict[str, str] = {}
    for entry in here:
        for gpu in entry.options.gpus or ():
            if gpu in owner:
                raise UsageError(
                    f"GPU {gpu} is given to both {owner[gpu]} and {entry.name}: models of a "
                    "fleet need GPU sets of their own"
                )
            if gpus is not None and not ray and gpu not in gpus.ids:
                raise UsageError(
                    f"{entry.name} asks for GPU {gpu}, but {gpus.source} gives "
                    f"{','.join(gpus.ids) or 'none'}"
                )
            owner[gpu] = entry.name
    free = [g for g in (gpus.ids if gpus is not None else ()) if g not in owner]
    counted = [e for e in here if not e.options.gpus and e.gpus_needed()]
    need = sum(e.gpus_needed() for e in counted)
    if counted and not ray:
        if gpus is None and (len(counted) > 1 or owner):
            raise UsageError(
                f"placing {', '.join(e.name for e in counted)} on GPUs of their own needs a GPU "
                "list: give --gpus, set CUDA_VISIBLE_DEVICES, or give each model gpus: [...]"
            )
        if gpus is not None and need > len(free):
            each = ", ".join(f"{e.name} {e.gpus_needed()}" for e in counted)
            raise UsageError(
                f"the fleet needs {need + len(owner)} GPUs ({each}"
                f"{', ' + str(len(owner)) + ' listed by gpus:' if owner else ''}), but "
                f"{gpus.source} gives {len(gpus.ids)} ({','.join(gpus.ids) or 'none'})"
            )
    for entry in here:
        options = entry.options
        if not options.gpus and entry.gpus_needed() and gpus is not None and not ray:
            options = replace(options, gpus=tuple(free[: entry.gpus_needed()]))
            free = free[entry.gpus_needed() :]
        if entry.caches and BACKENDS[options.backend].needs_gpus:  # the mock compiles nothing
            folder = os.path.join(fleet.cache_dir, slug(entry.name))
            options = replace(options, cache_dir=folder)
        placed.append(replace(entry, options=options))
    return placed


def slug(name: str) -> str:
    """A model name as one folder or file name part ("Qwen/Qwen3-8B" -> "Qwen--Qwen3-8B")."""
    return re.sub(r"[^A-Za-z0-9._-]+", "--", name).strip("-.") or "model"


def _split(item: str) -> list[str]:
    try:
        return shlex.split(item)
    except ValueError as exc:
        raise UsageError(f"server_args: cannot split {item!r}: {exc}") from None


def _gpu_ids(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else value
    ids = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, str)) or not str(item).strip():
            raise UsageError(f"gpus: {item!r} is not a GPU id")
        ids.append(str(item).strip())
    if len(set(ids)) != len(ids):
        raise UsageError(f"gpus names a GPU twice: {','.join(ids)}")
    if not ids:
        raise UsageError("gpus is empty (leave it out, or give gpu_count)")
    return tuple(ids)


def _env_value(key: Any, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise UsageError(f"env {key}: a value is a string or a number, got {value!r}")
    return str(value)

"""The endpoints file: which URLs serve which model, for a run whose requests name several.

    {"agent": {"urls": ["http://node1:8000/v1", "http://node1:8001/v1"], "backend": "vllm",
               "tp": 1, "dp": 4},
     "expert": {"urls": ["http://node1:8004/v1"], "backend": "vllm", "tp": 4, "dp": 1}}

`jsonlbatch serve --fleet ... --endpoints-out FILE` writes it (atomically, once every model
serves); `jsonlbatch exec --endpoints FILE` reads it, and so can any other client. Only `urls` is
required; `backend`, `tp` and `dp` say what serves them, `concurrency` caps the requests in
flight to that model (else `exec -c` applies to each model). Several files (or a folder of `*.json`,
one per SLURM component) are read as one map; a model named in two of them is an error, since
requests could not tell which servers are meant.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import orjson

from jsonlbatch.errors import InputError, Problem
from jsonlbatch.file_io.filecheck import read_json
from jsonlbatch.file_io.jsonl import rewrite_atomically


@dataclass
class ModelEndpoints:
    """The URLs serving one model, and what they are."""

    urls: list[str]
    backend: str | None = None
    tp: int | None = None
    dp: int | None = None
    concurrency: int | None = None  # requests in flight to this model at most (exec's side)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"urls": list(self.urls)}
        for key in ("backend", "tp", "dp", "concurrency"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


def write_endpoints(path: str, models: Mapping[str, ModelEndpoints]) -> None:
    """Write the map atomically: a reader sees the old file or the whole new one."""
    body = {name: m.to_json() for name, m in models.items()}
    rewrite_atomically(path, [orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n"])


def read_endpoints(paths: Sequence[str]) -> dict[str, ModelEndpoints]:
    """One map from endpoints files and folders of them; InputError naming the file and the
    model for anything malformed."""
    out: dict[str, ModelEndpoints] = {}
    where: dict[str, str] = {}
    for path in _files(paths):
        for name, model in _read_one(path).items():
            if name in out:
                raise InputError(
                    f"model {name!r} is in two endpoints files",
                    [Problem(where[name], None, name, "first"), Problem(path, None, name, "again")],
                )
            out[name], where[name] = model, path
    return out


def _files(paths: Iterable[str]) -> list[str]:
    found = []
    for path in paths:
        if os.path.isdir(path):
            inside = sorted(f for f in os.listdir(path) if f.endswith(".json"))
            if not inside:
                raise InputError(f"{path}: no *.json endpoints file in this folder")
            found += [os.path.join(path, f) for f in inside]
        else:
            found.append(path)
    return found


def _read_one(path: str) -> dict[str, ModelEndpoints]:
    def bad(field: str | None, message: str) -> InputError:
        return InputError("bad endpoints file", [Problem(path, None, field, message)])

    data = read_json(path, "endpoints file")
    if not isinstance(data, dict) or not data:
        raise bad(None, 'must be a mapping {"MODEL": {"urls": [...]}, ...}')
    out = {}
    for name, entry in data.items():
        if not isinstance(entry, dict):
            raise bad(name, 'must be a mapping with "urls"')
        urls = entry.get("urls")
        if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
            raise bad(f"{name}.urls", "must be a non-empty list of base URLs")
        for key in ("tp", "dp", "concurrency"):
            value = entry.get(key)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise bad(f"{name}.{key}", "must be a whole number of at least 1")
        backend = entry.get("backend")
        if backend is not None and not isinstance(backend, str):
            raise bad(f"{name}.backend", "must be a string")
        out[name] = ModelEndpoints(
            list(urls), backend, entry.get("tp"), entry.get("dp"), entry.get("concurrency")
        )
    return out

"""Names a package offers without importing what defines them until they are first used.

`import jsonlbatch` must not import every stage (aiohttp, the executor, the launcher) just to
offer `jsonlbatch.execute`: a package lists its public names and where they live, and gets a
module `__getattr__` (PEP 562) that imports on first access and keeps the value.

    __getattr__, __dir__ = lazy(__name__, {"Job": "jsonlbatch.exec.job", "post": "jsonlbatch.post"})

A name that maps to `<package>.<name>` is that submodule itself.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy(
    package: str, names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """(`__getattr__`, `__dir__`) for `package`, loading each of `names` from its module."""
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:
        where = names.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(where)
        value = module if where == f"{package}.{name}" else getattr(module, name)
        namespace[name] = value  # the next access is a plain one
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__

"""Optional extras: the one place that says which extra a missing library comes with.

Heavy or rarely needed libraries (pyarrow, matplotlib, Ray, the office writers) are optional
extras of the package. A command that needs one checks for it before it reads or writes
anything, and a missing one is a `MissingExtra` naming the extra to install; never an
ImportError traceback from deep inside a run that already did half its work.

    require("pyarrow", extra="parquet", for_what="export to Parquet")
    yaml = load("yaml", extra="experiment", for_what="experiment files (YAML)")
"""

from __future__ import annotations

import importlib
from types import ModuleType

from jsonlbatch.errors import UsageError

#: Import names whose package is called otherwise on the index (what the user would install).
_PACKAGES = {
    "yaml": "PyYAML",
    "docx": "python-docx",
    "pptx": "python-pptx",
    "fpdf": "fpdf2",
    "prometheus_client": "prometheus-client",
    "PIL": "Pillow",
}


class MissingExtra(UsageError):
    """A library of an optional extra is not installed (or does not import)."""

    def __init__(self, for_what: str, modules: list[str], extra: str, *, also: str = "") -> None:
        super().__init__(message(for_what, modules, extra) + (f" ({also})" if also else ""))
        self.extra = extra
        self.modules = modules


def message(for_what: str, modules: list[str], extra: str) -> str:
    """The one way to say it: what needs which missing packages, and how to install them."""
    names = ", ".join(package_name(m) for m in modules)
    verb = "is" if len(modules) == 1 else "are"
    return f"{for_what} needs {names}, which {verb} not installed: {hint(extra)}"


def hint(extra: str) -> str:
    """The command that installs `extra`."""
    return f"pip install 'jsonlbatch[{extra}]'"


def package_name(module: str) -> str:
    """The name to install for the import name `module` (its top-level package)."""
    top = module.split(".")[0]
    return _PACKAGES.get(top, top)


def missing(*modules: str) -> list[str]:
    """Those of `modules` that cannot be imported. Imported for real, not only looked up: an
    install that is broken or shadowed fails here, up front, like one that is absent."""
    gone = []
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            gone.append(module)
    return gone


def check(*modules: str, extra: str, for_what: str) -> str | None:
    """The message for what is missing, or None: for features that degrade instead of failing
    (a report page without charts) and say so before the work starts."""
    gone = missing(*modules)
    return message(for_what, gone, extra) if gone else None


def require(*modules: str, extra: str, for_what: str) -> None:
    """Raise `MissingExtra` (a usage error: exit 2) unless every one of `modules` imports."""
    gone = missing(*modules)
    if gone:
        raise MissingExtra(for_what, gone, extra)


def load(module: str, *, extra: str, for_what: str) -> ModuleType:
    """`module`, imported; `MissingExtra` when it cannot be."""
    require(module, extra=extra, for_what=for_what)
    return importlib.import_module(module)

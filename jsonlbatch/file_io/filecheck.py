"""Settings files (YAML, or JSON) read with line marks and checked key by key.

The experiment file and the fleet file are both hand-written settings files, so both get the same
treatment: every problem names the key path and its line (`fleet.yaml:7: models.1.tp_size: must
be a integer, got str 'two'`), all problems at once, and a duplicated key is an error instead of
YAML's silent overwrite. The file is composed with PyYAML's safe loader (no Python tags) and walked
here, so every key keeps the line it was written on. JSON is YAML, so a `.json` file reads the same
way.

Paths in a file are relative to the file's own folder.
"""

from __future__ import annotations

import os
from typing import Any

import orjson

from jsonlbatch.errors import InputError, JsonlbatchError, Problem, problems_text

# The kinds of value a key may take; "path" is a file that must exist (relative to the file).
NUM, INT, STR, BOOL, PATH = "number", "integer", "string", "boolean", "path"
MAP, STRS, URLS, ANY = "mapping", "string or list of strings", "urls", "any"
LIST, FOLDER = "list", "folder"
EXTRACT = "extractor(s)"

_CHECKS = {
    NUM: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    INT: lambda v: isinstance(v, int) and not isinstance(v, bool),
    STR: lambda v: isinstance(v, str),
    BOOL: lambda v: isinstance(v, bool),
    PATH: lambda v: isinstance(v, str) and bool(v),
    MAP: lambda v: v is None or isinstance(v, dict),  # `files:` alone: all defaults
    LIST: lambda v: isinstance(v, list),
    STRS: lambda v: (
        isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))
    ),
    URLS: lambda v: (
        isinstance(v, str) or (isinstance(v, list) and v and all(isinstance(x, str) for x in v))
    ),
    EXTRACT: lambda v: isinstance(v, (str, list, dict)),
    ANY: lambda v: True,
    FOLDER: lambda v: isinstance(v, str) and bool(v),
}


#: Bounds on a settings file once its YAML aliases are expanded: a real one holds hundreds of
#: values, a few levels deep.
MAX_VALUES = 100_000
MAX_DEPTH = 100


def read_text(path: str, what: str = "file") -> str:
    """A UTF-8 text file (a template, a settings file); `InputError` naming it otherwise."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise InputError(f"cannot read {what} {path}: {reason}") from None


def read_json(path: str, what: str = "file") -> Any:
    """A JSON file's value; `InputError` naming it (and the JSON problem) otherwise."""
    try:
        with open(path, "rb") as f:
            return orjson.loads(f.read())
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror}") from None
    except orjson.JSONDecodeError as exc:
        raise InputError(f"{what} {path} is not JSON: {exc}") from None


class FileChecker:
    """Turns YAML nodes into values (remembering each key's line) and collects problems."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.base = os.path.dirname(os.path.abspath(path))
        self.lines: dict[tuple[str, ...], int] = {}
        self.problems: list[Problem] = []

    # -- reading -------------------------------------------------------------------------------

    def load(self, what: str) -> Any:
        """The file's value (YAML, or JSON) as plain values; a syntax error is an InputError with
        its line. `what` names the file in messages ("experiment file", "fleet file")."""
        text = read_text(self.path, what)
        import yaml  # a core dependency

        try:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = mark.line + 1 if mark is not None else None
            problem = getattr(exc, "problem", None) or str(exc)
            raise InputError("not a YAML file", [Problem(self.path, line, None, problem)]) from None
        except RecursionError:  # PyYAML composes nested nodes recursively
            deep = Problem(self.path, None, None, f"nested more than {MAX_DEPTH} levels")
            raise InputError(f"bad {what}", [deep]) from None
        if node is None:
            return None
        self._yaml = yaml
        self._loader = yaml.SafeLoader("")
        self._what = what
        self._expanded = 0  # values made so far, aliases expanded
        self._open: set[int] = set()  # the collections being made: meeting one again is a loop
        return self.value(node, ())

    def value(self, node: Any, where: tuple[str, ...]) -> Any:
        """The plain value of `node`. An alias is the very node it names, so one that holds
        itself (`a: &a [*a]`: RecursionError before) and aliases of aliases that expand to
        billions of values (36 s and 4 GB before) are refused, with the line."""
        yaml = self._yaml
        line = node.start_mark.line + 1
        self.lines.setdefault(where, line)
        self._expanded += 1
        if id(node) in self._open:
            self._refuse(line, where, "an alias refers to a value that holds it (a recursion)")
        if self._expanded > MAX_VALUES or len(self._open) >= MAX_DEPTH:
            self._refuse(
                line,
                where,
                f"more than {MAX_VALUES:,} values or {MAX_DEPTH} levels once aliases are "
                "expanded (an alias bomb?)",
            )
        if not isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
            return self._loader.construct_object(node)
        self._open.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            items = [self.value(item, (*where, str(i))) for i, item in enumerate(node.value)]
            self._open.discard(id(node))
            return items
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = str(self._loader.construct_object(key_node))
            at = (*where, key)
            if key in out:
                self.problem(at, "appears twice", line=key_node.start_mark.line + 1)
            self.lines[at] = key_node.start_mark.line + 1
            out[key] = self.value(value_node, at)
        self._open.discard(id(node))
        return out

    def _refuse(self, line: int, where: tuple[str, ...], message: str) -> None:
        field = ".".join(where[:8]) or None  # a bomb's path can be thousands of keys long
        raise InputError(f"bad {self._what}", [Problem(self.path, line, field, message)])

    # -- problems ------------------------------------------------------------------------------

    def problem(self, where: tuple[str, ...], message: str, *, line: int | None = None) -> None:
        if line is None:
            probe = where
            while probe and probe not in self.lines:
                probe = probe[:-1]
            line = self.lines.get(probe)
        self.problems.append(Problem(self.path, line, ".".join(where) or None, message))

    def raise_problems(self, what: str) -> None:
        """One InputError listing every problem found, if any."""
        if self.problems:
            raise InputError(f"bad {what} ({problems_text(self.problems)})", self.problems)

    def keys(
        self,
        value: Any,
        where: tuple[str, ...],
        schema: dict[str, str],
        required: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """Check a mapping against `schema`; return it with paths made absolute."""
        if value is None:
            value = {}
        if not isinstance(value, dict):
            self.problem(where, f"must be a mapping, got {kind_of(value)}")
            return {}
        out: dict[str, Any] = {}
        for key, item in value.items():
            at = (*where, key)
            if key not in schema:
                self.problem(at, f"unknown key (known: {', '.join(schema)})")
                continue
            out[key] = self.typed(item, at, schema[key])
        for key in required:
            if key not in value:
                self.problem(where, f"missing {key!r}")
        return out

    def typed(self, item: Any, at: tuple[str, ...], kind: str) -> Any:
        if not _CHECKS[kind](item):
            self.problem(at, f"must be a {kind}, got {kind_of(item)} {item!r}")
            return None
        if kind in (PATH, FOLDER):
            full = os.path.join(self.base, item)
            if not (os.path.isfile(full) if kind == PATH else os.path.isdir(full)):
                what = "file" if kind == PATH else "folder"
                self.problem(
                    at, f"no such {what}: {item} (paths are relative to the file's folder)"
                )
            return full
        return item

    def guard(self, where: tuple[str, ...], check: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a check of another part; its error becomes a located problem."""
        try:
            return check(*args, **kwargs)
        except JsonlbatchError as exc:
            self.problem(where, str(exc).splitlines()[0])
            return None


def kind_of(value: Any) -> str:
    return "null" if value is None else type(value).__name__

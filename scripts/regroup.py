"""Group the shared core into a few packages by meaning, and split the two core modules that do
two things; rewrite every import and mention to match. Run once, by the lead, on the merged tree:

    python scripts/regroup.py            # moves, splits, rewrites; prints what it did
    python scripts/regroup.py --check    # changes nothing; exit 1 if there is anything to do

regroup: skip-file  (this script names the old paths on purpose: it never rewrites itself)

The top of `jsonlbatch/` then holds the stages, `cli/`, four core packages and the five modules
every layer imports (`errors`, `lazy`, `extras`, `redact`, `stats`):

- `batch_format/`: the OpenAI Batch format (`records`, `answers`, `samples`, `idset`, `media`);
- `file_io/`: files on disk (`jsonl`: reading and crash-safe writing; `output_guard`, split out
  of it: which output a command may write; `filecheck`: hand-written settings files);
- `pricing/`: what a request and an answer cost (`cost`, `prices`);
- `answer_contract/`: JSON Schemas in requests and answers checked against them (`contract`: the
  validators and verdicts; `schema_forms`, split out of it: a schema in each endpoint's form;
  `schema_bounds`, `bounded_check`).

Generic over the tree, so files it has never seen are rewritten too: every Python file's imports
are parsed (`ast`): `from jsonlbatch.X import a, b`, `from jsonlbatch import X`, relative imports,
lazy tables (`{"Name": "jsonlbatch.X"}`); a name split out of a module is routed to its new
module. Every text file (code, docs, TOML, YAML, scripts) then gets its whole dotted paths
(`jsonlbatch.X`, `jsonlbatch.X.name`) and file paths (`jsonlbatch/X.py`) rewritten, keyed on the
whole path, never on a bare word; in docs, comments and strings, `` `X.py` `` and the split names
(`jsonl.check_output`) too. Idempotent: a second run finds nothing to do. A file with the words
"regroup: skip-file" is left alone.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import shutil
import subprocess
import sys
import textwrap
import time
import tokenize
from dataclasses import dataclass
from pathlib import Path

PKG = "jsonlbatch"

#: The new core packages, in the order docs show them, each with its `__init__` docstring.
PACKAGES: dict[str, str] = {
    "batch_format": (
        "The OpenAI Batch format every stage reads and writes: request and response lines\n"
        "(`records`), what a usable answer is per endpoint (`answers`), what a response line says\n"
        "choice by choice (`samples`), a compact set of custom_ids (`idset`), and pictures and\n"
        "files inside requests (`media`)."
    ),
    "file_io": (
        "Files on disk: JSONL read and written crash-safely (`jsonl`), which output a command may\n"
        "write (`output_guard`), and hand-written settings files checked key by key (`filecheck`)."
    ),
    "pricing": (
        "What a request and an answer cost: token estimates before sending (`cost`) and the\n"
        "price table and billed usage after (`prices`)."
    ),
    "answer_contract": (
        "The answer contract: JSON Schemas declared in requests (`schema_forms`: each endpoint's\n"
        "form, read and written), answers checked against them (`contract`: validators and\n"
        "verdicts), and the bounds that keep a hostile schema's check cheap (`schema_bounds`,\n"
        "`bounded_check`)."
    ),
}

#: Old top-level module -> its new dotted path under `jsonlbatch`. A module absent from the tree
#: (`media` before its branch merges) is skipped.
MOVES: dict[str, str] = {
    "records": "batch_format.records",
    "answers": "batch_format.answers",
    "samples": "batch_format.samples",
    "idset": "batch_format.idset",
    "media": "batch_format.media",
    "jsonl": "file_io.jsonl",
    "filecheck": "file_io.filecheck",
    "cost": "pricing.cost",
    "prices": "pricing.prices",
    "contract": "answer_contract.contract",
    "schema_bounds": "answer_contract.schema_bounds",
    "bounded_check": "answer_contract.bounded_check",
}
#: What stays at the top: imported by every layer, one idea each.
KEEP_AT_TOP = ("errors", "lazy", "extras", "redact", "stats")


@dataclass(frozen=True)
class Split:
    """Part of a module moved into a new one: the public names that anchor the part (with the
    private helpers only they use), and both modules' new docstrings."""

    module: str  # the old top-level name
    into: str  # the new module's dotted path under `jsonlbatch`
    anchors: tuple[str, ...]
    doc: str  # the new module's docstring
    remaining_doc: str  # the old module's docstring, now that the part has gone


SPLITS: dict[str, Split] = {
    "jsonl": Split(
        module="jsonl",
        into="file_io.output_guard",
        anchors=("same_file", "check_output", "OutputLock"),
        doc=(
            "Which output a command may write: never one of its inputs, never one a running exec\n"
            "holds.\n"
            "\n"
            "`check_output` is the one guard every command with inputs and `-o` calls (exec, merge,\n"
            "gen, export, post votes/patches, report, serve --fleet --endpoints-out): an output that\n"
            "is an input (by path, symbolic or hard link: `same_file`) or that a running exec holds\n"
            "is refused. `OutputLock` is that hold: one exec per output, by advisory `flock`s the\n"
            "kernel drops when the process dies, so there is no stale lock to clean up."
        ),
        remaining_doc=(
            "Reading and crash-safe writing of JSONL files.\n"
            "\n"
            "Output is only ever appended in whole lines with one `os.write` per batch on an\n"
            "`O_APPEND` descriptor: a crash can at worst leave a torn last line (power loss), never\n"
            "a line glued to another. `repair_tail` cuts such a tail off before anything new is\n"
            "appended, and rewrites happen through a temporary file and an atomic rename. Which\n"
            "output may be written at all (not an input, not one a running exec holds) is\n"
            "`output_guard`'s."
        ),
    ),
    "contract": Split(
        module="contract",
        into="answer_contract.schema_forms",
        anchors=(
            "SCHEMA_URLS",
            "DEFAULT_NAME",
            "ANY_OBJECT",
            "Declared",
            "declared_schema",
            "SCHEMA_KEYS",
            "check_declared",
            "with_schema",
        ),
        doc=(
            "A request's answer schema in the form its endpoint expects, read and written (so gen,\n"
            "exec, the mock and the readers agree):\n"
            "\n"
            "- chat and completions (OpenAI, vLLM, SGLang): ``response_format`` of type\n"
            "  ``json_schema`` (``json_schema.schema``), or ``json_object`` (any object); vLLM's\n"
            "  ``structured_outputs.json`` and its removed ``guided_json`` (ignored by vLLM 0.32,\n"
            "  which then answers unconstrained: all the more reason to check);\n"
            "- the Responses API: ``text.format`` of type ``json_schema`` (``schema``) or\n"
            "  ``json_object``;\n"
            "- Anthropic's Messages API: ``output_config.format`` of type ``json_schema``; and the\n"
            "  older tool form, one tool forced by ``tool_choice`` whose ``input_schema`` is the\n"
            "  schema (the answer is the tool call's input).\n"
            "\n"
            "Checking answers against the schema found here is `contract`'s."
        ),
        remaining_doc=(
            "The answer contract: a JSON Schema per request, checked on each answer's arrival.\n"
            "\n"
            "Where a request declares its schema, in each endpoint's form, is `schema_forms`'s.\n"
            "This module checks answers against it. An answer's text is read by the rules in\n"
            "`strip_json` (documented in docs/exec.md): a reasoning block, code fences and leading\n"
            "prose are what models wrap JSON in and are taken off; text after a complete JSON value\n"
            "means the model broke the contract, and the answer is invalid.\n"
            "\n"
            "Validators are compiled once per distinct schema (`compile_schema`, keyed by the\n"
            "schema's canonical JSON), so checking costs one dictionary lookup plus the validation\n"
            "itself; `check_choice` gives each choice its verdict, and `recorded` reads it back."
        ),
    ),
}

#: docs/architecture.md rows for the split modules (the old single rows described both halves).
SPLIT_ROWS: dict[str, str] = {
    "file_io.jsonl": "crash-safe file I/O: whole-line appends, torn-tail handling, atomic "
    "rewrites, line readers",
    "file_io.output_guard": "`check_output`, the one guard every command with inputs and `-o` "
    "calls (exec, merge, gen, export, post votes/patches, report, serve --fleet --endpoints-out): "
    "an output that is an input (path, symbolic or hard link) or that a running exec holds is "
    "refused; `OutputLock` (one exec per output)",
    "answer_contract.schema_forms": "a request's JSON Schema in each endpoint's form, read "
    "(`declared_schema`, `check_declared`) and written (`with_schema`)",
    "answer_contract.contract": "the answer contract's checks: the stripping rules that read JSON "
    "out of an answer, validators compiled once per schema, the per-choice verdict exec records "
    "and post, export and report read",
}

#: Rows for moved modules the old table had none for.
DEFAULT_ROWS: dict[str, str] = {
    "answer_contract.schema_bounds": "bounds on the JSON Schemas requests declare (a schema is "
    "hostile input): size, depth, `enum`, patterns, local `$ref`s only, no `$ref` loop; checked "
    "once per schema, refused with a `SchemaError` before anything is sent",
    "answer_contract.bounded_check": "one answer checked against its schema within a time limit: "
    "validators that look at the clock, patterns in the `regex` engine, `uniqueItems` in one pass",
}

CORE_INTRO = """\
Only what two or more stages read sits here: four packages, each one idea, and five modules
every layer imports (`errors.py`, `lazy.py`, `extras.py`, `redact.py`, `stats.py`). A module one
stage uses lives in that stage (`safe_names` moved to `batchapi/client/`, the only side that takes
names from a server). Core modules import only the core.

| package | holds |
| --- | --- |
| `batch_format/` | the OpenAI Batch format: request and response lines, usable answers, what a response line says, custom_id sets, media in requests |
| `file_io/` | files on disk: JSONL read and written crash-safely, the output guard, hand-written settings files |
| `pricing/` | what requests and answers cost: estimates before sending, prices and billed usage after |
| `answer_contract/` | JSON Schemas declared in requests, answers checked against them, the bounds on that check |
| (top level) | `errors.py`, `lazy.py`, `extras.py`, `redact.py`, `stats.py` |
"""

#: Mentions of a split module that mean the part that moved out (the whole-path rewrite cannot
#: know): pattern on the old text -> replacement.
PHRASES: tuple[tuple[str, str], ...] = (
    (
        r"(form\s+)`jsonlbatch\.contract` reads",
        r"\1`jsonlbatch.answer_contract.schema_forms` reads",
    ),
)

SKIP_MARK = "regroup: skip-file"
TEXT_SKIP_SUFFIXES = {
    ".jsonl",
    ".png",
    ".jpg",
    ".jpeg",
    ".gif",
    ".webp",
    ".pdf",
    ".typed",
    ".parquet",
}
NEVER_WALK = {".git", "__pycache__", ".venv", "venv", "node_modules", "build", "dist", ".mypy_cache",
              ".ruff_cache", ".pytest_cache"}  # fmt: skip


class Regroup:
    def __init__(self, root: Path, check: bool = False) -> None:
        self.root = root
        self.pkg = root / PKG
        self.check = check
        self.log: list[str] = []
        self.changed: list[Path] = []
        #: old module -> new path, for the modules this tree has (or had: already moved)
        self.moves = {
            old: new
            for old, new in MOVES.items()
            if (self.pkg / f"{old}.py").exists() or self._file(new).exists()
        }
        self.split_names: dict[str, set[str]] = {}  # old module -> the names now in `into`
        #: a moved (or split-off) module's new dotted path -> where it was
        self.was = {f"{PKG}.{new}": f"{PKG}.{old}" for old, new in self.moves.items()}
        self.was |= {f"{PKG}.{s.into}": f"{PKG}.{s.module}" for s in SPLITS.values()}
        self._compiled: tuple[re.Pattern[str], ...] | None = None

    def _file(self, dotted: str) -> Path:
        return self.pkg.joinpath(*dotted.split(".")).with_suffix(".py")

    # -- moving and splitting ----------------------------------------------------------------------

    def move(self) -> None:
        for package, doc in PACKAGES.items():
            if not any(new.split(".")[0] == package for new in self.moves.values()):
                continue
            init = self.pkg / package / "__init__.py"
            if not init.exists():
                self.log.append(f"create  {init.relative_to(self.root)}")
                if not self.check:
                    init.parent.mkdir(exist_ok=True)
                    init.write_text(f'"""{doc}\n"""\n', encoding="utf-8")
        for old, new in self.moves.items():
            src, dst = self.pkg / f"{old}.py", self._file(new)
            if src.exists() and dst.exists():
                sys.exit(f"regroup: both {src} and {dst} exist; merge them by hand first")
            if src.exists():
                self.log.append(
                    f"move    {src.relative_to(self.root)} -> {dst.relative_to(self.root)}"
                )
                if not self.check:
                    shutil.move(src, dst)
        for split in SPLITS.values():
            if split.module in self.moves:
                self._split(split)

    def _split(self, split: Split) -> None:
        remaining = self._file(self.moves[split.module])
        target = self._file(split.into)
        if target.exists():  # done before: route by what it defines
            self.split_names[split.module] = set(_defined(ast.parse(target.read_text("utf-8"))))
            return
        if self.check and not remaining.exists():
            remaining = self.pkg / f"{split.module}.py"
        text = remaining.read_text(encoding="utf-8")
        tree = ast.parse(text)
        stmts = tree.body
        defs = [s for s in stmts if _names_of(s) and not isinstance(s, ast.Import | ast.ImportFrom)]
        missing = [a for a in split.anchors if not any(a in _names_of(s) for s in defs)]
        if missing:
            sys.exit(f"regroup: {remaining} no longer defines {missing}; update SPLITS")
        moved = {id(s) for s in defs if set(_names_of(s)) & set(split.anchors)}
        while True:  # private helpers used only by what moves go with it
            used_moved = set().union(*(_used(s) for s in defs if id(s) in moved))
            used_kept = set().union(*(_used(s) for s in stmts if id(s) not in moved))
            more = {
                id(s)
                for s in defs
                if id(s) not in moved
                and all(n.startswith("_") for n in _names_of(s))
                and set(_names_of(s)) & used_moved
                and not set(_names_of(s)) & used_kept
            }
            if not more:
                break
            moved |= more
        moved_names = {n for s in defs if id(s) in moved for n in _names_of(s)}
        kept_defs = {n for s in defs if id(s) not in moved for n in _names_of(s)}
        back = moved_names & set().union(*(_used(s) for s in stmts if id(s) not in moved))
        if back:
            sys.exit(f"regroup: what stays in {remaining} uses {sorted(back)}: the split would "
                     "make a circle; update SPLITS")  # fmt: skip
        lines = text.splitlines(keepends=True)
        spans = _spans(stmts, len(lines))
        imports = [s for s in stmts if isinstance(s, ast.Import | ast.ImportFrom)]
        moved_body = "".join(
            "".join(lines[a:b]) for s, (a, b) in zip(stmts, spans, strict=True) if id(s) in moved
        )
        kept_body = "".join(
            "".join(lines[a:b])
            for s, (a, b) in zip(stmts, spans, strict=True)
            if id(s) not in moved and s not in imports and not _is_docstring(s, stmts)
        )
        need_from_kept = sorted(
            kept_defs & set().union(*(_used(s) for s in defs if id(s) in moved))
        )
        new_imports = _imports_for(imports, lines, _body_uses(moved_body))
        if need_from_kept:
            new_imports.append(
                f"from {PKG}.{self.moves[split.module]} import {', '.join(need_from_kept)}\n"
            )
        new_text = _module(split.doc, new_imports, moved_body)
        kept_text = _module(
            split.remaining_doc, _imports_for(imports, lines, _body_uses(kept_body)), kept_body
        )
        rel = remaining.relative_to(self.root)
        self.log.append(
            f"split   {rel}: {', '.join(sorted(moved_names))} -> {target.relative_to(self.root)}"
        )
        self.split_names[split.module] = moved_names
        if not self.check:
            target.write_text(new_text, encoding="utf-8")
            remaining.write_text(kept_text, encoding="utf-8")
            self.changed += [target, remaining]

    # -- rewriting ---------------------------------------------------------------------------------

    def route(self, module: str, name: str | None) -> str | None:
        """The new module path of `module` (dotted, under jsonlbatch), with `name` taken from it;
        None when nothing changes."""
        if not module.startswith(PKG + "."):
            return None
        rest = module[len(PKG) + 1 :]
        for old, new in self.moves.items():
            split = SPLITS.get(old)
            names = self.split_names.get(old, set())
            if rest == old:
                if split and name in names:
                    return f"{PKG}.{split.into}"
                return f"{PKG}.{new}"
            if split and rest == new and name in names:
                return f"{PKG}.{split.into}"
        return None

    def rewrite(self) -> None:
        for path in self._files():
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if SKIP_MARK in text:
                continue
            new = self._rewrite_py(path, text) if path.suffix in (".py", ".pyi") else text
            new = self._rewrite_text(
                new, python=path.suffix in (".py", ".pyi"), markdown=path.suffix == ".md"
            )
            if path == self.root / "tests" / "test_layout.py":
                new = self._layout_rules(new)
            if path == self.pkg / "__init__.py":
                new = _root_docstring(new)
            if path == self.root / "docs" / "architecture.md":
                new = self._architecture(new)
            if new != text:
                self.log.append(f"rewrite {path.relative_to(self.root)}")
                if not self.check:
                    path.write_text(new, encoding="utf-8")
                    self.changed.append(path)

    def _files(self) -> list[Path]:
        try:
            out = subprocess.run(
                ["git", "ls-files", "-co", "--exclude-standard", "-z"],
                cwd=self.root, capture_output=True, check=True,
            ).stdout.decode()  # fmt: skip
            found = [self.root / p for p in out.split("\0") if p]
        except (OSError, subprocess.CalledProcessError):
            found = [
                p
                for p in self.root.rglob("*")
                if not NEVER_WALK & set(p.relative_to(self.root).parts)
            ]
        seen = set(found)
        found += [p for p in self.pkg.rglob("*.py") if p not in seen]  # just created or moved
        return sorted(p for p in set(found) if p.is_file() and p.suffix not in TEXT_SKIP_SUFFIXES)

    def _module_of(self, path: Path) -> tuple[str, bool] | None:
        try:
            rel = path.relative_to(self.pkg)
        except ValueError:
            return None
        parts = [PKG, *rel.with_suffix("").parts]
        is_init = parts[-1] == "__init__"
        return ".".join(parts[:-1] if is_init else parts), is_init

    def _rewrite_py(self, path: Path, text: str) -> str:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            self.log.append(f"warning: {path.relative_to(self.root)} does not parse; text only")
            return text
        where = self._module_of(path)
        moved_here = where is not None and where[0] in self.was
        if moved_here and where is not None:  # its relative imports were written for the old place
            where = (self.was[where[0]], False)
        starts = _line_starts(text)
        edits: list[tuple[int, int, str]] = []
        aliases: dict[str, str] = {}  # a split module bound to a local name
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = _absolute(node, where)
                if module is None:
                    continue
                groups: dict[str, list[ast.alias]] = {}
                for alias in node.names:
                    if module == PKG:
                        dest = self.route(f"{PKG}.{alias.name}", None)
                        dest = dest.rsplit(".", 1)[0] if dest else PKG
                    else:
                        dest = self.route(module, alias.name) or module
                    groups.setdefault(dest, []).append(alias)
                    if module == PKG and alias.name in SPLITS:
                        aliases[alias.asname or alias.name] = alias.name
                if list(groups) == [module] and not (node.level and moved_here):
                    continue
                indent = " " * node.col_offset
                if "#" in (ast.get_source_segment(text, node) or ""):
                    self.log.append(
                        f"warning: {path.relative_to(self.root)}:{node.lineno}: a comment inside "
                        "this import is dropped by its rewrite; put it back by hand"
                    )
                stmt = f"\n{indent}".join(
                    _from_import(dest, names, len(indent)) for dest, names in groups.items()
                )
                edits.append((_offset(text, starts, node.lineno, node.col_offset),
                              _offset(text, starts, node.end_lineno, node.end_col_offset), stmt))  # fmt: skip
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name.startswith(PKG + "."):
                        old = alias.name[len(PKG) + 1 :]
                        if old in SPLITS:
                            aliases[alias.asname] = old
            elif isinstance(node, ast.Dict):  # lazy tables: {"Name": "jsonlbatch.module"}
                for key, value in zip(node.keys, node.values, strict=True):
                    if (
                        isinstance(key, ast.Constant)
                        and isinstance(key.value, str)
                        and isinstance(value, ast.Constant)
                        and isinstance(value.value, str)
                        and (dest := self.route(value.value, key.value)) is not None
                        and dest != self.route(value.value, None)
                    ):
                        edits.append((_offset(text, starts, value.lineno, value.col_offset),
                                      _offset(text, starts, value.end_lineno, value.end_col_offset),
                                      repr(dest).replace("'", '"')))  # fmt: skip
        for node in ast.walk(tree):  # `jsonl.check_output` through a module alias: by hand
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr in self.split_names.get(aliases[node.value.id], ())
            ):
                self.log.append(
                    f"warning: {path.relative_to(self.root)}:{node.lineno}: "
                    f"{node.value.id}.{node.attr} now lives in "
                    f"{SPLITS[aliases[node.value.id]].into}; change it by hand"
                )
        for start, end, new in sorted(edits, reverse=True):
            text = text[:start] + new + text[end:]
        return text

    def _patterns(self) -> tuple[re.Pattern[str], ...]:
        if self._compiled is None:
            self._compiled = self._make_patterns()
        return self._compiled

    def _make_patterns(self) -> tuple[re.Pattern[str], ...]:
        olds = "|".join(sorted(map(re.escape, self.moves), key=len, reverse=True))
        news = "|".join(re.escape(self.moves[s]) for s in SPLITS if s in self.moves) or "(?!)"
        dotted = re.compile(rf"(?<![\w.]){PKG}\.({olds}|{news})\b(?:\.([A-Za-z_]\w*))?")
        path = re.compile(rf"(?<![\w/.-]){PKG}/({olds})\.py\b")
        unique = [o for o in self.moves if self._unique_basename(o)]
        bare = re.compile(rf"(?<=[`(\s])({'|'.join(map(re.escape, unique)) or '(?!)'})\.py\b")
        split_words = [
            rf"{re.escape(s)}\.(?:{'|'.join(map(re.escape, sorted(self.split_names[s])))})\b"
            for s in SPLITS
            if self.split_names.get(s)
        ]
        names = re.compile(rf"(?<![\w./])({'|'.join(split_words) or '(?!)'})")
        return dotted, path, bare, names

    def _markers(self) -> tuple[str, ...]:
        """Text that only this script's rewrites put in a line."""
        splits = [s.into.rsplit(".", 1)[1] for s in SPLITS.values()]
        return (*(f"{p}/" for p in PACKAGES), *(f"{p}." for p in PACKAGES), *splits)

    def _unique_basename(self, old: str) -> bool:
        """Whether `old.py` names one module only (so a bare `old.py` in a doc can be moved)."""
        new_file = self._file(self.moves[old])
        return not any(
            p.name == f"{old}.py" and p not in (new_file, self.pkg / f"{old}.py")
            for p in self.pkg.rglob(f"{old}.py")
        )

    def _rewrite_text(self, text: str, python: bool, markdown: bool = False) -> str:
        dotted, path, bare, names = self._patterns()

        def dotted_sub(m: re.Match[str]) -> str:
            module, attr = f"{PKG}.{m.group(1)}", m.group(2)
            dest = self.route(module, attr)
            if dest is None:
                return m.group(0)
            if dest != self.route(module, None):
                return f"{dest}.{attr}"
            return f"{dest}.{attr}" if attr else dest

        def path_sub(m: re.Match[str]) -> str:
            return f"{PKG}/{self.moves[m.group(1)].replace('.', '/')}.py"

        def bare_sub(m: re.Match[str]) -> str:
            return f"{self.moves[m.group(1)].replace('.', '/')}.py"

        def name_sub(m: re.Match[str]) -> str:
            module, name = m.group(1).split(".")
            return f"{SPLITS[module].into.rsplit('.', 1)[1]}.{name}"

        for pattern, replacement in PHRASES:
            text = re.sub(pattern, replacement, text)
        text = dotted.sub(dotted_sub, text)
        text = path.sub(path_sub, text)

        def prose(chunk: str) -> str:
            return names.sub(name_sub, bare.sub(bare_sub, chunk))

        if not python:
            text = prose(text)
            return _reflow_markdown(text, self._markers()) if markdown else text
        try:  # only comments and strings are prose in a Python file
            tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
        except (tokenize.TokenError, SyntaxError):
            return text
        starts = _line_starts(text)
        out, pos = [], 0
        for tok in tokens:
            if tok.type in (tokenize.COMMENT, tokenize.STRING):
                a = starts[tok.start[0] - 1] + tok.start[1]
                b = starts[tok.end[0] - 1] + tok.end[1]
                out += [text[pos:a], prose(text[a:b])]
                pos = b
        out.append(text[pos:])
        return "".join(out)

    # -- the files that describe the layout ------------------------------------------------------

    def _layout_rules(self, text: str) -> str:
        """tests/test_layout.py's CORE set: each moved module's name becomes its package's."""
        m = re.search(r"^CORE = \{(.*?)\}(  # fmt: skip)?\n", text, re.S | re.M)
        if not m:
            self.log.append("warning: tests/test_layout.py has no CORE set to rewrite")
            return text
        names = ast.literal_eval("{" + m.group(1) + "}")
        core = sorted({self.moves[n].split(".")[0] if n in self.moves else n for n in names})
        body = _wrap_names(core, "    ")
        return text[: m.start()] + "CORE = {\n" + body + "\n}  # fmt: skip\n" + text[m.end() :]

    def _architecture(self, text: str) -> str:
        text = self._diagram(text)
        m = re.search(r"^## The shared core.*?\n(?=## )", text, re.S | re.M)
        if not m:
            self.log.append("warning: docs/architecture.md has no '## The shared core' section")
            return text
        rows: dict[str, str] = {}  # module path (jsonlbatch-relative, no .py) -> what it holds
        for line in m.group(0).splitlines():
            cell = re.match(r"\|\s*`([\w/]+)\.py`\s*\|\s*(.*?)\s*\|\s*$", line)
            if cell:
                rows[cell.group(1).replace("/", ".")] = cell.group(2)
        rows = {self.moves.get(k, k): v for k, v in rows.items()}
        for split in SPLITS.values():  # the split module's row, then its new part's
            if split.module in self.moves and split.into not in rows:
                kept = self.moves[split.module]
                rows = {
                    k: v
                    for key, value in rows.items()
                    for k, v in (
                        [(kept, SPLIT_ROWS[kept]), (split.into, SPLIT_ROWS[split.into])]
                        if key == kept
                        else [(key, value)]
                    )
                }
        for module, row in DEFAULT_ROWS.items():
            if module not in rows and self._file(module).exists():
                rows[module] = row
        order = list(PACKAGES)
        top = [k for k in rows if "." not in k]
        grouped = sorted(  # by package, in the table's own order within each
            (k for k in rows if "." in k),
            key=lambda k: order.index(k.split(".")[0]) if k.split(".")[0] in order else 99,
        )
        table = ["| module | holds |", "| --- | --- |"]
        table += [f"| `{k.replace('.', '/')}.py` | {rows[k]} |" for k in [*grouped, *top]]
        section = "## The shared core\n\n" + CORE_INTRO + "\n" + "\n".join(table) + "\n\n"
        return text[: m.start()] + section + text[m.end() :]

    def _diagram(self, text: str) -> str:
        m = re.search(r"^( *)shared core:.*\n(?:\1 +\S.*\n)*", text, re.M)
        if not m:
            return text
        indent = m.group(1)
        names = [
            f"{p}/" for p in PACKAGES if any(n.startswith(p + ".") for n in self.moves.values())
        ]
        names += [n for n in KEEP_AT_TOP if (self.pkg / f"{n}.py").exists()]
        lead = f"{indent}shared core: "
        lines, line = [], lead
        for name in names:
            if len(line) + len(name) + 2 > 92 and line.strip() != "shared core:":
                lines.append(line.rstrip())
                line = " " * len(lead)
            line += name + "  "
        lines.append(line.rstrip())
        return text[: m.start()] + "\n".join(lines) + "\n" + text[m.end() :]

    # -- the end ---------------------------------------------------------------------------------

    def tidy(self) -> None:
        """Sort the rewritten imports and format the files this run wrote (ruff, when here)."""
        py = sorted({str(p) for p in self.changed if p.suffix == ".py" and p.exists()})
        if not py:
            return
        ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
        if not Path(ruff).exists():
            self.log.append(
                "note: ruff not found; run `ruff check --select I --fix` and `ruff format`"
            )
            return
        subprocess.run([ruff, "check", "-q", "--select", "I", "--fix", *py], cwd=self.root)
        subprocess.run([ruff, "format", "-q", *py], cwd=self.root)

    def leftovers(self) -> None:
        """Top-level modules this script does not place (a branch added one): say so."""
        for path in sorted(self.pkg.glob("*.py")):
            name = path.stem
            if name not in (*KEEP_AT_TOP, "__init__", "__main__") and name not in MOVES:
                self.log.append(
                    f"warning: jsonlbatch/{name}.py is a top-level module this script does not "
                    "place: add it to MOVES (and test_layout's CORE) and run again"
                )


# -- helpers ---------------------------------------------------------------------------------------


def _names_of(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [stmt.name]
    if isinstance(stmt, ast.Assign):
        return [n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return [stmt.target.id]
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        return [(a.asname or a.name).split(".")[0] for a in stmt.names]
    return []


def _defined(tree: ast.Module) -> list[str]:
    return [
        n for s in tree.body if not isinstance(s, ast.Import | ast.ImportFrom) for n in _names_of(s)
    ]


def _used(stmt: ast.stmt) -> set[str]:
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _body_uses(body: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(body)) if isinstance(n, ast.Name)}


def _is_docstring(stmt: ast.stmt, stmts: list[ast.stmt]) -> bool:
    return (
        stmt is stmts[0]
        and isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def _spans(stmts: list[ast.stmt], n_lines: int) -> list[tuple[int, int]]:
    """Each statement's lines (0-based, end exclusive), the comments and blank lines above it
    included, so a `#:` comment or a section rule travels with what it describes."""
    spans, prev_end = [], 0
    for stmt in stmts:
        end = stmt.end_lineno or stmt.lineno
        spans.append((prev_end, end))
        prev_end = end
    if spans:
        spans[-1] = (spans[-1][0], n_lines)
    return spans


def _imports_for(imports: list[ast.stmt], lines: list[str], used: set[str]) -> list[str]:
    """The import statements `used` needs, in their order, trimmed to the names it uses."""
    out = []
    for stmt in imports:
        assert isinstance(stmt, ast.Import | ast.ImportFrom)
        source = "".join(lines[stmt.lineno - 1 : stmt.end_lineno])
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            continue
        keep = [a for a in stmt.names if (a.asname or a.name).split(".")[0] in used]
        if not keep:
            continue
        if len(keep) == len(stmt.names):
            out.append(source)
        elif isinstance(stmt, ast.ImportFrom):
            out.append(_from_import("." * stmt.level + (stmt.module or ""), keep, 0) + "\n")
        else:
            out.append(f"import {', '.join(_alias(a) for a in keep)}\n")
    return out


def _module(doc: str, imports: list[str], body: str) -> str:
    body = body.lstrip("\n")
    return (
        f'"""{doc}\n"""\n\nfrom __future__ import annotations\n\n'
        + "".join(imports)
        + ("\n\n" + body if imports else "\n" + body)
    )


def _alias(alias: ast.alias) -> str:
    return f"{alias.name} as {alias.asname}" if alias.asname else alias.name


def _from_import(module: str, names: list[ast.alias], indent: int) -> str:
    one = f"from {module} import {', '.join(_alias(a) for a in names)}"
    if indent + len(one) <= 100:
        return one
    pad = " " * (indent + 4)
    inner = "".join(f"{pad}{_alias(a)},\n" for a in names)
    return f"from {module} import (\n{inner}{' ' * indent})"


def _absolute(node: ast.ImportFrom, where: tuple[str, bool] | None) -> str | None:
    if not node.level:
        return node.module
    if where is None:
        return None
    module, is_init = where
    parts = module.split(".") if is_init else module.split(".")[:-1]
    base = parts[: len(parts) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


_ITEM = re.compile(r"^(\s*)([-*]|\d+\.)\s+")


def _plain(line: str) -> bool:
    """A line of a markdown paragraph (not a table row, heading, quote, fence or blank)."""
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith(("|", "#", ">", "```", "<"))


def _reflow_markdown(text: str, markers: tuple[str, ...], width: int = 100) -> str:
    """Wrap again each markdown paragraph (or list item) that a rewrite made longer than
    `width`: only those, so the rest of a page keeps its own line breaks."""
    lines = text.split("\n")
    out: list[str] = []
    fenced = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip().startswith("```"):
            fenced = not fenced
        if fenced or not _plain(line):
            out.append(line)
            i += 1
            continue
        j = i + 1
        while j < len(lines) and _plain(lines[j]) and not _ITEM.match(lines[j]):
            j += 1
        block = lines[i:j]
        if any(len(b) > width and any(m in b for m in markers) for b in block):
            item = _ITEM.match(block[0])
            first = item.group(0) if item else re.match(r"\s*", block[0]).group(0)  # type: ignore[union-attr]
            rest = re.match(r"\s*", block[1]).group(0) if len(block) > 1 else " " * len(first)  # type: ignore[union-attr]
            words = " ".join([block[0][len(first) :].strip(), *(b.strip() for b in block[1:])])
            out += textwrap.wrap(
                words,
                width=width,
                initial_indent=first,
                subsequent_indent=rest,
                break_long_words=False,
                break_on_hyphens=False,
            )
        else:
            out += block
        i = j
    return "\n".join(out)


def _line_starts(text: str) -> list[int]:
    starts, pos = [0], 0
    for line in text.splitlines(keepends=True):
        pos += len(line)
        starts.append(pos)
    return starts


def _offset(text: str, starts: list[int], lineno: int | None, col: int | None) -> int:
    """A character offset from ast's (line, UTF-8 byte column)."""
    assert lineno is not None and col is not None
    start = starts[lineno - 1]
    line = text[start : starts[lineno] if lineno < len(starts) else len(text)]
    return start + len(line.encode("utf-8")[:col].decode("utf-8", errors="ignore"))


def _wrap_names(names: list[str], indent: str) -> str:
    lines, line = [], indent
    for name in names:
        item = f'"{name}", '
        if len(line) + len(item) > 100:
            lines.append(line.rstrip())
            line = indent
        line += item
    lines.append(line.rstrip())
    return "\n".join(lines)


_CORE_LIST = re.compile(r"over a small shared core \((`[^)]*`)\)")


def _root_docstring(text: str) -> str:
    """The package docstring's list of the core, its paragraph wrapped again."""
    m = _CORE_LIST.search(text)
    if not m:
        return text
    core = "`batch_format`, `file_io`, `pricing`, `answer_contract`, `errors`, `redact`, `stats`"
    if m.group(1) == core:
        return text
    start = text.rfind("\n\n", 0, m.start()) + 2
    ends = [i for i in (text.find("\n\n", m.end()), text.find('\n"""', m.end())) if i >= 0]
    end = min(ends) if ends else len(text)
    paragraph = text[start:end].replace(m.group(0), f"over a small shared core ({core})")
    wrapped = textwrap.fill(
        " ".join(paragraph.split()), width=99, break_long_words=False, break_on_hyphens=False
    )
    return text[:start] + wrapped + text[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if there is work"
    )
    args = parser.parse_args(argv)
    began = time.monotonic()
    job = Regroup(args.root.resolve(), check=args.check)
    job.move()
    job.rewrite()
    job.tidy()
    job.leftovers()
    work = [line for line in job.log if not line.startswith(("warning", "note"))]
    for line in job.log:
        print(line)
    took = time.monotonic() - began
    if not work:
        print(f"regroup: nothing to do ({took:.1f} s)")
        return 0
    print(
        f"regroup: {'would change' if args.check else 'changed'} {len(work)} things ({took:.1f} s)"
    )
    return 1 if args.check else 0


if __name__ == "__main__":
    sys.exit(main())

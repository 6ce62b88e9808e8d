"""The package's layout is its architecture: imports flow cli -> stages -> shared core.

Read from the source (ast), so that a lazy import inside a function counts as much as one at the
top of a module. See docs/architecture.md.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import jsonlbatch

ROOT = Path(jsonlbatch.__file__).parent
CORE = {
    "answer_contract", "batch_format", "errors", "extras", "file_io", "lazy", "pricing", "redact",
    "stats",
}  # fmt: skip
STAGES = {
    "gen", "exec", "serve", "post", "report", "mock", "experiment", "batchapi", "cache", "view",
    "rollouts",
}  # fmt: skip
#: For each stage, the other stages it may import. Everything else between stages is a mistake.
ALLOWED = {
    "gen": set(),
    # exec looks answers up in the cache before sending and stores them before writing.
    "exec": {"cache"},
    "cache": set(),
    "serve": {"exec", "mock"},  # exec's endpoint probe; the mock is a backend it launches
    "post": set(),
    "report": set(),
    "mock": set(),
    # `jsonlbatch run`: an orchestrating stage above the others. It composes their library APIs
    # (gen writes, exec sends, serve launches, post scores, report compares) into multi-step,
    # multi-round experiments; nothing imports it back, so it cannot make a circle.
    "experiment": {"gen", "exec", "serve", "post", "report"},
    # Both sides of the Batch API run on exec: the server's batches go through exec.Job (same
    # retries, exactly-once resume), the client reuses exec's input scan, endpoints and backoff.
    "batchapi": {"exec"},
    # The viewer shows the report's headline and charts for the files it serves, and reads a
    # live run through exec's event stream (exec --view, --metrics-port).
    "view": {"report", "exec"},
    # Rollouts run on exec's front door and run loop: the driver is a request source of an
    # exec run (exec/hooks/request_source.py), its calls file exec's output.
    "rollouts": {"exec"},
}


def _modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        found.append((".".join(parts), path))
    return found


def _imports(path: Path, module: str) -> set[str]:
    """Top-level names under `jsonlbatch` that `path` imports (absolute or relative)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                targets = [".".join(["jsonlbatch", *base, node.module or ""]).rstrip(".")]
            else:
                targets = [node.module or ""]
            if targets == ["jsonlbatch"]:
                targets = [f"jsonlbatch.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            if parts[0] == "jsonlbatch" and len(parts) > 1:
                names.add(parts[1])
    return names


def _part(module: str) -> str:
    return module.split(".")[0] if module else ""


def test_every_module_belongs_somewhere():
    for module, _ in _modules():
        top = _part(module)
        assert top in CORE | STAGES | {"cli", "", "__main__"}, (
            f"jsonlbatch.{module} is neither the shared core nor a stage: place it in "
            "docs/architecture.md's map first"
        )


def test_shared_core_imports_no_stage_and_no_cli():
    for module, path in _modules():
        if _part(module) in CORE:
            wrong = _imports(path, module) - CORE
            assert not wrong, f"core module jsonlbatch.{module} imports {sorted(wrong)}"


def test_stages_import_only_the_core_and_allowed_stages():
    for module, path in _modules():
        stage = _part(module)
        if stage not in STAGES:
            continue
        imported = _imports(path, module) - CORE - {stage}
        assert "cli" not in imported, f"jsonlbatch.{module} imports the CLI"
        wrong = imported - ALLOWED[stage]
        assert not wrong, f"stage module jsonlbatch.{module} imports stage(s) {sorted(wrong)}"


def test_the_checker_sees_a_wrong_import(tmp_path):
    """The rules above must be able to fail: a core module importing a stage is caught."""
    bad = tmp_path / "records.py"
    bad.write_text("from jsonlbatch.exec.job import Job\nfrom . import cli\n")
    assert _imports(bad, "records") == {"exec", "cli"}


def _top_level(tree: ast.Module) -> list[ast.stmt]:
    """The module's own statements, and those under `if TYPE_CHECKING:`: an import for type
    hints only is a dependency of the design even though Python does not run it."""
    out: list[ast.stmt] = []
    for node in tree.body:
        out.append(node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out += node.body
    return out


def _module_level_edges() -> dict[str, set[str]]:
    """module -> the jsonlbatch modules it imports when it is imported, or for its type hints
    (top level only: an import inside a function runs later, for a narrower purpose, and
    cannot make a circle at import time)."""
    known = {module for module, _ in _modules()}
    edges: dict[str, set[str]] = {}
    for module, path in _modules():
        out: set[str] = set()
        for node in _top_level(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                bases = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                bases = [a.name for a in node.names]
            else:
                continue
            for base in bases:
                parts = base.split(".")[1:] if base.startswith("jsonlbatch") else []
                # importing a.b.c imports a, a.b and a.b.c
                for i in range(1, len(parts) + 1):
                    name = ".".join(parts[:i])
                    # a module's own packages are initialised before it: no edge back to them
                    if name in known and name != module and not module.startswith(name + "."):
                        out.add(name)
        edges[module] = out
    return edges


def test_no_import_circle():
    _assert_no_circle(_module_level_edges())


def test_type_hint_imports_count_as_edges(tmp_path):
    """An import under `if TYPE_CHECKING:` is seen, so a circle made for type hints fails too."""
    path = tmp_path / "mod.py"
    path.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from jsonlbatch.x import Y\n"
    )
    body = _top_level(ast.parse(path.read_text()))
    assert any(isinstance(n, ast.ImportFrom) and n.module == "jsonlbatch.x" for n in body)


def _all_edges() -> dict[str, set[str]]:
    """module -> every jsonlbatch module it imports anywhere, inside functions too (the package
    root, whose lazy attributes name every stage, left out)."""
    known = {module for module, _ in _modules()} - {""}
    edges: dict[str, set[str]] = {}
    for module, path in _modules():
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                bases = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                bases = [a.name for a in node.names]
            else:
                continue
            for base in bases:
                name = base.removeprefix("jsonlbatch.") if base.startswith("jsonlbatch.") else ""
                if name in known and name != module and not module.startswith(name + "."):
                    out.add(name)
        edges[module] = out
    return edges


def test_no_circle_even_through_a_lazy_import():
    """A module imported inside a function (an optional extra, a faster start) still makes a
    design circle if it imports its importer back: `serve.launch` once started Ray's
    `raycluster`, which builds on `launch`; `serve.start` now chooses between them."""
    edges = _all_edges()
    edges.pop("", None)
    _assert_no_circle(edges)


def test_the_circle_check_can_fail():
    with pytest.raises(pytest.fail.Exception, match=r"report\.build -> report\.render_html"):
        _assert_no_circle(
            {"report.build": {"report.render_html"}, "report.render_html": {"report.build"}}
        )


def _assert_no_circle(edges: dict[str, set[str]]) -> None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                pytest.fail("import circle: " + " -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module)


def test_public_api_and_stage_attributes():
    assert callable(jsonlbatch.execute) and callable(jsonlbatch.RequestWriter)
    assert callable(jsonlbatch.post.run_votes)
    assert callable(jsonlbatch.report.build_report)
    for name in jsonlbatch.__all__:
        assert hasattr(jsonlbatch, name), name


def _imported_by(code: str, *argv: str) -> set[str]:
    """The modules a fresh interpreter holds after running `code` (with `sys.argv[1:]` =
    `argv`): what a command really imports, not what its source says."""
    script = f"import sys\nsys.argv[1:] = {list(argv)!r}\n{code}\nprint('\\n'.join(sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    return set(out.stdout.split())


_HEAVY = {"aiohttp", "tqdm", "jinja2", "pyarrow", "pandas", "matplotlib", "yaml", "uvloop"}
_STAGE_MODULES = {f"jsonlbatch.{stage}" for stage in STAGES}


def _main_help() -> str:
    return "from jsonlbatch.cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass"


def test_import_jsonlbatch_imports_no_stage_and_no_heavy_dependency():
    loaded = _imported_by("import jsonlbatch")
    assert not loaded & (_HEAVY | _STAGE_MODULES | {"click", "orjson"}), sorted(
        loaded & (_HEAVY | _STAGE_MODULES)
    )


def test_help_imports_no_stage_and_gen_help_no_executor():
    loaded = _imported_by(_main_help(), "--help")
    assert "jsonlbatch.cli" in loaded
    assert not loaded & (_HEAVY | _STAGE_MODULES), sorted(loaded & (_HEAVY | _STAGE_MODULES))
    loaded = _imported_by(_main_help(), "gen", "--help")
    assert "jsonlbatch.gen" in loaded
    wrong = loaded & ({"aiohttp", "tqdm", "jsonlbatch.exec", "jsonlbatch.serve"} | _STAGE_MODULES)
    assert wrong == {"jsonlbatch.gen"}, sorted(wrong)
    # exec loads what sending needs, not the launcher or the mock's web server (`--serve` does)
    loaded = _imported_by(_main_help(), "exec", "--help")
    assert "jsonlbatch.exec.run_loop" in loaded
    wrong = loaded & {"jsonlbatch.serve.launch", "jsonlbatch.mock", "aiohttp.web", "jinja2"}
    assert not wrong, sorted(wrong)


def test_the_import_check_sees_an_import():
    assert "aiohttp" in _imported_by("import jsonlbatch\njsonlbatch.execute")


#: Inside batchapi: the client and the server share only the formats (and exec, the core).
SIDES = {"batchapi.client": {"batchapi.server"}, "batchapi.server": {"batchapi.client"},
         "batchapi.formats": {"batchapi.client", "batchapi.server"}}  # fmt: skip


def _side_crossings(edges: dict[str, set[str]]) -> list[str]:
    found = []
    for module, imported in sorted(edges.items()):
        for side, forbidden in SIDES.items():
            if module == side or module.startswith(side + "."):
                wrong = {i for i in imported for f in forbidden if i == f or i.startswith(f + ".")}
                found += [f"jsonlbatch.{module} imports jsonlbatch.{w}" for w in sorted(wrong)]
    return found


def test_batchapi_client_and_server_share_only_the_formats():
    assert not _side_crossings(_all_edges())


def test_the_sides_check_can_fail():
    edges = {"batchapi.client.submit": {"batchapi.server.batch_store", "batchapi.formats.x"}}
    assert _side_crossings(edges) == [
        "jsonlbatch.batchapi.client.submit imports jsonlbatch.batchapi.server.batch_store"
    ]

"""Git-style unified diffs of edited files, and the normalized patch used for voting.

Diffs are made here from the original and edited texts (no scratch repository needed) in the
form `git apply` expects: `diff --git a/p b/p` headers, `new file mode`/`deleted file mode` for
created and deleted files, and `\\ No newline at end of file` where a last line has none.

The normalized patch diffs the same files after removing comments, docstrings and blank lines
(Python is re-printed by `ast.unparse`), so samples that differ only cosmetically count as the
same fix when voting (the Agentless rerank rule).
"""

from __future__ import annotations

import ast
import difflib
import functools
from collections.abc import Mapping

_NO_NEWLINE = "\\ No newline at end of file\n"


def file_diff(path: str, old: str | None, new: str | None, context: int = 3) -> str:
    """The git-style diff of one file; "" when nothing changed."""
    if old == new:
        return ""
    head = [f"diff --git a/{path} b/{path}\n"]
    if old is None:
        head.append("new file mode 100644\n")
    elif new is None:
        head.append("deleted file mode 100644\n")
    a_lines = (old or "").splitlines(keepends=True)
    b_lines = (new or "").splitlines(keepends=True)
    if not a_lines and not b_lines:
        return "".join(head)  # an empty file created or deleted: headers only, as git writes it
    head.append("--- /dev/null\n" if old is None else f"--- a/{path}\n")
    head.append("+++ /dev/null\n" if new is None else f"+++ b/{path}\n")
    body = []
    for line in list(difflib.unified_diff(a_lines, b_lines, n=context))[2:]:
        body.append(line)
        if not line.endswith("\n"):
            body.append("\n" + _NO_NEWLINE)
    return "".join(head + body)


def make_diff(original: Mapping[str, str | None], updated: Mapping[str, str | None]) -> str:
    """One patch for all files that changed, in path order."""
    return "".join(file_diff(p, original.get(p), updated[p]) for p in sorted(updated))


class _DropDocstrings(ast.NodeTransformer):
    def _strip(self, node: ast.AST) -> ast.AST:
        self.generic_visit(node)
        body = node.body  # type: ignore[attr-defined]
        if (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
        return node

    visit_Module = visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = _strip


@functools.lru_cache(maxsize=128)  # the same original is normalized again for every sample
def normalize_code(path: str, text: str | None) -> str | None:
    """Text with comments, docstrings and blank lines removed; Python re-printed."""
    if text is None:
        return None
    if path.endswith(".py"):
        try:
            tree = _DropDocstrings().visit(ast.parse(text))
            return ast.unparse(tree) + "\n"
        except (SyntaxError, ValueError, RecursionError):
            pass  # not parseable: fall back to the line filter below
    comment = "#" if path.endswith((".py", ".sh", ".toml", ".cfg", ".yaml", ".yml")) else None
    kept = [
        line.rstrip() + "\n"
        for line in text.splitlines()
        if line.strip() and not (comment and line.lstrip().startswith(comment))
    ]
    return "".join(kept)


def normalized_diff(original: Mapping[str, str | None], updated: Mapping[str, str | None]) -> str:
    """The patch between normalized originals and normalized edits; "" for cosmetic changes."""
    return "".join(
        file_diff(p, normalize_code(p, original.get(p)), normalize_code(p, updated[p]))
        for p in sorted(updated)
    )


def syntax_errors(
    original: Mapping[str, str | None], updated: Mapping[str, str | None]
) -> list[str]:
    """Edited Python files that no longer parse (files that did not parse before are not blamed)."""
    errors = []
    for path in sorted(updated):
        new = updated[path]
        if not path.endswith(".py") or new is None or new == original.get(path):
            continue
        try:
            ast.parse(new)
        except SyntaxError as exc:
            old = original.get(path)
            if old is not None and not _parses(old):
                continue
            errors.append(f"{path}: line {exc.lineno}: {exc.msg}")
        except (ValueError, RecursionError) as exc:
            errors.append(f"{path}: {exc}")
    return errors


def _parses(text: str) -> bool:
    try:
        ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return False
    return True

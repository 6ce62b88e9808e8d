"""Pass rules such as `score >= 6` or `score >= 6 and verdict == 'pass'`, parsed safely.

The rule is parsed with Python's own parser (`ast`, expression mode) and then walked by a small
interpreter that knows only comparisons, `and`/`or`/`not`, the names the judge extracts, and
literal numbers, strings, booleans and lists. Nothing is ever `eval`ed: a rule cannot call, index,
import or reach an attribute, and anything else is refused when the rule is read, with the reason.

A name whose value is missing (nothing extracted) makes every comparison that uses it false, so
an unreadable score never passes.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jsonlbatch.errors import UsageError

_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
#: A pass rule is a few comparisons: these bounds keep a hostile one from the recursion limit.
MAX_RULE_CHARS = 2000
MAX_RULE_DEPTH = 32
# one unbounded repeat per run of digits: `\d+\.?\d*` backtracks quadratically over a long one
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
#: An extracted value longer than this is compared as text, not read as a number.
MAX_NUMBER_CHARS = 400


def coerce(value: str | None) -> Any:
    """An extracted string as the rule sees it: a number when it reads as one (`7`, `7.5`,
    `7/10` is not), `true`/`false` as booleans, else the string itself."""
    if value is None:
        return None
    text = value.strip()
    if len(text) <= MAX_NUMBER_CHARS and _NUMBER.fullmatch(text):
        number = float(text)
        if not math.isfinite(number):  # `1e400000`: too large to be a number here
            return text
        return (
            int(number)
            if number.is_integer() and "." not in text and "e" not in text.lower()
            else number
        )
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


class PassRule:
    """A compiled pass rule over the names in `names`."""

    def __init__(self, text: str, names: Sequence[str]) -> None:
        self.text = text
        self.names = tuple(names)
        if len(text) > MAX_RULE_CHARS:
            raise UsageError(
                f"pass rule {text[:40]!r}...: {len(text)} characters, more than "
                f"{MAX_RULE_CHARS}; a rule is a few comparisons"
            )
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as exc:
            raise UsageError(f"pass rule {text!r} does not parse: {exc.msg}") from None
        except (RecursionError, MemoryError):
            raise UsageError(f"pass rule {text[:40]!r}... is nested too deeply") from None
        self._check(tree.body)
        self._tree = tree.body

    def __call__(self, values: Mapping[str, Any]) -> bool:
        return bool(self._eval(self._tree, values))

    def __repr__(self) -> str:
        return f"PassRule({self.text!r})"

    def _check(self, node: ast.AST, depth: int = 0) -> None:
        """Refuse what the interpreter does not know, and nesting deeper than `MAX_RULE_DEPTH`
        (`not not ... score >= 6` 3,000 deep hit Python's recursion limit when evaluated)."""
        if depth > MAX_RULE_DEPTH:
            raise UsageError(
                f"pass rule {self.text[:40]!r}... is nested more than {MAX_RULE_DEPTH} deep"
            )
        if isinstance(node, ast.BoolOp):
            for value in node.values:
                self._check(value, depth + 1)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            self._check(node.operand, depth + 1)
        elif isinstance(node, ast.Compare):
            for op in node.ops:
                if type(op) not in _COMPARE:
                    raise UsageError(f"pass rule {self.text!r}: `is` comparisons are not allowed")
            for operand in (node.left, *node.comparators):
                self._check(operand, depth + 1)
        elif isinstance(node, ast.Name):
            if node.id not in self.names:
                raise UsageError(
                    f"pass rule {self.text!r} uses {node.id!r}, which is not extracted "
                    f"(extracted: {', '.join(self.names)})"
                )
        elif isinstance(node, (ast.List, ast.Tuple)):
            for element in node.elts:
                self._check(element, depth + 1)
        elif not (
            isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool))
        ):
            raise UsageError(
                f"pass rule {self.text!r}: only comparisons, and/or/not, extracted names and "
                f"literals are allowed, not {ast.unparse(node)!r}"
            )

    def _eval(self, node: ast.AST, values: Mapping[str, Any]) -> Any:
        if isinstance(node, ast.BoolOp):
            results = (self._eval(v, values) for v in node.values)
            return all(results) if isinstance(node.op, ast.And) else any(results)
        if isinstance(node, ast.UnaryOp):
            operand = self._eval(node.operand, values)
            if isinstance(node.op, ast.Not):
                return not operand
            return -operand if isinstance(operand, (int, float)) else None
        if isinstance(node, ast.Compare):
            left = self._eval(node.left, values)
            for op, right_node in zip(node.ops, node.comparators, strict=True):
                right = self._eval(right_node, values)
                if left is None or right is None:
                    return False
                try:
                    if not _COMPARE[type(op)](left, right):
                        return False
                except TypeError:  # "7/10" >= 6: a text score compared to a number fails
                    return False
                left = right
            return True
        if isinstance(node, ast.Name):
            return values.get(node.id)
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self._eval(e, values) for e in node.elts]
        assert isinstance(node, ast.Constant)
        return node.value

"""Answer extraction and normalization for majority votes.

Extractors are tried in order as fallbacks (e.g. `boxed`, then `answer-is`, then
`last-number`, the Qwen2.5-Math order); none matching yields `INVALID`, which the vote never
lets win over a real answer. Normalizers make equal answers equal (`1,000` = `1000` = `1000.0`,
`\\dfrac` = `\\frac`, `$...$`, a trailing period, case and spacing of text) and are pluggable:
a registered name or any `module:function`.

Answer text is a model's: any length, any shape. Every extractor and the default normalizer run
in time linear in the text (no regular expression here has two unbounded repeats that can take
the same characters, and no loop re-slices the text per step), JSON that nests past the
interpreter's recursion limit is no JSON, and a value too large to normalise (longer than
`MAX_NORMAL_CHARS`, or a number whose exponent is beyond `MAX_DIGITS`: `1e400000`, a
million-digit integer) stays as text, case-folded and its spacing collapsed.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from jsonlbatch.errors import UsageError
from jsonlbatch.post.markdown import iter_fences, json_chunks
from jsonlbatch.post.responses import lookup

INVALID = "[invalid]"
DEFAULT_EXTRACTORS = ("boxed", "answer-is", "last-number")

Extractor = Callable[[str], "str | None"]
Normalizer = Callable[[str], str]

#: A normalised answer is compared, counted and written per sample: longer than this, it is
#: text (an answer of a vote is a number, a letter, a short expression).
MAX_NORMAL_CHARS = 4000
#: Digits a canonical number may have before or after its point (Python's int-to-text limit is
#: 4,300 digits; `1e400000` written out is 400,001 of them).
MAX_DIGITS = 4000

_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d*\.?\d+")
# Whitespace runs are matched by one `\s*` each, never two in a row: `\s*:?\s*` over a
# megabyte of newlines backtracks quadratically.
_ANSWER_IS = re.compile(r"(?:final answer|the answer)\s*(?:is|:)\s*(?::\s*)?(.+)", re.IGNORECASE)
_CHOICE_AFTER = re.compile(
    r"answer\s*(?:is\s*)?(?::\s*)?(?:\*+\s*)?\(?([A-E])\)?(?![A-Za-z])", re.IGNORECASE
)
_CHOICE_PAREN = re.compile(r"\(([A-E])\)")
_CHOICE_ALONE = re.compile(r"^\s*\**\(?([A-E])\)?[.:)]?\**\s*$")


def boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`), braces matched."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    if text.startswith(" ", i):  # `\boxed 5`
        m = re.match(r"\s+([^\s$]+)", text[i:])
        return m[1] if m else None
    if not text.startswith("{", i):
        return None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j].strip()
    return None  # unbalanced: truncated


def answer_is(text: str) -> str | None:
    """The rest of the sentence after the last "the answer is" / "final answer is"."""
    matches = list(_ANSWER_IS.finditer(text))
    if not matches:
        return None
    answer = matches[-1][1].split("\n", 1)[0]
    inner = boxed(answer)
    if inner is not None:
        return inner or None
    answer = re.split(r"\.(?:\s|$)", answer, maxsplit=1)[0]  # the sentence, not what follows
    return answer.strip().strip("*").strip().rstrip(".") or None


def last_number(text: str) -> str | None:
    """The last number in the text, thousands separators removed."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def choice(text: str) -> str | None:
    """A multiple-choice letter A-E: after "answer is", else the last `(X)`, else a lone letter."""
    for pattern in (_CHOICE_AFTER, _CHOICE_PAREN):
        found = pattern.findall(text)
        if found:
            return found[-1].upper()
    m = _CHOICE_ALONE.match(text)
    return m[1] if m else None


def full(text: str) -> str | None:
    """The whole answer text."""
    return text.strip() or None


def regex_extractor(pattern: str) -> Extractor:
    """The first match of `pattern` (its first group if it has one), as lm-eval's regex filter."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise UsageError(f"bad regex {pattern!r}: {exc}") from None

    def extract(text: str) -> str | None:
        m = compiled.search(text)
        if not m:
            return None
        value = m[1] if compiled.groups else m[0]
        return value.strip() if value else None

    return extract


def json_extractor(path: str) -> Extractor:
    """A field (dotted path) of a JSON answer: the whole text, a ```json block, or the last object.

    The extractor carries its `json_path`: where exec recorded the answer's value under a schema
    (`contract.recorded_value`), `extract_answer` reads the field from that value instead.
    """

    def extract(text: str) -> str | None:
        for candidate in _json_candidates(text):
            found = json_field(candidate, path)
            if found is not None:
                return found
        return None

    extract.json_path = path  # type: ignore[attr-defined]
    return extract


def json_field(value: Any, path: str) -> str | None:
    """The field at a dotted `path` of a decoded JSON value, as a string (JSON for non-strings)."""
    found = lookup(value, path)
    if found is None:
        return None
    return found if isinstance(found, str) else json.dumps(found, sort_keys=True)


def _json_candidates(text: str) -> list[Any]:
    out: list[Any] = list(json_chunks(text, iter_fences(text)))
    if out:
        return out[::-1]
    decoder = json.JSONDecoder()
    starts = [m.start() for m in re.finditer(r"\{", text)][-200:]
    for start in reversed(starts):
        try:
            return [decoder.raw_decode(text, start)[0]]
        except (ValueError, RecursionError):  # nested past the recursion limit: not JSON here
            continue
    return []


class ToolExtractor:
    """`tool:PATH`: the answer is the first tool call the sample made, not its text: `tool:name`
    its function's name, `tool:arguments` its arguments (JSON, keys sorted),
    `tool:arguments.order_id` a dotted path into the arguments (decoded from their JSON
    string). An answer that called no tool (or lacks the path) has none by this extractor;
    called on text alone it finds nothing."""

    def __init__(self, path: str) -> None:
        head = path.split(".", 1)[0]
        if head not in ("name", "arguments"):
            raise UsageError(f"tool:{path}: the path starts with name or arguments "
                             "(tool:name, tool:arguments.order_id)")  # fmt: skip
        self.path = path

    def __call__(self, text: str) -> str | None:
        return None

    def from_calls(self, calls: Sequence[Any]) -> str | None:
        """The answer read from the sample's `tool_calls`, or None."""
        first = calls[0] if calls else None
        function = first.get("function") if isinstance(first, dict) else None
        if not isinstance(function, dict):
            return None
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError):  # json recurses per level: a model's text
                arguments = None  # no field of broken arguments is read
        try:
            return json_field({"name": function.get("name"), "arguments": arguments}, self.path)
        except RecursionError:  # nested past what json.dumps writes back: no field either
            return None


_EXTRACTORS: dict[str, Extractor] = {
    "boxed": boxed,
    "answer-is": answer_is,
    "last-number": last_number,
    "choice": choice,
    "full": full,
}


def get_extractor(spec: str | Extractor) -> Extractor:
    """An extractor from its name, `regex:PATTERN` or `json:PATH`."""
    if callable(spec):
        return spec
    if spec.startswith("regex:"):
        return regex_extractor(spec[len("regex:") :])
    if spec.startswith("json:"):
        return json_extractor(spec[len("json:") :])
    if spec.startswith("tool:"):
        return ToolExtractor(spec[len("tool:") :])
    try:
        return _EXTRACTORS[spec]
    except KeyError:
        known = ", ".join([*_EXTRACTORS, "regex:PATTERN", "json:PATH", "tool:PATH"])
        raise UsageError(f"unknown extractor {spec!r} (known: {known})") from None


def extract_answer(
    text: str,
    extractors: Sequence[str | Extractor] = DEFAULT_EXTRACTORS,
    *,
    value: Any = None,
    calls: Sequence[Any] = (),
) -> str | None:
    """The answer of the first extractor that finds one; None when none does. `value` is the
    answer's JSON as exec read and validated it under a schema, for `json:` extractors;
    `calls` the answer's `tool_calls`, for `tool:` extractors."""
    for spec in extractors:
        extractor = get_extractor(spec)
        if isinstance(extractor, ToolExtractor):
            found = extractor.from_calls(calls)
            if found is not None and found.strip():
                return found.strip()
            continue
        path = getattr(extractor, "json_path", None)
        found = json_field(value, path) if path is not None and value is not None else None
        if found is None:
            found = extractor(text)
        if found is not None and found.strip():
            return found.strip()
    return None


# ---------------------------------------------------------------------------------------------
# Normalization

_LATEX_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
_LATEX_NOISE = (
    "\\left",
    "\\right",
    "\\!",
    "\\,",
    "\\;",
    "\\:",
    "^\\circ",
    "^{\\circ}",
    "\\displaystyle",
)
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?", re.IGNORECASE)
_GROUPED = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d*)?")
_FRACTION = re.compile(r"(-?)(\d+)/(\d+)")


def canonical_number(text: str) -> str | None:
    """`1,000` / `1000.0` / `+1e3` -> `1000`; None when `text` is not a plain number."""
    s = text.strip().lstrip("$").strip()
    if _GROUPED.fullmatch(s):
        s = s.replace(",", "")
    if not _PLAIN_NUMBER.fullmatch(s):
        return None
    try:
        value = Decimal(s)
    except InvalidOperation:
        return None
    if abs(value.adjusted()) > MAX_DIGITS or len(value.as_tuple().digits) > MAX_DIGITS:
        return None  # too large to write out: it stays as text
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def normalize_answer(answer: str) -> str:
    """The default normalizer: numbers canonical, LaTeX spelling unified, text case-folded."""
    if len(answer) > MAX_NORMAL_CHARS:
        return normalize_text(answer)  # too large to normalise: it stays as text
    s = answer.strip()
    for opening, closing in (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        while (
            len(s) > len(opening) + len(closing) - 1
            and s.startswith(opening)
            and s.endswith(closing)
        ):
            s = s[len(opening) : len(s) - len(closing)].strip()
    s = _LATEX_WRAPPERS.sub(r"\1", s)
    for noise in _LATEX_NOISE:
        s = s.replace(noise, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.rstrip(".").strip()
    number = canonical_number(s)
    if number is not None:
        return number
    m = _FRACTION.fullmatch(s)
    if m:
        return f"{m[1]}\\frac{{{m[2]}}}{{{m[3]}}}"
    if "\\" in s or "{" in s or "^" in s:
        s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
        return re.sub(r"\s+", "", s)
    return normalize_text(s)


def normalize_text(answer: str) -> str:
    """Case-folded, whitespace collapsed, a trailing period dropped."""
    return " ".join(answer.split()).rstrip(".").strip().casefold()


NORMALIZERS: dict[str, Normalizer] = {
    "default": normalize_answer,
    "text": normalize_text,
    "none": lambda s: s.strip(),
}


def get_normalizer(spec: str | Normalizer) -> Normalizer:
    """A normalizer by name (`default`, `text`, `none`) or `package.module:function`."""
    if callable(spec):
        return spec
    if spec in NORMALIZERS:
        return NORMALIZERS[spec]
    module, _, name = spec.partition(":")
    if not name:
        raise UsageError(
            f"unknown normalizer {spec!r} (known: {', '.join(NORMALIZERS)}, or module:function)"
        )
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:  # ValueError: `:x`, `..m:x`
        raise UsageError(f"cannot load normalizer {spec!r}: {exc}") from None
    if not callable(fn):
        raise UsageError(f"normalizer {spec!r} is not callable")
    return _checked(spec, fn)


def _checked(spec: str, fn: Callable[[str], Any]) -> Normalizer:
    """A user's normalizer that fails cleanly: it must take a string and return one
    (`builtins:len` returns an int, which no vote can compare with a gold answer)."""

    def normalize(text: str) -> str:
        try:
            out = fn(text)
        except Exception as exc:  # the user's code: any failure is a usage error, not ours
            raise UsageError(
                f"normalizer {spec!r} failed on {text[:80]!r}: {type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(out, str):
            raise UsageError(
                f"normalizer {spec!r} must return a string, returned {type(out).__name__}"
            )
        return out

    return normalize

"""Jinja2 templates rendered once per data row: prompts, custom_ids and row filters.

Templates come from users and datasets from anywhere, so they run in Jinja's sandbox, and with
`StrictUndefined`: a misspelt field is an error naming the row and the field rather than an
empty string silently sent to a model a million times.

A template sees the row's fields as variables, plus `row` (the whole row, for fields whose
names are not identifiers, or `row | tojson`) and `row_index`; a field of the same name wins.
Local pictures and files go in with the filters `data_url`, `image_part` and `file_part`
(`gen.data_urls`); a relative path is read from the data file's folder.
"""

from __future__ import annotations

import json
import os
import re
import traceback
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import orjson
from jinja2 import StrictUndefined, TemplateSyntaxError, UndefinedError
from jinja2.sandbox import SandboxedEnvironment

from jsonlbatch.batch_format.records import check_messages
from jsonlbatch.errors import InputError, JsonlbatchError, Problem, UsageError
from jsonlbatch.extras import MissingExtra
from jsonlbatch.file_io.filecheck import read_text
from jsonlbatch.gen import data_urls
from jsonlbatch.gen.sources import Row

_FILENAME = "<template>"
_UNDEFINED = re.compile(r"'([^']+)' is undefined|has no attribute '([^']+)'")
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def _tojson(value: Any) -> str:
    """Plain JSON: Jinja's own `tojson` escapes `<`, `>`, `&` and `'` for HTML, which would
    reach a model as `\\u003c` in a text prompt."""
    return json.dumps(value, ensure_ascii=False, default=str)


#: The folder relative media paths are read from: the data file's, while one of its rows renders.
_MEDIA_BASE: ContextVar[str | None] = ContextVar("media_base", default=None)


def _path(value: Any) -> str:
    if not isinstance(value, str):
        raise data_urls.MediaError(f"a file path is a string, not {type(value).__name__} {value!r}")
    return value


def _data_url(path: Any, max_side: int | None = None) -> str:
    return data_urls.data_url(_path(path), max_side, base=_MEDIA_BASE.get())


def _image_part(path: Any, max_side: int | None = None, detail: str | None = None) -> Any:
    return data_urls.image_part(_path(path), max_side, detail, base=_MEDIA_BASE.get())


def _file_part(path: Any, filename: str | None = None) -> Any:
    return data_urls.file_part(_path(path), filename, base=_MEDIA_BASE.get())


_ENV = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False)
_ENV.filters["tojson"] = _tojson
_ENV.filters |= {"data_url": _data_url, "image_part": _image_part, "file_part": _file_part}


def _media_base(row: Row) -> str | None:
    """The folder of the row's data file (None for stdin: the current folder)."""
    if row.source in ("-", "<stdin>") or not row.source:
        return None
    return os.path.dirname(os.path.abspath(row.source))


def _context(row: Row) -> dict[str, Any]:
    return {"row": row.data, "row_index": row.index, **row.data}


class RowTemplate:
    """One compiled template; `name` (a file name, or an option name) labels its errors."""

    def __init__(self, source: str, *, name: str = "template") -> None:
        self.name = name
        try:
            self._template = _ENV.from_string(source)
        except TemplateSyntaxError as exc:
            raise InputError(
                f"bad template {name}", [Problem(name, exc.lineno, None, exc.message or "")]
            ) from None

    @classmethod
    def from_file(cls, path: str) -> RowTemplate:
        return cls(read_text(path, "template"), name=path)

    @classmethod
    def inline(cls, text: str, *, name: str, instead: str | None = None) -> RowTemplate:
        """A template typed on the command line, where `\\n` and `\\t` mean newline and tab.
        A text that is a file's name is a mistake (the prompt would be the literal name):
        refused when `instead` says what to do with a file."""
        if instead is not None and names_a_file(text):
            raise UsageError(
                f"{name} takes the template text itself, but {text!r} names a file: {instead} "
                "(else every prompt would hold the file's name)"
            )
        return cls(re.sub(r"\\([nt\\])", lambda m: _ESCAPES[m.group(1)], text), name=name)

    def render(self, row: Row) -> str:
        token = _MEDIA_BASE.set(_media_base(row))
        try:
            return self._template.render(_context(row))
        except MissingExtra:
            raise
        except Exception as exc:  # any failure inside a user's template is the user's to fix
            raise render_error(exc, row, f"cannot render {self.name}") from None
        finally:
            _MEDIA_BASE.reset(token)


_TEMPLATE_SUFFIXES = (".j2", ".jinja", ".jinja2")


def names_a_file(text: str) -> bool:
    """One word that is an existing file, or ends like a template file's name."""
    word = text.strip()
    if not word or any(c.isspace() for c in word) or "{" in word:
        return False
    return word.lower().endswith(_TEMPLATE_SUFFIXES) or os.path.isfile(word)


def render_error(exc: Exception, row: Row, what: str, *, template_line: bool = True) -> InputError:
    """An error naming the row, the missing field when there is one, and the template line."""
    field = None
    if isinstance(exc, UndefinedError):
        match = _UNDEFINED.search(exc.message or "")
        if match:
            field = match.group(1) or match.group(2)
            message = f"has no field {field!r} (it has: {_fields(row)})"
        else:
            message = exc.message or "undefined value"
    elif isinstance(exc, JsonlbatchError):  # one of ours (a file data_url cannot embed)
        message = str(exc)
    else:
        message = f"{type(exc).__name__}: {exc}"
    frames = traceback.extract_tb(exc.__traceback__) if template_line else []
    lines = [f.lineno for f in frames if f.filename == _FILENAME]
    if lines:
        what += f" (template line {lines[-1]})"
    return InputError(what, [row.problem(field, message)])


def _fields(row: Row) -> str:
    names = list(row.data)
    shown = ", ".join(names[:12]) or "no fields"
    return shown + (f", ... ({len(names)} in all)" if len(names) > 12 else "")


def compile_condition(expression: str) -> Callable[[Row], bool]:
    """A row filter from a Jinja expression such as `split == 'test' and stars > 3`."""
    try:
        compiled = _ENV.compile_expression(expression, undefined_to_none=False)
    except TemplateSyntaxError as exc:
        raise UsageError(f"bad condition {expression!r}: {exc.message}") from None

    def condition(row: Row) -> bool:
        try:
            return bool(compiled(_context(row)))
        except Exception as exc:
            what = f"cannot evaluate condition {expression!r}"
            raise render_error(exc, row, what, template_line=False) from None

    return condition


#: Body fields a continued conversation carries into its next request (`Prompt.carried`): the
#: next turn offers the same tools, so the calls in the conversation stay answerable.
CARRIED = ("tools", "tool_choice", "parallel_tool_calls")


@dataclass
class Prompt:
    """What one row asks: either `user` text (optionally after a `system` text), giving a
    prompt string or a two-message chat, or `messages`, a template that renders a JSON list of
    chat messages (multi-turn, multi-part, images): the whole conversation is the template's.

    `continues`: the row is a response read with its request (`gen.response_rows`), and the `user`
    text is a new turn after the request's messages and the assistant's answer (a second turn,
    a self-check, a repair prompt)."""

    user: RowTemplate | None = None
    system: RowTemplate | None = None
    messages: RowTemplate | None = None
    continues: bool = False

    def __post_init__(self) -> None:
        if (self.user is None) == (self.messages is None):
            raise UsageError("give exactly one prompt: a user text template or a messages template")
        if self.messages is not None and self.system is not None:
            raise UsageError(
                "a messages template writes its own system message; drop the system text"
            )
        if self.continues and (self.user is None or self.system is not None):
            raise UsageError(
                "continuing a conversation takes a user text template only (the conversation "
                "brings its own system message)"
            )

    def build(self, row: Row) -> str | list[dict[str, Any]]:
        """The user text alone (a plain prompt), or a list of chat messages."""
        if self.messages is not None:
            return self._messages(row)
        assert self.user is not None
        text = self.user.render(row)
        if self.continues:
            conversation = row.data.get("conversation")
            if not isinstance(conversation, list):
                why = "the request's messages are needed: read responses with their requests"
                if row.data.get("failed"):
                    why = (
                        "the request failed: there is no answer to continue (--where 'not failed')"
                    )
                raise InputError("cannot continue the conversation", [row.problem(None, why)])
            return [*conversation, {"role": "user", "content": text}]
        if self.system is None:
            return text
        return [
            {"role": "system", "content": self.system.render(row)},
            {"role": "user", "content": text},
        ]

    def carried(self, row: Row) -> dict[str, Any]:
        """What a continued conversation keeps of its request's body besides the messages:
        the tools it offers and how it may call them (`CARRIED`); nothing for a new prompt."""
        body = row.data.get("body") if self.continues else None
        if not isinstance(body, dict):
            return {}
        return {key: body[key] for key in CARRIED if key in body}

    def _messages(self, row: Row) -> list[dict[str, Any]]:
        template = self.messages
        assert template is not None
        rendered = template.render(row)
        what = f"{template.name} did not render a list of messages"
        try:
            messages = orjson.loads(rendered)
        except orjson.JSONDecodeError as exc:
            hint = "; insert fields with `{{ field | tojson }}`"
            raise InputError(what, [row.problem(None, f"not JSON ({exc}){hint}")]) from None
        problems = check_messages(messages, "messages")
        if problems:
            raise InputError(what, [row.problem(f, m) for f, m in problems])
        return messages

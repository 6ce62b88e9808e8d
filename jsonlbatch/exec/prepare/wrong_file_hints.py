"""What a file that is not a request file looks like, from its first lines, and which command
makes a request file from it.

A newcomer's first mistakes are files of the wrong kind: bare chat bodies (`{"model",
"messages"}` without `custom_id`, `url`, `body`), a CSV of data, exec's own output given back as
input. Each gives one problem per line (three per line for bare bodies, "bad JSON" for CSV,
hundreds for a response file); the list says what is wrong but not what to do. `hint` reads the
first lines only and names the shape and the `jsonlbatch gen` command that turns it into
requests.
"""

from __future__ import annotations

import csv
import io
import re
import shlex
from typing import Any

import orjson

_HEAD_BYTES = 64 * 1024  # enough for the first few lines of any of these shapes
_LINES = 5
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _head(path: str) -> list[bytes]:
    try:
        with open(path, "rb") as fh:
            data = fh.read(_HEAD_BYTES)
    except OSError:
        return []
    lines = [x.strip() for x in data.removeprefix(b"\xef\xbb\xbf").splitlines()]
    return [x for x in lines if x][:_LINES]


def _objects(lines: list[bytes]) -> list[Any] | None:
    out = []
    for raw in lines:
        try:
            out.append(orjson.loads(raw))
        except orjson.JSONDecodeError:
            return None
    return out


def hint(path: str, shown: str | None = None) -> str | None:
    """What the file at `path` looks like when it is not a request file, and the command that
    makes one from it; None when its first lines look like request lines (or like nothing
    known)."""
    lines = _head(path)
    if not lines:
        return None
    name = shlex.quote(shown or path)
    objects = _objects(lines)
    if objects is None:
        return _table_hint(lines, name, shown or path)
    dicts = [o for o in objects if isinstance(o, dict)]
    if len(dicts) != len(objects):
        return None
    if all("custom_id" in o and "response" in o and "body" not in o for o in dicts):
        return (
            f"{shown or path} looks like a response file (exec's output), not requests. To send "
            "its requests again, give the request file it came from; to ask about its answers "
            "(a second turn, a judge), make requests from it with `jsonlbatch gen --responses "
            f"{name} --prompt 'Check this answer: {{{{ answer }}}}' --model MODEL -o "
            "requests.jsonl`"
        )
    if all("custom_id" not in o and "body" not in o and "url" not in o for o in dicts):
        if all(isinstance(o.get("messages"), list) for o in dicts):
            models = {o.get("model") for o in dicts}
            model = models.pop() if len(models) == 1 else None
            model = shlex.quote(model) if isinstance(model, str) and model else "MODEL"
            return (
                f"{shown or path} looks like bare chat request bodies (model, messages) without "
                "custom_id, url and body. Wrap each in a request line with `jsonlbatch gen "
                f"--data {name} --messages messages.j2 --model {model} -o requests.jsonl`, where "
                "messages.j2 holds `{{ messages | tojson }}` (other body fields: --param "
                "KEY=JSON, or --body-file)"
            )
        return _rows_hint(dicts, name, shown or path)
    return None


def _rows_hint(rows: list[dict[str, Any]], name: str, shown: str) -> str | None:
    """Rows of data (no request fields at all): `gen --data` with a prompt on one field."""
    fields = [k for k, v in rows[0].items() if isinstance(v, str) and _IDENT.match(k)]
    if not fields:
        return None
    field = next((f for f in ("prompt", "question", "input", "text") if f in fields), fields[0])
    return (
        f"{shown} looks like rows of data (fields: {', '.join(list(rows[0])[:6])}), not request "
        f"lines. Make requests from it with `jsonlbatch gen --data {name} --prompt "
        f"'{{{{ {field} }}}}' --model MODEL -o requests.jsonl`"
    )


def _table_hint(lines: list[bytes], name: str, shown: str) -> str | None:
    """A CSV: not JSON, a header row of names, rows with as many commas."""
    try:
        text = b"\n".join(lines).decode()
    except UnicodeDecodeError:
        return None
    rows = list(csv.reader(io.StringIO(text)))
    header = [h.strip() for h in rows[0]]
    if len(header) < 2 or any(len(r) != len(header) for r in rows[1:-1]):
        return None
    field = next((h for h in header if _IDENT.match(h)), None)
    if field is None:
        return None
    fmt = "" if shown.lower().endswith(".csv") else " --format csv"
    return (
        f"{shown} looks like a CSV table (columns: {', '.join(header[:6])}), not JSONL request "
        f"lines. Make requests from it with `jsonlbatch gen --data {name}{fmt} --prompt "
        f"'{{{{ {field} }}}}' --model MODEL -o requests.jsonl`"
    )

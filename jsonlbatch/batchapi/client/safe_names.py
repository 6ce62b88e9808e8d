"""Names that come from a server are data, never paths.

A remote API chooses its ids (batch ids, file ids, file names); a hostile or broken one can
answer `../../home/me/.bashrc` or `/etc/passwd` as an id. Anything that turns such a name into
a file name goes through `safe_name`, which keeps a plain id as it is (readable folders) and
reduces anything else to a name of our own, so the server never chooses where we write or
what we delete. Every Batch API provider (OpenAI, Anthropic, Gemini) uses this one function.
"""

from __future__ import annotations

import hashlib
import re

#: What a plain id looks like: letters, digits, `-`, `_`, and dots inside (never `.` or `..`).
_PLAIN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")


def safe_name(name: object) -> str:
    """`name` itself when it is a plain id (`batch_abc123`, `file-xyz`), else `id-<sha256
    prefix>` of it: one path component, no separators, never `.`/`..`, at most 100 characters.
    The same name always gives the same result, and two different unsafe names do not meet."""
    text = name if isinstance(name, str) else repr(name)
    if isinstance(name, str) and _PLAIN.fullmatch(text) and ".." not in text:
        return text
    return "id-" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def is_plain_id(name: object) -> bool:
    """Whether `name` is a non-empty string that `safe_name` keeps as it is: what an id a
    server gives must look like before it goes into a URL path or a file name."""
    return isinstance(name, str) and safe_name(name) == name

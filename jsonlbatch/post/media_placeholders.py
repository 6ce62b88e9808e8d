"""Base64 media in exported text, replaced by a short placeholder.

An answer may carry a picture as a `data:` URL (a markdown image, a chart a code tool drew, a
JSON field holding a file): megabytes of base64 that make a table column unreadable and a
Parquet file large, and that no dataset tool shows as a picture. `export` writes in its place
`[image/png, 20,480 bytes, sha256 3f2a9c1b04de]`: the type, the decoded size and the start of
the bytes' SHA-256, enough to tell two pictures apart and to find the original in the response
file.
"""

from __future__ import annotations

import binascii
import hashlib
import re
from typing import Any

#: A base64 `data:` URL in text.
_DATA_URL = re.compile(
    r"data:([A-Za-z0-9.+-]+/[A-Za-z0-9.+-]+)(?:;[^;,\s\"']*)*;base64,([A-Za-z0-9+/=]+)"
)
#: Digits of the SHA-256 kept in a placeholder.
HASH_DIGITS = 12


def placeholder(mime: str, payload: str) -> str:
    """The text that stands for one base64 payload."""
    try:
        data = binascii.a2b_base64(payload)
    except (binascii.Error, ValueError):
        return f"[{mime}, base64 that does not decode, {len(payload):,} characters]"
    digest = hashlib.sha256(data).hexdigest()[:HASH_DIGITS]
    return f"[{mime}, {len(data):,} bytes, sha256 {digest}]"


def without_base64(text: str) -> str:
    """`text` with every base64 `data:` URL replaced by its placeholder."""
    if ";base64," not in text:
        return text
    return _DATA_URL.sub(lambda m: placeholder(m.group(1).lower(), m.group(2)), text)


def row_without_base64(row: dict[str, Any]) -> dict[str, Any]:
    """A result row whose text cells (and lists of text) hold no base64 media."""
    for name, value in row.items():
        if isinstance(value, str) and ";base64," in value:
            row[name] = without_base64(value)
        elif isinstance(value, list) and any(isinstance(v, str) and ";base64," in v for v in value):
            row[name] = [without_base64(v) if isinstance(v, str) else v for v in value]
    return row

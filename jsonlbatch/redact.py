"""Keep secrets out of everything we print or write.

Secrets are registered once (API keys from options, the environment, `--header` values) and
every message that leaves the process through the CLI passes through `redact`.
"""

from __future__ import annotations

_secrets: set[str] = set()


def register_secret(value: str | None) -> None:
    """Remember a value that must never be shown. Very short values are not tracked: masking
    every "a" in a message would make it unreadable and protects nothing."""
    if value and len(value) >= 4:
        _secrets.add(value)


def redact(text: str) -> str:
    """Replace every registered secret in `text` with `***`."""
    for secret in sorted(_secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, "***")
    return text

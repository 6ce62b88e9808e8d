"""Keep secrets out of everything we print or write: the one place where text is masked.

Every text that reaches a user or a file passes through here: progress and status lines, notes,
error messages (ours and the servers'), saved response lines, post-processing manifests,
reports, and, in the CLI, all of stderr. Two kinds of rule apply:

* registered secrets: API keys (`--api-key`, `OPENAI_API_KEY`, server keys), every `--header`
  value, secret query parameters of `--url`s, and the environment's secret-looking variables;
  each is masked wherever it appears, as is a prefix of one left at the very end of a text
  that someone (a server, a log) cut short;
* shapes that are secrets whoever wrote them: `Bearer <token>`, `"api-key": "<value>"` and
  other credential-named fields a server may echo, and secret query parameters in any URL
  (`?api_key=`, `&code=`, `&sig=` ...), which aiohttp puts in its error texts.

Truncation happens only here, after masking (`redact(text, limit=...)`): cutting first could
leave the head of a key that no rule recognises any more.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

MASK = "***"

#: Words that make an environment variable (or a `post --run` variable) a credential.
SECRET_VARIABLE_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")
#: Words that make a URL query parameter a credential: `code` is Azure Functions' key, `sig`
#: an Azure SAS signature, `X-Amz-Credential`/`X-Amz-Signature` S3's.
_QUERY_WORDS = ("key", "token", "secret", "password", "passwd", "pwd", "credential", "auth",
                "sig", "code", "cookie", "session")  # fmt: skip

#: Very short values are not tracked: masking every "a" would make text unreadable and
#: protects nothing.
MIN_SECRET_LEN = 4
#: A secret's head left at the end of a cut text is masked from this many characters on.
_MIN_PREFIX = 6

_secrets: set[str] = set()
_secret_forms: tuple[str, ...] = ()  # every secret as written and encoded, longest first
_secret_bytes: tuple[bytes, ...] = ()
#: Secrets at least this long are also looked for base64- and %-encoded: shorter ones would
#: make their encodings too short to tell from ordinary text.
_MIN_ENCODED_LEN = 8

_QUERY_NAME = r"[A-Za-z0-9_.-]*(?:" + "|".join(_QUERY_WORDS) + r")[A-Za-z0-9_.-]*"
#: Names of fields and headers whose value is a credential, as a server may echo them.
_FIELD_NAME = (
    r"(?:x-|proxy-)?(?:authorization|api[-_]?key|(?:access|refresh|auth|id|bearer)[-_]?token"
    r"|token|(?:client[-_])?secret|password|passwd|(?:set-)?cookie"
    r"|(?:ocp-apim-)?subscription[-_]key)"
)
_SCHEME = r"(?i:bearer)\s+(?=[A-Za-z0-9._~+/=-]{6})|Basic\s+(?=[A-Za-z0-9+/=]{8})"
_RULES = re.compile(
    # Authorization schemes: `Bearer sk-...` (any case), `Basic dXNlcjpw...`.
    rf"(?P<scheme>\b(?:{_SCHEME}))[A-Za-z0-9._~+/=-]+"
    # A credential-named query parameter in a URL: `?api_key=...`, `&code=...`.
    rf"|(?P<query>[?&;](?i:{_QUERY_NAME})=)[^&#\s\"'<>]+"
    # A credential field or header someone echoed: `"api-key": "..."`, `x-api-key: ...`,
    # `'Authorization': 'Bearer ...'`, `password=...`.
    rf"|(?P<field>(?<![\w-])(?i:{_FIELD_NAME})[\"']?\s*[:=]\s*[\"']?(?:{_SCHEME})?)"
    r"(?!\*\*\*)[^\s\"',;}&]+"
)
_FIELD = re.compile(_FIELD_NAME, re.IGNORECASE)
#: Cheap first look, on the lowercased text: `_RULES` (case-insensitive alternations, tried at
#: every position) costs ~80 us on a 400-character error line, these substring searches about a
#: microsecond. A text in which none is found cannot match `_RULES`.
_HINT_WORDS = ("bearer", "basic", "authorization", "api-key", "api_key", "apikey", "secret",
               "passw", "cookie", "subscription")  # fmt: skip
_TOKEN_HINT = re.compile(r"token[\"']?\s*[:=]")
_QUERY_HINT = re.compile(r"[?&;][a-z0-9_.-]*=")


def _shapes_possible(text: str) -> bool:
    low = text.lower()
    return (
        any(word in low for word in _HINT_WORDS)
        or ("token" in low and _TOKEN_HINT.search(low) is not None)
        or (("?" in low or "&" in low or ";" in low) and _QUERY_HINT.search(low) is not None)
    )


def register_secret(value: str | None) -> None:
    """Remember a value that must never be shown (nor its JSON, base64 or %-encoded forms)."""
    global _secret_bytes, _secret_forms
    if value and len(value) >= MIN_SECRET_LEN and value not in _secrets:
        _secrets.add(value)
        forms: set[str] = set()
        for secret in _secrets:
            forms.add(secret)
            forms.add(json.dumps(secret)[1:-1])  # as a JSON string escapes it
            forms.add(json.dumps(secret, ensure_ascii=False)[1:-1])
            if len(secret) >= _MIN_ENCODED_LEN:
                forms.update(_encoded_forms(secret))
        _secret_forms = tuple(sorted(forms, key=len, reverse=True))
        _secret_bytes = tuple(form.encode() for form in _secret_forms)


def _encoded_forms(secret: str) -> set[str]:
    """How a secret looks inside a URL (`%2F`, `+` for a space) or inside base64, at any of
    base64's three alignments (a key inside `user:key` or a JSON blob that was encoded whole):
    only the characters that depend on the secret alone, so the match holds whatever surrounds
    it."""
    import base64
    import urllib.parse

    raw = secret.encode()
    forms = {urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret)}
    forms |= {re.sub(r"%[0-9A-F]{2}", lambda m: m[0].lower(), f) for f in list(forms)}
    for pad in range(3):
        encoded = base64.b64encode(b"\0" * pad + raw).decode().rstrip("=")
        total = pad + len(raw)
        start = (0, 2, 3)[pad]  # the first character free of the bytes before the secret
        end = 4 * (total // 3) + (0, 1, 2)[total % 3]  # the last one free of those after it
        inner = encoded[start:end]
        forms |= {inner, inner.replace("+", "-").replace("/", "_")}  # standard, URL-safe
    return {f for f in forms if len(f) >= MIN_SECRET_LEN}


def register_environment(environ: Mapping[str, str] | None = None) -> None:
    """Register the values of environment variables whose names look secret (OPENAI_API_KEY,
    HF_TOKEN, ...): a server or an old output file may carry them where we never put them."""
    for name, value in (os.environ if environ is None else environ).items():
        if secret_variable(name):
            register_secret(value)


def secret_variable(name: str) -> bool:
    """Whether an environment variable's name says it holds a credential."""
    return any(word in name.upper() for word in SECRET_VARIABLE_WORDS)


def secret_query_parameter(name: str) -> bool:
    """Whether a URL query parameter's name says it holds a credential (`api_key`, `code`)."""
    name = name.lower()
    return any(word in name for word in _QUERY_WORDS)


def redact(text: str, limit: int | None = None) -> str:
    """`text` with every secret masked, then cut to `limit` characters (with "...")."""
    if _secrets:
        for form in _secret_forms:
            if form in text:
                text = text.replace(form, MASK)
        text = _mask_cut_tail(text)
    if _shapes_possible(text):
        text = _RULES.sub(_masked, text)
    if limit is not None and len(text) > limit:
        text = text[: max(0, limit - 3)] + "..."
    return text


def _masked(match: re.Match[str]) -> str:
    return (match["scheme"] or match["query"] or match["field"]) + MASK


def _mask_cut_tail(text: str) -> str:
    """Mask the head of a registered secret that ends the text (a server cut its echo short)."""
    for secret in _secrets:
        for size in range(len(secret) - 1, _MIN_PREFIX - 1, -1):
            if text.endswith(secret[:size]):
                return text[:-size] + MASK
    return text


def redact_json(value: Any) -> Any:
    """A decoded JSON value with every string in it (keys too) passed through `redact`."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {
            redact(k): MASK if isinstance(v, str) and _FIELD.fullmatch(k) else redact_json(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact_json(v) for v in value]
    return value


def redact_line(line: bytes, *, thorough: bool) -> bytes:
    """A JSON line about to be saved, masked where needed.

    Fast when there is nothing to mask: a success line is only searched for registered secrets
    (a few substring searches, no decoding, so its bytes stay exactly as the server sent them);
    a failure line (`thorough`, e.g. a 4xx body that echoes our headers) is also searched for
    the credential shapes. Only a line with a hit is decoded (with the stdlib parser, which keeps
    big integers exact), masked string by string, and encoded again.
    """
    hit = any(form in line for form in _secret_bytes)
    if not hit and thorough:
        text = line.decode("utf-8", "replace")
        hit = _shapes_possible(text) and _RULES.search(text) is not None
    if not hit:
        return line
    try:
        obj = json.loads(line)
    except ValueError:
        return redact(line.decode("utf-8", "replace")).encode()
    masked = redact_json(obj)
    if masked == obj:
        return line
    try:
        text = json.dumps(masked, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:  # NaN from a server: keep the line readable as it was, masked as text
        return redact(line.decode("utf-8", "replace")).encode()
    return text.encode() + b"\n"


class RedactingStream:
    """A text stream (stderr) whose every write is masked: the CLI's last gate, so that
    click's messages, warnings and anything else printed is covered too."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

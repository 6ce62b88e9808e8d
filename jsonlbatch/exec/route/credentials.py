"""Credentials checked where they are read: an API key, extra headers, a URL's `user:password@`.

A key read from a file or a Kubernetes secret often ends in a newline; a header pasted from a
terminal may hold a CR/LF. aiohttp refuses such a header when the first request is written
(`ValueError: Forbidden control character`), deep inside the start-up model check, as a
traceback. Here, when options are read (the CLI, a settings file, Python: they all make an
`ExecOptions` or a `SubmitOptions`), one trailing newline is taken off as the OpenAI and
Anthropic SDKs do (`str.strip()` of the key), and any other control character is a
`UsageError` naming the option and never quoting the value.

A URL with `user:password@` sends HTTP Basic credentials; with an API key (or an
`Authorization` header) as well, the request would carry two `Authorization`s, which aiohttp
refuses: that is refused here too, saying which to drop.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable, Mapping

from jsonlbatch.errors import UsageError
from jsonlbatch.exec.route.endpoints import parse_endpoint
from jsonlbatch.redact import redact, register_secret

#: C0 controls and DEL: never valid in an HTTP header value (tab is allowed by RFC 9110 but a
#: key never holds one, so a tab in a credential is a paste mistake too).
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: What RFC 9110 allows in a header's name (a `token`).
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def clean_secret(value: str | None, option: str) -> str | None:
    """`value` without one trailing newline (`\\n` or `\\r\\n`); a `UsageError` naming
    `option` when any other control character is left. The value is registered as a secret
    (both forms) and never shown."""
    if value is None:
        return None
    if not isinstance(value, str):  # not quoted back: it may be a key of another type
        raise UsageError(f"{option} must be a string, got {type(value).__name__}")
    register_secret(value)
    if value.endswith("\r\n"):
        value = value[:-2]
    elif value.endswith("\n"):
        value = value[:-1]
    register_secret(value)
    _refuse_controls(value, option)
    return value


def _refuse_controls(value: str, option: str) -> None:
    found = _CONTROL.search(value)
    if found:
        raise UsageError(
            f"{option} holds a control character ({_named(found.group())} at position "
            f"{found.start() + 1}); a credential is one line of printable text (the value "
            "is not shown)"
        )


def clean_headers(headers: Mapping[str, str], option: str = "--header") -> dict[str, str]:
    """Extra request headers with each value cleaned as `clean_secret` does and each name
    checked to be a header name."""
    if not isinstance(headers, Mapping):
        raise UsageError(f"{option} must be a mapping of names to values")
    cleaned = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise UsageError(
                f"{option} {redact(str(name))!r}: a header name is letters, digits and "
                "!#$%&'*+-.^_`|~ only"
            )
        if value is None:
            raise UsageError(f"{option} {name}: a header's value must be a string, got None")
        cleaned[name] = clean_secret(value, f"{option} {name}") or ""
    return cleaned


def check_url_credentials(
    urls: Iterable[str], api_key: str | None, headers: Mapping[str, str]
) -> None:
    """Refuse a URL with `user:password@` when the request would also carry an API key or an
    `Authorization` header (aiohttp cannot send both), and userinfo with control characters."""
    for url in urls:
        try:
            split = urllib.parse.urlsplit(url.strip())
            user, password = split.username, split.password
        except ValueError:
            continue  # parse_endpoint says what is wrong with it
        if user is None and password is None:
            continue
        shown = redact(url.replace(f"{password}@", "***@") if password else url)
        clean_secret(urllib.parse.unquote(password or ""), f"--url {shown} (its password)")
        _refuse_controls(urllib.parse.unquote(user or ""), f"--url {shown} (its user name)")
        authorization = any(name.lower() == "authorization" for name in headers)
        endpoint = parse_endpoint(url)
        # An API key goes as `Authorization: Bearer` except to Azure and Anthropic hosts.
        bearer = api_key and not (endpoint.azure or endpoint.anthropic)
        if authorization or bearer:
            given = "an Authorization --header" if authorization else "an API key"
            raise UsageError(
                f"--url {shown} carries user:password@ and {given} is given as well: a "
                "request has one Authorization; drop one of them"
            )


def _named(char: str) -> str:
    return {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\x00": "a NUL"}.get(
        char, f"U+{ord(char):04X}"
    )

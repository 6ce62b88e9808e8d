"""What makes two requests the same question: the cache key.

A key is a hash of the endpoint path (`/v1/chat/completions`, not the server's URL, so another
server of the same model reuses the answers) and of the request body in a canonical form:

- keys sorted and no whitespace, so a file re-serialised by another tool keys alike;
- numbers by value: 0.6 and 0.60 are one float once parsed, and a float with an integral value
  (64.0) is written as the integer (64), as the servers read it;
- fields that do not change the answer left out (`ANSWER_NEUTRAL`): `metadata`, `user`, `store`,
  `stream` and `stream_options` (exec rebuilds a streamed answer into the plain body),
  `service_tier`, `priority`, `request_id`. `custom_id` is not part of the body at all.

Samples are not one answer: a body without a fixed seed and with a temperature above 0 is a
draw from a distribution, and the k-th copy of it in a request file is keyed as draw k
(`entry_name`), so that a re-run reuses draws one to one. A body with a `seed`, a temperature of
0, or an endpoint that does not sample (embeddings, moderations, score, rerank) is one draw.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import orjson

#: Top-level body fields left out of the key: they route, label or stream a request, and the
#: answer is the same with or without them.
ANSWER_NEUTRAL = frozenset(
    {"metadata", "user", "store", "stream", "stream_options", "service_tier", "priority",
     "request_id"}
)  # fmt: skip

#: Endpoints whose answer is a function of the request: every copy is the same one draw.
DETERMINISTIC_URLS = frozenset(
    {
        "/v1/embeddings",
        "/v1/moderations",
        "/v1/score",
        "/v1/rerank",
        "/v2/rerank",
        "/score",
        "/rerank",
    }
)

_VERSION = b"jsonlbatch-cache-1\0"
_EXACT_FLOAT = float(2**53)  # integral floats beyond this are kept as floats (no int overflow)


def canonical(value: Any) -> Any:
    """`value` with integral floats made integers, recursively (key order is left to the
    encoder's OPT_SORT_KEYS). Booleans stay booleans."""
    kind = type(value)
    if kind is str:
        return value
    if kind is float:
        if value.is_integer() and -_EXACT_FLOAT < value < _EXACT_FLOAT:
            return int(value)
        return value
    if kind is dict:
        return {k: canonical(v) for k, v in value.items()}
    if kind is list:
        return [canonical(v) for v in value]
    return value


def canonical_body(body: dict[str, Any], sorted_body: bytes | None = None) -> bytes:
    """The body as keyed: answer-neutral fields out, canonical numbers, sorted keys.
    `sorted_body`, if the caller has it, is `orjson.dumps(body, option=OPT_SORT_KEYS)`.

    Fast path: orjson writes every integral float below 2**53 as digits and ".0", so a body
    whose encoding holds no ".0" has no float to rewrite (most bodies: "0.7" and "64" are
    canonical already), and is encoded once without walking it in Python.
    """
    if not ANSWER_NEUTRAL.isdisjoint(body):
        body = {k: v for k, v in body.items() if k not in ANSWER_NEUTRAL}
        sorted_body = None
    raw = sorted_body or orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    if b".0" in raw:
        raw = orjson.dumps(canonical(body), option=orjson.OPT_SORT_KEYS)
    return raw


def one_draw(url: str, body: dict[str, Any]) -> bool:
    """Whether every copy of this request has the same answer: a fixed `seed`, temperature 0
    (greedy), or an endpoint that does not sample."""
    if url in DETERMINISTIC_URLS or body.get("seed") is not None:
        return True
    temperature = body.get("temperature")
    return type(temperature) in (int, float) and temperature == 0


def key_scope(urls: Sequence[str]) -> bytes:
    """What `--cache-key-url` adds to every key: the run's endpoint URLs, sorted, without a
    trailing slash. Only hashed into keys, never stored, so a key in a URL stays out of the
    cache directory."""
    return b"\0".join(sorted({u.rstrip("/").encode() for u in urls}))


def body_digest(
    url: str, body: dict[str, Any], scope: bytes = b"", sorted_body: bytes | None = None
) -> bytes:
    """The key of a request: BLAKE2b-128 of scope, endpoint path and canonical body, the same
    for every copy (a draw number tells copies of a sampled body apart). `sorted_body`: as
    for `canonical_body`."""
    head = _HEADS.get((scope, url))
    if head is None:
        head = _HEADS[(scope, url)] = b"%s%s\0%s\0" % (_VERSION, scope, url.encode())
    return hashlib.blake2b(head + canonical_body(body, sorted_body), digest_size=16).digest()


#: What each key hashes before the body, by (scope, endpoint path): a few, built once.
_HEADS: dict[tuple[bytes, str], bytes] = {}


def body_key(url: str, body: dict[str, Any], scope: bytes = b"") -> str:
    """`body_digest` as 32 hex digits, as in `metrics.cache_key` (`entry_name` adds the
    draw)."""
    return body_digest(url, body, scope).hex()


def entry_name(key: str, draw: int) -> str:
    """The name of the stored answer of draw `draw` of `key` (`<key>.<draw>`), as it appears in
    `metrics.cache_key` of a hit."""
    return f"{key}.{draw}"

"""Which provider's batch API a run talks to, and what that provider takes.

`exec --batch-api` submits to OpenAI's (and Azure's, and `serve --batch-api`'s) Files and
Batches API, to Anthropic's Message Batches or to Gemini's batch mode. The provider is chosen
once, before anything is submitted: `--batch-provider` if given, else the URL's host
(`api.anthropic.com`, `generativelanguage.googleapis.com`), else the request lines (all
`/v1/messages`: Anthropic), else OpenAI. Each provider says which request lines it takes, how
many requests and bytes per batch and how large one request may be, whether custom_ids must be
reduced to a safe alphabet, and what in a line it cannot take (checked for every line before
the first upload).
"""

from __future__ import annotations

import hashlib
import re
import urllib.parse
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from jsonlbatch.batch_format.records import (
    CHAT_URL,
    COMPLETIONS_URL,
    EMBEDDINGS_URL,
    MESSAGES_URL,
    MODERATIONS_URL,
    RESPONSES_URL,
)
from jsonlbatch.batchapi.client.batch_api import BatchApi, BatchProvider
from jsonlbatch.batchapi.formats.anthropic_format import chat_to_messages
from jsonlbatch.batchapi.formats.gemini_format import chat_to_gemini
from jsonlbatch.errors import UsageError
from jsonlbatch.exec.route.endpoints import Endpoint
from jsonlbatch.exec.send.retry import Backoff

NAMES = ("openai", "anthropic", "gemini")
_SAFE_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_MAPPED = re.compile(r"^jb-[0-9a-f]{32}$")

Check = Callable[[dict[str, Any]], list[tuple[str, str]]]
#: A translation of another endpoint's body: (the body as this provider's endpoint wants it,
#: what could not be translated).
Translate = Callable[[dict[str, Any]], tuple[dict[str, Any], list[tuple[str, str]]]]


def _anthropic_check(body: dict[str, Any]) -> list[tuple[str, str]]:
    problems = []
    if body.get("stream"):
        problems.append(("body.stream", "a batch answers whole: leave out stream"))
    n = body.get("n")
    if n not in (None, 1):
        problems.append(("body.n", "Anthropic has no n: write one request line per sample"))
    return problems


def _gemini_check(body: dict[str, Any]) -> list[tuple[str, str]]:
    return chat_to_gemini(body)[1]


@dataclass(frozen=True)
class Provider:
    name: str
    endpoints: frozenset[str]
    max_requests: int
    max_bytes: int
    #: custom_ids outside `^[a-zA-Z0-9_-]{1,64}$` are sent as `safe_id(...)` and mapped back
    safe_ids: bool = False
    check: Check | None = None
    #: lines of other endpoints it takes, translated: url -> (its own url, translation)
    translated: Mapping[str, tuple[str, Translate]] = field(default_factory=dict)
    #: the largest one request may be (bytes of its line); None: only the part's limit
    max_request_bytes: int | None = None

    @property
    def takes(self) -> frozenset[str]:
        """Every endpoint of request lines it takes, translated or not."""
        return self.endpoints | frozenset(self.translated)

    def problems(self, url: str, body: dict[str, Any]) -> list[tuple[str, str]]:
        """What in a line it cannot take (its translation's problems first)."""
        found: list[tuple[str, str]] = []
        if url in self.translated:
            body, found = self.translated[url][1](body)
        if self.check is not None:
            found += self.check(body)
        return found


PROVIDERS = {
    "openai": Provider(
        "openai",
        frozenset({CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL, RESPONSES_URL, MODERATIONS_URL}),
        50_000,
        200 * 1000 * 1000,
    ),
    "anthropic": Provider(
        "anthropic",
        frozenset({MESSAGES_URL}),
        100_000,
        256 * 1000 * 1000,
        True,
        _anthropic_check,
        {CHAT_URL: (MESSAGES_URL, chat_to_messages)},
        32 * 1000 * 1000,  # a Messages request, images and PDFs as base64 included
    ),
    # Gemini's file mode takes up to 2 GB per input file; a part of 100,000 requests keeps
    # each job's results file (and a re-run after an expiry) a manageable size.
    # A request's inline data (images as base64) may be 20 MB in all.
    "gemini": Provider(
        "gemini",
        frozenset({CHAT_URL}),
        100_000,
        2 * 1000 * 1000 * 1000,
        False,
        _gemini_check,
        max_request_bytes=20 * 1000 * 1000,
    ),
}


def safe_id(custom_id: str) -> str:
    """The id a provider with a restricted alphabet gets: the id itself when it fits (and
    cannot be mistaken for a mapped one), else `jb-` + 32 hex digits of its hash; the same id
    always maps to the same safe id, so a crash never loses the mapping."""
    if _SAFE_ID.match(custom_id) and not _MAPPED.match(custom_id):
        return custom_id
    return "jb-" + hashlib.blake2b(custom_id.encode(), digest_size=16).hexdigest()


def choose(explicit: str | None, url: str, endpoints: Mapping[str, int]) -> Provider:
    """The provider for a run, from `--batch-provider`, the URL and the request lines'
    endpoints (url -> count); a file it cannot take whole is refused with the counts."""
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    if explicit is not None:
        if explicit not in PROVIDERS:
            raise UsageError(f"--batch-provider: one of {', '.join(NAMES)}")
        name = explicit
    elif host == "api.anthropic.com" or host.endswith(".anthropic.com"):
        name = "anthropic"
    elif host == "generativelanguage.googleapis.com":
        name = "gemini"
    elif endpoints and set(endpoints) == {MESSAGES_URL}:
        name = "anthropic"
    else:
        name = "openai"
    provider = PROVIDERS[name]
    refused = {u: n for u, n in endpoints.items() if u not in provider.takes}
    if refused:
        counts = ", ".join(f"{n} {u}" for u, n in Counter(endpoints).most_common())
        takes = ", ".join(sorted(provider.takes))
        raise UsageError(
            f"the {name} batch API takes {takes} lines; this file has {counts}. Split the "
            f"file by endpoint (one run each), or name the provider with --batch-provider"
        )
    return provider


def open_api(
    provider: Provider,
    endpoint: Endpoint,
    session: aiohttp.ClientSession,
    *,
    api_key: str | None,
    headers: Mapping[str, str] | None,
    max_retries: int,
    backoff: Backoff | None = None,
) -> BatchProvider:
    """The provider's adapter over one session."""
    from jsonlbatch.batchapi.client.anthropic_api import AnthropicBatchApi
    from jsonlbatch.batchapi.client.gemini_api import GeminiBatchApi

    kinds: dict[str, type[BatchApi]] = {
        "openai": BatchApi,
        "anthropic": AnthropicBatchApi,
        "gemini": GeminiBatchApi,
    }
    return kinds[provider.name](
        endpoint,
        session,
        api_key=api_key,
        headers=headers,
        max_retries=max_retries,
        backoff=backoff,
    )

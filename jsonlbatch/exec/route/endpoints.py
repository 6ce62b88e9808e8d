"""The servers a run talks to: one `Endpoint` per `--url`, its address and its credentials.

`parse_endpoint` checks a `--url` and takes secrets out of its display name; `auth_headers` says
how each provider wants its key (Bearer, Azure's `api-key`, Anthropic's `x-api-key`). Which
endpoint gets the next request, and how a dead one is waited for, is `endpoint_pool.py`'s.
"""

from __future__ import annotations

import asyncio
import re
import socket
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import yarl
from aiohttp.http_exceptions import HttpProcessingError

from jsonlbatch.errors import UsageError
from jsonlbatch.exec.route.endpoint_concurrency import ConcurrencyController, FixedConcurrency
from jsonlbatch.redact import redact, register_secret, secret_query_parameter

_AZURE_SUFFIXES = (".openai.azure.com", ".cognitiveservices.azure.com", ".services.ai.azure.com")
_ANTHROPIC_HOSTS = ("anthropic.com",)
#: Sent to Anthropic's API unless a `--header anthropic-version=...` says otherwise.
ANTHROPIC_VERSION = "2023-06-01"


#: A path that starts with an API version (`/v2/rerank`), and a path segment that is one.
_VERSIONED = re.compile(r"/v[0-9]+/")
_VERSION = re.compile(r"v[0-9]+")


@dataclass(eq=False)
class Endpoint:
    """One base URL, e.g. `http://node1:8000/v1` or an Azure deployment URL."""

    base: str
    name: str
    query: str = ""
    azure: bool = False
    anthropic: bool = False  # the key goes in `x-api-key`, with an `anthropic-version`
    proxy: str | None = None
    in_flight: int = 0
    launched: bool = False  # a server this run started: its name may not resolve yet
    priority_sign: int = 0  # a priority goes as -N (vLLM), N (SGLang) or not at all (0)
    up: bool = True
    failures: int = 0
    failing_since: float = 0.0  # monotonic time of the first failure in the current run of them
    down_reason: str = ""
    probe: asyncio.Task[None] | None = field(default=None, repr=False)
    #: Back from being set aside on its probe's word alone: one request at a time until a real
    #: answer succeeds (a replica can say 200 to /health and 500 to every generation).
    on_trial: bool = False
    set_asides: int = 0  # times set aside since its last success: the next probe waits longer
    last_success: float = 0.0  # monotonic time of its last real answer
    #: Its in-flight limit (exec/route/endpoint_concurrency.py); the default never binds below the workers.
    controller: ConcurrencyController = field(
        default_factory=lambda: FixedConcurrency(1 << 30), repr=False
    )
    _targets: dict[str, yarl.URL] = field(default_factory=dict, repr=False)

    def target(self, path: str) -> yarl.URL:
        """`url_for(path)` parsed once per path: a request line's `url` is one of a handful, and
        parsing it again for each of a million requests is measurable client CPU."""
        url = self._targets.get(path)
        if url is None:
            url = self._targets[path] = yarl.URL(self.url_for(path))
        return url

    def url_for(self, path: str) -> str:
        """Join the base with a request line's `url`, avoiding a doubled `/v1`: a base ending in
        a version (`.../v1`) takes a path of another version in its place (`/v2/rerank` under
        `http://host/v1` is `http://host/v2/rerank`, not `/v1/v2/rerank`)."""
        split = urllib.parse.urlsplit(self.base)
        base_path = split.path.rstrip("/")
        if base_path and path.startswith("/v1/"):
            path = path[3:]
        else:
            version = _VERSIONED.match(path)
            head, _, last = base_path.rpartition("/")
            if version and _VERSION.fullmatch(last):
                base_path = head
        url = urllib.parse.urlunsplit((split.scheme, split.netloc, base_path + path, "", ""))
        return f"{url}?{self.query}" if self.query else url

    def root_url(self, path: str) -> str:
        """A path at the server's root, where vLLM and SGLang answer `/health`."""
        split = urllib.parse.urlsplit(self.base)
        return urllib.parse.urlunsplit((split.scheme, split.netloc, path, "", ""))


def parse_endpoint(url: str) -> Endpoint:
    """Check and normalise a `--url`. Credentials in the URL are taken out of its display name."""
    try:
        split = urllib.parse.urlsplit(url.strip())
        if split.port == 0:  # raises for a port out of range or not a number
            raise ValueError("port 0 cannot be connected to")
    except ValueError as exc:  # `http://[::1`, `:99999`
        raise UsageError(f"--url {redact(url)!r} is not a valid URL: {exc}") from None
    if split.scheme not in ("http", "https") or not split.hostname:
        raise UsageError(
            f"--url must be an http(s) URL such as http://localhost:8000/v1, got {url!r}"
        )
    if split.password:
        register_secret(split.password)
    for key, value in urllib.parse.parse_qsl(split.query):
        if secret_query_parameter(key):
            register_secret(value)
    host = split.hostname
    port = f":{split.port}" if split.port else ""
    name = f"{split.scheme}://{host}{port}{split.path.rstrip('/')}"
    base = urllib.parse.urlunsplit((split.scheme, split.netloc, split.path, "", ""))
    proxies = urllib.request.getproxies()
    proxy = None
    if not urllib.request.proxy_bypass(host) and host not in ("127.0.0.1", "localhost", "::1"):
        proxy = proxies.get(split.scheme)
    return Endpoint(
        base=base,
        name=name,
        query=split.query,
        azure=host.endswith(_AZURE_SUFFIXES),
        anthropic=host == "anthropic.com"
        or host.endswith(tuple("." + h for h in _ANTHROPIC_HOSTS)),
        proxy=proxy,
    )


def auth_headers(
    endpoint: Endpoint, api_key: str | None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    given = {key.lower() for key in extra or {}}
    anthropic = endpoint.anthropic or "anthropic-version" in given
    if anthropic and "anthropic-version" not in given:
        headers["anthropic-version"] = ANTHROPIC_VERSION
    if api_key:
        register_secret(api_key)
        if anthropic:
            headers["x-api-key"] = api_key
        elif endpoint.azure:
            headers["api-key"] = api_key
        else:
            headers["Authorization"] = f"Bearer {api_key}"
    for key, value in (extra or {}).items():
        register_secret(value)  # every header value is a secret: its name says nothing
        headers[key] = value
    return headers


def model_ids(body: Any) -> list[str] | None:
    """The model ids a `/v1/models` body lists (None when it is not such a body)."""
    if isinstance(body, dict) and isinstance(body.get("data"), list):
        return [m["id"] for m in body["data"] if isinstance(m, dict) and "id" in m]
    return None


def unresolvable(exc: BaseException) -> bool:
    """The host's name is unknown to the resolver (a typo), as opposed to a resolver that could
    not be reached for now (EAI_AGAIN), a refused connection or a silent server."""
    os_error = getattr(exc, "os_error", exc)
    codes = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}
    return isinstance(os_error, socket.gaierror) and os_error.errno in codes


def describe_exception(exc: BaseException) -> str:
    """A short, key-free description of a transport error."""
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect ({exc.os_error.strerror or exc.os_error})"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "server disconnected"
    if isinstance(exc, aiohttp.ClientResponseError) and isinstance(
        exc.__cause__, HttpProcessingError
    ):
        # aiohttp's parser refused the reply; its words are multi-line, and empty before 3.14
        detail = exc.message.strip().splitlines()[0].rstrip(":") if exc.message.strip() else ""
        url = exc.request_info.real_url  # its query is masked where the text is shown
        return f"not an HTTP answer from {url}" + (f" ({detail})" if detail else "")
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

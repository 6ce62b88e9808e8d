"""Which endpoint of a pool gets the next request, and waiting out the ones that are down.

A request goes to a healthy endpoint chosen by the router (`router`: by prompt prefix, least
busy or round robin), among those under their concurrency controller's limit. An endpoint that
refuses connections, or keeps failing, is set aside and probed in the background until it
answers again; while no endpoint is up, `acquire` waits (up to the ready timeout) instead of
letting requests burn their attempts on a dead or cold server.

Health follows what an endpoint does to real requests, not what its probe says: one that comes
back is on trial (one request at a time) until a real answer succeeds, and a failed trial sets
it aside again at once, its next probe waiting twice as long. A request is retried on an
endpoint it has not failed on while there is one (`acquire(avoid=...)`, `untried`), so one
broken replica does not turn into failures while another answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import aiohttp
import orjson

from jsonlbatch.errors import AuthenticationError, ServerUnavailableError, UsageError
from jsonlbatch.exec.route.endpoints import Endpoint, describe_exception, model_ids, unresolvable
from jsonlbatch.exec.route.router import PrefixKey, Router
from jsonlbatch.exec.send.body_caps import read_body
from jsonlbatch.exec.send.streaming import StreamError

#: An endpoint is set aside and probed after this many server-side failures in a row, lasting
#: at least SET_ASIDE_SECONDS: errors come back faster than answers, so a burst of them at high
#: concurrency (a 10% error rate, 256 in flight) must not pause a healthy server. Where another
#: endpoint answered meanwhile, the failures in a row are enough.
SET_ASIDE_AFTER = 8
SET_ASIDE_SECONDS = 2.0
PROBE_DELAY_MAX = 30.0  # the longest wait before a set-aside endpoint is probed again
_MAX_LOOKUPS = 20  # models looked up by name per endpoint when its listing leaves them out


def _limit(endpoint: Endpoint) -> int:
    """How many requests `endpoint` may have in flight: one while it is on trial."""
    return 1 if endpoint.on_trial else endpoint.controller.limit


class EndpointPool:
    """Chooses endpoints, tracks their health, and waits for one when none is up."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        session: aiohttp.ClientSession,
        headers: Mapping[Endpoint, dict[str, str]],
        *,
        ready_timeout: float,
        watchdog: Callable[[], None] | None = None,
        router: Router | None = None,
    ) -> None:
        if not endpoints:
            raise UsageError("no endpoint: give --url or --serve")
        self.endpoints = list(endpoints)
        self.router = router or Router(self.endpoints)
        self.headers = headers
        self._session = session
        self._ready_timeout = ready_timeout
        self._watchdog = watchdog
        self._changed = asyncio.Event()
        #: Requests waiting for room (every endpoint at its limit), oldest first. A release
        #: wakes one, not all: with `-c auto` hundreds of workers may wait, and waking them all
        #: at every answer costs more CPU than the sending.
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._all_down_since: float | None = None
        self.status: str = ""  # shown by the progress display while waiting
        #: Called with (endpoint, its model list or None) when an endpoint is first seen or comes
        #: back; returns why it must not be used, or None. Set by the executor's model check.
        self.admit: Callable[[Endpoint, list[str] | None], str | None] = lambda ep, names: None
        #: Models the run asks for: one a listing leaves out is looked up by name (below).
        self.wanted: list[str] = []

    # -- choosing ------------------------------------------------------------------------------

    async def acquire(
        self, key: PrefixKey | None = None, avoid: Collection[Endpoint] = ()
    ) -> Endpoint:
        """An endpoint for a request with prefix `key` (see `Router.key`), one not in `avoid`
        (those it failed on) while such a one is up; waits while none is up."""
        waiter: asyncio.Future[None] | None = None
        try:
            while True:
                up = [ep for ep in self.endpoints if ep.up]
                if avoid:
                    up = [ep for ep in up if ep not in avoid] or up
                if up:
                    room = [ep for ep in up if ep.in_flight < _limit(ep)]
                    if room:
                        best: Endpoint = self.router.choose(room, key)
                        best.in_flight += 1
                        if len(room) > 1 or best.in_flight < _limit(best):
                            self._wake_one()  # room left (a limit grew): the next one takes it
                        return best
                    # every endpoint that is up is at its controller's limit: wait for a
                    # release, in line (the same place across re-checks)
                    if waiter is None or waiter.done():
                        waiter = asyncio.get_running_loop().create_future()
                        self._waiters.append(waiter)
                    await asyncio.wait((waiter,), timeout=1.0)  # limits may change meanwhile
                    continue
                await self._wait_for_change()
        finally:
            if waiter is not None and not waiter.done():
                waiter.cancel()  # left the line: a release skips it

    def untried(self, failed_on: Collection[Endpoint], extra: int) -> bool:
        """Whether a request out of retries, whose last attempt failed on an endpoint, gets one
        more on an endpoint that is up and that it has not failed on: a replica's fault is not
        the request's. `extra`: the attempts it already had beyond its retries (at most one per
        endpoint, so this ends)."""
        return extra < len(self.endpoints) and any(
            ep.up and ep not in failed_on for ep in self.endpoints
        )

    def release(self, endpoint: Endpoint) -> None:
        endpoint.in_flight -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():  # a timed-out waiter's future is cancelled: skip it
                waiter.set_result(None)
                return

    async def _wait_for_change(self) -> None:
        now = time.monotonic()
        if self._all_down_since is None:
            self._all_down_since = now
        waited = now - self._all_down_since
        reasons = "; ".join(f"{ep.name}: {ep.down_reason}" for ep in self.endpoints)
        self.status = (
            f"waiting for a server ({waited:.0f}s of --ready-timeout {self._ready_timeout:g}s): "
            f"{reasons}"
        )
        if self._watchdog is not None:
            self._watchdog()
        left = self._ready_timeout - waited
        if left <= 0:
            raise ServerUnavailableError(
                f"no server answered for {self._ready_timeout:g}s ({reasons}); the output is "
                "valid: run the same command again to resume"
            )
        self._changed.clear()
        with contextlib.suppress(asyncio.TimeoutError):  # never past the deadline
            await asyncio.wait_for(self._changed.wait(), timeout=min(1.0, left))

    # -- health --------------------------------------------------------------------------------

    def record_success(self, endpoint: Endpoint) -> None:
        endpoint.failures = 0
        endpoint.last_success = time.monotonic()
        if endpoint.on_trial:
            endpoint.on_trial = False
            endpoint.set_asides = 0
            self._wake_one()  # its full limit is room again

    def record_failure(self, endpoint: Endpoint, reason: str) -> None:
        if endpoint.on_trial:  # its probe answered, real requests do not: that is its health
            self.set_aside(endpoint, f"failed again after its probe answered ({reason})")
            return
        now = time.monotonic()
        if endpoint.failures == 0:
            endpoint.failing_since = now
        endpoint.failures += 1
        if endpoint.failures >= SET_ASIDE_AFTER and (
            now - endpoint.failing_since >= SET_ASIDE_SECONDS or self._others_answer(endpoint)
        ):
            self.set_aside(endpoint, f"{endpoint.failures} failures in a row ({reason})")

    def _others_answer(self, endpoint: Endpoint) -> bool:
        """Whether another endpoint answered since `endpoint` began failing: then its failures
        are its own, not a burst every server sees, and waiting the 2 s out only feeds it more
        requests (a replica that fails at once gets the most from least-busy routing)."""
        since = endpoint.failing_since
        return any(ep is not endpoint and ep.last_success > since for ep in self.endpoints)

    def set_aside(self, endpoint: Endpoint, reason: str) -> None:
        """Stop routing to `endpoint` and probe it until it answers again."""
        endpoint.down_reason = reason
        if not endpoint.up:
            return
        endpoint.up = False
        endpoint.on_trial = False
        endpoint.set_asides += 1
        if endpoint.probe is None or endpoint.probe.done():
            endpoint.probe = asyncio.ensure_future(self._probe(endpoint))

    def _mark_up(self, endpoint: Endpoint) -> None:
        endpoint.up = True
        endpoint.on_trial = True  # until a real request succeeds there
        endpoint.failures = 0
        endpoint.down_reason = ""
        self._all_down_since = None
        self.status = ""
        self._changed.set()

    async def _probe(self, endpoint: Endpoint) -> None:
        # an endpoint set aside again and again (its probe answers, its requests fail) is
        # probed ever later while another endpoint serves: 0.25 s the first time, then twice
        # as long each time. Alone, it is the only way to an answer or to the request's own
        # failure line: probed as soon as ever (a lone server failing every request ends its
        # requests' retries in seconds, not in minutes of waits)
        elsewhere = any(ep is not endpoint and ep.up for ep in self.endpoints)
        times = endpoint.set_asides - 1 if elsewhere else 0
        delay = min(0.25 * 2 ** max(0, times), PROBE_DELAY_MAX)
        while not endpoint.up:
            await asyncio.sleep(delay)
            delay = min(delay * 2, max(5.0, delay))
            try:
                # /health tells a warming vLLM/SGLang (503) from a ready one; servers without
                # it (404) are judged by their models listing alone.
                status, _ = await self.get(endpoint, "/health", timeout=30, root=True)
                if status < 500:
                    status, body = await self.get(endpoint, "/v1/models", timeout=10)
                names = await self._confirm(endpoint, model_ids(body)) if status == 200 else None
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                endpoint.down_reason = describe_exception(exc)
                continue
            if status >= 500:
                endpoint.down_reason = f"HTTP {status}"
                continue
            refusal = self.admit(endpoint, names)
            if refusal:
                endpoint.down_reason = refusal
            else:
                self._mark_up(endpoint)

    async def get(
        self, endpoint: Endpoint, path: str, *, timeout: float, root: bool = False
    ) -> tuple[int, Any]:
        """GET a JSON document; returns (status, decoded body or None)."""
        async with self._session.get(
            endpoint.root_url(path) if root else endpoint.url_for(path),
            headers=self.headers[endpoint],
            proxy=endpoint.proxy,
            timeout=aiohttp.ClientTimeout(total=timeout),
            allow_redirects=False,  # a redirect could carry our credentials elsewhere
        ) as resp:
            try:  # a model list is small: a bigger answer is no usable one
                raw = await read_body(resp.content.iter_any(), declared=resp.content_length)
            except StreamError:
                return resp.status, None
        try:
            return resp.status, orjson.loads(raw)
        except orjson.JSONDecodeError:
            return resp.status, None

    # -- start-up ------------------------------------------------------------------------------

    async def served_models(self, endpoint: Endpoint) -> list[str] | None:
        """Wait until `endpoint` answers (cold start), then list its models.

        Returns None when the server has no usable models listing (then the model check is
        skipped); raises AuthenticationError on 401/403.
        """
        deadline = time.monotonic() + self._ready_timeout
        delay = 0.25
        while True:
            # No attempt, and no pause between attempts, runs past the deadline: a dead port
            # gives up within the ready timeout, not a backoff step later.
            attempt = min(30.0, max(0.1, deadline - time.monotonic()))
            try:
                status, body = await self.get(endpoint, "/v1/models", timeout=attempt)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                if not endpoint.launched and unresolvable(exc):
                    host = urllib.parse.urlsplit(endpoint.base).hostname
                    raise UsageError(
                        f"--url {endpoint.name}: the host {host!r} does not resolve "
                        f"({describe_exception(exc).removeprefix('cannot connect (')[:-1]}); "
                        "check the address (a name that does not resolve is not a server "
                        "starting up, so it is not waited for)"
                    ) from None
                status, body = None, describe_exception(exc)
            if status in (401, 403):
                raise AuthenticationError(
                    f"{endpoint.name} rejected the credentials (HTTP {status}); check --api-key "
                    "or OPENAI_API_KEY"
                )
            if status is not None and status < 500:
                return await self._confirm(endpoint, model_ids(body)) if status == 200 else None
            left = deadline - time.monotonic()
            reason = body if status is None else f"HTTP {status}"
            waited = self._ready_timeout - left
            # how long, and which option changes it: a dead --url is otherwise a silent wait
            self.status = (
                f"waiting for {endpoint.name} ({waited:.0f}s of --ready-timeout "
                f"{self._ready_timeout:g}s): {reason}"
            )
            if self._watchdog is not None:
                self._watchdog()
            if left <= 0:
                raise ServerUnavailableError(
                    f"{endpoint.name} did not answer within --ready-timeout "
                    f"{self._ready_timeout:g}s (last: {reason})"
                )
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, 5.0)

    async def _confirm(self, endpoint: Endpoint, names: list[str] | None) -> list[str] | None:
        """`names` plus the wanted models the listing leaves out but the server says it serves
        when asked by name (`GET /v1/models/{id}`, OpenAI's "retrieve model"): proxies and the
        mock started as `jsonlbatch serve --backend mock` answer any model yet list few."""
        if names is None:
            return None
        extra = []
        for model in [m for m in self.wanted if m not in names][:_MAX_LOOKUPS]:
            try:
                status, body = await self.get(
                    endpoint, f"/v1/models/{urllib.parse.quote(model, safe='/')}", timeout=10
                )
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                break  # a transport error is the caller's to see on its next request
            if status == 200 and isinstance(body, dict) and body.get("id") == model:
                extra.append(model)
        return names + extra

    async def preflight(self, grace: float = 2.0) -> list[tuple[Endpoint, list[str] | None]]:
        """Wait (up to the ready timeout) until some endpoint answers, give the others `grace`
        seconds more, and set aside those still silent: they join when their probe succeeds.

        Returns (endpoint, model list or None) for each endpoint that answered.
        """
        tasks = {asyncio.ensure_future(self.served_models(ep)): ep for ep in self.endpoints}
        answered: list[tuple[Endpoint, list[str] | None]] = []
        pending = set(tasks)
        try:
            while pending and not answered:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    answered.append((tasks[task], task.result()))  # re-raises auth errors etc.
            if pending:
                done, pending = await asyncio.wait(pending, timeout=grace)
                for task in done:
                    answered.append((tasks[task], task.result()))
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        self.status = ""
        for task in pending:
            self.set_aside(tasks[task], "not answering yet")
        return answered

    async def close(self) -> None:
        for ep in self.endpoints:
            if ep.probe is not None:
                ep.probe.cancel()
        probes = [ep.probe for ep in self.endpoints if ep.probe is not None]
        await asyncio.gather(*probes, return_exceptions=True)

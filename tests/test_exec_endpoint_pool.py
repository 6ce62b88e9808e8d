"""`EndpointPool` (exec/route/endpoint_pool.py) and `admit.preflight` (exec/route/preflight.py), in-process.

The pool's endpoints point at scripted servers (`sendutil.ScriptedServer`, real HTTP on
127.0.0.1 in the test's loop) or at a port nothing listens on; the tests check which endpoint
a request gets, when a caller waits, when an endpoint is set aside and comes back, and what
start-up finds out about the servers' models.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence

import aiohttp
import pytest
from conftest import free_port
from sendutil import ScriptedServer

from jsonlbatch.errors import (
    AuthenticationError,
    ModelNotServedError,
    ServerUnavailableError,
    UsageError,
)
from jsonlbatch.exec.route.endpoint_concurrency import FixedConcurrency
from jsonlbatch.exec.route.endpoint_pool import SET_ASIDE_AFTER, SET_ASIDE_SECONDS, EndpointPool
from jsonlbatch.exec.route.endpoints import Endpoint, auth_headers, parse_endpoint
from jsonlbatch.exec.route.model_pools import ModelPools, PoolSpec
from jsonlbatch.exec.route.preflight import preflight


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"


@contextlib.asynccontextmanager
async def pool_over(
    urls: Sequence[str], *, limit: int = 1 << 30, ready_timeout: float = 5.0
) -> AsyncIterator[EndpointPool]:
    """A pool over `urls`, each endpoint limited to `limit` requests in flight."""
    endpoints = [parse_endpoint(url) for url in urls]
    for ep in endpoints:
        ep.controller = FixedConcurrency(limit)
    headers = {ep: auth_headers(ep, None) for ep in endpoints}
    async with aiohttp.ClientSession(trust_env=False) as session:
        pool = EndpointPool(endpoints, session, headers, ready_timeout=ready_timeout)
        try:
            yield pool
        finally:
            await pool.close()


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait (bounded) until `condition()` holds."""

    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout)


def test_a_pool_needs_an_endpoint() -> None:
    with pytest.raises(UsageError, match="no endpoint"):
        EndpointPool([], None, {}, ready_timeout=1.0)  # type: ignore[arg-type]


async def test_a_full_endpoint_makes_callers_wait_in_line() -> None:
    async with pool_over([dead_url()], limit=2) as pool:
        first, second = await pool.acquire(), await pool.acquire()
        assert first is second and first.in_flight == 2
        order: list[str] = []

        async def take(name: str) -> Endpoint:
            endpoint = await pool.acquire()
            order.append(name)
            return endpoint

        waiting = [asyncio.ensure_future(take(name)) for name in ("a", "b", "c")]
        await asyncio.sleep(0.05)
        assert order == []  # every endpoint is at its limit: nobody gets one
        pool.release(first)
        await until(lambda: order == ["a"])
        await asyncio.sleep(0.05)
        assert order == ["a"]  # one release lets one caller in, the oldest
        pool.release(first)
        pool.release(first)
        await until(lambda: len(order) == 3)
        assert order == ["a", "b", "c"] and first.in_flight == 2
        await asyncio.gather(*waiting)


async def test_a_cancelled_caller_leaves_the_line() -> None:
    async with pool_over([dead_url()], limit=1) as pool:
        held = await pool.acquire()
        gone = asyncio.ensure_future(pool.acquire())
        later = asyncio.ensure_future(pool.acquire())
        await asyncio.sleep(0.05)
        gone.cancel()
        await asyncio.sleep(0)
        pool.release(held)
        assert await asyncio.wait_for(later, 5) is held and held.in_flight == 1


async def test_failures_set_an_endpoint_aside_only_when_many_and_lasting() -> None:
    async with pool_over([dead_url(), dead_url()]) as pool:
        ep = pool.endpoints[0]
        for _ in range(SET_ASIDE_AFTER * 2):
            pool.record_failure(ep, "HTTP 500")
        assert ep.up  # a quick burst of errors does not pause a server
        pool.record_success(ep)
        assert ep.failures == 0
        for _ in range(SET_ASIDE_AFTER):
            pool.record_failure(ep, "HTTP 500")
        ep.failing_since -= SET_ASIDE_SECONDS  # the same failures, spread over more time
        pool.record_failure(ep, "HTTP 500")
        assert not ep.up
        assert ep.down_reason == f"{SET_ASIDE_AFTER + 1} failures in a row (HTTP 500)"
        assert ep.probe is not None
        for _ in range(5):  # the other endpoint takes the requests meanwhile
            assert await pool.acquire() is pool.endpoints[1]


async def test_a_set_aside_endpoint_comes_back_once_its_health_says_ready() -> None:
    async with ScriptedServer(health=[503]) as server, pool_over([server.url]) as pool:
        ep = pool.endpoints[0]
        pool.set_aside(ep, "HTTP 503 (starting or overloaded)")
        await until(lambda: ep.down_reason == "HTTP 503")
        assert not ep.up
        await until(lambda: ep.up)
        assert ep.down_reason == "" and pool.status == ""
        assert server.gets == ["/health", "/health", "/v1/models"]
        assert await pool.acquire() is ep


async def test_a_probe_that_finds_a_refused_model_keeps_the_endpoint_aside() -> None:
    async with ScriptedServer(models=["other"]) as server, pool_over([server.url]) as pool:
        ep = pool.endpoints[0]
        pool.admit = lambda endpoint, names: None if "mock" in (names or []) else "no mock"
        pool.set_aside(ep, "not answering yet")
        await until(lambda: ep.down_reason == "no mock")
        assert not ep.up
        server.models = ["mock"]
        await until(lambda: ep.up)


async def test_with_every_endpoint_down_a_caller_waits_then_gives_up() -> None:
    async with pool_over([dead_url()], ready_timeout=0.5) as pool:
        ep = pool.endpoints[0]
        pool.set_aside(ep, "cannot connect")
        with pytest.raises(ServerUnavailableError, match=r"no server answered for 0.5s") as err:
            await asyncio.wait_for(pool.acquire(), 10)
        assert ep.name in str(err.value) and "run the same command again" in str(err.value)
        assert pool.status.startswith("waiting for a server")


async def test_a_waiting_caller_gets_the_endpoint_that_comes_back() -> None:
    port = free_port()
    async with pool_over([f"http://127.0.0.1:{port}/v1"]) as pool:
        ep = pool.endpoints[0]
        pool.set_aside(ep, "cannot connect")
        waiting = asyncio.ensure_future(pool.acquire())
        await asyncio.sleep(0.3)
        assert not waiting.done() and "waiting for a server" in pool.status
        async with ScriptedServer(port=port):
            assert await asyncio.wait_for(waiting, 10) is ep
        assert ep.up and pool.status == ""


async def test_start_up_lists_models_and_finds_the_ones_asked_by_name() -> None:
    async with ScriptedServer(models=["a"], named=["b"]) as server, pool_over([server.url]) as pool:
        pool.wanted = ["a", "b", "c"]
        assert await pool.served_models(pool.endpoints[0]) == ["a", "b"]
        assert server.gets == ["/v1/models", "/v1/models/b", "/v1/models/c"]
    async with ScriptedServer(models=None) as server, pool_over([server.url]) as pool:
        assert await pool.served_models(pool.endpoints[0]) is None  # no listing: no check


async def test_start_up_refuses_rejected_credentials() -> None:
    async with ScriptedServer(models_status=401) as server, pool_over([server.url]) as pool:
        with pytest.raises(AuthenticationError, match=r"rejected the credentials \(HTTP 401\)"):
            await pool.served_models(pool.endpoints[0])


async def test_start_up_waits_for_a_server_up_to_the_ready_timeout() -> None:
    async with (
        ScriptedServer(models_status=503) as server,
        pool_over([server.url], ready_timeout=0.6) as pool,
    ):
        with pytest.raises(ServerUnavailableError, match=r"--ready-timeout 0.6s \(last: HTTP"):
            await pool.served_models(pool.endpoints[0])
        assert len(server.gets) >= 2  # asked again after a pause


async def test_preflight_sets_aside_the_silent_endpoints_after_a_grace() -> None:
    async with ScriptedServer() as server, pool_over([server.url, dead_url()]) as pool:
        answered = await pool.preflight(grace=0.2)
        live, dead = pool.endpoints
        assert answered == [(live, ["mock"])]
        assert live.up and not dead.up and dead.down_reason == "not answering yet"


async def test_preflight_checks_the_models_the_requests_ask_for() -> None:
    notes: list[str] = []
    async with ScriptedServer(models=["mock"]) as server, pool_over([server.url]) as pool:
        pools = ModelPools([(PoolSpec(), pool)])
        with pytest.raises(ModelNotServedError) as err:
            await preflight(pools, None, Counter({"gpt-x": 3, "mock": 1}), notes.append)
        assert "model 'gpt-x' (3 requests use it) is not served by" in str(err.value)
        assert "it serves: mock" in str(err.value) and "--model auto" in str(err.value)
        # --model NAME overrides every body's model: only that one must be served
        assert await preflight(pools, "mock", Counter({"gpt-x": 3}), notes.append) == "mock"
        assert notes == []


async def test_preflight_resolves_model_auto_to_the_one_served() -> None:
    notes: list[str] = []
    async with ScriptedServer(models=["qwen"]) as server, pool_over([server.url]) as pool:
        pools = ModelPools([(PoolSpec(), pool)])
        assert await preflight(pools, "auto", Counter({"x": 1}), notes.append) == "qwen"
    assert notes == ["--model auto: using qwen"]
    async with ScriptedServer(models=["a", "b"]) as server, pool_over([server.url]) as pool:
        pools = ModelPools([(PoolSpec(), pool)])
        with pytest.raises(ModelNotServedError, match=r"exactly one model .*; served: a, b"):
            await preflight(pools, "auto", Counter({"x": 1}), notes.append)


async def test_preflight_skips_the_check_for_a_server_without_a_listing() -> None:
    notes: list[str] = []
    async with ScriptedServer(models=None) as server, pool_over([server.url]) as pool:
        pools = ModelPools([(PoolSpec(), pool)])
        assert await preflight(pools, None, Counter({"anything": 2}), notes.append) is None
    assert notes == [f"{pool.endpoints[0].name} lists no models; skipping the model check"]


async def test_an_endpoint_that_comes_up_later_is_admitted_by_the_same_rule() -> None:
    notes: list[str] = []
    async with ScriptedServer(models=["mock"]) as server, pool_over([server.url]) as pool:
        pools = ModelPools([(PoolSpec(), pool)])
        await preflight(pools, None, Counter({"mock": 1}), notes.append)
        late = pool.endpoints[0]
        assert pool.admit(late, ["mock", "other"]) is None
        assert pool.admit(late, None) is None  # no listing: nothing to check
        assert pool.admit(late, ["other"]) == "does not serve 'mock'"
        late.down_reason = "does not serve 'mock'"  # as the probe records it
        assert pool.admit(late, ["other"]) == "does not serve 'mock'"
    assert notes == [f"{late.name} is up but does not serve 'mock'; not using it"]  # once


async def test_model_auto_needs_a_single_pool() -> None:
    async with pool_over([dead_url()]) as one, pool_over([dead_url()]) as two:
        pools = ModelPools([(PoolSpec(models=("a",)), one), (PoolSpec(), two)])
        with pytest.raises(UsageError, match="--model auto needs a single endpoint pool"):
            await preflight(pools, "auto", Counter({"a": 1}), print)

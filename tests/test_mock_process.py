"""The mock server as a process: flags, cold start, kill and restart, signals, clean errors."""

from __future__ import annotations

import signal
import socket
import time

import aiohttp
import pytest
from test_mock import CHAT, HELLO, call, post_json

from jsonlbatch.mock import reply_text


async def test_process_flags_and_env_key(mock_process):
    env = {"JSONLBATCH_MOCK_API_KEY": "sk-from-env"}
    mock = mock_process("--served-model-name", "A", "B", "--max-model-len", "64", env=env)
    assert (await call(mock.url, None, path="/models"))[0] == 401
    auth = {"Authorization": "Bearer sk-from-env"}
    status, models = await post_json(mock.url, None, "/models", headers=auth)
    assert status == 200 and [m["id"] for m in models["data"]] == ["A", "B"]
    assert models["data"][0]["max_model_len"] == 64
    status, out = await post_json(mock.url, {**HELLO, "model": "B"}, headers=auth)
    assert status == 200 and out["choices"][0]["message"]["content"] == reply_text(
        {**HELLO, "model": "B"}
    )
    assert "sk-from-env" not in mock.stderr()


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.mark.slow
async def test_startup_delay_refuses_then_serves(mock_process):
    mock = mock_process("--startup-delay", "2", wait=False)
    assert refused(mock.port)
    assert mock.wait_ready() == f"mock server ready on {mock.url}"
    assert not refused(mock.port)
    assert (await call(mock.url.removesuffix("/v1"), None, path="/health"))[0] == 200


@pytest.mark.slow
async def test_kill_and_restart_on_the_same_port(mock_process):
    mock = mock_process()
    assert (await post_json(mock.url, HELLO))[0] == 200
    port = mock.port
    mock.kill()
    assert refused(port)
    mock.restart()
    assert mock.port == port
    status, out = await post_json(mock.url, HELLO)
    assert status == 200 and out["choices"][0]["message"]["content"] == reply_text(HELLO)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_signals_stop_cleanly(mock_process, sig):
    mock = mock_process("--latency", "0.05")
    async with aiohttp.ClientSession() as session:  # an open keep-alive connection
        async with session.post(mock.url + CHAT, json=HELLO) as resp:
            assert resp.status == 200
        assert mock.send(sig) == 0
    assert "Traceback" not in mock.stderr()


@pytest.mark.slow
def test_signal_during_startup_delay(mock_process):
    mock = mock_process("--startup-delay", "30", wait=False)
    for _ in range(600):  # bounded: until it says it is waiting (30 s at most)
        if "starts listening in 30 s" in mock.stderr():
            break
        time.sleep(0.05)
    assert refused(mock.port)
    assert mock.send(signal.SIGTERM) == 0
    assert "Traceback" not in mock.stderr()


def test_bad_flags_and_busy_port_are_clean_errors(mock_process):
    bad = mock_process("--fail-rate", "2", wait=False)
    assert bad.proc.wait(30) == 2
    assert "Error: --fail-rate must be between 0 and 1" in bad.stderr()
    first = mock_process()
    second = mock_process(wait=False)
    second.port = first.port
    second.restart(wait=False)
    assert second.proc.wait(30) == 2
    err = second.stderr()
    assert "Error: cannot listen on 127.0.0.1" in err and "Traceback" not in err

"""A server whose port another process took between the launcher's pick and the server's bind
is started again on another free port (serve/ports.py), and the run goes on."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from batchutil import read_results, write_requests
from standins.harness import Standins, standin_session, wait_no_survivors, wait_until

import jsonlbatch
from jsonlbatch.errors import LaunchError
from jsonlbatch.serve.launch import ServeOptions, Servers, plan_servers, running
from jsonlbatch.serve.ports import port_of
from jsonlbatch.serve.start import serving

pytestmark = pytest.mark.timeout(120, method="thread")


@pytest.fixture(autouse=True)
def standins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Standins]:
    yield from standin_session(monkeypatch, tmp_path)


def _options(**fields: object) -> ServeOptions:
    settings = {"model_path": "/ckpt/m", "served_model_name": ("m",), "dp_size": 2,
                "dp_mode": "replicas", "gpus": ("0", "1"), "ready_timeout": 60.0}  # fmt: skip
    return ServeOptions("vllm", **{**settings, **fields})  # type: ignore[arg-type]


def test_a_replica_whose_port_was_taken_moves_to_another(
    standins: Standins, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STANDIN_PORT_TAKEN", str(standins.tmp / "taken"))
    requests, output = standins.tmp / "req.jsonl", standins.tmp / "resp.jsonl"
    write_requests(requests, 20, model="m")
    with serving(_options(), log_stem=str(output)) as servers:
        summary = jsonlbatch.execute(requests, output, urls=servers.urls, quiet=True,
                                     watchdog=servers.check)  # fmt: skip
        urls = servers.urls
    assert summary.succeeded == 20 and len(read_results(output)) == 20
    # The first start's port was taken; on this shared machine another pick may be taken too.
    moves = sum(p.moves for p in servers.processes)
    ports = [r["argv"][r["argv"].index("--port") + 1] for r in standins.records(moved=True)]
    assert moves >= 1 and len(ports) == 2 + moves
    final = [url.rsplit(":", 1)[1].removesuffix("/v1") for url in urls]
    assert len(set(final)) == 2 and set(final) <= set(ports)
    taken = re.findall(r"port (\d+) was taken before it could bind it; starting it again on port "
                       r"(\d+)", capsys.readouterr().err)  # fmt: skip
    assert len(taken) == moves and not {old for old, _ in taken} & set(final)
    assert wait_no_survivors(standins.tag) == []  # the squatter went with its server's group


def test_a_server_that_fails_otherwise_is_not_moved(
    standins: Standins, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_CRASH_AT_START", "torch.OutOfMemoryError: CUDA out of memory")
    options = _options(dp_size=1, gpus=("0",))
    with (
        pytest.raises(LaunchError, match="exited with status 1 before it was ready"),
        serving(options, quiet=True, log_stem=str(standins.tmp / "o.jsonl")),
    ):
        pass
    assert len(standins.records()) == 1


@pytest.mark.slow
def test_a_server_of_the_same_model_on_the_taken_port_is_not_taken_for_ours(
    standins: Standins,
) -> None:
    """Another user's server of the same model name takes the port between the pick and our
    server's bind: its answers must not count as ours being ready (nor serve the run)."""
    options = ServeOptions("mock", served_model_name=("m",), ready_timeout=60.0)
    (ours,) = plan_servers(options, log_stem=str(standins.tmp / "o.jsonl"))
    taken = port_of(ours.url)
    foreign = subprocess.Popen(
        [sys.executable, "-m", "jsonlbatch.mock", "--host", "127.0.0.1", "--port", str(taken),
         "--served-model-name", "m"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert wait_until(lambda: _serves(taken))  # the other one serves "m" there
        requests, output = standins.tmp / "req.jsonl", standins.tmp / "resp.jsonl"
        write_requests(requests, 5, model="m")
        servers = Servers(options, [ours], quiet=True)
        with running(servers):
            summary = jsonlbatch.execute(requests, output, urls=servers.urls, quiet=True)
        assert summary.succeeded == 5
        assert ours.moves == 1 and port_of(ours.url) != taken  # ours lost the port: moved
        with urllib.request.urlopen(f"http://127.0.0.1:{taken}/mock/stats", timeout=10) as r:
            sent = orjson.loads(r.read())["requests"]
        assert sent.get("/v1/chat/completions", 0) == 0  # the other server got none of ours
    finally:
        foreign.kill()
        foreign.wait()


def _serves(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
            return b'"m"' in r.read()
    except OSError:
        return False

"""Launching stand-in vLLM/SGLang servers for real: readiness, failures, restarts, teardown."""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from batchutil import read_results, write_requests
from standins.harness import Standins, alive, standin_session, tagged_pids, wait_until

import jsonlbatch
from jsonlbatch.errors import LaunchError
from jsonlbatch.serve.launch import ServeOptions, plan_servers, stop_all
from jsonlbatch.serve.start import serving

SECRET = "sk-launch-test-secret-42"

# The executor may sit in uvloop, which a SIGALRM cannot interrupt: time out from a thread.
pytestmark = pytest.mark.timeout(120, method="thread")


@pytest.fixture(autouse=True)
def standins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Standins]:
    yield from standin_session(monkeypatch, tmp_path)


def _stats(url: str) -> dict:
    root = url.rsplit("/v1", 1)[0]
    with urllib.request.urlopen(f"{root}/mock/stats", timeout=5) as resp:
        return orjson.loads(resp.read())


def test_vllm_replicas_serve_a_run_pinned_to_their_gpus(standins: Standins) -> None:
    requests, output = standins.tmp / "req.jsonl", standins.tmp / "out" / "resp.jsonl"
    output.parent.mkdir()
    write_requests(requests, 40, model="qwen")
    opts = ServeOptions(
        "vllm",
        model_path="/ckpt/qwen",
        served_model_name=("qwen",),
        tp_size=2,
        dp_size=2,
        dp_mode="replicas",
        gpus=("0", "1", "2", "3"),
        api_key=SECRET,
        ready_timeout=60,
    )
    with serving(opts, quiet=True, log_stem=str(output)) as servers:
        assert len(servers.urls) == 2
        summary = jsonlbatch.execute(
            requests,
            output,
            urls=servers.urls,
            api_key=servers.api_key,
            watchdog=servers.check,
            concurrency=8,
            quiet=True,
        )
        served = [_stats(u)["requests"].get("/v1/chat/completions", 0) for u in servers.urls]
    assert summary.failed == 0 and len(read_results(output)) == 40
    assert all(n > 0 for n in served) and sum(served) == 40  # both replicas did work
    records = standins.records()
    assert sorted(r["env"]["CUDA_VISIBLE_DEVICES"] for r in records) == ["0,1", "2,3"]
    for r in records:
        assert r["env"]["VLLM_API_KEY"] == SECRET and SECRET not in " ".join(r["argv"])
        assert r["argv"][1:3] == ["serve", "/ckpt/qwen"]
    logs = sorted(output.parent.glob("resp.jsonl.server-*.log"))
    assert [p.name for p in logs] == ["resp.jsonl.server-0.log", "resp.jsonl.server-1.log"]
    assert all("Uvicorn running" in p.read_text() for p in logs)


def test_sglang_native_dp_waits_through_warmup_and_masks_the_key_in_its_log(
    standins: Standins, monkeypatch: pytest.MonkeyPatch
) -> None:
    # /health answers 503 at first; longer than the launcher's longest probe interval (1 s), so a
    # probe sees it even on a loaded machine
    monkeypatch.setenv("STANDIN_WARMUP", "2.5")
    opts = ServeOptions(
        "sglang", model_path="/ckpt/m", dp_size=2, api_key=SECRET, reasoning_parser="qwen3"
    )
    with serving(opts, quiet=True, log_stem=str(standins.tmp / "o.jsonl")) as servers:
        (url,) = servers.urls
        assert _stats(url)["responses"].get("503", 0) >= 1  # a probe saw it warming up
        request = urllib.request.Request(url + "/models")
        request.add_header("Authorization", f"Bearer {SECRET}")
        with urllib.request.urlopen(request, timeout=5) as resp:
            assert [m["id"] for m in orjson.loads(resp.read())["data"]] == ["/ckpt/m"]
    (record,) = standins.records()
    assert record["argv"][record["argv"].index("--dp-size") + 1] == "2"
    assert "CUDA_VISIBLE_DEVICES" not in record["env"]  # no GPU list known: not pinned
    log = (standins.tmp / "o.jsonl.server.log").read_text()
    assert "api_key='***'" in log and "fired up" in log and SECRET not in log


def test_crash_at_start_shows_the_servers_own_words(
    standins: Standins, monkeypatch: pytest.MonkeyPatch
) -> None:
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    monkeypatch.setenv("STANDIN_CRASH_AT_START", oom)
    monkeypatch.setenv("STANDIN_GRANDCHILD", "1")  # its worker must not outlive it
    with (
        pytest.raises(LaunchError, match="exited with status 1 before it was ready") as info,
        serving(ServeOptions("vllm", model_path="M"), quiet=True),
    ):
        pytest.fail("must not get here")
    assert oom in str(info.value)
    assert "jsonlbatch-vllm.server.log" in str(info.value)


def test_an_unknown_server_flag_fails_with_argparse_message(standins: Standins) -> None:
    opts = ServeOptions("sglang", model_path="M", server_args=("--no-such-flag", "1"))
    with pytest.raises(LaunchError) as info, serving(opts, quiet=True):
        pass
    assert "unrecognized arguments: --no-such-flag 1" in str(info.value)
    assert "exited with status 2" in str(info.value)


def test_ready_timeout_stops_the_slow_server(
    standins: Standins, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_READY_DELAY", "120")
    monkeypatch.setenv("STANDIN_GRANDCHILD", "1")
    opts = ServeOptions("vllm", model_path="M", ready_timeout=1.0)
    expected = r"not ready within --ready-timeout 1s \(cannot connect"
    with pytest.raises(LaunchError, match=expected) as info, serving(opts, quiet=True):
        pass
    # it was started (then taken down: the fixture checks that nothing survives); its log is
    # in a run directory under the temp dir, not in the current one
    log = re.search(r"its log (\S+jsonlbatch-vllm\.server\.log)", str(info.value))[1]
    assert "start 1: vllm serve M" in Path(log).read_text()
    assert not Path("jsonlbatch-vllm.server.log").exists()


@pytest.mark.slow
def test_a_server_dying_mid_run_is_restarted_on_the_same_port(
    standins: Standins, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_CRASH_AFTER", "5")
    monkeypatch.setenv("STANDIN_CRASH_MARKER", str(standins.tmp / "crashed"))
    monkeypatch.setenv("STANDIN_GRANDCHILD", "1")
    requests, output = standins.tmp / "req.jsonl", standins.tmp / "resp.jsonl"
    write_requests(requests, 30, model="M")
    opts = ServeOptions("vllm", model_path="M", restart=1, ready_timeout=60)
    with serving(opts, quiet=True, log_stem=str(output)) as servers:
        summary = jsonlbatch.execute(
            requests, output, urls=servers.urls, watchdog=servers.check, concurrency=4, quiet=True
        )
    assert summary.failed == 0 and len(read_results(output)) == 30
    first, second = standins.records()
    port = first["argv"][first["argv"].index("--port") + 1]
    assert second["argv"][second["argv"].index("--port") + 1] == port
    assert not alive(first["grandchild"])  # the crashed server's worker went with it
    log = (standins.tmp / "resp.jsonl.server.log").read_text()
    assert "illegal memory access" in log and "start 2:" in log


@pytest.mark.slow
def test_a_server_that_keeps_dying_ends_the_run_with_its_log(
    standins: Standins, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_CRASH_AFTER", "3")
    requests, output = standins.tmp / "req.jsonl", standins.tmp / "resp.jsonl"
    write_requests(requests, 30, model="M")
    opts = ServeOptions("vllm", model_path="M", restart=1, ready_timeout=60)
    with pytest.raises(LaunchError) as info, serving(opts, quiet=True) as servers:
        jsonlbatch.execute(
            requests, output, urls=servers.urls, watchdog=servers.check, concurrency=2, quiet=True
        )
    message = str(info.value)
    assert "--restart-server 1 used up" in message and "illegal memory access" in message
    assert len(standins.records()) == 2
    done = read_results(output)  # what finished is kept, whole lines only: a re-run resumes
    assert 0 < len(done) < 30


@pytest.mark.slow
def test_a_restarted_server_that_never_gets_ready_ends_the_run(
    standins: Standins, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 5 s: a first start on a loaded machine can take more than a second
    opts = ServeOptions("vllm", model_path="M", restart=3, ready_timeout=5.0)
    # as on this busy machine, another process takes the first pick's port: a move, no start
    monkeypatch.setenv("STANDIN_PORT_TAKEN", str(standins.tmp / "taken"))
    with serving(opts, quiet=True) as servers:
        (first,) = standins.records()
        os.kill(first["pid"], signal.SIGKILL)  # the server dies; its reaper stays
        monkeypatch.setenv("STANDIN_READY_DELAY", "120")  # the restart will hang loading
        assert wait_until(lambda: servers.processes[0].poll() is not None)
        servers.check()  # restarts it
        assert wait_until(lambda: len(standins.records()) == 2)
        with pytest.raises(
            LaunchError, match=r"server 0 .* not ready within --ready-timeout 5s after a restart"
        ):
            for _ in range(300):  # bounded: about 30 s; the watcher gives up after 5 s
                servers.check()
                time.sleep(0.1)


def test_teardown_on_an_exception_takes_the_whole_group(
    standins: Standins, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_GRANDCHILD", "1")
    opts = ServeOptions("mock", served_model_name=("m",), dp_size=2, dp_mode="replicas")
    with pytest.raises(RuntimeError, match="boom"), serving(opts, quiet=True) as servers:
        pids = [p.pid for p in servers.processes]
        assert all(tagged_pids(standins.tag) for _ in pids)
        raise RuntimeError("boom")
    assert not any(alive(pid) for pid in pids)


@pytest.mark.slow
def test_a_server_ignoring_sigterm_is_killed_after_the_grace(
    standins: Standins, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_IGNORE_SIGTERM", "1")
    monkeypatch.setenv("STANDIN_GRANDCHILD", "stubborn")
    (server,) = plan_servers(ServeOptions("vllm", model_path="M"))
    server.grace = 0.5
    server.start()
    try:
        assert wait_until(lambda: server.probe() is None)
    finally:
        stuck = stop_all([server], grace=0.5)
    assert stuck == [] and server.poll() is not None
    (record,) = standins.records()
    assert not alive(record["pid"]) and not alive(record["grandchild"])


def test_records_are_json_lines(standins: Standins) -> None:
    # the harness itself: a launch writes one record per start, with its process group
    with serving(ServeOptions("vllm", model_path="M"), quiet=True) as servers:
        (record,) = standins.records()
        assert record["pgid"] == servers.processes[0].pid  # the reaper leads the group
        assert os.getpgid(record["pid"]) == record["pgid"]
        os.kill(record["pid"], signal.SIGCONT)  # alive and ours

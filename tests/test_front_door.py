"""The front door: `jsonlbatch.execute`/`aexecute` take every mode of `jsonlbatch exec`, with its
option names, and hand the same `RunSpec` to the same `exec.front_door.start` the command uses.

Real runs against the mock (launched by the run itself with `serve="mock"`, or in-process),
real files; the answers come back typed, by custom_id.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from batchutil import read_results, write_requests
from contractutil import SCHEMA
from test_exec_contract import schema_requests

import jsonlbatch
from jsonlbatch.cli.library import build_spec
from jsonlbatch.errors import UsageError
from jsonlbatch.exec.front_door import EndpointsFiles, Urls
from jsonlbatch.serve.target import Launch


async def test_aexecute_in_a_running_loop_with_a_launched_mock_cache_and_reasks(
    tmp_path: Path,
) -> None:
    """The issue's own line: inside a running loop, a launched server, the cache, re-asks."""
    requests, out, cache = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "cache"
    schema_requests(requests, 8)
    ticks = 0

    async def ticker() -> None:  # the caller's loop keeps running while the run goes on
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    beat = asyncio.ensure_future(ticker())
    try:
        summary = await jsonlbatch.aexecute(
            requests, out, serve="mock", cache=cache, reask=2, quiet=True
        )
    finally:
        beat.cancel()
    assert ticks > 0 and summary.succeeded == 8
    results = summary.results
    assert sorted(results) == sorted(f"r{i}" for i in range(8))
    answer = results["r3"]
    assert answer.ok and answer.valid is True and answer.error is None
    assert answer.value is not None and set(answer.value) == set(SCHEMA["required"])
    assert orjson.loads(answer.text) == answer.value  # the text the value was read from
    assert answer.usage["completion_tokens"] > 0 and not answer.cached
    # the same call into a new file: every answer from the cache, checked, typed the same
    again = await jsonlbatch.aexecute(requests, tmp_path / "b.jsonl", serve="mock",
                                      cache=cache, reask=2, quiet=True)  # fmt: skip
    hit = again.results["r3"]
    assert hit.cached and hit.valid is True and hit.value == answer.value
    assert again.schema_valid == 8


def test_execute_speaks_the_command_lines_names_and_forms(tmp_path: Path, mock_server) -> None:
    url = mock_server()
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 5)
    summary = jsonlbatch.execute(
        requests, out, url=url, header={"X-Trace": "t-1"}, rate_limits=False,
        concurrency=2, quiet=True,
    )  # fmt: skip
    assert summary.succeeded == 5 and len(summary.results) == 5
    assert summary.results["req-0"].text  # the mock's answer
    assert len(read_results(out)) == 5


@pytest.mark.parametrize("batch_api", [False, True])
def test_execute_from_a_worker_thread_runs(tmp_path: Path, mock_server, batch_api: bool) -> None:
    """A web app's handler, a thread pool of runs: signals reach the main thread only, so a
    run started elsewhere leaves them to it (before: `RuntimeError: set_wakeup_fd only works in
    main thread`, from the live and the Batch API run alike)."""
    import threading

    from batchapiutil import BatchServer

    url = mock_server()
    if batch_api:
        url = BatchServer(tmp_path / "state", url).start().url
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 3)
    outcome: list[object] = []
    extra = {"batch_api": True, "poll_interval": 0.1} if batch_api else {}

    def run() -> None:
        try:
            outcome.append(jsonlbatch.execute(requests, out, url=url, quiet=True, **extra))
        except Exception as exc:  # the test's thread sees it
            outcome.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(timeout=60)
    assert not isinstance(outcome[0], Exception), outcome[0]
    assert len(read_results(out)) == 3


def test_an_unknown_option_names_the_nearest(tmp_path: Path) -> None:
    write_requests(tmp_path / "in.jsonl", 1)
    with pytest.raises(UsageError, match="unknown option 'concurency': did you mean 'concurrency'"):
        jsonlbatch.execute(tmp_path / "in.jsonl", tmp_path / "out.jsonl", concurency=4)
    with pytest.raises(UsageError, match="unknown option 'serv': did you mean 'serve'"):
        build_spec(tmp_path / "in.jsonl", tmp_path / "out.jsonl", serv="mock")
    with pytest.raises(UsageError, match="unknown option 'concurrenc'"):
        jsonlbatch.exec.execute(tmp_path / "in.jsonl", tmp_path / "out.jsonl", concurrenc=4)
    assert not (tmp_path / "out.jsonl").exists()


def test_a_bad_value_is_the_commands_message(tmp_path: Path) -> None:
    write_requests(tmp_path / "in.jsonl", 1)
    with pytest.raises(UsageError, match="--max-retries"):
        build_spec(tmp_path / "in.jsonl", tmp_path / "out.jsonl", url="http://127.0.0.1:9/v1",
                   max_retries=-1)  # fmt: skip
    with pytest.raises(UsageError, match="give one of --serve, --fleet and --endpoints"):
        build_spec(tmp_path / "in.jsonl", tmp_path / "out.jsonl", serve="mock",
                   endpoints=[str(tmp_path)])  # fmt: skip


def test_each_mode_is_one_target(tmp_path: Path) -> None:
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 1)
    (tmp_path / "eps.json").write_text('{"mock": ["http://127.0.0.1:9/v1"]}')
    assert build_spec(requests, out, url="http://127.0.0.1:9/v1").target == Urls(
        ("http://127.0.0.1:9/v1",)
    )
    launched = build_spec(requests, out, serve="mock", served_model_name="m")
    assert isinstance(launched.target, Launch) and launched.target.serve.backend == "mock"
    files = build_spec(requests, out, endpoints=tmp_path / "eps.json")
    assert files.target == EndpointsFiles((str(tmp_path / "eps.json"),))
    counted = build_spec(requests, out, url="http://127.0.0.1:9/v1", dry_run=True)
    assert counted.dry_run
    report = jsonlbatch.execute(requests, out, url="http://127.0.0.1:9/v1", dry_run=True)
    assert report.requests == 1 and not out.exists()  # counted, nothing sent or written
    negated = build_spec(requests, out, url="http://127.0.0.1:9/v1", no_schema_check=True)
    assert negated.options.schema_check is False


async def test_cancelling_aexecute_stops_the_run_and_its_server(tmp_path: Path) -> None:
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 40)
    run = jsonlbatch.aexecute(
        requests, out, serve="mock", server_arg="--latency=1", concurrency=2, quiet=True
    )
    task = asyncio.ensure_future(run)
    for _ in range(600):  # until the first answers are written (bounded: 60 s)
        await asyncio.sleep(0.1)
        if out.exists() and out.stat().st_size:
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    written = len(read_results(out))
    assert 0 < written < 40  # stopped partway: no new requests after the cancel
    log = next(tmp_path.glob("out.jsonl*.log"), None)  # the launched mock's log
    summary = await jsonlbatch.aexecute(requests, out, serve="mock", quiet=True)
    assert summary.already_done == written and len(read_results(out)) == 40  # resumed
    assert log is None or log.exists()


def test_the_settings_file_sets_defaults_and_the_librarys_options_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 1)
    settings = tmp_path / "settings.yaml"
    settings.write_text("exec:\n  concurrency: 3\n  max-retries: 5\n")
    monkeypatch.setenv("JSONLBATCH_CONFIG", str(settings))
    monkeypatch.setenv("JSONLBATCH_CACHE", str(tmp_path / "cache"))
    spec = build_spec(requests, out, url="http://127.0.0.1:9/v1", concurrency=7)
    assert spec.options.concurrency == 7 and spec.options.max_retries == 5
    assert spec.options.cache == str(tmp_path / "cache")  # $JSONLBATCH_CACHE, as for the CLI
    off = build_spec(requests, out, url="http://127.0.0.1:9/v1", cache="off")
    assert off.options.cache is None  # `--cache off` wins over $JSONLBATCH_CACHE

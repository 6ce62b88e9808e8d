"""Every `exec` option, from the command line and from `jsonlbatch.execute`: the same run or
the same refusal, for a run on URLs and for a Batch API run (cli/option_use.py's table).

The command line's side parses as `jsonlbatch exec` does (click, then `settled`, then
`spec_from_params`), without starting the run; the library's side is `build_spec`, which
`execute` starts. An option the run's target does not use is refused both ways, in the same
words; from a settings file it is noted once and left out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from jsonlbatch.cli import main
from jsonlbatch.cli.exec import exec_
from jsonlbatch.cli.exec_spec import spec_from_params
from jsonlbatch.cli.library import build_spec
from jsonlbatch.cli.option_use import BATCH, ENDPOINTS, FLEET, LAUNCH, URLS, uses
from jsonlbatch.errors import ServerUnavailableError, UsageError

URL = "http://127.0.0.1:9/v1"

#: One value per option that differs from its default: command line words (a flag alone).
#: `test_the_samples_cover_every_option` fails when an option is added without one.
SAMPLES: dict[str, list[str]] = {
    "urls": ["--url", "http://127.0.0.1:8/v1"],
    "concurrency": ["-c", "4"],
    "model": ["--model", "m"],
    "api_key": ["--api-key", "sk-parity-0123456789"],
    "headers": ["--header", "X-A=1"],
    "timeout": ["--timeout", "30"],
    "max_response_bytes": ["--max-response-bytes", "2MiB"],
    "stream_stall_timeout": ["--stream-stall-timeout", "30"],
    "max_retries": ["--max-retries", "3"],
    "ready_timeout": ["--ready-timeout", "30"],
    "backoff_base": ["--backoff", "2"],
    "retry_failed": ["--retry-failed"],
    "changed": ["--changed", "resend"],
    "shard": ["--shard", "0/2"],
    "stream": ["--stream"],
    "route": ["--route", "least-busy"],
    "order_window": ["--order-window", "8"],
    "balance_abs_threshold": ["--balance-abs-threshold", "3"],
    "balance_rel_threshold": ["--balance-rel-threshold", "2"],
    "rpm": ["--rpm", "60"],
    "tpm": ["--tpm", "1000"],
    "rate_limits": ["--rate-limits", "off"],
    "priority": ["--priority", "1"],
    "price": ["--price", "in=1,out=2"],
    "max_cost": ["--max-cost", "5"],
    "reask": ["--reask", "1"],
    "reask_feedback": ["--reask-feedback"],
    "schema_check": ["--no-schema-check"],
    "fit_context": ["--fit-context"],
    "parse_tool_calls": ["--parse-tool-calls", "hermes"],
    "files_dir": ["--files-dir", "{tmp}/files"],
    "require_files": ["--require-files"],
    "max_file_bytes": ["--max-file-bytes", "1000"],
    "dry_run": ["--dry-run"],
    "cache": ["--cache", "{tmp}/cache"],
    "no_cache": ["--no-cache"],
    "cache_mode": ["--cache-mode", "read"],
    "cache_key_url": ["--cache-key-url"],
    "quiet": ["--quiet"],
    "fleet": ["--fleet", "{tmp}/fleet.yaml"],
    "endpoint_files": ["--endpoints", "{tmp}/endpoints.json"],
    "backend": ["--serve", "mock"],
    "model_path": ["--model-path", "p"],
    "served_model_name": ["--served-model-name", "n"],
    "tp_size": ["--tp-size", "2"],
    "dp_size": ["--dp-size", "2"],
    "dp_mode": ["--dp-mode", "replicas"],
    "gpus": ["--gpus", "0"],
    "host": ["--host", "0.0.0.0"],
    "port": ["--port", "9000"],
    "server_api_key": ["--server-api-key", "srv-parity-0123456789"],
    "gpu_memory_utilization": ["--gpu-memory-utilization", "0.5"],
    "context_length": ["--context-length", "100"],
    "chat_template": ["--chat-template", "t"],
    "reasoning_parser": ["--reasoning-parser", "r"],
    "tool_call_parser": ["--tool-call-parser", "t"],
    "seed": ["--server-seed", "1"],
    "server_args": ["--server-arg", "--x"],
    "executable": ["--server-executable", "vllm"],
    "restart": ["--restart-server", "1"],
    "ray": ["--ray"],
    "ray_address": ["--ray-address", "auto"],
    "log_dir": ["--server-log-dir", "{tmp}/logs"],
    "batch_provider": ["--batch-provider", "anthropic"],
    "completion_window": ["--completion-window", "2h"],
    "batch_metadata": ["--batch-metadata", "k=v"],
    "batch_max_requests": ["--batch-max-requests", "5"],
    "batch_max_bytes": ["--batch-max-bytes", "5000"],
    "price_file": ["--price-file", "{tmp}/prices.yaml"],
    "poll_interval": ["--poll-interval", "0.5"],
    "view": ["--view"],
    "view_address": ["--view-address", "127.0.0.1:1234"],
    "metrics_port": ["--metrics-port", "0"],
    "view_port": ["--view-port", "0"],
    "watch_host": ["--watch-host", "localhost"],
}
#: What chooses the run rather than shapes it, or is about the command itself.
NOT_SAMPLED = {"requests", "output", "batch_api", "config", "help_all"}
#: The option that makes each kind of run.
DEFINES = {LAUNCH: "backend", FLEET: "fleet", ENDPOINTS: "endpoint_files"}
#: Each kind of run: its command line words and the same as `execute`'s arguments.
TARGETS: dict[str, tuple[list[str], dict[str, Any]]] = {
    URLS: (["--url", URL], {"url": URL}),
    BATCH: (["--batch-api", "--url", URL], {"batch_api": True, "url": URL}),
    LAUNCH: (["--serve", "mock"], {"serve": "mock"}),
    FLEET: (["--fleet", "{tmp}/fleet.yaml"], {"fleet": "{tmp}/fleet.yaml"}),
    ENDPOINTS: (["--endpoints", "{tmp}/endpoints.json"], {"endpoints": "{tmp}/endpoints.json"}),
}


def _files(tmp: Path) -> tuple[Path, Path]:
    requests, out = tmp / "in.jsonl", tmp / "out.jsonl"
    requests.write_text(
        '{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", '
        '"body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}\n'
    )
    (tmp / "fleet.yaml").write_text("models:\n  - model_path: m\n    backend: mock\n")
    (tmp / "endpoints.json").write_text('{"m": ["http://127.0.0.1:7/v1"]}')
    (tmp / "prices.yaml").write_text("m: {in: 1, out: 2}\n")
    return requests, out


def _cli(args: list[str]) -> Any:
    """What `jsonlbatch exec ARGS` builds before it starts: its spec, or its refusal."""
    try:
        ctx = exec_.make_context("exec", list(args))
    except click.ClickException as exc:
        return ("refused", exc.format_message())
    try:
        with ctx:
            exec_.settled(ctx)
            params = dict(ctx.params)
            return _shown(spec_from_params(params.pop("requests"), params.pop("output"), params))
    except UsageError as exc:
        return ("refused", str(exc))


def _library(requests: Path, out: Path, options: dict[str, Any]) -> Any:
    try:
        return _shown(build_spec(requests, out, **options))
    except UsageError as exc:
        return ("refused", str(exc))


def _shown(spec: Any) -> Any:
    # targets compare by what they hold (a launch target is no value class)
    return ("run", spec.options, repr(spec.target), spec.dry_run, [type(w) for w in spec.watchers])


def _as_python(name: str, words: list[str]) -> dict[str, Any]:
    """The same option as `execute` takes it: its parameter's name, the value as a string."""
    if name == "schema_check":
        return {"no_schema_check": True}
    return {name: True if len(words) == 1 else words[1]}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OPENAI_API_KEY", "JSONLBATCH_CONFIG", "JSONLBATCH_CACHE",
                "JSONLBATCH_SERVER_API_KEY"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)


def test_the_samples_cover_every_option() -> None:
    names = {p.name for p in exec_.params} - NOT_SAMPLED
    assert names == set(SAMPLES), names ^ set(SAMPLES)


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_option_gives_the_same_run_or_refusal_both_ways(
    tmp_path: Path, clean_env: None, target: str, name: str
) -> None:
    requests, out = _files(tmp_path)
    words = [w.format(tmp=tmp_path) for w in SAMPLES[name]]
    base, python = TARGETS[target]
    base = [] if name == DEFINES.get(target) else [w.format(tmp=tmp_path) for w in base]
    python = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in python.items()}
    from_cli = _cli([str(requests), "-o", str(out), *base, *words])
    if name == "urls" and "url" in python:
        python["url"] = [python["url"], words[1]]
    elif name == DEFINES.get(target):  # the option that makes this kind of run, once
        python = _as_python(name, words)
    else:
        python.update(_as_python(name, words))
    from_python = _library(requests, out, python)
    assert from_cli == from_python, (name, from_cli, from_python)
    if target not in uses(name) and name not in DEFINES.values():  # the table: refused
        assert from_cli[0] == "refused", from_cli
    assert not out.exists()  # nothing ran


@pytest.mark.parametrize(
    ("python", "message"),
    [
        ({"reask": 2}, "--reask does not go with --batch-api"),
        ({"concurrency": 4}, "--concurrency does not go with --batch-api"),
        ({"timeout": 30}, "--timeout does not go with --batch-api"),
        ({"rpm": 60}, "--rpm does not go with --batch-api"),
        ({"route": "least-busy"}, "--route does not go with --batch-api"),
        ({"cache_mode": "read"}, "--cache-mode does not go with --batch-api"),
        ({"tp_size": 2}, "--tp-size does not go with --batch-api"),
    ],
)
def test_batch_api_from_python_refuses_what_it_would_drop(
    tmp_path: Path, clean_env: None, python: dict[str, Any], message: str
) -> None:
    # the issue's own case: `execute(..., batch_api=True, reask=2)` was accepted and dropped
    requests, out = _files(tmp_path)
    with pytest.raises(UsageError, match=message):
        build_spec(requests, out, url=URL, batch_api=True, **python)
    assert not out.exists()


def test_a_batch_option_without_batch_api_is_refused(tmp_path: Path, clean_env: None) -> None:
    requests, out = _files(tmp_path)
    with pytest.raises(
        UsageError, match="--poll-interval is a Batch API option: it needs --batch-api"
    ):
        build_spec(requests, out, url=URL, poll_interval=5)
    result = CliRunner().invoke(
        main, ["exec", str(requests), "-o", str(out), "--url", URL, "--poll-interval", "5"]
    )
    assert result.exit_code == 2 and "--poll-interval is a Batch API option" in result.output
    assert "Traceback" not in result.output


def test_a_default_given_again_is_no_refusal(tmp_path: Path, clean_env: None) -> None:
    requests, out = _files(tmp_path)
    spec = build_spec(requests, out, url=URL, batch_api=True, reask=0, timeout=1800, quiet=True)
    assert spec.options.quiet and type(spec.target).__name__ == "ProviderBatch"


def test_a_settings_files_unused_options_are_noted_once_and_left_out(
    tmp_path: Path, clean_env: None, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    requests, out = _files(tmp_path)
    settings = tmp_path / "settings.yaml"
    settings.write_text("exec:\n  rpm: 60\n  concurrency: 8\n  reask: 1\n  max-retries: 4\n")
    monkeypatch.setenv("JSONLBATCH_CONFIG", str(settings))
    spec = build_spec(requests, out, url=URL, batch_api=True)
    err = capsys.readouterr().err
    assert err.count("note:") == 1 and "--batch-api run: left out" in err
    assert "--rpm" in err and "--concurrency" in err and "--reask" in err
    assert "--max-retries" not in err and spec.options.max_retries == 4  # used: kept
    assert spec.options.rpm is None and spec.options.reask == 0
    # the command line's side: the same note once, and the run goes on (here to a closed port)
    args = [
        "exec",
        str(requests),
        "-o",
        str(out),
        "--url",
        URL,
        "--batch-api",
        "--max-retries",
        "0",
    ]
    result = CliRunner().invoke(main, args)
    assert result.output.count("note:") == 1 and "--batch-api run: left out" in result.output
    assert result.exit_code == 1 and "Traceback" not in result.output  # nothing listens on :9
    refused = CliRunner().invoke(main, [*args, "--rpm", "5"])  # given: refused, not noted
    assert refused.exit_code == 2 and "--rpm does not go with --batch-api" in refused.output


def test_one_public_execute_the_other_a_deprecated_alias(tmp_path: Path, clean_env: None) -> None:
    import jsonlbatch
    import jsonlbatch.exec

    requests, out = _files(tmp_path)
    assert jsonlbatch.execute.__module__ == "jsonlbatch.cli.library"
    # the old names still run (nothing listens on :9)
    with (
        pytest.warns(DeprecationWarning, match="use jsonlbatch.execute"),
        pytest.raises(ServerUnavailableError),
    ):
        jsonlbatch.exec.execute(requests, out, urls=[URL], quiet=True, ready_timeout=0)


def test_seams_a_batch_api_run_would_never_call_are_refused(
    tmp_path: Path, clean_env: None
) -> None:
    from jsonlbatch.exec.hooks.seams import Seams
    from jsonlbatch.exec.route.model_pools import PoolSpec

    requests, out = _files(tmp_path)
    pools = Seams(pools=[PoolSpec(urls=(URL,))])
    with pytest.raises(UsageError, match=r"Seams\(pools=...\) does not go with --batch-api"):
        build_spec(requests, out, url=URL, batch_api=True, seams=pools)
    checked = Seams(check=lambda answer: None, subscribers=[(print, ())])
    assert build_spec(requests, out, url=URL, batch_api=True, seams=checked).seams is checked

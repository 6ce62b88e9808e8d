"""`jsonlbatch exec`: the command and its options; the run they describe is made in
`cli/exec_spec.py` (`spec_from_params`), which `jsonlbatch.execute` shares."""

from __future__ import annotations

import sys
from typing import Any

import click

from jsonlbatch.batch_format.records import PRIORITY_RANGE
from jsonlbatch.cache import MODES as CACHE_MODES
from jsonlbatch.cli.batch_options import (
    BATCH_NAMES,
    batch_api_options,
)
from jsonlbatch.cli.exec_spec import spec_from_params
from jsonlbatch.cli.exec_watch import WATCH_NAMES, add_watch_options
from jsonlbatch.cli.params import (
    BYTES,
    COUNT_OR_AUTO,
    COUNT_OR_ZERO,
    SECONDS,
    SECONDS_OR_ZERO,
    ByteSize,
    CacheDir,
    Finite,
    HttpUrl,
    NonEmpty,
)
from jsonlbatch.cli.sections import Deprecated, Section, Sectioned
from jsonlbatch.cli.serve_options import (
    SERVE_NAMES,
    serve_options,
)
from jsonlbatch.cli.settings import settings_option
from jsonlbatch.errors import Interrupted
from jsonlbatch.exec.exec_options import ExecOptions
from jsonlbatch.exec.front_door import start
from jsonlbatch.exec.hooks.tool_call_parser import PARSERS as TOOL_CALL_PARSERS
from jsonlbatch.exec.output.run_summary import RunSummary
from jsonlbatch.exec.prepare.input_scan import CHANGED_POLICIES
from jsonlbatch.exec.route.router import POLICIES

#: Exit status of a run that finished but recorded failed requests.
EXIT_SOME_FAILED = 3
#: Exit status of a run that --max-cost stopped before every request was sent.
EXIT_BUDGET = 4


_SECTIONS: list[Section] = [
    ("Input and output", ("output", "retry_failed", "changed", "shard", "dry_run", "quiet")),
    ("Sending", ("urls", "model", "api_key", "headers", "concurrency", "priority", "timeout", "stream",
                 "max_response_bytes", "stream_stall_timeout", "fit_context", "reask",
                 "reask_feedback", "schema_check", "parse_tool_calls")),
    ("Retries and limits", ("max_retries", "ready_timeout", "backoff_base", "rpm", "tpm",
                            "rate_limits", "price", "max_cost")),
    ("Routing (several --url)", ("route", "order_window", "balance_abs_threshold",
                                 "balance_rel_threshold")),
    ("Several models (routed by body.model)", ("fleet", "endpoint_files")),
    ("Answer cache", ("cache", "cache_mode", "cache_key_url")),
    ("Hosted code interpreter files", ("files_dir", "require_files", "max_file_bytes")),
    ("Server launch (--serve)", SERVE_NAMES),
    ("Batch API (--batch-api)", BATCH_NAMES),
    ("Watching a run", WATCH_NAMES),
    ("Settings", ("config", "help_all")),
    ("Deprecated (removed in the next release)", ("no_cache", "view_port", "watch_host")),
]  # fmt: skip
#: What `exec --help` shows (at most 40 options, --help included: tests/test_cli_settings.py):
#: the first run's options and every option README.md and docs/*.md use (tests/
#: test_cli_newcomer.py); the rest are tuning knobs, listed by --help-all and set in a
#: settings file (--config).
_BRIEF = (
    "output", "retry_failed", "dry_run", "quiet", "shard",
    "urls", "model", "api_key", "concurrency", "timeout", "stream", "reask", "reask_feedback",
    "max_retries", "price", "max_cost",
    "route",
    "fleet", "endpoint_files",
    "cache", "files_dir", "parse_tool_calls",
    "backend", "model_path", "served_model_name", "tp_size", "dp_size", "dp_mode",
    "context_length", "reasoning_parser", "server_args", "restart", "ray_address",
    "batch_api", "poll_interval",
    "view", "metrics_port",
    "config",
)  # fmt: skip


def _settle(ctx: click.Context) -> None:
    """`--cache off` reaches the run as the old `--no-cache` did (no cache, whatever
    `$JSONLBATCH_CACHE` says)."""
    params = ctx.params
    if params.get("cache") == CacheDir.OFF:
        params["cache"], params["no_cache"] = None, True


_EXAMPLES = (
    "jsonlbatch exec requests.jsonl -o responses.jsonl --url http://localhost:8000/v1 -c 256",
    "jsonlbatch exec requests.jsonl -o responses.jsonl --serve vllm --model-path Qwen/Qwen3-8B",
    "jsonlbatch exec requests.jsonl -o responses.jsonl --serve mock    # try it: no GPU",
    "jsonlbatch exec requests.jsonl -o responses.jsonl --url https://api.openai.com/v1 \\",
    "    --price in=0.15,out=0.60 --max-cost 20                         # exit 4 at the budget",
    "jsonlbatch exec requests.jsonl -o responses.jsonl --dry-run --price in=1,out=4",
    "jsonlbatch exec mixed.jsonl -o responses.jsonl --fleet fleet.yaml   # several models",
)


@click.command(
    "exec", cls=Sectioned, sections=_SECTIONS, examples=_EXAMPLES, brief=_BRIEF, settle=_settle
)
@click.argument("requests", type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False),
    help="Response JSONL; if it exists, requests with a result are skipped (resume).",
)
@click.option(
    "--url",
    "urls",
    multiple=True,
    type=HttpUrl(),
    metavar="URL",
    help="OpenAI-compatible base URL, e.g. http://localhost:8000/v1 (repeat for several).",
)
@click.option(
    "-c",
    "--concurrency",
    type=COUNT_OR_AUTO,
    default=None,
    help="Requests in flight, or auto: tuned per endpoint from the server's load. Default: "
    "auto for launched servers and URLs with vLLM/SGLang /metrics, else 256.",
)
@click.option(
    "--model",
    type=NonEmpty(),
    metavar="NAME|auto",
    help="Override every request's model; 'auto' uses the one the server serves.",
)
@click.option(
    "--api-key",
    envvar="OPENAI_API_KEY",
    show_envvar=True,
    help="Sent as a Bearer token (as `api-key` to Azure OpenAI).",
)
@click.option("--header", "headers", multiple=True, metavar="KEY=VALUE", help="Extra HTTP header.")
@click.option(
    "--timeout",
    type=SECONDS,
    default=ExecOptions.timeout,
    show_default=True,
    metavar="SECONDS",
    help="Per-attempt timeout; long, for reasoning models and cold caches.",
)
@click.option(
    "--max-response-bytes",
    type=BYTES,
    default=ExecOptions.max_response_bytes,
    show_default=ByteSize.text(ExecOptions.max_response_bytes),
    help="Largest answer taken (decoded, streamed or not); a larger one is a "
    "response_too_large failure, not retried.",
)
@click.option(
    "--stream-stall-timeout",
    type=SECONDS,
    default=ExecOptions.stream_stall_timeout,
    show_default=True,
    metavar="SECONDS",
    help="--stream: a stream that sends bytes but no output this long fails (stream_stalled).",
)
@click.option(
    "--max-retries",
    type=COUNT_OR_ZERO,
    default=ExecOptions.max_retries,
    show_default=True,
    metavar="N",
    help="Retries for timeouts, dropped connections, 408/429/5xx.",
)
@click.option(
    "--ready-timeout",
    type=SECONDS_OR_ZERO,
    default=ExecOptions.ready_timeout,
    show_default=True,
    metavar="SECONDS",
    help="How long a refusing or dead server is waited for before giving up.",
)
@click.option(
    "--backoff",
    "backoff_base",
    type=SECONDS_OR_ZERO,
    default=ExecOptions.backoff_base,
    show_default=True,
    metavar="SECONDS",
    help="First retry delay; doubles per attempt (with jitter) up to 8 times itself.",
)
@click.option(
    "--retry-failed",
    is_flag=True,
    help="Re-send requests whose line in the output records a failure.",
)
@click.option(
    "--changed",
    type=click.Choice(CHANGED_POLICIES),
    default=ExecOptions.changed,
    show_default=True,
    help="Requests edited since their result was written (their fingerprint differs): refuse "
    "to run, send them again (replacing their old lines), or keep the old results.",
)
@click.option(
    "--shard",
    metavar="K/N",
    help="Only the K-th of N parts of the input (K from 0), split by the custom_id's group "
    "(a task's samples stay together).",
)
@click.option(
    "--stream",
    is_flag=True,
    help="Stream chat/completions answers to measure TTFT and inter-token latency; the "
    "written bodies are the same as without.",
)
@click.option(
    "--route",
    type=click.Choice(POLICIES),
    default=ExecOptions.route,
    show_default=True,
    help="How requests are spread over several endpoints: 'prefix' sends a prompt to the "
    "server that already cached most of it (unless that server is much busier), "
    "'least-busy' to the fewest in flight, 'round-robin' in turn.",
)
@click.option(
    "--order-window",
    type=COUNT_OR_ZERO,
    default=ExecOptions.order_window,
    show_default=True,
    metavar="N",
    help="With --route prefix: look this many pending requests ahead to send those sharing a "
    "prompt prefix together (0: file order).",
)
@click.option(
    "--balance-abs-threshold",
    type=COUNT_OR_ZERO,
    default=ExecOptions.balance_abs_threshold,
    metavar="N",
    help="With --route prefix: leave the cached server when it has N more requests in flight "
    "than the least busy one ...  [default: auto: half of -c per server, 1 to 16, and never "
    "an idle server]",
)
@click.option(
    "--balance-rel-threshold",
    type=Finite(min=1),
    default=ExecOptions.balance_rel_threshold,
    show_default=True,
    metavar="F",
    help="... and more than F times as many.",
)
@click.option(
    "--rpm",
    type=Finite(min=0, min_open=True),
    metavar="N",
    help="Requests per minute, across all workers and endpoints (a token bucket).",
)
@click.option(
    "--tpm",
    type=Finite(min=0, min_open=True),
    metavar="N",
    help="Tokens per minute: prompt estimate + output cap, corrected by the real usage.",
)
@click.option(
    "--rate-limits",
    type=click.Choice(["on", "off"]),
    default="on" if ExecOptions.rate_limits else "off",
    show_default=True,
    help="Learn limits from OpenAI/Azure/Anthropic rate-limit headers and pace by them, and "
    "slow down on evidence of a limit in 429s; off: only --rpm/--tpm pace the run.",
)
@click.option(
    "--priority",
    type=click.IntRange(*PRIORITY_RANGE),
    metavar="N",
    help="Every request's priority, higher = more important (-1: yield to live traffic at 0); "
    "sent as vLLM's or SGLang's own priority field. A line's 'priority' wins.",
)
@click.option(
    "--price",
    metavar="in=$,out=$",
    help="Dollars per million tokens (as report --price): spend shown while running.",
)
@click.option(
    "--max-cost",
    type=Finite(min=0),
    metavar="USD",
    help="Stop sending once spent + in flight could pass this (whole output file; needs "
    "--price). Exit status 4; the same command with a higher budget resumes.",
)
@click.option(
    "--reask",
    type=COUNT_OR_ZERO,
    default=ExecOptions.reask,
    show_default=True,
    metavar="N",
    help="Ask again, at most N times, when an answer breaks its request's JSON schema "
    "(a fresh sample with a new seed), or with --require-files produced no file.",
)
@click.option(
    "--reask-feedback",
    is_flag=True,
    help="Re-ask as a follow-up turn that quotes the validator's message instead.",
)
@click.option(
    "--schema-check/--no-schema-check",
    default=ExecOptions.schema_check,
    show_default=True,
    help="Check answers against their requests' JSON schemas (off: send and store as is).",
)
@click.option(
    "--parse-tool-calls",
    type=click.Choice(TOOL_CALL_PARSERS),
    metavar="FORMAT",
    help="Read tool calls the model wrote as text into tool_calls before any check: hermes "
    "(<tool_call>{...}</tool_call>, Hermes and Qwen templates), as vLLM's parser does.",
)
@click.option(
    "--fit-context",
    is_flag=True,
    help="A request refused as longer than the model's context: once more with max_tokens "
    "cut to what fits.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Validate and count requests, prompt tokens (tiktoken if installed), output caps "
    "and, with --price, the cost range; send nothing, touch no output.",
)
@click.option(
    "--cache",
    type=CacheDir(),
    help="Answer cache: look each request up before sending, store usable answers (shared by "
    "runs, processes and machines). Default: $JSONLBATCH_CACHE, else none; off: none, "
    "whatever $JSONLBATCH_CACHE says.",
)
@click.option("--no-cache", cls=Deprecated, is_flag=True, instead="--cache off")
@click.option(
    "--cache-mode",
    type=click.Choice(CACHE_MODES),
    default=ExecOptions.cache_mode,
    show_default=True,
    help="read: look up only; write: store only (refresh answers); rw: both.",
)
@click.option(
    "--cache-key-url",
    is_flag=True,
    help="Put the endpoints' URLs in the cache key: only the same servers reuse answers.",
)
@click.option(
    "--files-dir",
    type=click.Path(file_okay=False),
    metavar="DIR",
    help="Collect the files a hosted code interpreter wrote (cited, or listed as the model's) "
    "into DIR/<custom_id>/ as each answer arrives (docs/files.md).",
)
@click.option(
    "--require-files",
    is_flag=True,
    help="With --files-dir: an answer that produced no file fails as no_files (--reask N asks "
    "again with a feedback turn).",
)
@click.option(
    "--max-file-bytes",
    type=click.IntRange(min=1),
    default=ExecOptions.max_file_bytes,
    show_default=True,
    metavar="N",
    help="The largest file --files-dir collects; a larger one fails its request.",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or notes; errors only.")
@click.option(
    "--fleet",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Launch every model of this fleet file for the run; each request goes to the model "
    "its body names (docs/serve.md).",
)
@click.option(
    "--endpoints",
    "endpoint_files",
    multiple=True,
    type=click.Path(exists=True),
    metavar="FILE|DIR",
    help="An endpoints file (model -> URLs, as serve --fleet --endpoints-out writes), or a folder "
    "of them; each request goes to the URLs of the model it names (repeat for several).",
)
@serve_options
@batch_api_options
@add_watch_options
@settings_option("exec")
def exec_(requests: str, output: str, **params: Any) -> None:
    """Send the REQUESTS file (OpenAI Batch JSONL) and write one result line per request.

    Stop it at any time (Ctrl-C, kill -9, power loss): the same command again resumes and
    ends with exactly one line per request. Exit status: 0 all ok, 1 bad input or no server
    (nothing sent, or the output valid to resume), 2 a wrong option, 3 some requests failed
    (their lines say why; --retry-failed sends them again), 4 stopped by --max-cost,
    130 interrupted.
    """
    spec = spec_from_params(requests, output, params)
    try:
        outcome = start(spec)
    except Interrupted as exc:
        if isinstance(exc.summary, RunSummary) and not spec.options.quiet:
            click.echo(exc.summary.format(), err=True)
        raise
    if outcome.dry is not None:
        click.echo(outcome.dry.format())
        return
    summary = outcome.summary
    if not spec.options.quiet or summary.failed or summary.failed_before or summary.budget_stopped:
        click.echo(summary.format(), err=True)
    if summary.budget_stopped:
        sys.exit(EXIT_BUDGET)
    if summary.failed or summary.failed_before:
        again = "send" if isinstance(summary, RunSummary) else "submit"
        click.echo(f"some requests failed; re-run with --retry-failed to {again} them again",
                   err=True)  # fmt: skip
        sys.exit(EXIT_SOME_FAILED)

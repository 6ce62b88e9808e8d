"""`jsonlbatch rollout` and `jsonlbatch.rollout(...)` / `arollout(...)`: conversations with
tools, run to their end on exec's front door.

Every sending option of `exec` is an option here too: the command takes exec's own parameters
(copies of them, so their help, types and defaults are written once, in cli/exec.py), and the
library passes its options through `cli/library.build_spec` as `execute` does. Both build exec's
`RunSpec` for the calls file, with the rollout driver (`jsonlbatch/rollouts/`) as its request
source, and start it with exec's `start`/`astart`.
"""

from __future__ import annotations

import copy
import os
import sys
import types
from collections.abc import Mapping
from typing import Any

import click

from jsonlbatch.batch_format.call_ids import companions
from jsonlbatch.cli.exec import EXIT_BUDGET, EXIT_SOME_FAILED, exec_, spec_from_params
from jsonlbatch.cli.params import SECONDS
from jsonlbatch.cli.sections import Sectioned
from jsonlbatch.errors import Interrupted, UsageError
from jsonlbatch.exec.front_door import RunSpec, astart, start
from jsonlbatch.exec.hooks.seams import Seams
from jsonlbatch.exec.output.run_summary import RunSummary
from jsonlbatch.file_io.output_guard import check_output
from jsonlbatch.rollouts.driver import DEFAULT_MAX_TURNS, DEFAULT_TOOL_TIMEOUT, Rollout
from jsonlbatch.rollouts.rollout_summary import RolloutSummary
from jsonlbatch.rollouts.tools import load_tools

Tools = str | os.PathLike[str] | types.ModuleType | Mapping[str, Any]

#: Conversations held at once, per request allowed in flight (memory is bounded by this).
LIVE_PER_SLOT = 4


def _prepare(
    requests: str,
    output: str,
    tools: Tools,
    max_turns: int,
    tool_timeout: float | None,
) -> tuple[Rollout, str]:
    if requests in ("-", "/dev/stdin"):
        raise UsageError("rollout reads REQUESTS twice: give a file, not standard input")
    calls, journal = companions(output)
    check_output(output, [requests], exec_lock=False)
    check_output(journal, [requests], exec_lock=False)
    if max_turns < 1:
        raise UsageError("--max-turns must be at least 1")
    driver = Rollout(output, load_tools(tools), max_turns=max_turns, tool_timeout=tool_timeout)
    return driver, calls


def _checked(spec: RunSpec, driver: Rollout) -> RunSpec:
    """Refuse what a rollout cannot do; size its live conversations by the concurrency."""
    if not spec.target.uses_job:
        raise UsageError("--batch-api does not go with rollout: each turn needs the last answer")
    if spec.dry_run:
        raise UsageError("--dry-run does not go with rollout: a conversation's turns are not "
                         "known before its answers")  # fmt: skip
    if spec.options.retry_failed:
        raise UsageError("--retry-failed does not go with rollout: a failed call ends its "
                         "conversation as failed; remove its line from the conversations file "
                         "to run it again (its failed turn is sent again)")  # fmt: skip
    if spec.options.changed != "refuse":
        raise UsageError(f"--changed {spec.options.changed} does not go with rollout: an edited "
                         "conversation is refused")  # fmt: skip
    driver.live = LIVE_PER_SLOT * spec.options.fixed_concurrency
    return spec


def rollout(
    requests: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    tools: Tools,
    max_turns: int = DEFAULT_MAX_TURNS,
    tool_timeout: float | None = DEFAULT_TOOL_TIMEOUT,
    handle_signals: bool = True,
    **options: Any,
) -> RolloutSummary:
    """Run each request line as the first turn of a conversation to its end (blocking), with
    `tools` (a TOOLS.py path, a module or a dict of functions), and return the summary. The
    options are `jsonlbatch.execute`'s (`serve="mock"`, `urls=[...]`, `concurrency=`, ...).
    The same call again resumes: no answered call is sent again, no tool that ran runs again."""
    from jsonlbatch.cli.library import build_spec
    from jsonlbatch.exec.job import refuse_running_loop

    refuse_running_loop("jsonlbatch.rollout", "jsonlbatch.arollout")
    driver, calls = _prepare(os.fspath(requests), os.fspath(output), tools, max_turns,
                             tool_timeout)  # fmt: skip
    spec = build_spec(requests, calls, seams=Seams(source=driver), **options)
    outcome = start(_checked(spec, driver), handle_signals=handle_signals)
    driver.summary.run = outcome.summary
    return driver.summary


async def arollout(
    requests: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    tools: Tools,
    max_turns: int = DEFAULT_MAX_TURNS,
    tool_timeout: float | None = DEFAULT_TOOL_TIMEOUT,
    **options: Any,
) -> RolloutSummary:
    """`rollout` inside a running event loop: the run goes on in a worker thread (`astart`);
    cancelling the awaiting task stops it as a first Ctrl-C does."""
    from jsonlbatch.cli.library import build_spec

    driver, calls = _prepare(os.fspath(requests), os.fspath(output), tools, max_turns,
                             tool_timeout)  # fmt: skip
    spec = build_spec(requests, calls, seams=Seams(source=driver), **options)
    outcome = await astart(_checked(spec, driver))
    driver.summary.run = outcome.summary
    return driver.summary


def _own_options() -> list[click.Parameter]:
    return [
        click.Option(
            ["--tools", "tools"], required=True, metavar="TOOLS.py",
            type=click.Path(dir_okay=False),
            help="Python file of tool functions (and the hooks user_turn, new_state, "
            "final_state): docs/rollout.md.",
        ),
        click.Option(
            ["--max-turns"], type=click.IntRange(min=1), default=DEFAULT_MAX_TURNS,
            show_default=True,
            help="Model calls per conversation; one that still calls tools then ends as "
            "max_turns.",
        ),
        click.Option(
            ["--tool-timeout"], type=SECONDS, default=DEFAULT_TOOL_TIMEOUT, show_default=True,
            metavar="S", help="Seconds a tool call may run; then the model is told it timed out.",
        ),
    ]  # fmt: skip


def _exec_options() -> list[click.Parameter]:
    """exec's parameters, copied (their `hidden` is set per command), REQUESTS first."""
    params = [copy.copy(p) for p in exec_.params if p.name != "help_all"]
    for param in params:
        if param.name == "output":
            param.help = ("Conversations JSONL, one line per request line; the calls file and "
                          "the tool journal go beside it (conv.jsonl -> conv.calls.jsonl, "
                          "conv.tools.jsonl). If they exist, the run resumes.")  # fmt: skip
    return params


_EXAMPLES = (
    "jsonlbatch rollout tasks.jsonl -o conv.jsonl --tools tools.py --serve mock",
    "jsonlbatch rollout tasks.jsonl -o conv.jsonl --tools tools.py --url http://localhost:8000/v1 "
    "-c 256",
    "jsonlbatch rollout tasks.jsonl -o conv.jsonl --tools tools.py --fleet fleet.yaml  # an "
    "agent and an expert model",
    "jsonlbatch report conv.calls.jsonl     # every model call, as any exec output",
)
_SECTIONS = [("Rollout", ("tools", "max_turns", "tool_timeout")), *exec_.sections]
_BRIEF = ("tools", "max_turns", "tool_timeout", "output", "quiet", "urls", "model", "api_key",
          "concurrency", "timeout", "max_retries", "price", "max_cost", "fleet",
          "endpoint_files", "cache", "backend", "model_path", "server_args", "parse_tool_calls",
          "config")  # fmt: skip


def _run(requests: str, output: str, tools: str, max_turns: int, tool_timeout: float,
         **params: Any) -> None:  # fmt: skip
    """Run each line of REQUESTS as the first turn of a conversation, to its end: the model's
    tool calls run as Python functions from TOOLS.py, their results go back to it, and its next
    turn is sent as soon as its tools have run.

    Writes CONVERSATIONS (one line per request line, when its conversation ends), the calls
    file beside it (every model call as an exec response line: report, view and export read
    it) and the tool journal. Stop it at any time: the same command resumes, sending no
    answered call again and running no tool that ran. Exit status as exec's: 0 all ended, 1 bad
    input or no server, 2 a wrong option, 3 some conversations failed, 4 stopped by
    --max-cost, 130 interrupted.
    """
    driver, calls = _prepare(requests, output, tools, max_turns, tool_timeout)
    spec = _checked(spec_from_params(requests, calls, params, Seams(source=driver)), driver)
    quiet = spec.options.quiet
    try:
        outcome = start(spec)
    except Interrupted as exc:
        if isinstance(exc.summary, RunSummary) and not quiet:
            click.echo(driver.summary.format(), err=True)
        raise
    summary = driver.summary
    summary.run = outcome.summary
    if not quiet or summary.failed or summary.budget_stopped:
        click.echo(outcome.summary.format(), err=True)
        click.echo(summary.format(), err=True)
    if summary.budget_stopped:
        sys.exit(EXIT_BUDGET)
    if summary.failed:
        click.echo(f"{summary.failed} conversations failed: their lines in {output} say why",
                   err=True)  # fmt: skip
        sys.exit(EXIT_SOME_FAILED)


rollout_command = Sectioned(
    "rollout",
    callback=_run,
    params=[*_exec_options(), *_own_options()],
    sections=_SECTIONS,
    examples=_EXAMPLES,
    brief=_BRIEF,
    settle=exec_.settle,
    help=_run.__doc__,
    short_help="Run each request as a conversation with tools, to its end (agent rollouts).",
)

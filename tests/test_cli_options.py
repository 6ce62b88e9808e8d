"""Every option of every command refuses a bad value with a usage error (exit 2) naming the
option: no traceback, and no value that only fails later on every request (issue 11, item 21)."""

from __future__ import annotations

from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from jsonlbatch.cli import main
from jsonlbatch.cli.params import Finite

_NUMBER_TYPES = (click.types.IntParamType, click.types.FloatParamType)


def _commands(
    group: click.Group, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # the lazy group imports each command here
        command = group.get_command(ctx, name)
        assert command is not None
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name), command


def _numeric_options() -> list[tuple[tuple[str, ...], str]]:
    found = []
    for path, command in _commands(main):
        for param in command.params:
            if isinstance(param, click.Option) and isinstance(param.type, _NUMBER_TYPES):
                found.append((path, param.opts[-1]))
    return found


NUMERIC = _numeric_options()


def run(*args: str) -> click.testing.Result:
    return CliRunner().invoke(main, list(args))


def test_there_are_numeric_options_to_check():
    assert len(NUMERIC) > 20


def test_no_float_option_takes_infinity_or_nan():
    """A bare `float` (or a FloatRange, which takes `inf` when it has no upper bound) lets `inf`
    and `nan` through: every float option uses `Finite`."""
    loose = [
        (path, param.opts[-1])
        for path, command in _commands(main)
        for param in command.params
        if isinstance(param.type, click.types.FloatParamType) and not isinstance(param.type, Finite)
    ]
    assert not loose


@pytest.mark.parametrize(
    ("path", "option"), NUMERIC, ids=[f"{' '.join(p)} {o}" for p, o in NUMERIC]
)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999", "abc", ""])
def test_bad_numbers_are_usage_errors(path, option, value):
    result = run(*path, f"{option}={value}")
    assert result.exit_code == 2, result.output
    assert f"'{option}'" in result.output and "Invalid value for" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("exec", "r.jsonl", "-o", "o.jsonl", "--timeout", "inf"), "'--timeout'"),
        (
            ("exec", "r.jsonl", "-o", "o.jsonl", "--url", "http://127.0.0.1:99999/v1"),
            "Port out of range",
        ),
        (("exec", "r.jsonl", "-o", "o.jsonl", "--url", "http://[::1"), "Invalid IPv6 URL"),
        (("exec", "r.jsonl", "-o", "o.jsonl", "--url", "http://127.0.0.1:0/v1"), "port 0"),
        (("exec", "r.jsonl", "-o", "o.jsonl", "--model", ""), "'--model': must not be empty"),
        (("exec", "r.jsonl", "-o", "o.jsonl", "--model", "  "), "must not be empty"),
        (("exec", "r.jsonl", "-o", "o.jsonl", "--concurrency", "0"), "'-c' / '--concurrency'"),
        (("gen", "-d", "d.jsonl", "-o", "o.jsonl", "--model", ""), "must not be empty"),
        (("gen", "-d", "d.jsonl", "-o", "o.jsonl", "--top-p", "1.5"), "'--top-p'"),
        (("post", "votes", "x", "--weight", "nan"), "'--weight'"),
        (("post", "files", "x", "--memory-mb", str(1 << 40)), "'--memory-mb'"),
        (
            ("serve", "--backend", "mock", "--gpu-memory-utilization", "0"),
            "--gpu-memory-utilization",
        ),
    ],
)
def test_named_bad_values_are_usage_errors(args, message):
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_a_normalizer_that_returns_no_string_is_a_usage_error(tmp_path):
    responses = tmp_path / "r.jsonl"
    responses.write_text(
        '{"custom_id":"q|1","response":{"status_code":200,"body":{"choices":[{"index":0,'
        '"message":{"role":"assistant","content":"\\\\boxed{4}"},"finish_reason":"stop"}]}},'
        '"error":null}\n'
    )
    for spec, message in (
        ("builtins:len", "must return a string, returned int"),
        ("ipaddress:ip_address", "failed on '4': ValueError"),
    ):
        result = run(
            "post", "votes", str(responses), "-o", str(tmp_path / "v.jsonl"), "--normalize", spec
        )
        assert result.exit_code == 2, (spec, result.output)
        assert message in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("exec", "r.jsonl", "-o", "o.jsonl", "--serve", "mock", '--server-executable="'),
            "No closing quotation",
        ),
        (
            ("exec", "r.jsonl", "-o", "o.jsonl", "--serve", "mock", '--server-arg="'),
            "No closing quotation",
        ),
        (
            ("exec", "r.jsonl", "-o", "o.jsonl", "--serve", "mock", "--host="),
            "'--host': must not be empty",
        ),
        (("post", "votes", "x", "--normalize", "::"), None),
    ],
)
def test_more_values_that_gave_tracebacks(args, message, tmp_path):
    """Found beyond the issue's list: unbalanced quotes in server command parts, an empty bind
    address (which would bind every interface), a normalizer spec importlib cannot parse."""
    if args[0] == "post":
        responses = tmp_path / "r.jsonl"
        responses.write_text(
            '{"custom_id":"q","response":{"status_code":200,"body":{"choices":[{"index":0,'
            '"message":{"role":"assistant","content":"4"},"finish_reason":"stop"}]}},"error":null}\n'
        )
        args = ("post", "votes", str(responses), "-o", str(tmp_path / "v.jsonl"), *args[3:])
        message = "cannot load normalizer '::'"
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_the_lazy_command_table_matches_the_commands():
    """`jsonlbatch --help` lists the commands from `cli.COMMANDS` without importing them: each
    entry must name the command it loads and carry that command's own summary."""
    from jsonlbatch.cli import COMMANDS

    ctx = click.Context(main)
    assert main.list_commands(ctx)[:6] == ["gen", "exec", "post", "report", "export", "run"]
    for name, (_, _, summary) in COMMANDS.items():
        command = main.get_command(ctx, name)
        assert command is not None and command.name == name
        short = click.Command(name, help=summary).get_short_help_str(1000)
        assert command.get_short_help_str(1000) == short, name
    assert "view" in run("--help").output.split("Commands:")[1]


def test_every_command_help_has_examples_and_sections_that_hold_every_option():
    """Issue 26: `exec --help` listed about 65 options in one flat list, with no example."""
    from jsonlbatch.cli.sections import Sectioned

    for path, command in _commands(main):
        if path == ("post", "render-schema"):
            continue  # no options, nothing to show by example
        assert isinstance(command, Sectioned), path
        text = run(*path, "--help").output
        assert "\nExamples:\n  jsonlbatch " + " ".join(path) in text, path
        if command.sections:  # every option sits in a section: only --help is left over
            named = {n for _, names in command.sections for n in names}
            options = {p.name for p in command.params if isinstance(p, click.Option)}
            assert options <= named, (path, sorted(options - named))
    text = run("exec", "--help").output
    titles = ["Input and output:", "Sending:", "Retries and limits:", "Routing (several --url):",
              "Server launch (--serve):", "Batch API (--batch-api):"]  # fmt: skip
    found = [text.index(t) for t in titles]
    assert found == sorted(found)
    assert "--max-cost" in text[text.index("Retries and limits:") : text.index("Routing")]


def test_top_level_help_lists_the_pipeline_first_with_whole_summaries():
    text = run("--help").output.split("Commands:")[1]
    assert "..." not in text
    order = [line.split()[0] for line in text.splitlines() if line.startswith("  ") and
             not line.startswith("   ")]  # fmt: skip
    assert order[:6] == ["gen", "exec", "post", "report", "export", "run"]
    assert "deliverable files" in text and "plain files under RUNS/<experiment id>/" in text


def test_an_option_typed_short_suggests_the_options_it_begins():
    result = run("gen", "--temp", "0.5")
    assert result.exit_code == 2
    assert "No such option '--temp'. Did you mean '--template', '--temperature'?" in result.output


@pytest.mark.parametrize(
    ("given", "named"),
    [
        (["--cache", "answers"], "--cache"),
        (["--reask", "2"], "--reask"),
        (["--reask-feedback"], "--reask-feedback"),
        (["--priority", "3"], "--priority"),
        (["--fleet", "fleet.yaml"], "--fleet"),
        (["--endpoints", "endpoints.json"], "--endpoints"),
        (["--stream"], "--stream"),
    ],
)
def test_live_only_options_are_refused_with_batch_api(tmp_path, given, named):
    # a Batch API run would ignore them (the cache looked nothing up, nothing was re-asked)
    requests = tmp_path / "req.jsonl"
    requests.write_text("")
    (tmp_path / "endpoints.json").write_text("{}")
    out = tmp_path / "out.jsonl"
    args = ["exec", str(requests), "-o", str(out), "--batch-api", "--url", "http://127.0.0.1:9/v1"]
    given = [str(tmp_path / g) if g[0] != "-" and not g.isdigit() else g for g in given]
    result = CliRunner().invoke(main, [*args, *given])
    assert result.exit_code == 2, result.output
    assert f"Error: {named} does not go with --batch-api" in result.output
    assert "Traceback" not in result.output and not out.exists()
    assert not (tmp_path / "answers").exists()


def test_concurrency_names_both_forms_when_neither_is_given(tmp_path):
    requests = tmp_path / "req.jsonl"
    requests.write_text("")
    for bad in ("autoo", "0", "-3"):
        result = run("exec", str(requests), "-o", str(tmp_path / "o.jsonl"), "-c", bad)
        assert result.exit_code == 2
        assert f"{bad!r}: give a number of at least 1, or auto" in result.output, result.output

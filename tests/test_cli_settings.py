"""A smaller `exec --help` (issue 36, item 4; 40 since issue 45): at most 40 options shown, every option listed by
`--help-all`, the tuning knobs set in a settings file (`--config`, `$JSONLBATCH_CONFIG`) that
is checked like any input, each default written once, and the old spellings kept for one
release with a note on stderr."""

from __future__ import annotations

import dataclasses
import re

import click
import pytest
from batchutil import ENV, click_runner, exec_cli, read_results, write_requests

from jsonlbatch.cli import main
from jsonlbatch.cli.exec import exec_
from jsonlbatch.exec.exec_options import ExecOptions

#: An option's row in a help: two spaces, then its first spelling (`-o, --output`, `--url`).
_ROW = re.compile(r"^  (-\w, )?--[\w-]+", re.MULTILINE)


def _help(*args: str) -> str:
    result = click_runner().invoke(main, ["exec", *args], env={"JSONLBATCH_CONFIG": None})
    assert result.exit_code == 0, result.output
    return result.output


def test_exec_help_shows_at_most_40_options():
    """30 until issue 45: the options README.md and docs/*.md use show too
    (tests/test_cli_newcomer.py), the server launch's among them."""
    text = _help("--help")
    rows = _ROW.findall(text)
    assert 20 <= len(rows) <= 40, len(rows)
    assert "--help-all" in text and "--config FILE" in text
    for knob in ("--order-window", "--stream-stall-timeout", "--backoff", "--cache-mode",
                 "--balance-rel-threshold", "--max-response-bytes", "--no-cache"):  # fmt: skip
        assert knob not in text, knob


def test_help_all_lists_every_option_and_the_deprecated_ones_apart():
    text = _help("--help-all")
    options = [p for p in exec_.params if isinstance(p, click.Option)]
    for option in options:
        for spelling in option.opts:
            assert re.search(rf"(^|[ ,]){re.escape(spelling)}\b", text, re.M), spelling
    assert len(_ROW.findall(text)) == len(options) + 1  # and --help
    deprecated = text[text.index("Deprecated (removed in the next release):") :]
    assert "--no-cache" in deprecated and "Use --cache off instead." in deprecated
    assert "--view-port" in deprecated and "--watch-host" in deprecated


def test_every_default_is_the_one_execoptions_has():
    """Defaults were written twice (click and ExecOptions): 64MiB here, MAX_RESPONSE_BYTES
    there. Now click takes them from ExecOptions."""
    ctx = click.Context(exec_)
    fields = {f.name: f for f in dataclasses.fields(ExecOptions)}
    checked = 0
    for param in exec_.params:
        field = fields.get(str(param.name))
        if field is None or field.default is dataclasses.MISSING or param.multiple:
            continue
        default = param.get_default(ctx)
        if default is None or not isinstance(default, (int, float, str, bool)):
            continue  # no default (None, or click's UNSET): nothing written twice
        if param.name == "rate_limits":
            default = default == "on"
        if param.name == "concurrency" or param.name == "cache":
            continue  # "auto"/None and $JSONLBATCH_CACHE: resolved later, documented as such
        assert default == field.default, (param.name, default, field.default)
        checked += 1
    assert checked >= 12


def _invoke(requests, output, *args: str, env: dict | None = None) -> click.testing.Result:
    """exec in this process: the checks of options and settings, which come before any run."""
    argv = ["exec", str(requests), "-o", str(output), *args]
    return click_runner().invoke(main, argv, env={"JSONLBATCH_CONFIG": None, **(env or {})})


def _requests(tmp_path, count=3):
    write_requests(tmp_path / "req.jsonl", count)
    return tmp_path / "req.jsonl"


def test_a_settings_file_sets_a_hidden_knob_by_config_and_by_env(tmp_path, mock_server):
    url = mock_server(default_max_tokens=400)  # answers of about 2 KB
    req = _requests(tmp_path)
    settings = tmp_path / "settings.yaml"
    settings.write_text(
        f"# the tuning knobs of this project\nexec:\n  url: {url}\n"
        "  max-response-bytes: 1KiB\n  max-retries: 0\n"
    )
    by_option = exec_cli(req, tmp_path / "a.jsonl", "--config", str(settings))
    assert by_option.returncode == 3, by_option.stderr
    lines = read_results(tmp_path / "a.jsonl")
    assert {line["error"]["code"] for line in lines.values()} == {"response_too_large"}

    env = {**ENV, "JSONLBATCH_CONFIG": str(settings)}
    by_env = exec_cli(req, tmp_path / "b.jsonl", env=env)
    assert by_env.returncode == 3, by_env.stderr
    assert {x["error"]["code"] for x in read_results(tmp_path / "b.jsonl").values()} == {
        "response_too_large"
    }

    # the command line wins over the file, --config over the variable
    wins = exec_cli(req, tmp_path / "c.jsonl", "--max-response-bytes", "1MiB", env=env)
    assert wins.returncode == 0, wins.stderr
    other = tmp_path / "other.yaml"
    other.write_text(f"exec:\n  url: [{url}]\n")
    chosen = exec_cli(req, tmp_path / "d.jsonl", "--config", str(other), env=env)
    assert chosen.returncode == 0, chosen.stderr
    assert "Note:" not in chosen.stderr and "Traceback" not in chosen.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "exec:\n  order_window: 3\n",
            "settings.yaml:2: exec.order_window: unknown key; did you mean 'order-window'?",
        ),
        (
            "exec:\n  timeout: 30\n  stream-stall-timout: 5\n",
            "settings.yaml:3: "
            "exec.stream-stall-timout: unknown key; did you mean 'stream-stall-timeout'?",
        ),
        (
            "exec:\n  order-window: '64'\n",
            "settings.yaml:2: exec.order-window: must be a integer, got str '64'",
        ),
        ("exec:\n  stream: yes please\n", "settings.yaml:2: exec.stream: must be a boolean"),
        ("exec:\n  backoff: -1\n", "settings.yaml:2: exec.backoff: -1.0 is not in the range"),
        (
            "exec:\n  max-response-bytes: -1\n",
            "settings.yaml:2: exec.max-response-bytes: -1 must be between 1KiB and 1TiB",
        ),
        ("exec:\n  route: fastest\n", "settings.yaml:2: exec.route: 'fastest' is not one of"),
        ("exce:\n  timeout: 3\n", "settings.yaml:1: exce: unknown key; did you mean 'exec'?"),
        ("exec:\n  no-cache: true\n", "settings.yaml:2: exec.no-cache: unknown key"),
        ("exec: [1, 2]\n", "settings.yaml:1: exec: must be a mapping"),
        ("exec:\n  timeout: 3\n  timeout: 4\n", "settings.yaml:3: exec.timeout: appears twice"),
        ("exec: {timeout: [1\n", "not a YAML file"),
    ],
)
def test_a_bad_settings_file_is_a_clean_error_with_file_and_line(tmp_path, text, expected):
    req = _requests(tmp_path, 1)
    settings = tmp_path / "settings.yaml"
    settings.write_text(text)
    out = tmp_path / "out.jsonl"
    out.write_text("")  # an existing output is left as it is
    done = _invoke(req, out, "--url", "http://127.0.0.1:9/v1", "--config", str(settings))
    assert done.exit_code == 1, done.output
    assert expected in done.stderr.replace(str(tmp_path) + "/", ""), done.stderr
    assert done.exception is None or isinstance(done.exception, SystemExit)
    assert out.read_text() == ""


def test_a_missing_settings_file_named_by_the_variable_says_so(tmp_path):
    env = {"JSONLBATCH_CONFIG": str(tmp_path / "nope.yaml")}
    done = _invoke(_requests(tmp_path, 1), tmp_path / "o.jsonl", env=env)
    assert done.exit_code == 1
    assert "cannot read settings file ($JSONLBATCH_CONFIG)" in done.stderr, done.stderr
    assert "nope.yaml" in done.stderr and "Traceback" not in done.stderr


def test_yaml_off_and_server_settings_in_a_file_shared_with_serve(tmp_path, mock_server):
    """`cache: off` unquoted is YAML's boolean false: read as the word. Server options in the
    file are defaults for runs that launch one, no mistake in a run that does not."""
    url = mock_server()
    req = _requests(tmp_path, 2)
    settings = tmp_path / "s.yaml"
    settings.write_text("exec:\n  cache: off\n  rate-limits: off\n  tp-size: 2\n  gpus: '0,1'\n")
    env = {**ENV, "JSONLBATCH_CACHE": str(tmp_path / "cache")}
    done = exec_cli(req, tmp_path / "o.jsonl", "--url", url, "--config", str(settings), env=env)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "cache").exists()  # off won over the variable


def test_cache_off_replaces_no_cache_which_still_works_with_a_note(tmp_path, mock_server):
    url = mock_server()
    req = _requests(tmp_path, 2)
    env = {**ENV, "JSONLBATCH_CACHE": str(tmp_path / "cache")}
    new = exec_cli(req, tmp_path / "a.jsonl", "--url", url, "--cache", "off", env=env)
    assert new.returncode == 0, new.stderr
    assert "deprecated" not in new.stderr and not (tmp_path / "cache").exists()
    old = exec_cli(req, tmp_path / "b.jsonl", "--url", url, "--no-cache", env=env)
    assert old.returncode == 0, old.stderr
    assert not (tmp_path / "cache").exists()
    assert (
        "Note: --no-cache is deprecated and goes in the next release; use --cache off."
        in old.stderr
    )
    assert "Traceback" not in old.stderr and "cache" not in read_results(tmp_path / "b.jsonl")[
        "req-0"
    ].get("metrics", {})
    # and a folder named off is still a folder: ./off
    folder = exec_cli(req, tmp_path / "c.jsonl", "--url", url, "--cache", str(tmp_path / "off"))
    assert folder.returncode == 0 and (tmp_path / "off").is_dir(), folder.stderr


def test_view_port_and_watch_host_still_work_with_a_note(tmp_path, mock_server):
    from conftest import free_port

    url = mock_server()
    port = free_port()
    old = ("--watch-host", "127.0.0.1", "--view-port", str(port))
    done = exec_cli(_requests(tmp_path, 1), tmp_path / "o.jsonl", "--url", url, "--view", *old)
    assert done.returncode == 0, done.stderr
    assert f"view: http://127.0.0.1:{port}/" in done.stderr, done.stderr
    for spelling in old[::2]:
        assert f"Note: {spelling} is deprecated" in done.stderr
    assert "Traceback" not in done.stderr


def test_view_address_is_the_one_option_for_the_view_address(tmp_path, mock_server):
    from conftest import free_port

    url = mock_server()
    port = free_port()
    done = exec_cli(_requests(tmp_path, 1), tmp_path / "o.jsonl", "--url", url, "--view",
                    "--view-address", f"127.0.0.1:{port}")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"view: http://127.0.0.1:{port}/" in done.stderr and "Note:" not in done.stderr
    for bad in ("127.0.0.1:99999", "host:port", "[::1", ""):
        refused = _invoke(tmp_path / "r.jsonl", tmp_path / "o.jsonl", "--view-address", bad)
        assert refused.exit_code == 2 and "'--view-address'" in refused.stderr, refused.output


def test_deprecated_options_are_hidden_and_name_their_replacement():
    from jsonlbatch.cli.sections import Deprecated

    deprecated = [p for p in exec_.params if isinstance(p, Deprecated)]
    assert {p.opts[0] for p in deprecated} == {"--no-cache", "--view-port", "--watch-host"}
    assert all(p.hidden and p.instead.startswith("--") for p in deprecated)


def test_the_documented_example_settings_file_reads_as_documented(tmp_path):
    """examples/settings.yaml (README, docs/exec.md) is read without a problem; its paths are
    the file's folder's, `~` expanded."""
    from pathlib import Path

    from jsonlbatch.cli.settings import read_settings

    example = Path(__file__).parent.parent / "examples" / "settings.yaml"
    values = read_settings(str(example), "exec", exec_, click.Context(exec_))
    assert values["urls"] == ("http://node1:8000/v1", "http://node2:8000/v1")
    assert values["order_window"] == 1024 and values["max_response_bytes"] == 64 << 20
    assert values["rate_limits"] == "on" and values["gpus"] == "0,1"
    assert values["cache"] == str(Path("~/answers").expanduser())
    relative = tmp_path / "s.yaml"
    relative.write_text("exec:\n  cache: answers\n  endpoints: [e.json]\n")
    (tmp_path / "e.json").write_text("{}")
    values = read_settings(str(relative), "exec", exec_, click.Context(exec_))
    assert values["cache"] == str(tmp_path / "answers")
    assert values["endpoint_files"] == (str(tmp_path / "e.json"),)


def test_a_special_file_as_settings_is_refused_before_it_is_read(tmp_path):
    """A FIFO would hang the command and /dev/zero fill its memory."""
    import os

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    big = tmp_path / "big.yaml"
    big.write_text("exec:\n" + "# padding\n" * 200_000)
    for path, said in ((fifo, "is not a regular file"), ("/dev/zero", "is not a regular file"),
                       (big, "is larger than 1 MiB")):  # fmt: skip
        done = _invoke(tmp_path / "r.jsonl", tmp_path / "o.jsonl", "--config", str(path))
        assert done.exit_code == 1 and said in done.stderr, done.output


def test_serve_help_is_brief_too_and_serve_reads_its_own_section(tmp_path):
    """`serve` had 37 options in its --help; its knobs (server log dir, Ray, the batch front's
    limits, ...) move to --help-all and a settings file's `serve:` section."""
    import signal
    import urllib.request

    from batchutil import start_cli

    result = click_runner().invoke(main, ["serve", "--help"], env={"JSONLBATCH_CONFIG": None})
    assert len(_ROW.findall(result.output)) <= 30 and "--server-log-dir" not in result.output
    every = click_runner().invoke(main, ["serve", "--help-all"], env={"JSONLBATCH_CONFIG": None})
    assert "--server-log-dir" in every.output and "--ray-address" in every.output

    settings = tmp_path / "conf" / "settings.yaml"
    settings.parent.mkdir()
    settings.write_text(
        "exec:\n  timeout: 5\nserve:\n  backend: mock\n  served-model-name: [m]\n"
        "  server-log-dir: logs\n"
    )
    proc = start_cli("serve", "--config", str(settings))
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.stderr else ""
    with urllib.request.urlopen(url + "/models", timeout=10) as resp:
        assert b'"id":"m"' in resp.read()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0
    assert [p.name for p in (tmp_path / "conf" / "logs").iterdir()]  # beside the file


def test_a_settings_file_for_live_runs_does_not_stop_a_batch_api_run(tmp_path, mock_server):
    """A cache, re-asks and --stream in the file are defaults for live runs (as
    $JSONLBATCH_CACHE is): --batch-api leaves them alone; on its command line it refuses them."""
    from batchapiutil import BatchServer

    server = BatchServer(tmp_path / "state", mock_server()).start()
    req = _requests(tmp_path, 3)
    settings = tmp_path / "s.yaml"
    settings.write_text(
        "exec:\n  cache: answers\n  reask: 2\n  stream: true\n  poll-interval: 0.1\n"
    )
    done = exec_cli(req, tmp_path / "o.jsonl", "--batch-api", "--url", server.url,
                    "--config", str(settings))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(read_results(tmp_path / "o.jsonl")) == 3 and not (tmp_path / "answers").exists()
    refused = exec_cli(req, tmp_path / "p.jsonl", "--batch-api", "--url", server.url, "--stream",
                       "--config", str(settings))  # fmt: skip
    assert refused.returncode == 2 and "--stream does not go with --batch-api" in refused.stderr


def test_a_secret_in_a_settings_file_is_never_quoted(tmp_path):
    settings = tmp_path / "s.yaml"
    settings.write_text("exec:\n  api-key: 918273645546372819\n  header: [3141592653589793]\n")
    done = _invoke(tmp_path / "r.jsonl", tmp_path / "o.jsonl", "--config", str(settings))
    assert done.exit_code == 1, done.output
    assert "s.yaml:2: exec.api-key: *** must be a string, got int" in done.stderr, done.stderr
    assert "s.yaml:3: exec.header: (secret) must be a string, got int" in done.stderr
    assert "918273645546372819" not in done.output and "3141592653589793" not in done.output


def test_the_command_line_chooses_the_kind_of_run_over_the_settings_file(tmp_path, mock_server):
    """A settings file's `fleet:` is a default like any other: `--url` on the command line
    makes a run on that URL, the file's fleet left out with a note (before: "--url goes with
    --serve or alone: a fleet's URLs come from its file", exit 2)."""
    url = mock_server()
    req = _requests(tmp_path, 2)
    settings = tmp_path / "s.yaml"
    settings.write_text("exec:\n  fleet: fleet.yaml\n  endpoints: [eps.yaml]\n")
    (tmp_path / "fleet.yaml").write_text("models: []\n")
    (tmp_path / "eps.yaml").write_text("[]\n")
    done = exec_cli(req, tmp_path / "o.jsonl", "--url", url, "--config", str(settings))
    assert done.returncode == 0, done.stderr
    assert "note: --fleet, --endpoints from the settings file: the command line chose" in (
        done.stderr
    )
    assert len(read_results(tmp_path / "o.jsonl")) == 2
    # the file's kind stays the default when the command line names none
    alone = exec_cli(req, tmp_path / "p.jsonl", "--config", str(settings))
    assert alone.returncode == 2 and "give one of --serve, --fleet and --endpoints" in alone.stderr

"""What a newcomer meets first (issue 45, item 5): the help shows the options the README and the
docs use, errors name the right option and command, a settings file's keys are checked in
every section and named by their command, and the file `$JSONLBATCH_CONFIG` applies is named."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from batchutil import ENV, cli, write_requests

from jsonlbatch.cli import main

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def documented_uses() -> dict[tuple[str, ...], set[tuple[str, str]]]:
    """(command[, subcommand]) -> {(option, file)} for every `jsonlbatch CMD ... --option` in
    the README and docs/*.md (continued lines joined; quoted values, which pass flags on to a
    server, and anything after a pipe or a comment left out)."""
    ctx = click.Context(main)
    uses: dict[tuple[str, ...], set[tuple[str, str]]] = {}
    for doc in DOCS:
        text = re.sub(r"\\\n", " ", doc.read_text())
        for m in re.finditer(r"jsonlbatch ([a-z][a-z-]*)((?: [a-z][a-z-]*)?)([^\n`|;&#]*)", text):
            name, sub, rest = m.group(1), m.group(2).strip(), m.group(3)
            command = main.get_command(ctx, name)
            if command is None:
                continue  # prose ("jsonlbatch is a toolkit")
            if not isinstance(command, click.Group) or sub not in command.commands:
                rest, sub = m.group(2) + rest, ""
            rest = re.sub(r"'[^']*'|\"[^\"]*\"", "", rest)
            key = (name, sub) if sub else (name,)
            for option in re.findall(r"(?<![\w=-])(--[a-z][a-z0-9-]*)", rest):
                uses.setdefault(key, set()).add((option, doc.name))
    return uses


def test_every_option_the_readme_and_docs_use_is_in_plain_help() -> None:
    uses = documented_uses()
    assert ("exec",) in uses and ("serve",) in uses and len(uses) >= 8
    assert ("--server-arg", "README.md") in uses[("exec",)]  # the quick start's
    missing = []
    for key, options in sorted(uses.items()):
        shown = cli(*key, "--help").stdout
        for option, doc in sorted(options):
            if not re.search(re.escape(option) + r"(?![\w-])", shown):
                missing.append(f"{' '.join(key)} {option} ({doc})")
    assert missing == [], missing


def test_serve_batch_api_upstream_port_names_batch_port() -> None:
    proc = cli("serve", "--batch-api", "--upstream", "http://127.0.0.1:9/v1", "--port", "9000")
    assert proc.returncode == 2, proc.stderr
    assert "--batch-port" in proc.stderr and "--serve mock" not in proc.stderr
    assert "`serve`" in proc.stderr and "Traceback" not in proc.stderr
    # another launch option without a backend names serve's own spelling, --backend
    proc = cli("serve", "--batch-api", "--upstream", "http://127.0.0.1:9/v1", "--tp-size", "2")
    assert "--tp-size is an option of a server `serve` launches" in proc.stderr
    assert "needs --backend" in proc.stderr and "--serve" not in proc.stderr


def test_report_html_suggests_format_html(tmp_path: Path) -> None:
    (tmp_path / "r.jsonl").write_text("")
    proc = cli("report", str(tmp_path / "r.jsonl"), "--html")
    assert proc.returncode == 2
    assert (
        "Did you mean '--format html'?" in proc.stderr
        and "--help" not in proc.stderr.split("Error:")[-1]
    )


def settings(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "settings.yaml"
    path.write_text(text)
    return path


def test_a_key_of_another_command_is_named_as_that_commands(tmp_path: Path) -> None:
    requests = tmp_path / "in.jsonl"
    write_requests(requests, 1)
    path = settings(tmp_path, "exec:\n  timeout: 30\n  batch-port: 9000\n  sla: 2s\n")
    proc = cli("exec", str(requests), "-o", str(tmp_path / "o.jsonl"), "--config", str(path),
               "--dry-run")  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "settings.yaml:3: exec.batch-port: not an option of `exec`: batch-port is a " \
           "`serve` option; put it under `serve:`" in proc.stderr  # fmt: skip
    assert "settings.yaml:4: exec.sla: not an option of `exec`: sla is a `report` option, " \
           "and `report` reads no settings file" in proc.stderr  # fmt: skip
    assert not (tmp_path / "o.jsonl").exists()


def test_a_typo_in_the_serve_section_stops_exec_too(tmp_path: Path) -> None:
    requests = tmp_path / "in.jsonl"
    write_requests(requests, 1)
    path = settings(tmp_path, "exec:\n  timeout: 30\nserve:\n  bakend: mock\n  port: ten\n")
    proc = cli("exec", str(requests), "-o", str(tmp_path / "o.jsonl"), "--config", str(path),
               "--dry-run")  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "settings.yaml:4: serve.bakend: unknown key; did you mean 'backend'?" in proc.stderr
    assert "settings.yaml:5: serve.port:" in proc.stderr


@pytest.mark.parametrize("quiet", [False, True])
def test_the_settings_file_from_the_environment_is_named_once(tmp_path: Path, quiet: bool) -> None:
    requests = tmp_path / "in.jsonl"
    write_requests(requests, 2)
    path = settings(tmp_path, "exec:\n  timeout: 30\n")
    args = ["exec", str(requests), "-o", str(tmp_path / "o.jsonl"), "--dry-run",
            "--url", "http://127.0.0.1:9/v1", *(["-q"] if quiet else [])]  # fmt: skip
    proc = cli(*args, env={**ENV, "JSONLBATCH_CONFIG": str(path)})
    assert proc.returncode == 0, proc.stderr
    line = f"settings: {path} (from $JSONLBATCH_CONFIG)"
    assert proc.stderr.count(line) == (0 if quiet else 1), proc.stderr
    named = cli(*args[:-1] if quiet else args, "--config", str(path))  # named on the line
    assert "settings:" not in named.stderr


def test_module_names_in_comments_resolve() -> None:
    """A comment or docstring that names a module or folder of the package names one that
    exists (`cli/api.py` and `jsonlbatch/api/` did not)."""
    package = ROOT / "jsonlbatch"
    files = sorted(package.rglob("*.py"))
    known = {p.relative_to(package).as_posix() for p in files}
    wrong = []
    for path in files:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for ref in re.findall(r"`jsonlbatch/([a-z_/]+?)/?`", line):
                if not (package / ref).exists() and not (package / f"{ref}.py").exists():
                    wrong.append(f"{path.name}:{n}: jsonlbatch/{ref}")
            for ref in re.findall(r"`((?:cli|exec|serve|batchapi|post|report|view|gen|cache|"
                                  r"experiment|mock)/[a-z_/]+\.py)`", line):  # fmt: skip
                if ref not in known and not any(k.endswith("/" + ref) for k in known):
                    wrong.append(f"{path.name}:{n}: {ref}")
    assert wrong == [], wrong

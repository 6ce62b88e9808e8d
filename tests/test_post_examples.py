"""examples/post/README.md stays true: every `jsonlbatch post` command in it runs on a copy of
the example folder and prints exactly the output shown after it."""

from __future__ import annotations

import itertools
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import orjson
from postutil import post

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "post"


def commands_and_outputs() -> list[tuple[list[str], list[str]]]:
    """(command words, expected output lines) for each command block followed by an output block."""
    blocks = re.findall(r"^```\n(.*?)^```", (EXAMPLES / "README.md").read_text(), re.M | re.S)
    pairs = []
    for block, after in itertools.pairwise(blocks):
        if block.startswith("jsonlbatch post "):
            words = shlex.split(block.replace("\\\n", " "))
            pairs.append((words[2:], after.splitlines()))
    return pairs


def test_every_example_command_prints_what_the_readme_shows(tmp_path: Path) -> None:
    work = tmp_path / "post"
    shutil.copytree(EXAMPLES, work)
    pairs = commands_and_outputs()
    assert [words[0] for words, _ in pairs] == ["patches", "votes", "files"]
    for words, expected in pairs:
        result = post(*words, cwd=work)
        assert result.returncode == 0, result.stderr
        assert (result.stdout + result.stderr).splitlines() == expected, words

    # the voted patch applies with real git on a copy of the original checkout
    checkout = tmp_path / "calc-1"
    shutil.copytree(work / "patches" / "repos" / "demo__calc-1", checkout)
    pred = orjson.loads((work / "out" / "preds.jsonl").read_bytes().splitlines()[0])
    run = {"cwd": checkout, "capture_output": True, "text": True, "timeout": 30}
    subprocess.run(["git", "init", "-q"], **run, check=True)
    check = subprocess.run(["git", "apply", "--check", "-"], input=pred["model_patch"], **run)
    assert check.returncode == 0, check.stderr
    assert (work / "out" / "deliverables" / "task-1" / "summary.txt").read_text() == (
        "months: 3\ntotal revenue: 405\n"
    )
    assert not (tmp_path / "etc").exists()

"""An output that is one of the inputs (by path, symbolic or hard link) is refused by every
command that reads files and writes `-o`, and so is an output a running exec holds the lock on:
one guard, `output_guard.check_output`, in each command's library function."""

from __future__ import annotations

import os
import time

import pytest
from batchutil import cli, start_exec, write_requests
from postutil import chat_line, write_jsonl

from jsonlbatch.errors import UsageError
from jsonlbatch.gen.writer import RequestWriter
from jsonlbatch.post.export import export
from jsonlbatch.post.patches import run_patches
from jsonlbatch.post.votes import run_votes
from jsonlbatch.report import build_report, write_report


@pytest.fixture
def responses(tmp_path):
    return write_jsonl(
        tmp_path / "r.jsonl", [chat_line("a|0", "\\boxed{1}"), chat_line("b|0", "2")]
    )


def _aliases(path):
    """The same file under its own name, a symbolic link and a hard link."""
    link = path.with_name("link.jsonl")
    link.symlink_to(path)
    hard = path.with_name("hard.jsonl")
    os.link(path, hard)
    return [path, link, hard]


def test_export_onto_its_input_is_refused_and_the_input_kept(tmp_path, responses):
    before = responses.read_bytes()
    done = cli("export", str(responses), "-o", str(responses), "--format", "csv")
    assert done.returncode == 2 and "is also an input" in done.stderr, done.stderr
    assert responses.read_bytes() == before


def test_every_writer_refuses_each_alias_of_an_input(tmp_path, responses):
    before = responses.read_bytes()
    gold = write_jsonl(tmp_path / "gold.jsonl", [{"id": "a", "answer": "1"}])
    for alias in _aliases(responses):
        out = str(alias)
        with pytest.raises(UsageError, match="is also an input"):
            export([str(responses)], out, fmt="csv")
        with pytest.raises(UsageError, match="is also an input"):
            run_votes([str(responses)], out)
        with pytest.raises(UsageError, match="is also an input"):
            run_patches([str(responses)], out, sources=lambda _: None)  # type: ignore[arg-type]
        with pytest.raises(UsageError, match="is also an input"):
            write_report(build_report([str(responses)]), out, "md")
        with pytest.raises(UsageError, match="is also an input"):
            RequestWriter(out, force=True, inputs=[str(responses)])
    with pytest.raises(UsageError, match="is also an input"):
        run_votes([str(responses)], str(gold), gold=str(gold))
    assert responses.read_bytes() == before


@pytest.mark.slow
def test_an_output_a_running_exec_holds_is_refused(tmp_path, mock_server, responses):
    url = mock_server(latency=0.5)
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 40)
    proc = start_exec(requests, out, "--url", url, "--concurrency", "1", "--quiet")
    lock = tmp_path / ".out.jsonl.lock"
    deadline = time.monotonic() + 30
    while not (lock.exists() and out.exists() and out.stat().st_size > 0):
        assert time.monotonic() < deadline and proc.poll() is None, "exec did not start"
        time.sleep(0.05)
    inode = out.stat().st_ino
    done = cli("export", str(responses), "-o", str(out), "--format", "jsonl")
    assert done.returncode == 2 and "being written by a jsonlbatch exec" in done.stderr
    assert "pid" in done.stderr, done.stderr
    hard = tmp_path / "hard-out.jsonl"
    os.link(out, hard)  # another name for the same file: the lock on the inode tells
    with pytest.raises(UsageError, match="being written by a jsonlbatch exec"):
        run_votes([str(responses)], str(hard))
    assert out.stat().st_ino == inode  # not replaced under the running exec
    proc.kill()
    proc.wait()


def test_serve_fleet_refuses_an_endpoints_file_that_is_the_fleet_file(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("models: []\n")
    done = cli("serve", "--fleet", str(fleet), "--endpoints-out", str(fleet))
    assert done.returncode == 2 and "is also an input" in done.stderr, done.stderr
    assert fleet.read_text() == "models: []\n"

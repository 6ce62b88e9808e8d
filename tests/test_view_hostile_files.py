"""The viewer against files that are not what a run writes: one rewritten in place (same inode,
other bytes, larger), a line with no end, a torn last line that stays torn, `/dev/zero` and a
FIFO. Memory stays bounded, an idle viewer does not read the file again, special files are
refused with a message. Real files, `jsonlbatch view` as a real process over 127.0.0.1; the
bombs are small (the index's line cap is lowered for them)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
import tracemalloc
import urllib.request
from pathlib import Path

import pytest
from batchutil import ENV
from viewutil import ViewProcess, response_line, write_run

from jsonlbatch.errors import UsageError
from jsonlbatch.view.index import LineIndex
from jsonlbatch.view.server import Viewer


def _index(path: Path, **kwargs: int) -> LineIndex:
    index = LineIndex(str(path), **kwargs)  # type: ignore[arg-type]
    while index.refresh(max_lines=7):
        pass
    return index


def _read_bytes() -> int:
    """Bytes this process has read so far (`rchar`: every read and pread, cache or not)."""
    with open("/proc/self/io") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("rchar:"))


def test_a_file_rewritten_in_place_and_larger_is_indexed_again(tmp_path: Path) -> None:
    path = write_run(tmp_path / "r.jsonl", 10)
    inode = path.stat().st_ino
    index = _index(path)
    assert len(index) == 10
    bigger = write_run(tmp_path / "bigger.jsonl", 20, shift=3)
    shutil.copyfile(bigger, path)  # as `cp` does: the same inode, written from the start
    assert path.stat().st_ino == inode
    while index.refresh(max_lines=7):
        pass
    assert len(index) == 20
    lines = [json.loads(index.read(i)) for i in range(20)]  # whole lines, none cut
    assert [x["custom_id"] for x in lines] == [f"task-{i:05d}" for i in range(20)]
    assert sum(not index.flags[i] & 1 for i in range(20)) == sum(
        (i + 3) % 17 == 0 for i in range(20)
    )


def test_a_file_rewritten_in_place_at_the_same_size_is_indexed_again(tmp_path: Path) -> None:
    path = write_run(tmp_path / "r.jsonl", 12)
    written = path.stat().st_mtime_ns - 10**9  # so the rewrite's time differs, however coarse
    os.utime(path, ns=(written, written))
    index = _index(path)
    data = path.read_bytes()
    middle = data.index(b"task-00006")  # one id changed in the middle: same size, same ends
    with path.open("r+b") as fh:
        fh.seek(middle)
        fh.write(b"task-99999")
    while index.refresh():
        pass
    assert [json.loads(index.read(i))["custom_id"] for i in (5, 6, 7)] == [
        "task-00005",
        "task-99999",
        "task-00007",
    ]
    assert index.find("task-99999") == [6] and index.find("task-00006") == []


def test_the_page_follows_a_file_copied_over(tmp_path: Path) -> None:
    path = write_run(tmp_path / "r.jsonl", 10)
    view = ViewProcess(str(path))
    try:
        _until(view.url, lambda files: files[0]["lines"] == 10)
        shutil.copyfile(write_run(tmp_path / "bigger.jsonl", 20, shift=3), path)
        _until(view.url, lambda files: files[0]["bytes_indexed"] == path.stat().st_size)
        with urllib.request.urlopen(view.url + "api/rows?size=100", timeout=30) as response:
            rows = json.loads(response.read())
        assert rows["total"] == 20
        assert [r["custom_id"] for r in rows["rows"]] == [f"task-{i:05d}" for i in range(20)]
        assert not any(r["unreadable"] for r in rows["rows"])
    finally:
        view.close()


def _until(url: str, done: object, limit: float = 60.0) -> None:
    """Poll `api/files` until `done(files)` (bounded)."""
    deadline = time.monotonic() + limit
    while True:
        with urllib.request.urlopen(url + "api/files", timeout=30) as response:
            files = json.loads(response.read())["files"]
        if done(files):  # type: ignore[operator]
            return
        assert time.monotonic() < deadline, files
        time.sleep(0.1)


def test_a_line_with_no_end_is_one_oversized_row_read_once_in_bounded_memory(
    tmp_path: Path,
) -> None:
    from jsonlbatch.view.index import OVERSIZED, SHOWN, UNREADABLE

    path = tmp_path / "r.jsonl"
    path.write_bytes(b"x" * (3 << 20))  # 3 MiB and no newline; the cap below is 64 KiB
    tracemalloc.start()
    try:
        index = _index(path, max_line=64 << 10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < (3 << 20), peak  # about a read chunk (1 MiB), not the line
    assert len(index) == 1 and index.flags[0] == UNREADABLE | OVERSIZED
    assert index.done and index.size == 3 << 20
    before = _read_bytes()
    assert index.refresh() == 0 and index.refresh() == 0  # idle: nothing read again
    assert _read_bytes() - before < 64 << 10
    with path.open("ab") as fh:  # the line ends, and a real one follows
        fh.write(b"\n" + json.dumps(response_line(1)).encode() + b"\n")
    assert index.refresh() == 1 and len(index) == 2
    assert index.lengths[0] == 3 << 20 and len(index.read(0)) == min(SHOWN, 3 << 20)
    assert json.loads(index.read(1))["custom_id"] == "task-00001"


def test_a_torn_last_line_that_stays_torn_is_not_read_again_while_idle(tmp_path: Path) -> None:
    path = write_run(tmp_path / "r.jsonl", 3)
    with path.open("ab") as fh:
        fh.write(b'{"custom_id": "' + b"y" * (512 << 10))  # half a line, never finished
    index = _index(path)
    assert len(index) == 3 and index.done
    before = _read_bytes()
    for _ in range(3):
        assert index.refresh() == 0
    assert _read_bytes() - before < 64 << 10


def _view(*args: str) -> subprocess.CompletedProcess[str]:
    """`jsonlbatch view ARGS` with its address space capped at 1 GiB (a viewer that reads a
    device into memory stops at the cap instead of taking the machine's)."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return subprocess.run(
        [sys.executable, "-m", "jsonlbatch", "view", *args],
        capture_output=True, text=True, timeout=60, env=ENV, preexec_fn=cap,
    )  # fmt: skip


def test_dev_zero_and_a_fifo_are_refused_with_a_message(tmp_path: Path) -> None:
    zero = _view("/dev/zero")
    assert zero.returncode == 2, zero.stderr
    assert "/dev/zero: a device or socket, not a regular file" in zero.stderr
    fifo = tmp_path / "out.jsonl"
    os.mkfifo(fifo)
    refused = _view(str(fifo))
    assert refused.returncode == 2 and "a FIFO, not a regular file" in refused.stderr
    assert "Traceback" not in zero.stderr + refused.stderr
    with pytest.raises(UsageError, match="/dev/zero: a device"):  # --requests: the same check
        Viewer([str(write_run(tmp_path / "ok.jsonl", 2))], requests=["/dev/zero"])

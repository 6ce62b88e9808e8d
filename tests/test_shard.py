"""`--shard K/N` splits by custom_id the same way everywhere; `merge` joins the parts strictly."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from batchutil import cli, read_results, write_requests

from jsonlbatch.batch_format.records import Result
from jsonlbatch.errors import InputError, UsageError
from jsonlbatch.exec.prepare.shard import MergeError, in_shard, merge, parse_shard, shard_of


def test_parse_shard() -> None:
    assert parse_shard("0/1") == (0, 1)
    assert parse_shard(" 3/4 ") == (3, 4)
    for bad in ("4/4", "-1/4", "1/0", "1", "a/b", "1/2/3", ""):
        with pytest.raises(UsageError, match="K/N"):
            parse_shard(bad)


def test_every_id_is_in_exactly_one_shard_and_shards_are_balanced() -> None:
    ids = [f"task-{i}|{j}" for i in range(2000) for j in range(2)]  # balanced by task
    for n in (1, 2, 3, 8):
        owners = [[k for k in range(n) if in_shard(cid, k, n)] for cid in ids]
        assert all(len(o) == 1 for o in owners)
        sizes = [sum(o == [k] for o in owners) for k in range(n)]
        assert min(sizes) > 0.8 * len(ids) / n and max(sizes) < 1.2 * len(ids) / n


def test_the_split_is_the_same_in_every_process() -> None:
    """Python's hash() is salted per process: the split must not depend on it."""
    ids = [f"id-{i}" for i in range(200)] + ["ünïcode-id", "a|0"]
    code = (
        "import sys, orjson\n"
        "from jsonlbatch.exec.prepare.shard import shard_of\n"
        "ids = orjson.loads(sys.stdin.buffer.read())\n"
        "print(orjson.dumps([shard_of(i, 7) for i in ids]).decode())\n"
    )
    runs = []
    for seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-c", code],
            input=orjson.dumps(ids),
            capture_output=True,
            env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
            check=True,
        )
        runs.append(orjson.loads(done.stdout))
    assert runs[0] == runs[1] == [shard_of(i, 7) for i in ids]


def test_exec_shards_then_merge_restores_every_result_in_request_order(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server(served_models=("m",))
    requests = tmp_path / "req.jsonl"
    lines = write_requests(requests, 60, model="m")
    parts = []
    for k in range(3):
        part = tmp_path / f"part-{k}.jsonl"
        done = cli("exec", str(requests), "-o", str(part), "--url", url, "--shard", f"{k}/3", "-q")
        assert done.returncode == 0, done.stderr
        assert set(read_results(part)) == {
            x["custom_id"] for x in lines if in_shard(x["custom_id"], k, 3)
        }
        parts.append(str(part))
    merged = tmp_path / "all.jsonl"
    done = cli("merge", *parts, "--requests", str(requests), "-o", str(merged))
    assert done.returncode == 0, done.stderr
    assert "60 results for 60 requests (60 ok, 0 failed)" in done.stderr
    got = [orjson.loads(x)["custom_id"] for x in merged.read_bytes().splitlines()]
    assert got == [x["custom_id"] for x in lines]


# -- merge on hand-made parts ---------------------------------------------------------------


def _requests(path: Path, ids: list[str]) -> Path:
    path.write_bytes(b"".join(orjson.dumps({"custom_id": i, "body": {}}) + b"\n" for i in ids))
    return path


def _part(path: Path, results: list[tuple[str, bool]], tail: bytes = b"") -> Path:
    out = b""
    for cid, ok in results:
        if ok:
            out += Result(cid, 200, {"choices": [{"message": {"content": cid}}]}).to_line()
        else:
            out += Result(cid, None, error={"code": "http_500", "message": "x"}).to_line()
    path.write_bytes(out + tail)
    return path


def test_a_success_beats_failures_and_the_last_failure_is_kept(tmp_path: Path) -> None:
    req = _requests(tmp_path / "req.jsonl", ["a", "b", "c"])
    p1 = _part(tmp_path / "p1.jsonl", [("c", False), ("a", False), ("b", True)])
    p2 = _part(tmp_path / "p2.jsonl", [("a", True), ("c", False), ("b", False)])
    summary = merge([p1, p2], req, tmp_path / "out.jsonl")
    assert (summary.ok, summary.failed, summary.superseded) == (2, 1, 3)
    out = [orjson.loads(x) for x in (tmp_path / "out.jsonl").read_bytes().splitlines()]
    assert [x["custom_id"] for x in out] == ["a", "b", "c"]
    assert out[0]["error"] is None and out[1]["error"] is None and out[2]["error"] is not None
    chosen_c = p2.read_bytes().splitlines()[1]  # the later failure of "c", byte for byte
    assert (tmp_path / "out.jsonl").read_bytes().splitlines()[2] == chosen_c


def test_missing_duplicate_and_unknown_ids_are_named_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    ids = [f"r{i}" for i in range(30)]
    req = _requests(tmp_path / "req.jsonl", ids)
    p1 = _part(tmp_path / "p1.jsonl", [(i, True) for i in ids[:10]] + [("stranger", True)])
    p2 = _part(tmp_path / "p2.jsonl", [("r3", True)])
    out = tmp_path / "out.jsonl"
    out.write_bytes(b"previous\n")
    with pytest.raises(MergeError) as info:
        merge([p1, p2], req, out)
    err = info.value
    assert err.missing == ids[10:] and err.duplicated == ["r3"] and err.unknown == ["stranger"]
    text = str(err)
    assert "20 missing id(s), 1 duplicated id(s), 1 unknown id(s)" in text
    assert f"{p2}:1: custom_id: second success for 'r3' ({p1}:4)" in text
    assert f"{req}:11: custom_id: no result for 'r10'" in text
    assert "'stranger' is not in the requests" in text
    assert out.read_bytes() == b"previous\n"  # untouched


def test_merge_cli_exit_status_and_messages(tmp_path: Path) -> None:
    req = _requests(tmp_path / "req.jsonl", ["a", "b"])
    part = _part(tmp_path / "p.jsonl", [("a", True)], tail=b'{"custom_id": "b", "resp')
    done = cli("merge", str(part), "--requests", str(req), "-o", str(tmp_path / "o.jsonl"))
    assert done.returncode == 1
    assert "cannot merge, nothing written: 1 invalid line(s), 1 missing id(s)" in done.stderr
    assert "a torn last line" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "o.jsonl").exists()
    done = cli("merge", str(part), "--requests", str(req), "-o", str(part))
    assert done.returncode == 2 and "is also an input" in done.stderr
    done = cli("merge", "--requests", str(req), "-o", str(tmp_path / "o.jsonl"))
    assert done.returncode == 2  # no part at all: click's usage error


def test_bad_request_files_are_input_errors(tmp_path: Path) -> None:
    req = tmp_path / "req.jsonl"
    req.write_bytes(b'{"custom_id": "a"}\n{"custom_id": "a"}\n[1]\n{"x": 1}\n')
    part = _part(tmp_path / "p.jsonl", [("a", True)])
    with pytest.raises(InputError) as info:
        merge([part], req, tmp_path / "o.jsonl")
    text = str(info.value)
    assert f"{req}:2: custom_id: 'a' repeats line 1" in text
    assert f"{req}:3: not a JSON object" in text
    assert f"{req}:4: custom_id: missing" in text


def test_merge_waits_for_no_exec_and_knows_a_part_under_another_name(tmp_path: Path) -> None:
    """The output a run is writing is not replaced under it; a hard link to a part is that
    part."""
    import os

    from jsonlbatch.errors import OutputError
    from jsonlbatch.file_io.output_guard import OutputLock

    req = _requests(tmp_path / "req.jsonl", ["a"])
    p1 = _part(tmp_path / "p1.jsonl", [("a", True)])
    out = tmp_path / "out.jsonl"
    out.write_bytes(b"")
    running = OutputLock(out)  # what an exec on `out` holds
    running.acquire()
    try:
        with pytest.raises(OutputError, match="being written by another jsonlbatch run"):
            merge([p1], req, out)
    finally:
        running.release()
    assert out.read_bytes() == b""
    os.link(p1, tmp_path / "alias.jsonl")
    with pytest.raises(UsageError, match="given twice"):
        merge([p1, tmp_path / "alias.jsonl"], req, out)
    with pytest.raises(UsageError, match="is also an input"):
        merge([p1], req, tmp_path / "alias.jsonl")


def test_a_tasks_samples_stay_on_one_shard() -> None:
    """Issue 26: the split was by custom_id, so one task's samples went to different shards
    (votes, pass@k and the prefix cache need them together)."""
    for sep in ("|", "#", "__pass"):
        for task in range(50):
            owners = {shard_of(f"task-{task}{sep}{k}", 4) for k in range(8)}
            assert len(owners) == 1, (sep, task, owners)
    shards = {shard_of(f"task-{t}|0", 4) for t in range(50)}
    assert shards == {0, 1, 2, 3}  # tasks still spread over every shard

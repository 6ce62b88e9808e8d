"""`exec --cache`: answers looked up before sending and stored before writing, over real HTTP to
the mock (whose request counter proves what was sent), real subprocesses and kill -9."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import orjson
import pytest
from batchutil import ENV, chat_body, cli, exec_cli, read_results, start_exec
from conftest import free_port

from jsonlbatch import execute
from jsonlbatch.batch_format.records import request_line
from jsonlbatch.cache import Cache, cache_stats
from jsonlbatch.cache.pack import iter_records
from jsonlbatch.exec.output.run_summary import RunSummary

CHAT = "/v1/chat/completions"


def sent(url: str) -> int:
    """Chat requests the mock has answered so far."""
    with urllib.request.urlopen(url.replace("/v1", "/mock/stats"), timeout=10) as resp:
        return json.loads(resp.read())["requests"].get(CHAT, 0)


def run_exec(requests: Path, output: Path, url: str, **options: object) -> RunSummary:
    """`jsonlbatch.execute` in this process (no interpreter to start: quicker than the CLI)."""
    return execute(str(requests), str(output), urls=[url], quiet=True, **options)


def write(path: Path, bodies: list[dict], prefix: str = "r") -> list[bytes]:
    lines = [request_line(f"{prefix}{i}", body) for i, body in enumerate(bodies)]
    path.write_bytes(b"".join(lines))
    return lines


def bodies_by_id(path: Path) -> dict[str, bytes]:
    """custom_id -> the response body, as the bytes written."""
    out = {}
    for cid, line in read_results(path).items():
        out[cid] = orjson.dumps(line["response"]["body"])
    return out


def stored_body(cache: Path, name: str) -> bytes | None:
    """The answer a lookup of `name` (`<key>.<draw>`, as in metrics.cache_key) finds."""
    key, draw = name.split(".")
    store = Cache(cache, "read")
    try:
        entry = store.get(bytes.fromhex(key), int(draw))
    finally:
        store.close()
    return orjson.dumps(orjson.loads(entry.body)) if entry is not None else None


def damage(cache: Path, name: str, how: str) -> None:
    """Damage the stored record of `name` in place: "cut" zeroes its last bytes (as a torn
    write would), "flip" inverts one byte of its compressed payload."""
    key, draw = bytes.fromhex(name.split(".")[0]), int(name.split(".")[1])
    for pack in (cache / "packs").glob("*.pack"):
        fd = os.open(pack, os.O_RDWR)
        try:
            for rec in iter_records(fd):
                if rec.key == key and rec.draw == draw:
                    end = rec.offset + rec.length
                    if how == "cut":
                        os.pwrite(fd, bytes(5), end - 5)
                    else:
                        os.pwrite(fd, bytes([os.pread(fd, 1, end - 3)[0] ^ 0xFF]), end - 3)
                    return
        finally:
            os.close(fd)
    raise AssertionError(f"no record of {name}")


@pytest.fixture
def shm_dir(tmp_path):
    """A folder on another file system than tmp_path when /dev/shm exists (tmpfs)."""
    base = Path("/dev/shm")
    if not base.is_dir() or os.stat(base).st_dev == os.stat(tmp_path).st_dev:
        yield tmp_path / "elsewhere"
        return
    folder = base / f"jsonlbatch-test-{os.getpid()}-{time.monotonic_ns()}"
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_rerun_is_answered_by_the_cache(tmp_path, mock_server, shm_dir):
    """Hits are written as normal lines, marked, and sent nowhere; reordered keys, number
    spellings and answer-neutral fields do not matter; the cache sits on another file system."""
    url = mock_server()
    cache = shm_dir / "cache"
    req = tmp_path / "req.jsonl"
    write(req, [chat_body(i, max_tokens=8, temperature=0) for i in range(6)])
    first = exec_cli(req, tmp_path / "a.jsonl", "--url", url, "--cache", str(cache))
    assert first.returncode == 0, first.stderr
    assert sent(url) == 6
    a = read_results(tmp_path / "a.jsonl")
    assert {line["metrics"]["cache"] for line in a.values()} == {"stored"}
    # the same requests re-serialised: other key order, 8.0 for 8, metadata, another id prefix
    lines = [
        orjson.dumps(
            {
                "body": {"temperature": 0.0, "max_tokens": 8.0, "metadata": {"x": i},
                         **{k: v for k, v in chat_body(i).items()}},
                "url": CHAT,
                "custom_id": f"again-{i}",
            }
        )
        + b"\n"
        for i in reversed(range(6))
    ]  # fmt: skip
    (tmp_path / "again.jsonl").write_bytes(b"".join(lines))
    env = {**ENV, "JSONLBATCH_CACHE": str(cache)}
    second = cli("exec", str(tmp_path / "again.jsonl"), "-o", str(tmp_path / "b.jsonl"),
                 "--url", url, "--price", "in=1,out=2", env=env)  # fmt: skip
    assert second.returncode == 0, second.stderr
    assert sent(url) == 6  # nothing more
    assert "6 hits" in second.stderr and "saved $" in second.stderr
    b = read_results(tmp_path / "b.jsonl")
    for i in range(6):
        hit, original = b[f"again-{i}"], a[f"r{i}"]
        assert hit["metrics"]["cache"] == "hit"
        assert hit["metrics"]["cache_key"] == original["metrics"]["cache_key"]
        assert hit["response"]["body"] == original["response"]["body"]
        assert hit["response"]["status_code"] == 200 and hit["error"] is None
        assert len(hit["metrics"]["fingerprint"]) == 16
    # a resume of the new output has nothing to do: the hits are results like any other
    again = cli("exec", str(tmp_path / "again.jsonl"), "-o", str(tmp_path / "b.jsonl"),
                "--url", url, env=env)  # fmt: skip
    assert again.returncode == 0 and "nothing to send" in again.stderr
    # --no-cache wins over the environment
    plain = cli("exec", str(req), "-o", str(tmp_path / "c.jsonl"), "--url", url, "--no-cache",
                env=env)  # fmt: skip
    assert plain.returncode == 0 and sent(url) == 12
    assert "cache" not in read_results(tmp_path / "c.jsonl")["r0"]["metrics"]
    # report says how many answers came from the cache and what they saved
    report = cli("report", str(tmp_path / "b.jsonl"), "--price", "in=1,out=2", "--format", "md")
    assert report.returncode == 0, report.stderr
    assert "from the answer cache" in report.stdout and "saved by the answer cache" in report.stdout
    # each run that used the cache left its counts for `cache stats` (the resume used it too:
    # nothing to look up, nothing recorded)
    stats = cache_stats(cache)
    assert (stats.runs, stats.hits, stats.misses, stats.stored) == (2, 6, 6, 6)


def test_samples_are_drawn_one_to_one(tmp_path, mock_server):
    """The k-th copy of a sampled body is the k-th stored draw, in every run, shard and resume;
    a seeded or greedy body is one draw."""
    url = mock_server()
    cache = str(tmp_path / "cache")
    sample = chat_body(1, temperature=0.9, max_tokens=4)
    greedy = chat_body(2, temperature=0, max_tokens=4)
    seeded = chat_body(3, temperature=0.9, seed=5, max_tokens=4)
    write(tmp_path / "two.jsonl", [sample, greedy, sample, seeded])
    run_exec(tmp_path / "two.jsonl", tmp_path / "two-out.jsonl", url, cache=cache)
    assert sent(url) == 4
    two = bodies_by_id(tmp_path / "two-out.jsonl")
    # five copies of the sample, two of the greedy and seeded bodies, in another order
    write(tmp_path / "five.jsonl",
          [greedy, sample, seeded, sample, sample, greedy, sample, seeded, sample])  # fmt: skip
    run_exec(tmp_path / "five.jsonl", tmp_path / "five-out.jsonl", url, cache=cache)
    assert sent(url) == 4 + 3  # only the three missing draws of the sample
    five = bodies_by_id(tmp_path / "five-out.jsonl")
    assert five["r1"] == two["r0"] and five["r3"] == two["r2"]  # draws 0 and 1, reused
    new = {five[c] for c in ("r4", "r6", "r8")}
    assert len(new) == 3 and not new & {two["r0"], two["r2"]}  # three new, distinct draws
    assert five["r0"] == five["r5"] == two["r1"]  # greedy: one draw
    assert five["r2"] == five["r7"] == two["r3"]  # seeded: one draw
    keys = {c: line["metrics"]["cache_key"] for c, line in read_results(tmp_path / "five-out.jsonl").items()}  # fmt: skip
    assert [keys[c].rsplit(".", 1)[1] for c in ("r1", "r3", "r4", "r6", "r8")] == list("01234")
    # shards count copies over the whole file: each shard gets the same draws
    for k in range(2):
        run_exec(tmp_path / "five.jsonl", tmp_path / f"shard{k}.jsonl", url, cache=cache,
                 shard=(k, 2))  # fmt: skip
    assert sent(url) == 7
    merged = {**bodies_by_id(tmp_path / "shard0.jsonl"), **bodies_by_id(tmp_path / "shard1.jsonl")}
    assert merged == five


def test_a_run_the_cache_answers_whole_needs_no_server(tmp_path, mock_server):
    """Lines are answered while the input is scanned: a run the cache answers whole writes its
    output without reaching a server (none listens at the URL; `--serve` launches nothing), and
    a resume sends exactly the requests neither the output nor the cache has."""
    url = mock_server()
    cache = str(tmp_path / "cache")
    req = tmp_path / "req.jsonl"
    write(req, [chat_body(i, temperature=0.7, max_tokens=4) for i in range(5)])
    run_exec(req, tmp_path / "a.jsonl", url, cache=cache)
    dead = f"http://127.0.0.1:{free_port()}/v1"
    done = exec_cli(req, tmp_path / "b.jsonl", "--url", dead, "--cache", cache)
    assert done.returncode == 0, done.stderr
    assert "nothing to send" in done.stderr and "5 of them now" in done.stderr
    assert bodies_by_id(tmp_path / "b.jsonl") == bodies_by_id(tmp_path / "a.jsonl")
    b = read_results(tmp_path / "b.jsonl")
    assert {line["metrics"]["cache"] for line in b.values()} == {"hit"}
    assert len({line["metrics"]["run"] for line in b.values()}) == 1
    served = exec_cli(req, tmp_path / "c.jsonl", "--serve", "mock", "--cache", cache,
                      "--server-executable", str(tmp_path / "no-such-server"))  # fmt: skip
    assert served.returncode == 0, served.stderr
    assert len(read_results(tmp_path / "c.jsonl")) == 5
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []  # the lines waiting beside the output were appended and removed
    # a resume: two lines done, five cached, two new: exactly the two new ones are sent
    more = [chat_body(i, temperature=0.7, max_tokens=4) for i in range(7)]
    write(req, more)
    partial = tmp_path / "d.jsonl"
    partial.write_bytes(b"".join((tmp_path / "a.jsonl").read_bytes().splitlines(True)[:2]))
    before = sent(url)
    summary = run_exec(req, partial, url, cache=cache)
    assert sent(url) - before == 2 and summary.cache_hits == 3
    assert len(read_results(partial)) == 7


def test_samples_the_cache_holds_whole_need_no_server(tmp_path, mock_server):
    """Later copies of a sampled body (`gen --samples`) get their draw only once the whole file
    is counted; they are still answered before the run decides it needs a server, so a file of
    samples the cache holds whole is written with no server listening, draws one to one."""
    url = mock_server()
    cache = str(tmp_path / "cache")
    a, b = (chat_body(i, temperature=0.8, max_tokens=4) for i in range(2))
    write(tmp_path / "req.jsonl", [a, b, a, a, b])
    run_exec(tmp_path / "req.jsonl", tmp_path / "first.jsonl", url, cache=cache)
    first = read_results(tmp_path / "first.jsonl")
    dead = f"http://127.0.0.1:{free_port()}/v1"
    done = exec_cli(tmp_path / "req.jsonl", tmp_path / "again.jsonl", "--url", dead,
                    "--cache", cache)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "nothing to send" in done.stderr and "5 of them now" in done.stderr
    again = read_results(tmp_path / "again.jsonl")
    assert {line["metrics"]["cache"] for line in again.values()} == {"hit"}
    assert {c: line["metrics"]["cache_key"] for c, line in again.items()} == {
        c: line["metrics"]["cache_key"] for c, line in first.items()
    }
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_resume_never_gives_a_draw_its_output_holds_to_another_line(tmp_path, mock_server):
    """A copy of a sampled body added at the top of a request file (or the file reordered)
    after some copies were answered: copy numbers moved, but the draws the output holds are not
    given again; that line is sent and its answer stored as a new draw."""
    url = mock_server()
    cache = str(tmp_path / "cache")
    sample = chat_body(1, temperature=0.9, max_tokens=4)
    lines = write(tmp_path / "req.jsonl", [sample, sample, sample])
    out = tmp_path / "out.jsonl"
    run_exec(tmp_path / "req.jsonl", out, url, cache=cache)
    assert sent(url) == 3
    (tmp_path / "req.jsonl").write_bytes(request_line("new", sample) + b"".join(lines))
    summary = run_exec(tmp_path / "req.jsonl", out, url, cache=cache)
    assert sent(url) == 4 and summary.cache_hits == 0
    keys = [line["metrics"]["cache_key"] for line in read_results(out).values()]
    assert len(keys) == 4 and len(set(keys)) == 4, keys
    assert sorted(k.rsplit(".", 1)[1] for k in keys) == list("0123")


def test_modes_errors_retry_failed_and_the_url_in_the_key(tmp_path, mock_server):
    url = mock_server()
    other = mock_server()
    cache = str(tmp_path / "cache")
    req = tmp_path / "req.jsonl"
    write(req, [chat_body(i, temperature=0, max_tokens=4) for i in range(4)])

    def run(out: str, target: str = url, **options: object) -> RunSummary:
        return run_exec(req, tmp_path / out, target, cache=cache, **options)

    # read: looks up, stores nothing (and the directory must exist)
    missing = exec_cli(req, tmp_path / "r.jsonl", "--url", url, "--cache", cache,
                       "--cache-mode", "read")  # fmt: skip
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    assert "Traceback" not in missing.stderr
    run("w.jsonl", cache_mode="write")
    assert sent(url) == 4
    run("w2.jsonl", cache_mode="write")  # write never reads
    assert sent(url) == 8
    assert run("r.jsonl", cache_mode="read").cache_hits == 4
    assert sent(url) == 8
    # the server's URL is not in the key, unless asked
    assert run("o.jsonl", target=other).cache_hits == 4 and sent(other) == 0
    run("u.jsonl", target=other, cache_key_url=True)
    assert sent(other) == 4
    # failed lines of an earlier run: --retry-failed looks them up before sending
    out = tmp_path / "failed.jsonl"
    out.write_bytes(
        b"".join(
            orjson.dumps({"id": f"batch_req_{i}", "custom_id": f"r{i}", "response": None,
                          "error": {"code": "connection_error", "message": "x"}}) + b"\n"
            for i in range(4)
        )
    )  # fmt: skip
    assert run("failed.jsonl", retry_failed=True).cache_hits == 4
    assert sent(url) == 8
    lines = read_results(out)
    assert all(line["metrics"]["cache"] == "hit" for line in lines.values()) and len(lines) == 4


def test_copies_of_a_one_draw_body_keep_one_answer(tmp_path, mock_server):
    """Three copies of a greedy body that all miss in one run are all sent; the cache keeps the
    first answer stored, and only that line says it was stored (its key finds its body)."""
    url = mock_server()
    cache = tmp_path / "cache"
    req = tmp_path / "req.jsonl"
    write(req, [chat_body(1, temperature=0, max_tokens=4)] * 3)
    run_exec(req, tmp_path / "a.jsonl", url, cache=str(cache))
    assert sent(url) == 3
    lines = read_results(tmp_path / "a.jsonl").values()
    marked = [line for line in lines if line["metrics"].get("cache") == "stored"]
    assert len(marked) == 1
    stored = stored_body(cache, marked[0]["metrics"]["cache_key"])
    assert stored == orjson.dumps(marked[0]["response"]["body"])


def test_only_usable_answers_are_stored(tmp_path, mock_server):
    url = mock_server(fail_rate=1.0)
    req = tmp_path / "req.jsonl"
    write(req, [chat_body(i, temperature=0) for i in range(3)])
    done = exec_cli(req, tmp_path / "o.jsonl", "--url", url, "--cache", str(tmp_path / "c"),
                    "--max-retries", "0")  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert cache_stats(tmp_path / "c").entries == 0


def test_a_corrupt_entry_is_a_miss_and_is_replaced(tmp_path, mock_server):
    url = mock_server()
    cache = tmp_path / "cache"
    req = tmp_path / "req.jsonl"
    write(req, [chat_body(i, temperature=0) for i in range(4)])
    run_exec(req, tmp_path / "a.jsonl", url, cache=str(cache))
    keys = {c: x["metrics"]["cache_key"] for c, x in read_results(tmp_path / "a.jsonl").items()}
    damage(cache, keys["r1"], "cut")
    damage(cache, keys["r2"], "flip")
    summary = run_exec(req, tmp_path / "b.jsonl", url, cache=str(cache))
    assert sent(url) == 6 and "2 corrupt" in summary.cache
    b = read_results(tmp_path / "b.jsonl")
    assert [b[c]["metrics"]["cache"] for c in ("r0", "r1", "r2", "r3")] == ["hit", "stored", "stored", "hit"]  # fmt: skip
    assert cache_stats(cache).corrupt == 2  # still on disk (until `cache prune`), never served
    assert run_exec(req, tmp_path / "c.jsonl", url, cache=str(cache)).cache_hits == 4
    assert sent(url) == 6


def _read_only(folder: Path, args: list[str]) -> subprocess.CompletedProcess:
    """Run the CLI with `folder` read-only: by its mode for a normal user; for root (whom modes
    do not stop), as a read-only bind mount in a private mount namespace."""
    if os.geteuid() != 0:
        for root, dirs, files in os.walk(folder):
            for name in dirs + files:
                os.chmod(os.path.join(root, name), 0o555)
        os.chmod(folder, 0o555)
        return cli(*args)
    if shutil.which("unshare") is None:
        pytest.skip("running as root without unshare: no way to make a folder read-only")
    script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
    cmd = ["unshare", "-rm", "sh", "-c", script, "sh", str(folder),
           os.sys.executable, "-m", "jsonlbatch", *args]  # fmt: skip
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("running as root and unshare is not permitted here")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=ENV)


def test_a_read_only_cache_is_read(tmp_path, mock_server):
    url = mock_server()
    cache = tmp_path / "cache"
    req = tmp_path / "req.jsonl"
    write(req, [chat_body(i, temperature=0) for i in range(3)])
    assert exec_cli(req, tmp_path / "a.jsonl", "--url", url, "--cache", str(cache)).returncode == 0
    write(req, [chat_body(i, temperature=0) for i in range(5)])  # two new requests
    run = _read_only(cache, ["exec", str(req), "-o", str(tmp_path / "b.jsonl"), "--url", url,
                             "--cache", str(cache)])  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "cannot be written" in run.stderr and "reading it only" in run.stderr
    assert sent(url) == 5
    b = read_results(tmp_path / "b.jsonl")
    assert sorted(x["metrics"].get("cache", "-") for x in b.values()) == ["-", "-", "hit", "hit", "hit"]  # fmt: skip
    refused = _read_only(cache, ["exec", str(req), "-o", str(tmp_path / "c.jsonl"), "--url",
                                 url, "--cache", str(cache), "--cache-mode", "write"])  # fmt: skip
    assert refused.returncode == 1 and "cannot write to cache" in refused.stderr
    assert "Traceback" not in refused.stderr


@pytest.mark.slow
def test_two_processes_share_a_cache_and_one_is_killed(tmp_path, mock_server):
    """Two runs write one cache at once; one is killed with SIGKILL mid-run and run again.
    No record is corrupt, the one lookup of each key finds an answer one of the outputs has
    under that key (where both stored the same draw at once, the first pack's), and a third
    run sends nothing."""
    url = mock_server(latency=0.05)
    cache = tmp_path / "cache"
    req = tmp_path / "req.jsonl"
    bodies = [chat_body(i % 40, temperature=0.8 if i % 2 else 0, max_tokens=4) for i in range(160)]
    write(req, bodies)
    args = ["--url", url, "--cache", str(cache), "-c", "16"]
    a = start_exec(req, tmp_path / "a.jsonl", *args)
    b = start_exec(req, tmp_path / "b.jsonl", *args)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # bounded: kill once some answers are in
        out = tmp_path / "a.jsonl"
        if out.exists() and out.stat().st_size > 4000:
            break
        time.sleep(0.02)
    a.send_signal(signal.SIGKILL)
    assert a.wait(timeout=10) == -signal.SIGKILL
    assert (tmp_path / "a.jsonl").read_bytes().count(b"\n") < 160  # killed mid-run
    assert b.wait(timeout=120) == 0, b.stderr.read()
    again = exec_cli(req, tmp_path / "a.jsonl", *args)
    assert again.returncode == 0, again.stderr
    stats = cache_stats(cache)
    assert stats.corrupt == 0  # a torn last record of the killed run's pack is no answer
    written: dict[str, set[bytes]] = {}
    for name in ("a.jsonl", "b.jsonl"):
        results = read_results(tmp_path / name)
        assert len(results) == 160
        for line in results.values():
            body = orjson.dumps(line["response"]["body"])
            if "cache_key" in line["metrics"]:  # not: a one-draw copy another answer is kept for
                written.setdefault(line["metrics"]["cache_key"], set()).add(body)
    for key, bodies in written.items():
        assert stored_body(cache, key) in bodies, key
    before = sent(url)
    third = exec_cli(req, tmp_path / "c.jsonl", *args)
    assert third.returncode == 0 and sent(url) == before


def test_experiment_conditions_that_share_requests_pay_once(tmp_path, mock_server):
    pytest.importorskip("yaml", reason="experiment files need PyYAML")
    from jsonlbatch.experiment.runner import run_experiment

    url = mock_server()
    folder = tmp_path / "exp"
    folder.mkdir()
    rows = "".join(json.dumps({"id": f"t{i}", "q": f"question {i}"}) + "\n" for i in range(5))
    (folder / "tasks.jsonl").write_text(rows)
    spec = {
        "experiment": {"id": "shared"},
        "cache": "answers",
        "data": {"file": "tasks.jsonl", "id": "{{ id }}"},
        "prompt": {"text": "Q: {{ q }}"},
        "defaults": {"model": "mock", "url": url, "max_tokens": 8, "temperature": 0},
        "conditions": {"baseline": {}, "again": {}, "sampled": {"temperature": 0.7}},
        "steps": [{"exec": {"concurrency": 4}}],
    }
    (folder / "experiment.yaml").write_text(json.dumps(spec))  # JSON is YAML
    result = run_experiment(
        str(folder / "experiment.yaml"), runs_dir=str(tmp_path / "runs"), quiet=True
    )
    assert sent(url) == 10  # baseline's five, once; sampled's five
    said = {o.condition: o.detail for o in result.outcomes if o.step == "exec"}
    assert said["again"] == "0 sent, 5 from the answer cache" and said["baseline"] == "5 sent"
    root = tmp_path / "runs" / "shared"
    hits = read_results(root / "again" / "responses.jsonl")
    assert {line["metrics"]["cache"] for line in hits.values()} == {"hit"}
    assert cache_stats(folder / "answers").entries == 10

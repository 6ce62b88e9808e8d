"""The answer cache as a library: keys, draws, packs and indexes on disk, stats and prune.

exec's use of it (hits, misses, kill -9, shared directories) is in test_exec_cache.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from batchutil import ENV, cli

from jsonlbatch.batch_format.records import request_line
from jsonlbatch.cache import Cache, body_digest, body_key, cache_stats, count_draws, one_draw, prune
from jsonlbatch.cache.pack import decode_record, encode_record
from jsonlbatch.cache.store import MARKER, MERGE_AT, WALKED_MAX
from jsonlbatch.errors import OutputError, UsageError

CHAT = "/v1/chat/completions"


def key_of(text: str, url: str = CHAT) -> str:
    return body_key(url, orjson.loads(text))


def test_keys_ignore_key_order_whitespace_and_number_spelling():
    a = key_of('{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.6,"max_tokens":64}')  # fmt: skip
    b = key_of(
        '{ "max_tokens" : 64.0, "temperature": 0.60,\n "messages": [{"content": "hi", '
        '"role": "user"}], "model": "m" }'
    )
    assert a == b
    # answer-neutral fields are left out; the custom_id is not in the body at all
    c = key_of(
        '{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":6e-1,'
        '"max_tokens":64,"metadata":{"run":"x"},"user":"u1","stream":true,'
        '"stream_options":{"include_usage":true},"store":false}'
    )
    assert c == a


def test_keys_differ_where_the_answer_can():
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
    k = body_key(CHAT, base)
    assert body_key(CHAT, {**base, "max_tokens": 65}) != k
    assert body_key(CHAT, {**base, "temperature": 0.7}) != k
    assert body_key(CHAT, {**base, "model": "other"}) != k
    assert body_key(CHAT, {**base, "n": 2}) != k
    assert body_key(CHAT, {**base, "messages": [{"role": "user", "content": "hi "}]}) != k
    assert body_key("/v1/completions", base) != k  # the endpoint path is part of the key
    assert body_key(CHAT, base, scope=b"http://a/v1") != k  # --cache-key-url
    assert body_key(CHAT, {**base, "logprobs": True}) != k
    # a boolean is not the number 1
    assert body_key(CHAT, {**base, "logprobs": 1}) != body_key(CHAT, {**base, "logprobs": True})


def test_one_draw_rules():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert not one_draw(CHAT, body)  # the default temperature samples
    assert not one_draw(CHAT, {**body, "temperature": 0.7})
    assert one_draw(CHAT, {**body, "temperature": 0})
    assert one_draw(CHAT, {**body, "temperature": 0.0, "n": 3})
    assert one_draw(CHAT, {**body, "temperature": 1.0, "seed": 7})
    assert not one_draw(CHAT, {**body, "seed": None})
    assert one_draw("/v1/embeddings", {"model": "e", "input": "x"})


def test_draws_count_copies_over_the_whole_file(tmp_path: Path):
    sample = {"model": "m", "messages": [{"role": "user", "content": "s"}], "temperature": 0.8}
    greedy = {"model": "m", "messages": [{"role": "user", "content": "g"}], "temperature": 0}
    path = tmp_path / "req.jsonl"
    lines = []
    for i in range(3):
        lines.append(request_line(f"s{i}", sample))
        lines.append(request_line(f"g{i}", greedy))
    # the same body spelled otherwise is the same body
    lines.append(b'{"custom_id":"s3","url":"/v1/chat/completions","body":{"temperature":0.80,'
                 b'"messages":[{"content":"s","role":"user"}],"model":"m"}}\n')  # fmt: skip
    path.write_bytes(b"".join(lines))
    draws = count_draws(path)
    ids = [orjson.loads(line)["custom_id"] for line in lines]
    assert [draws.draw_of(i) for i in ids] == [0, 0, 1, 0, 2, 0, 3]
    assert draws.repeats == 3
    # --model makes bodies of different models one body
    other = tmp_path / "models.jsonl"
    other.write_bytes(
        request_line("a", {**sample, "model": "x"}) + request_line("b", {**sample, "model": "y"})
    )
    assert count_draws(other).repeats == 0
    assert count_draws(other, model="z").repeats == 1


def _key(name: str) -> bytes:
    return body_digest(CHAT, {"model": "m", "messages": [{"role": "user", "content": name}]})


def _files(root: Path, suffix: str) -> list[str]:
    return sorted(p.name for p in (root / "packs").glob(f"*{suffix}"))


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_records_round_trip_and_corruption_is_a_miss(tmp_path: Path):
    root = tmp_path / "c"
    cache = Cache(root)
    key, other = _key("a"), _key("b")
    body = b'{"id":"x","choices":[{"message":{"content":"hello"}}]}'
    assert cache.get(key, 0) is None
    assert cache.put(key, 0, True, body, {"model": "m"}) == 0
    assert cache.put(other, 0, True, b'{"b":1}', {"model": "m"}) == 0
    entry = cache.get(key, 0)
    assert entry is not None and entry.body == body and entry.meta["model"] == "m"
    cache.close()
    [pack] = _files(root, ".pack")
    assert len(_files(root, ".idx")) == 1
    path = root / "packs" / pack
    data = path.read_bytes()
    assert b"hello" not in data  # compressed
    assert Cache(root, "read").get(key, 0).body == body
    # a flipped byte in the first record: a miss, counted; the other record still reads
    path.write_bytes(data[:40] + bytes([data[40] ^ 1]) + data[41:])
    reader = Cache(root, "read")
    assert reader.get(key, 0) is None and reader.counts.corrupt == 1
    assert reader.get(other, 0).body == b'{"b":1}'
    reader.close()
    assert cache_stats(root).corrupt == 1
    # a later store of that draw is served (one-draw answers are stored again when torn)
    writer = Cache(root)
    assert writer.put(key, 0, True, b'{"v":2}', {"model": "m"}) == 0
    writer.close()
    assert Cache(root, "read").get(key, 0).body == b'{"v":2}'
    # a pack cut short: the last record is a miss, counted too
    path.write_bytes(path.read_bytes()[:-3])
    reader = Cache(root, "read")
    assert reader.get(other, 0) is None and reader.counts.corrupt == 1
    assert reader.get(key, 0).body == b'{"v":2}'  # from the second pack
    assert decode_record(b"JBR2" + bytes(40)) is None
    record = encode_record(key, 3, {"model": "m"}, body)
    assert decode_record(record, key, 3).body == body and decode_record(record, key, 4) is None


def test_a_taken_draw_is_never_overwritten(tmp_path: Path):
    cache = Cache(tmp_path / "c")
    key = _key("sampled")
    assert cache.put(key, 0, False, b'{"a":0}', {}) == 0
    # draw 0 is stored already (by this or another process): this answer becomes draw 1
    assert cache.put(key, 0, False, b'{"a":1}', {}) == 1
    assert cache.get(key, 0).body == b'{"a":0}' and cache.get(key, 1).body == b'{"a":1}'
    assert cache.counts.stored == 2
    cache.close()
    leftovers = [n for _, _, names in os.walk(cache.root) for n in names if n.endswith(".tmp")]
    assert leftovers == []


# A process that stores answers and prints each one once it is stored: "<name> <draw>".
# Odd ones are its own, even ones are shared with another writer (the same body).
WRITER = """
import sys, time
from jsonlbatch.cache import Cache, body_digest
root, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
cache = Cache(root)
for i in range(n):
    name = f"{tag}{i}" if i % 2 else f"shared{i}"
    key = body_digest("/v1/chat/completions",
                      {"model": "m", "messages": [{"role": "user", "content": name}]})
    draw = cache.put(key, 0, True, b'{"n":"%s"}' % name.encode(), {"model": "m"})
    print(name, draw, flush=True)
if sys.argv[4:] == ["hang"]:
    print("hang", flush=True)
    time.sleep(120)
cache.close()
"""


def _writer(root: Path, tag: str, n: int, hang: bool = False) -> subprocess.Popen:
    args = [sys.executable, "-c", WRITER, str(root), tag, str(n), *(["hang"] if hang else [])]
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=ENV)


def _killed(proc: subprocess.Popen, after: str) -> list[str]:
    """The names `proc` said it stored, until it says `after` (or had said 200); then SIGKILL."""
    stored = []
    try:
        for line in proc.stdout:
            if line.strip() == after or len(stored) == 200:
                break
            stored.append(line.split()[0])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
    return stored


def _body(name: str) -> bytes:
    return b'{"n":"%s"}' % name.encode()


def test_a_killed_writer_s_pack_is_read_and_prune_leaves_it_alone(tmp_path: Path):
    root = tmp_path / "c"
    stored = _killed(_writer(root, "k", 6, hang=True), after="hang")
    assert len(stored) == 6
    assert _files(root, ".idx") == []  # killed before its close: no index
    reader = Cache(root, "read")
    assert all(reader.get(_key(n), 0).body == _body(n) for n in stored)
    reader.close()
    # young and unsealed: its writer may still append, so prune leaves it as it is
    before = _snapshot(root)
    result = prune(root, model="m")
    assert (result.removed, result.kept, result.in_use, result.in_use_packs) == (0, 6, 6, 1)
    assert "still being written" in result.format()
    assert {k: v for k, v in _snapshot(root).items() if k.endswith(".pack")} == {
        k: v for k, v in before.items() if k.endswith(".pack")
    }
    assert len(_files(root, ".idx")) == 1  # indexed (unsealed) all the same
    assert Cache(root, "read").get(_key(stored[0]), 0) is not None
    # an hour later its writer is surely dead: now it is pruned
    [pack] = _files(root, ".pack")
    then = time.time() - 7200
    os.utime(root / "packs" / pack, (then, then))
    assert prune(root, model="m").removed == 6
    assert _files(root, ".pack") == [] and _files(root, ".idx") == []


def test_a_live_writer_s_pack_is_not_rewritten(tmp_path: Path):
    root = tmp_path / "c"
    cache = Cache(root)
    cache.put(_key("x"), 0, True, b"{}", {"model": "m"})
    before = _snapshot(root)
    assert prune(root, max_bytes=0).in_use == 1
    assert {k: v for k, v in _snapshot(root).items() if k.endswith(".pack")} == {
        k: v for k, v in before.items() if k.endswith(".pack")
    }
    cache.put(_key("y"), 0, True, b"{}", {"model": "m"})  # the writer goes on appending
    cache.close()
    reader = Cache(root, "read")
    assert reader.get(_key("x"), 0) is not None and reader.get(_key("y"), 0) is not None


def test_many_indexes_are_merged_into_one(tmp_path: Path):
    root = tmp_path / "c"
    names = []
    for run in range(MERGE_AT + 1):
        if run == MERGE_AT:
            before = set(_files(root, ".idx"))
            assert len(before) == MERGE_AT
        cache = Cache(root)
        for i in range(3):
            names.append(f"{run}-{i}")
            cache.put(_key(names[-1]), 0, True, _body(names[-1]), {"model": "m"})
        cache.close()
    after = _files(root, ".idx")
    assert len(after) == 1 and not before & set(after)
    reader = Cache(root, "read")
    assert all(reader.get(_key(n), 0).body == _body(n) for n in names)
    assert not reader.view().walked  # one index covers every pack


def test_a_big_unindexed_pack_is_indexed_by_the_next_writer(tmp_path: Path):
    """A killed run leaves a pack and no index: readers walk it (every answer is found), and
    the next process that stores anything writes one index over it, so later ones do not."""
    root = tmp_path / "c"
    killed = Cache(root)
    for i in range(WALKED_MAX + 10):
        killed.put(_key(str(i)), 0, True, b'{"n":%d}' % i, {"model": "m"})
    assert killed._pack_fd is not None
    os.close(killed._pack_fd)  # as a kill -9 leaves it: no index written
    killed._pack_fd = None
    writer = Cache(root)
    assert writer.view().walked == WALKED_MAX + 10
    assert writer.get(_key("7"), 0).body == b'{"n":7}'
    writer.put(_key("new"), 0, True, b'{"n":-1}', {"model": "m"})
    writer.close()
    assert len(_files(root, ".idx")) == 1
    reader = Cache(root, "read")
    assert reader.view().walked == 0
    assert reader.get(_key("7"), 0).body == b'{"n":7}' and reader.get(_key("new"), 0) is not None
    reader.close()


def test_two_processes_write_one_cache_and_one_is_killed(tmp_path: Path):
    root = tmp_path / "c"
    survivor = _writer(root, "b", 1000)
    victim = _writer(root, "a", 100_000)
    stored = [survivor.stdout.readline().split()[0] for _ in range(100)]  # both are writing
    killed_stored = _killed(victim, after="never")
    out = survivor.stdout.read()  # not communicate(): it would skip what readline buffered
    assert survivor.wait(timeout=60) == 0
    stored += [line.split()[0] for line in out.splitlines()]
    assert len(stored) == 1000 and len(killed_stored) == 200
    reader = Cache(root, "read")
    for name in stored + killed_stored:
        entry = reader.get(_key(name), 0)
        assert entry is not None and entry.body == _body(name), name
    assert reader.counts.corrupt == 0
    reader.close()
    stats = cache_stats(root)
    assert stats.entries >= len(set(stored + killed_stored)) and stats.packs == 2


def test_a_rewritten_pack_keeps_its_place_in_name_order(tmp_path: Path):
    """Two runs stored one draw at once: the copy in the pack whose name sorts first wins, and
    still wins once prune has rewritten that pack (and the other one)."""
    root = tmp_path / "c"
    a, b = Cache(root), Cache(root)
    a.view(), b.view()  # both listed the cache before either stored: both store the draw
    for cache, tag in ((a, b"a"), (b, b"b")):
        cache.put(_key("same"), 0, True, b'{"by":"%s"}' % tag, {"model": "m"})
        cache.put(_key(f"gone-{tag.decode()}"), 0, True, b"{}", {"model": "old"})
        cache.close()
    first = Cache(root, "read").get(_key("same"), 0).body
    assert prune(root, model="old").removed == 2
    assert all("~" in name for name in _files(root, ".pack"))
    reader = Cache(root, "read")
    assert reader.get(_key("same"), 0).body == first and not reader.view().walked


def test_folders_that_are_not_caches_are_refused(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="not a jsonlbatch cache"):
        Cache(tmp_path)
    with pytest.raises(OutputError, match="does not exist"):
        Cache(tmp_path / "missing", mode="read")
    with pytest.raises(UsageError):
        Cache(tmp_path / "x", mode="sometimes")
    with pytest.raises(OutputError, match="not a jsonlbatch cache"):
        prune(tmp_path, older_than=1)
    # a new folder becomes a cache, marked for backup tools too
    cache = Cache(tmp_path / "new")
    assert (Path(cache.root) / "CACHEDIR.TAG").read_text().startswith("Signature: 8a477f59")
    # a cache of the first format (one file per answer) is refused, not mixed in or pruned
    old = tmp_path / "old"
    (old / "answers" / "ab").mkdir(parents=True)
    (old / MARKER).write_text('{"format": 1}\n')
    for call in (Cache, cache_stats, lambda r: prune(r, older_than=1)):
        with pytest.raises(OutputError, match=r"has format 1.*reads format 2"):
            call(old)
    assert sorted(p.name for p in old.iterdir()) == ["answers", MARKER]


READER = """
import sys
from jsonlbatch.cache import Cache, body_digest, cache_stats
from jsonlbatch.errors import OutputError
cache = Cache(sys.argv[1])
key = body_digest("/v1/chat/completions",
                  {"model": "m", "messages": [{"role": "user", "content": "ro"}]})
print(cache.get(key, 0).body.decode(), cache.put(key, 1, False, b"{}", {}), cache.counts.notes)
print(cache_stats(sys.argv[1]).entries)
try:
    from jsonlbatch.cache import prune
    prune(sys.argv[1], model="m")
except OutputError as exc:
    print("refused:", exc)
"""


def test_a_read_only_cache_is_read(tmp_path: Path):
    root = tmp_path / "c"
    _fill(root, 3, "m", age_s=0)
    cache = Cache(root)
    cache.put(_key("ro"), 0, True, b'{"ro":1}', {"model": "m"})
    cache.close()
    args = [sys.executable, "-c", READER, str(root)]
    if os.geteuid() != 0:
        for path in [root, *root.rglob("*")]:
            path.chmod(0o555)
    else:  # modes do not stop root: a read-only bind mount in a private mount namespace
        if shutil.which("unshare") is None:
            pytest.skip("running as root without unshare: no way to make a folder read-only")
        if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0:
            pytest.skip("running as root and unshare is not permitted here")
        script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
        args = ["unshare", "-rm", "sh", "-c", script, "sh", str(root), *args]
    before = _snapshot(root)
    try:
        run = subprocess.run(args, capture_output=True, text=True, timeout=60, env=ENV)
    finally:
        for path in [root, *root.rglob("*")]:
            path.chmod(0o755)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith('{"ro":1} -1 ') and "reading it only" in lines[0]
    assert lines[1] == "4"
    assert lines[2].startswith("refused: cannot prune cache")
    assert _snapshot(root) == before


def _fill(root: Path, n: int, model: str, age_s: float, monkeypatch=None) -> None:
    """Store `n` answers of `model`, the i-th as if `age_s + i` seconds ago (distinct ages:
    --max-size removes the oldest first), then close the cache (its pack is sealed)."""
    cache = Cache(root)
    real = time.time
    with pytest.MonkeyPatch.context() as patch:
        for i in range(n):
            then = real() - age_s - i
            patch.setattr(time, "time", lambda then=then: then)
            cache.put(_key(f"{model}{i}"), 0, True, b'{"x":%d}' % i, {"model": model})
    cache.close()


def test_stats_and_prune_by_model_age_and_size(tmp_path: Path):
    root = tmp_path / "c"
    _fill(root, 6, "alpha", age_s=10 * 86400)
    alpha = _files(root, ".pack")
    _fill(root, 4, "beta", age_s=60)
    [beta] = set(_files(root, ".pack")) - set(alpha)
    cache = Cache(root)
    cache.counts.hits, cache.counts.misses, cache.counts.stored = 7, 3, 3
    cache.record_run("out.jsonl")
    with open(root / "packs" / beta, "ab") as f:  # a torn record after beta's answers
        f.write(encode_record(_key("torn"), 0, {"model": "beta"}, b"{}")[:-4])
    stale = root / "packs" / "x.idx.1234.tmp"
    stale.write_bytes(b"")
    os.utime(stale, (time.time() - 7200,) * 2)

    stats = cache_stats(root)
    assert (stats.entries, stats.corrupt, stats.temp_files) == (10, 1, 1)
    assert stats.models == {"alpha": 6, "beta": 4} and (stats.packs, stats.indexes) == (2, 2)
    assert (stats.runs, stats.hits, stats.misses) == (1, 7, 3)
    assert stats.oldest < time.time() - 10 * 86400 < stats.newest
    text = stats.format()
    assert "10 answers" in text and "70.0% of lookups" in text and "alpha: 6 answers" in text

    before = _snapshot(root)
    dry = prune(root, older_than=86400, dry_run=True)
    assert (dry.removed, dry.kept, dry.temp_removed) == (7, 4, 1)  # six old, the torn one
    assert "would remove 7 answers" in dry.format(dry_run=True)
    assert _snapshot(root) == before
    done = prune(root, older_than=86400)
    assert (done.removed, done.kept, done.temp_removed, done.in_use) == (7, 4, 1, 0)
    assert not stale.exists()
    [pack] = _files(root, ".pack")
    assert pack.startswith(beta[: -len(".pack")] + "~")  # sorts where beta's pack did
    assert len(_files(root, ".idx")) == 1
    stats = cache_stats(root)
    assert stats.models == {"beta": 4} and stats.corrupt == 0
    reader = Cache(root, "read")
    assert [reader.get(_key(f"beta{i}"), 0).body for i in range(4)] == [
        b'{"x":%d}' % i for i in range(4)
    ]
    assert reader.get(_key("alpha0"), 0) is None and not reader.view().walked
    reader.close()

    trimmed = prune(root, max_bytes=done.kept_bytes - 1)  # the oldest one goes
    assert (trimmed.removed, trimmed.kept) == (1, 3)
    assert Cache(root, "read").get(_key("beta3"), 0) is None
    assert _files(root, ".pack")[0].startswith(beta[: -len(".pack")] + "~")
    assert prune(root, model="beta").removed == 3
    assert cache_stats(root).entries == 0 and _files(root, ".pack") == []
    with pytest.raises(UsageError):
        prune(root)


def test_cache_commands(tmp_path: Path):
    root = tmp_path / "c"
    _fill(root, 3, "alpha", age_s=3 * 86400)
    out = cli("cache", "stats", str(root))
    assert out.returncode == 0 and "3 answers" in out.stdout and "alpha: 3" in out.stdout
    out = cli("cache", "prune", str(root), "--older-than", "2d", "--dry-run")
    assert out.returncode == 0 and "would remove 3 answers" in out.stdout
    out = cli("cache", "prune", str(root), "--max-size", "1G")
    assert out.returncode == 0 and "removed 0 answers" in out.stdout
    out = cli("cache", "prune", str(root), "--older-than", "soon")
    assert out.returncode == 2 and "give a number and a unit" in out.stderr
    out = cli("cache", "stats", str(tmp_path / "nothing"))
    assert out.returncode == 1 and "Traceback" not in out.stderr


def test_damaged_index_slots_are_misses_not_crashes(tmp_path: Path):
    """Flipped bytes in an index's slots (a disk error, a bad copy) point at a pack number
    past its covers or a record of absurd length: a lookup is a miss, and a closing writer's
    merge of that index does not fail either."""
    from jsonlbatch.cache.pack import INDEX_HEAD, SLOT, Index

    root = tmp_path / "c"
    cache = Cache(root)
    names = [f"d{i}" for i in range(6)]
    for name in names:
        cache.put(_key(name), 0, True, _body(name), {"model": "m"})
    cache.close()
    [idx] = _files(root, ".idx")
    path = root / "packs" / idx
    index = Index.open(str(path))
    base, n_slots = index.table.base, index.table.n_slots
    index.close()
    data = bytearray(path.read_bytes())
    assert INDEX_HEAD.size <= base
    for at in range(n_slots):
        slot = base + at * SLOT.size
        k, d, pack, offset, length = SLOT.unpack_from(data, slot)
        if k:  # half the entries: a pack number past the covers, half: a huge length
            bad = (k, d, 1000, offset, length) if at % 2 else (k, d, pack, offset, 1 << 62)
            SLOT.pack_into(data, slot, *bad)
    path.write_bytes(bytes(data))
    reader = Cache(root)
    found = [reader.get(_key(n), 0) for n in names]  # a miss, or the record the CRC vouches for
    assert None in found and all(
        e is None or e.body == _body(n) for e, n in zip(found, names, strict=True)
    )
    for name in names:  # stored again; every index and the merge over them are written
        reader.put(_key(name), 0, True, _body(name), {"model": "m"})
    reader.close()
    for i in range(MERGE_AT):  # the last one merges every index, the damaged one too
        writer = Cache(root)
        writer.put(_key(f"x{i}"), 0, True, b"{}", {"model": "m"})
        writer.close()
    assert idx not in _files(root, ".idx")
    again = Cache(root, "read")
    found = [again.get(_key(n), 0) for n in names]
    assert all(e is None or e.body == _body(n) for e, n in zip(found, names, strict=True))


def test_a_good_copy_of_a_damaged_record_survives_a_merge(tmp_path: Path, monkeypatch):
    """A record damaged on disk is a miss and the next store adds a good copy; the index that
    merges both keeps the copy that reads, not the first pack's damaged one (every later run
    would miss it, pay again, and lose its new copy at the next merge)."""
    import itertools

    import jsonlbatch.cache.store as store

    names = itertools.count()  # packs named in the order they are made: the damaged one first
    monkeypatch.setattr(store, "_unique", lambda: f"w{next(names):06d}")
    root = tmp_path / "c"
    key = _key("damaged")
    first = Cache(root)
    first.put(key, 0, True, b'{"v":1}', {"model": "m"})
    first.close()
    [pack] = _files(root, ".pack")
    data = bytearray((root / "packs" / pack).read_bytes())
    data[40] ^= 1
    (root / "packs" / pack).write_bytes(bytes(data))
    second = Cache(root)
    assert second.get(key, 0) is None
    assert second.put(key, 0, True, b'{"v":2}', {"model": "m"}) == 0
    second.close()
    for i in range(MERGE_AT):
        writer = Cache(root)
        writer.put(_key(f"other{i}"), 0, True, b"{}", {"model": "m"})
        writer.close()
    assert len(_files(root, ".idx")) < MERGE_AT  # merged
    reader = Cache(root, "read")
    assert not reader.view().walked
    assert reader.get(key, 0).body == b'{"v":2}'


def test_a_cache_whose_packs_folder_is_a_file_is_an_error_not_a_traceback(tmp_path: Path):
    root = tmp_path / "c"
    Cache(root).close()
    (root / "packs").rmdir()
    (root / "packs").write_bytes(b"")
    with pytest.raises(OutputError, match="cannot read cache"):
        cache_stats(root)
    for command in (["stats"], ["prune", "--older-than", "1d"]):
        done = cli("cache", *command, str(root))
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert "cannot read cache" in done.stderr


def test_a_record_being_written_while_a_pack_is_walked_is_found_later(tmp_path: Path):
    """A reader walks a live writer's pack while a record is half written; its merged index
    covers the pack only up to the last whole record, so the record, once whole, is found
    (the writer killed before writing its own index)."""
    from jsonlbatch.cache.pack import encode_record

    root = tmp_path / "c"
    for i in range(MERGE_AT):  # enough indexes that the next closing writer merges them
        writer = Cache(root)
        writer.put(_key(f"old{i}"), 0, True, b"{}", {"model": "m"})
        writer.close()
    live = Cache(root)
    live.put(_key("whole"), 0, True, _body("whole"), {"model": "m"})
    record = encode_record(_key("late"), 0, {"model": "m"}, _body("late"))
    [path] = [p for p in (root / "packs").glob("*.pack") if p.name == live._pack_name]
    with open(path, "ab") as f:
        f.write(record[: len(record) // 2])  # the write in progress, as a reader sees it
    merger = Cache(root)
    merger.put(_key("merger"), 0, True, b"{}", {"model": "m"})
    merger.close()
    assert len(_files(root, ".idx")) == 1
    with open(path, "ab") as f:
        f.write(record[len(record) // 2 :])  # the write completes; its writer is then killed
    reader = Cache(root, "read")
    assert reader.get(_key("late"), 0).body == _body("late")
    assert reader.get(_key("whole"), 0).body == _body("whole")

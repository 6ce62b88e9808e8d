"""Planted and damaged cache files (issue 37): whatever is in a cache folder was maybe written by
someone else, so reading it is bounded: a miss or a clear error, never a hang or a traceback.
And `--cache-mode write` refreshes: what it stores replaces what other runs stored.

The bombs are small (a table of 64 slots, a record of a few KB inflating to 300 MB); the
subprocesses that could hang on the old code have a timeout, so a hang fails the test.
"""

from __future__ import annotations

import os
import resource
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import orjson
from batchutil import ENV, chat_body, cli, exec_cli, read_results

from jsonlbatch import execute
from jsonlbatch.batch_format.records import request_line
from jsonlbatch.cache import Cache, body_digest, cache_stats, prune
from jsonlbatch.cache.pack import (
    INDEX_HEAD,
    INDEX_MAGIC,
    REC_MAGIC,
    SLOT,
    ZDICT,
    Index,
    decode_record,
    encode_record,
)
from jsonlbatch.cache.store import MERGE_AT

CHAT = "/v1/chat/completions"


def _key(name: str) -> bytes:
    return body_digest(CHAT, {"model": "m", "messages": [{"role": "user", "content": name}]})


def _plant_index(root: Path, name: str, covers: object, slots: list[tuple], entries: int) -> Path:
    """An index file laid out as `pack.write_index` lays one out, with whatever is given."""
    covers_json = orjson.dumps(covers)
    head = INDEX_HEAD.pack(INDEX_MAGIC, len(covers_json), len(slots), entries)
    pad = bytes(-(len(head) + len(covers_json)) % 8)
    path = root / "packs" / name
    path.write_bytes(head + covers_json + pad + b"".join(SLOT.pack(*s) for s in slots))
    return path


def _full_table(root: Path, pack: str, entries: int = 3) -> Path:
    """An index of 64 slots, none empty: the old lookup of a key not there never ended."""
    slots = [(1000 + i, 0, 0, 0, 40) for i in range(64)]
    return _plant_index(root, "0000-planted.idx", [[pack, 10, True]], slots, entries)


def _cache_with(root: Path, names: list[str]) -> str:
    cache = Cache(root)
    for name in names:
        cache.put(_key(name), 0, True, b'{"n":"%s"}' % name.encode(), {"model": "m"})
    cache.close()
    return next((p.name for p in (root / "packs").glob("*.pack")), "")


def _in_child(code: str, root: Path) -> subprocess.CompletedProcess:
    """`code` run in a fresh interpreter with `root` as sys.argv[1]; 60 s for a hang to show."""
    return subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True,
                          text=True, timeout=60, env=ENV)  # fmt: skip


LOOKUPS = """
import sys
from jsonlbatch import execute
from jsonlbatch.cache import Cache, body_digest
cache = Cache(sys.argv[1], "read")
found = []
for name in ("a", "b", "nowhere"):
    key = body_digest("/v1/chat/completions",
                      {"model": "m", "messages": [{"role": "user", "content": name}]})
    entry = cache.get(key, 0)
    found.append(entry.body.decode() if entry else None)
print(found)
"""


def test_an_index_with_no_empty_slot_is_a_miss_not_a_hang(tmp_path: Path):
    root = tmp_path / "c"
    pack = _cache_with(root, ["a", "b"])
    _full_table(root, pack)
    done = _in_child(LOOKUPS, root)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == """['{"n":"a"}', '{"n":"b"}', None]"""


def test_exec_on_a_cache_with_a_planted_index_runs(tmp_path: Path, mock_server):
    """The issue's attack: every run on the cache spun at 100% CPU and wrote nothing."""
    url = mock_server()
    root = tmp_path / "c"
    pack = _cache_with(root, ["a"])
    _full_table(root, pack)
    req = tmp_path / "req.jsonl"
    req.write_bytes(b"".join(request_line(f"r{i}", chat_body(i, temperature=0))
                             for i in range(3)))  # fmt: skip
    out = tmp_path / "out.jsonl"
    done = exec_cli(req, out, "--url", url, "--cache", str(root), timeout=60)
    assert done.returncode == 0, done.stderr
    assert len(read_results(out)) == 3
    # a closing writer that merges the planted index (its header says 3 entries: 64 are
    # there) builds a table that grows, instead of probing a full one for ever
    for i in range(MERGE_AT):
        execute(str(req), str(tmp_path / f"o{i}.jsonl"), urls=[url], quiet=True,
                cache=str(root), cache_mode="write")  # fmt: skip
    assert "0000-planted.idx" not in os.listdir(root / "packs")
    assert cache_stats(root).entries >= 4


def test_thousands_of_packs_do_not_use_up_descriptors(tmp_path: Path, mock_server):
    """1,500 packs (planted, or a cache many runs used) were all kept open: under a limit of
    1,024 descriptors exec could not even start its event loop (a traceback)."""
    url = mock_server()
    root = tmp_path / "c"
    _cache_with(root, ["a"])
    for i in range(1500):
        (root / "packs" / f"1999{i:05d}-planted.pack").write_bytes(REC_MAGIC + bytes(40))
    req = tmp_path / "req.jsonl"
    req.write_bytes(b"".join(request_line(f"r{i}", chat_body(i, temperature=0))
                             for i in range(3)))  # fmt: skip
    out = tmp_path / "out.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "jsonlbatch", "exec", str(req), "-o", str(out), "--url", url,
         "--cache", str(root)],
        capture_output=True, text=True, timeout=120, env=ENV,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024)),
    )  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert len(read_results(out)) == 3


def test_index_headers_and_covers_are_checked(tmp_path: Path):
    """Covers that are not [name, size, sealed] (a negative size made the tail walk fail with
    an OSError traceback), more entries than slots: the index is left out, lookups still work."""
    root = tmp_path / "c"
    pack = _cache_with(root, ["a", "b"])
    empty = [(0, 0, 0, 0, 0)] * 8
    bad = {
        "neg.idx": ([[pack, -5, True]], 0),
        "dict.idx": ({"a": 1}, 0),
        "types.idx": ([[[pack], "10", 1]], 0),
        "entries.idx": ([[pack, 10, True]], 9),
    }
    for name, (covers, entries) in bad.items():
        path = _plant_index(root, name, covers, empty, entries)
        assert Index.open(str(path)) is None, name
    done = _in_child(LOOKUPS, root)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.strip() == """['{"n":"a"}', '{"n":"b"}', None]"""
    stats = cli("cache", "stats", str(root))
    assert stats.returncode == 0 and "2 answers" in stats.stdout, stats.stderr


def test_special_files_in_a_cache_are_not_waited_on_or_read_for_ever(tmp_path: Path):
    """A FIFO named like a pack or an index blocked every open; /dev/zero as the marker or a
    run's record was read until memory ran out."""
    root = tmp_path / "c"
    _cache_with(root, ["a", "b"])
    os.mkfifo(root / "packs" / "00-fifo.pack")
    os.mkfifo(root / "packs" / "00-fifo.idx")
    (root / "runs").mkdir(exist_ok=True)
    os.symlink("/dev/zero", root / "runs" / "zero.json")
    done = _in_child(LOOKUPS, root)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == """['{"n":"a"}', '{"n":"b"}', None]"""
    assert cache_stats(root).entries == 2
    assert prune(root, older_than=30 * 86400).removed == 0
    marker = root / "jsonlbatch-cache.json"
    marker.unlink()
    os.symlink("/dev/zero", marker)
    done = _in_child(LOOKUPS, root)
    assert done.returncode == 1 and "has format None" in done.stderr, done.stderr


def test_a_deflate_bomb_record_is_damaged_not_inflated(tmp_path: Path):
    """A record of a few hundred KB that inflates to 300 MB: a miss, not 300 MB in memory."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15, 8, zlib.Z_DEFAULT_STRATEGY, ZDICT)
    head = deflate.compress(b'{"model":"m"}\n') + deflate.flush(zlib.Z_FULL_FLUSH)
    # after a full flush the stream starts afresh: one MB of zeros compressed once, repeated
    megabyte = deflate.compress(bytes(1 << 20)) + deflate.flush(zlib.Z_FULL_FLUSH)
    payload = head + megabyte * 300 + deflate.flush()
    key = _key("bomb")
    rest = struct.pack("<II16s", len(payload), 0, key) + payload  # length, draw, key
    record = REC_MAGIC + struct.pack("<I", zlib.crc32(rest)) + rest
    assert len(record) < 1 << 20
    assert decode_record(record, key, 0) is None
    assert decode_record(record, head_only=True) is not None  # its head still reads


def test_planted_metadata_is_kept_to_its_fields_types_and_ranges(tmp_path: Path):
    """A record's metadata is checked where it is read: a `created` of 1e300 was a
    strftime traceback in `cache stats`; a `request_id` of any JSON went into output lines."""
    meta = {"model": ["not", "a", "name"], "created": 1e300, "status": 70000,
            "request_id": {"x": 1}, "usage": {"prompt_tokens": 1 << 60, "completion_tokens": 3},
            "url": 5, "planted": "x" * 100}  # fmt: skip
    entry = decode_record(encode_record(_key("m"), 0, meta, b"{}"))
    assert entry is not None and entry.meta == {"usage": {"completion_tokens": 3}}
    root = tmp_path / "c"
    _cache_with(root, [])
    foreign = root / "packs" / "20000101T000000-elsewhere.pack"
    foreign.write_bytes(encode_record(_key("m"), 0, meta, b"{}"))
    assert cache_stats(root).entries == 1
    stats = cli("cache", "stats", str(root))
    assert stats.returncode == 0 and "Traceback" not in stats.stderr, stats.stderr
    assert prune(root, older_than=3600).removed == 0  # aged by its pack's time instead


def test_cache_mode_write_replaces_an_answer(tmp_path: Path, mock_server):
    """`--cache-mode write` is documented as "store, never look up (refresh)": it stored
    nothing over an existing answer, so a bad answer could never be replaced. Now a normal run
    afterwards gets the refreshed answer, greedy and sampled bodies alike."""
    first, second = mock_server(), mock_server(reasoning=True)
    root = tmp_path / "c"
    req = tmp_path / "req.jsonl"
    bodies = [chat_body(0, temperature=0), chat_body(1, temperature=0.9),
              chat_body(1, temperature=0.9)]  # fmt: skip
    req.write_bytes(b"".join(request_line(f"r{i}", b) for i, b in enumerate(bodies)))

    def answers(out: Path) -> dict[str, object]:
        return {cid: line["response"]["body"] for cid, line in read_results(out).items()}

    def run(out: str, url: str, mode: str = "rw") -> dict[str, object]:
        execute(str(req), str(tmp_path / out), urls=[url], quiet=True, cache=str(root),
                cache_mode=mode)  # fmt: skip
        return answers(tmp_path / out)

    old = run("a.jsonl", first)
    new = run("b.jsonl", second, "write")
    assert all(new[cid] != old[cid] for cid in new)  # each answer is its own (ids, reasoning)
    assert run("c.jsonl", first) == new
    hits = read_results(tmp_path / "c.jsonl")
    assert all(line["metrics"].get("cache") == "hit" for line in hits.values())
    # a second refresh replaces the first; a merged index (a closing writer merges past
    # MERGE_AT indexes) keeps the newest refresh too
    for i in range(MERGE_AT + 1):
        last = run(f"w{i}.jsonl", first if i % 2 else second, "write")
    assert len(list((root / "packs").glob("*.idx"))) < MERGE_AT
    assert run("d.jsonl", first) == last

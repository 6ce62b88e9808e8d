"""The answer cache as a library: keys, draws, entries on disk, stats and prune.

exec's use of it (hits, misses, kill -9, shared directories) is in test_exec_cache.py.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import orjson
import pytest
from batchutil import cli

from jsonlbatch.cache import Cache, body_key, cache_stats, count_draws, one_draw, prune
from jsonlbatch.cache.store import decode_entry, encode_entry, entry_path
from jsonlbatch.errors import OutputError, UsageError
from jsonlbatch.records import request_line

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


def _meta() -> dict:
    return {"url": CHAT, "model": "m"}


def test_entries_round_trip_and_corruption_is_a_miss(tmp_path: Path):
    cache = Cache(tmp_path / "c")
    key = body_key(CHAT, {"model": "m", "messages": []})
    body = b'{"id":"x","choices":[{"message":{"content":"hello"}}]}'
    assert cache.get(f"{key}.0") is None
    assert cache.put(key, 0, True, body, _meta()) == f"{key}.0"
    entry = cache.get(f"{key}.0")
    assert entry is not None and entry.body == body and entry.meta["model"] == "m"
    path = entry_path(cache.root, f"{key}.0")
    data = Path(path).read_bytes()
    assert b"hello" not in data  # compressed
    for broken in (data[:-3], data[:10], b"", data[:20] + bytes([data[20] ^ 1]) + data[21:]):
        Path(path).write_bytes(broken)
        assert cache.get(f"{key}.0") is None
    assert cache.counts.corrupt == 4
    # an entry under the wrong name (a copied file) is no answer for that name
    Path(path).write_bytes(encode_entry({"name": f"{key}.1"}, body))
    assert cache.get(f"{key}.0") is None
    # a store replaces a corrupt entry
    assert cache.put(key, 0, True, b'{"v":2}', _meta()) == f"{key}.0"
    assert cache.get(f"{key}.0").body == b'{"v":2}'
    # a valid one-draw answer is kept, not overwritten
    assert cache.put(key, 0, True, b'{"v":3}', _meta()) == f"{key}.0"
    assert cache.get(f"{key}.0").body == b'{"v":2}'
    assert decode_entry(b"JBC1" + bytes(8)) is None


def test_a_taken_draw_is_never_overwritten(tmp_path: Path):
    cache = Cache(tmp_path / "c")
    key = "ab" * 16
    assert cache.put(key, 0, False, b'{"a":0}', _meta()) == f"{key}.0"
    # another process stored draw 0 meanwhile: this answer becomes draw 1
    assert cache.put(key, 0, False, b'{"a":1}', _meta()) == f"{key}.1"
    assert cache.get(f"{key}.0").body == b'{"a":0}'
    assert cache.get(f"{key}.1").body == b'{"a":1}'
    assert cache.counts.stored == 2
    leftovers = [n for _, _, names in os.walk(cache.root) for n in names if n.endswith(".tmp")]
    assert leftovers == []


def test_a_folder_that_is_not_a_cache_is_refused(tmp_path: Path):
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


def _fill(root: Path, n: int, model: str, age_s: float) -> Cache:
    cache = Cache(root)
    for i in range(n):
        name = cache.put(f"{model[:1]}{i:031x}", 0, True, b'{"x":%d}' % i, {"model": model})
        then = time.time() - age_s - i  # distinct ages: --max-size removes the oldest first
        os.utime(entry_path(cache.root, name), (then, then))
    return cache


def test_stats_and_prune_by_model_age_and_size(tmp_path: Path):
    root = tmp_path / "c"
    _fill(root, 6, "alpha", age_s=10 * 86400)
    cache = _fill(root, 4, "beta", age_s=60)
    cache.counts.hits, cache.counts.misses, cache.counts.stored = 7, 3, 3
    cache.record_run("out.jsonl")
    torn = Path(entry_path(cache.root, "b" + "f" * 31 + ".0"))
    torn.parent.mkdir(parents=True, exist_ok=True)
    torn.write_bytes(b"JBC1\x00")
    stale = torn.parent / ".x.tmp"
    stale.write_bytes(b"")
    os.utime(stale, (time.time() - 7200,) * 2)

    stats = cache_stats(root)
    assert (stats.entries, stats.corrupt, stats.temp_files) == (10, 1, 1)
    assert stats.models == {"alpha": 6, "beta": 4}
    assert (stats.runs, stats.hits, stats.misses) == (1, 7, 3)
    assert "10 answers" in stats.format() and "70.0% of lookups" in stats.format()

    dry = prune(root, older_than=86400, dry_run=True)
    assert (dry.removed, dry.kept) == (7, 4)  # six old answers and the torn one
    assert cache_stats(root).entries == 10
    done = prune(root, older_than=86400)
    assert (done.removed, done.kept, done.temp_removed) == (7, 4, 1)
    assert cache_stats(root).models == {"beta": 4}
    assert not stale.exists()

    size = cache_stats(root).bytes
    assert prune(root, max_bytes=size // 2 + 1).kept == 2
    assert prune(root, model="beta").removed == 2
    assert cache_stats(root).entries == 0
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

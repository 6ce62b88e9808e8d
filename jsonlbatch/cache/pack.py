"""The cache's files: append-only packs of answers, and hash-table indexes over them.

A **pack** (`packs/<time>-<host>-<pid>-<random>.pack`) is written by one process only, by
appending: no two writers ever share a file, so no lock is needed, on a local disk or over NFS.
Each record is a 32-byte header and a zlib stream::

    magic "JBR2" | CRC-32 of everything after it | payload length | draw | key (16 bytes)
    payload: raw deflate, with a preset dictionary (`ZDICT`), of meta JSON, newline, body

A record is appended with one `write` before its answer's output line is written; a kill -9
leaves at most a torn last record, which the CRC finds (as it finds any damaged record): it is a
miss. Records are found again by walking a pack (`iter_records`), which resynchronises on the
magic after damage.

An **index** (`packs/<time>-<host>-<pid>-<random>.idx`) maps (key, draw) to (pack, offset) for
the first bytes of one or more packs (its *covers*: pack name, bytes covered, and whether the
pack was sealed, i.e. will not grow). It is an open-addressing hash table of 32-byte slots read
through `mmap`, so a lookup is a probe or two into pages the kernel already caches, and opening
a cache of a million answers reads a few hundred bytes. Indexes are written whole to a temporary
name and renamed into place, so a reader sees an index entirely or not at all.

Where two records have the same (key, draw) (two runs stored the same draw at once), the one in
the pack whose name sorts first wins, everywhere and always: `Table` keeps the smallest pack
number, and pack numbers follow name order.

Everything in a cache folder may have been written by someone else, damaged or planted, so what
is read is bounded where it comes in: files are opened only if they are regular files
(`open_regular`: a FIFO or a device named like a pack is not waited on or read forever); an
index's header and covers are checked against its size and plain types (`Index.open`); a probe
stops after `MAX_PROBES` slots (a table with no empty slot is a miss, and set aside, not an
endless loop); a record longer, or inflating to more, than `MAX_RECORD` is damaged; and a
record's metadata keeps only the known fields, of their types and in range (`clean_meta`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

RECORD = struct.Struct("<4sIII16s")  # magic, CRC-32, payload length, draw, key
REC_MAGIC = b"JBR2"
SLOT = struct.Struct("<qIIQQ")  # key64 (0: empty), draw, pack number, offset, record length
INDEX_HEAD = struct.Struct("<4sIQQ")  # magic, length of the covers JSON, slots, entries
INDEX_MAGIC = b"JBX2"
PACK_SUFFIX = ".pack"
INDEX_SUFFIX = ".idx"
_MIX = 0x9E3779B97F4A7C15  # spreads the draws of one key over the table
_LOAD = 0.7  # at most this full
#: Slots one lookup probes at most. A table at most 70% full has runs of a few dozen at worst;
#: a longer one (a planted or damaged index with no empty slot) is a miss, and the table is
#: set aside for the rest of the process.
MAX_PROBES = 4096
#: The most bytes a record may take, stored or inflated (an answer is at most exec's
#: --max-response-bytes, 64 MiB by default): a longer one is damaged, never read into memory.
MAX_RECORD = 256 << 20
#: The most bytes of an index's covers (one pack a few dozen bytes: millions of packs).
MAX_COVERS = 64 << 20
#: Offsets and sizes past this are damage (8 EiB: no file is that long).
MAX_OFFSET = 1 << 62
_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)


def key64(key: bytes) -> int:
    """The 64-bit form of a key in index slots (0 marks an empty slot, so it is never one)."""
    return int.from_bytes(key[:8], "little", signed=True) or 1


@dataclass(slots=True)
class Entry:
    """One stored answer: the server's body, byte for byte, and what was known about it."""

    body: bytes
    meta: dict[str, Any]


#: The preset dictionary of every record's deflate stream: the JSON an answer and its metadata
#: mostly are (chat, completions, Responses, Messages, embeddings). A small answer then takes
#: about half the bytes, and inflating it skips building Huffman tables: 0.6 us, not 1.8.
#: Fixed for format 2: a record written with one dictionary cannot be read with another.
ZDICT = (
    b'{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.0'
    b'{"id":"resp_","object":"response","status":"completed","output":[{"type":"message",'
    b'"role":"assistant","content":[{"type":"output_text","text":"'
    b'{"id":"msg_","type":"message","role":"assistant","content":[{"type":"text","text":""}],'
    b'"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":,"output_tokens":}}'
    b'{"id":"cmpl-","object":"text_completion","created":17,"model":"","choices":[{"index":0,'
    b'"text":"","logprobs":null,"finish_reason":"stop","stop_reason":null}],'
    b'"tool_calls":[{"id":"call_","type":"function","function":{"name":"","arguments":"{\\"'
    b',"reasoning_content":null,"refusal":null,"annotations":null,"audio":null,'
    b'"function_call":null,"tool_calls":[],"system_fingerprint":null,"service_tier":null,'
    b'"prompt_logprobs":null,"kv_transfer_params":null'
    b'{"url":"/v1/chat/completions","model":"","status":200,"request_id":null,"usage":'
    b'{"prompt_tokens":,"completion_tokens":,"reasoning_tokens":},"created":17'
    b'\n{"id":"chatcmpl-","object":"chat.completion","created":17,"model":"","choices":'
    b'[{"index":0,"message":{"role":"assistant","content":"'
    b'"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":,"total_tokens":,'
    b'"completion_tokens":}}'
)
_HEAD_AFTER_CRC = struct.Struct("<II16s")


def encode_record(key: bytes, draw: int, meta: dict[str, Any], body: bytes) -> bytes:
    """A record's bytes: header, then raw deflate (with `ZDICT`) of meta JSON, newline, body."""
    deflate = zlib.compressobj(6, zlib.DEFLATED, -15, 8, zlib.Z_DEFAULT_STRATEGY, ZDICT)
    payload = deflate.compress(orjson.dumps(meta) + b"\n" + body) + deflate.flush()
    rest = _HEAD_AFTER_CRC.pack(len(payload), draw, key) + payload
    return REC_MAGIC + struct.pack("<I", zlib.crc32(rest)) + rest


def decode_record(
    data: bytes, key: bytes | None = None, draw: int | None = None, head_only: bool = False
) -> Entry | None:
    """The entry in a record's bytes, or None if it is torn, corrupt, or not (key, draw).
    `head_only` inflates just enough for the metadata (`cache stats`)."""
    if len(data) < RECORD.size:
        return None
    magic, crc, length, found_draw, found_key = RECORD.unpack_from(data)
    end = RECORD.size + length
    if (
        magic != REC_MAGIC
        or length > MAX_RECORD
        or len(data) < end
        or (key is not None and found_key != key)
        or (draw is not None and found_draw != draw)
        or zlib.crc32(memoryview(data)[8:end]) != crc
    ):
        return None
    try:
        inflate = zlib.decompressobj(-15, zdict=ZDICT)
        payload = memoryview(data)[RECORD.size : end]
        text = inflate.decompress(payload, (1 << 16) if head_only else MAX_RECORD + 1)
        if not head_only and (len(text) > MAX_RECORD or inflate.unconsumed_tail):
            return None  # a deflate bomb: a small record that would inflate without end
        head, _, body = text.partition(b"\n")
        meta = orjson.loads(head)
    except (zlib.error, orjson.JSONDecodeError):
        return None
    return Entry(body, clean_meta(meta)) if type(meta) is dict else None


#: A record's metadata as `clean_meta` keeps it: field -> (types, longest string or
#: (lowest, highest) number).
_META: dict[str, tuple[tuple[type, ...], Any]] = {
    "url": ((str,), 1024),
    "model": ((str,), 1024),
    "request_id": ((str,), 1024),
    "status": ((int,), (100, 599)),
    "created": ((int, float), (0, 1 << 36)),  # seconds: up to the year 4147
}
_USAGE = ("prompt_tokens", "completion_tokens", "reasoning_tokens")


def clean_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """A record's metadata with only the fields a writer puts there, of their types and in
    range (a string cut short is dropped); the rest is left out. Every reader of metadata
    (lookups, `cache stats`, `cache prune`) gets it through here: it may have been planted."""
    out: dict[str, Any] = {}
    for name, (types, bound) in _META.items():
        value = meta.get(name)
        if type(value) not in types:
            continue
        if isinstance(value, str) and len(value) > bound:
            continue
        if not isinstance(value, str) and not bound[0] <= value <= bound[1]:
            continue
        out[name] = value
    usage = meta.get("usage")
    if type(usage) is dict:
        out["usage"] = {k: v for k in _USAGE if type(v := usage.get(k)) is int and 0 <= v < 1 << 53}
    return out


def read_small(path: str, limit: int = 1 << 20) -> bytes:
    """The bytes of a small file of a cache folder (its marker, a run's counts), if it is a
    regular file of at most `limit` bytes; OSError otherwise."""
    fd = open_regular(path)
    try:
        data = os.pread(fd, limit + 1, 0)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise OSError(f"{path} is over {limit} bytes")
    return data


def open_regular(path: str) -> int:
    """A read-only descriptor of `path` if it is a regular file; OSError otherwise. Opened
    without waiting (a FIFO named like a pack would block an open forever: O_NONBLOCK, which
    regular files ignore), then checked (a device such as /dev/zero would be read without
    end)."""
    fd = os.open(path, _READ)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


@dataclass(slots=True)
class Found:
    """A record found by walking a pack."""

    offset: int
    length: int  # of the whole record
    key: bytes
    draw: int
    valid: bool  # CRC checked


def iter_records(fd: int, start: int = 0, end: int | None = None) -> Iterator[Found]:
    """Walk the records of a pack from `start` to `end` (its size): valid ones, and damaged
    ones whose header still reads (`valid=False`). After damage the walk goes on at the next
    record magic; a torn last record ends it."""
    if end is None:
        end = os.fstat(fd).st_size
    pos, buf, base = start, b"", start  # buf holds the file's bytes from `base`
    while pos < end:
        at = pos - base
        if len(buf) - at < RECORD.size:
            buf, base, at = os.pread(fd, max(1 << 20, RECORD.size), pos), pos, 0
            if len(buf) < RECORD.size:
                return
        magic, crc, length, draw, key = RECORD.unpack_from(buf, at)
        if magic != REC_MAGIC or length > MAX_RECORD or pos + RECORD.size + length > end:
            following = _next_magic(fd, pos + 1, end)
            if following is None:
                return
            pos = following
            continue
        size = RECORD.size + length
        if len(buf) - at < size:
            buf, base, at = os.pread(fd, max(1 << 20, size), pos), pos, 0
        valid = zlib.crc32(memoryview(buf)[at + 8 : at + size]) == crc
        yield Found(pos, size, key, draw, valid)
        pos += size


def _next_magic(fd: int, pos: int, end: int) -> int | None:
    while pos < end:
        chunk = os.pread(fd, 1 << 20, pos)
        if not chunk:
            return None
        at = chunk.find(REC_MAGIC)
        if at >= 0:
            return pos + at
        pos += max(len(chunk) - len(REC_MAGIC) + 1, 1)
    return None


# -- indexes ---------------------------------------------------------------------------------


class Table:
    """An open-addressing hash table of (key64, draw) -> (pack number, offset, length), in a
    buffer laid out as an index file's slots: a bytearray being built, or an index's mmap."""

    __slots__ = ("base", "buf", "entries", "n_slots")

    def __init__(self, buf: Any, n_slots: int, base: int = 0, entries: int = 0) -> None:
        self.buf = buf
        self.n_slots = n_slots
        self.base = base
        self.entries = entries

    @classmethod
    def empty(cls, capacity: int) -> Table:
        n_slots = max(8, int(capacity / _LOAD) + 1)
        return cls(bytearray(n_slots * SLOT.size), n_slots)

    def find(self, k64: int, draw: int) -> tuple[int, int, int] | None:
        """(pack number, offset, length) of (key64, draw), or None. After `MAX_PROBES` slots
        with no empty one the table is damaged or planted: it is set aside (no entries), so
        each later lookup skips it."""
        n, buf, base, unpack = self.n_slots, self.buf, self.base, SLOT.unpack_from
        at = (k64 + draw * _MIX) % n
        for _ in range(min(n, MAX_PROBES)):
            k, d, pack, offset, length = unpack(buf, base + at * SLOT.size)
            if k == k64 and d == draw:
                return pack, offset, length
            if k == 0:
                return None
            at = at + 1 if at + 1 < n else 0
        self.entries = 0
        return None

    def add(
        self, k64: int, draw: int, pack: int, offset: int, length: int, force: bool = False
    ) -> tuple[int, int, int] | None:
        """Insert; an entry already there for (key64, draw) is kept if its pack comes first
        (unless `force`). Returns the (pack, offset, length) left out, if there was one."""
        n, buf = self.n_slots, self.buf
        at = (k64 + draw * _MIX) % n
        while True:
            k, d, old_pack, old_offset, old_length = SLOT.unpack_from(buf, at * SLOT.size)
            if k == 0 or (k == k64 and d == draw):
                break
            at = at + 1 if at + 1 < n else 0
        if k == 0:
            self.entries += 1
        elif old_pack <= pack and not force:
            return pack, offset, length
        SLOT.pack_into(buf, at * SLOT.size, k64, draw, pack, offset, length)
        return None if k == 0 else (old_pack, old_offset, old_length)

    def full(self) -> bool:
        """Whether one more entry would pass the load factor: then `grown()`."""
        return self.entries + 1 > self.n_slots * _LOAD

    def grown(self) -> Table:
        """A table twice the size with the same entries (a bytearray)."""
        bigger = Table.empty(self.n_slots * 2)
        for item in self.items():
            bigger.add(*item)
        return bigger

    def items(self) -> Iterator[tuple[int, int, int, int, int]]:
        """Every (key64, draw, pack, offset, length) in the table."""
        view = memoryview(self.buf)[self.base : self.base + self.n_slots * SLOT.size]
        for item in SLOT.iter_unpack(view):
            if item[0]:
                yield item


@dataclass
class Cover:
    """What an index says of one pack: its first `covered` bytes are indexed; `sealed`: the
    pack was closed by its writer and will not grow."""

    pack: str
    covered: int
    sealed: bool


class Index:
    """An index file, opened: its covers and its table (an mmap; closed with `close`)."""

    def __init__(self, path: str, covers: list[Cover], table: Table, mm: mmap.mmap | None) -> None:
        self.path = path
        self.name = os.path.basename(path)
        self.covers = covers
        self.table = table
        self._mm = mm

    @classmethod
    def open(cls, path: str) -> Index | None:
        """The index at `path`, or None if it is gone, torn, damaged or not an index (not a
        regular file, a header its size belies, covers that are not [name, size, sealed])."""
        try:
            fd = open_regular(path)
        except OSError:
            return None
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, INDEX_HEAD.size, 0)
            if len(head) < INDEX_HEAD.size:
                return None
            magic, covers_len, n_slots, entries = INDEX_HEAD.unpack(head)
            base = _slots_at(covers_len)
            if (
                magic != INDEX_MAGIC
                or size != base + n_slots * SLOT.size
                or n_slots < 1
                or entries > n_slots * _LOAD + 1
                or covers_len > MAX_COVERS
            ):
                return None
            covers = _covers(os.pread(fd, covers_len, INDEX_HEAD.size))
            if covers is None:
                return None
            try:
                mm: mmap.mmap | None = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
                buf: Any = mm
            except (OSError, ValueError):  # a file system without mmap: read it whole
                mm, buf = None, os.pread(fd, size, 0)
        except OSError:
            return None
        finally:
            os.close(fd)
        return cls(path, covers, Table(buf, n_slots, base, entries), mm)

    def close(self) -> None:
        if self._mm is not None:
            with contextlib.suppress(BufferError):
                self._mm.close()
            self._mm = None


def _covers(raw: bytes) -> list[Cover] | None:
    """An index's covers, if they are a list of [pack name, bytes covered, sealed]."""
    try:
        found = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if type(found) is not list:
        return None
    covers = []
    for item in found:
        if type(item) is not list or len(item) != 3:
            return None
        pack, covered, sealed = item
        if type(pack) is not str or type(covered) is not int or type(sealed) is not bool:
            return None
        if not 0 <= covered <= MAX_OFFSET:
            return None
        covers.append(Cover(pack, covered, sealed))
    return covers


def _slots_at(covers_len: int) -> int:
    return (INDEX_HEAD.size + covers_len + 7) // 8 * 8


def write_index(
    path: str,
    covers: list[Cover],
    entries: Iterable[tuple[int, int, int, int, int]],
    count: int,
    reads: Callable[[int, int, int], bool] | None = None,
) -> None:
    """Write an index of `entries` ((key64, draw, pack number into `covers`, offset, length))
    to `path`, atomically (a temporary name, then a rename). Where two records of one
    (key64, draw) meet, the first pack's is kept, unless `reads(pack, offset, length)` says it
    is damaged and the other is not: a good copy stored after a damaged one stays found."""
    table = Table.empty(min(count, 1 << 20))  # `count` came from other indexes' headers:
    for k64, draw, pack, offset, length in entries:
        if table.full():  # it may be short, or absurd (a planted sparse file): grown as needed
            table = table.grown()
        other = table.add(k64, draw, pack, offset, length)
        if other is not None and reads is not None:
            first = table.find(k64, draw)
            if first is not None and first != other and not reads(*first) and reads(*other):
                table.add(k64, draw, *other, force=True)
    covers_json = orjson.dumps([[c.pack, c.covered, c.sealed] for c in covers])
    head = INDEX_HEAD.pack(INDEX_MAGIC, len(covers_json), table.n_slots, table.entries)
    pad = bytes(_slots_at(len(covers_json)) - len(head) - len(covers_json))
    tmp = f"{path}.{os.getpid()}-{os.urandom(4).hex()}.tmp"
    try:
        with open(tmp, "xb") as f:
            f.write(head + covers_json + pad)
            f.write(table.buf)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)

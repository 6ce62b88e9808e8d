"""The before-send lookup: a store of answers consulted before a request is sent, and fed after.

`AnswerStore.lookup(request, occurrence)` may return a stored `Result` to write instead of
sending (it costs no attempt, no rate-limit token and no budget); `store(request, occurrence,
result)` sees every result that was sent, before its output line is written, so a store that
keeps it durably never misses an answer that reached the output. What is worth storing (usually
`result.ok`) is the store's choice.

`occurrence` tells identical requests apart: it is how many lines *earlier in the file* ask
exactly the same thing (same URL and body, keys in any order), so the 3rd of five identical
samples is occurrence 2 in every run, whatever was already done or how the lines are ordered for
sending. Counting it needs one pass over the request file and a counter per distinct request
(only when a store is installed).

Every pending request is looked up before the first one is sent, in file order (`Run._answer`):
answers the store has are written at once, without the router, the queue or a server; only the
others go on to be sent. A stored answer takes the same steps as a sent one before its line is
written (`Vetter`: the endpoint's shape, the answer contract and the caller's check); one they
refuse is not written, and its request is sent (the store hears of it: `refused`).

A store's whole interface is `AnswerStore` (every member the run calls, with its signature);
`StoreBase` gives every member a default that changes nothing, so a store overrides only what it
has. A class with every member is used as it is, without a base class; a store with just
`lookup` and `store` (`SimpleStore`) is completed once where it enters the run (`as_store`); one
with some of the rest but not all is refused there, never trimmed. The answer cache
(`jsonlbatch/exec/hooks/answer_cache.py`) overrides them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import orjson

from jsonlbatch.batch_format.records import Request, Result, fingerprint
from jsonlbatch.exec.hooks.check_hook import Check, vet
from jsonlbatch.file_io.jsonl import iter_lines, read_lines_at


class SimpleStore(Protocol):
    """The least a store is: the two calls every store answers (`as_store` completes it)."""

    def lookup(self, request: Request, occurrence: int, /) -> Result | None:
        """A stored answer for this request (its `custom_id` is replaced by the request's), or
        None to send it."""
        ...

    def store(self, request: Request, occurrence: int, result: Result, /) -> None:
        """Called with each result of a sent request, before its line is written."""
        ...


@runtime_checkable
class AnswerStore(Protocol):
    """Every member the run calls on a store, with its real signature.

    Subclass `StoreBase` to get a do-nothing default for each; a class that writes them all
    itself needs no base class (it is used as it is); one with `lookup` and `store` only
    (`SimpleStore`) is completed with the defaults. A store with some of the others but not
    all is refused where it enters the run (`as_store`), so none of them is dropped silently.
    """

    #: True: the store tells identical requests apart itself (exec passes occurrence 0).
    counts_copies: bool
    #: Pending lines `scan_line` left for `settle_line` (a later copy of a sampled body).
    deferred: int

    def lookup(self, request: Request, occurrence: int, /) -> Result | None:
        """A stored answer for this request (its `custom_id` is replaced by the request's), or
        None to send it."""
        ...

    def store(self, request: Request, occurrence: int, result: Result, /) -> None:
        """Called with each result of a sent request, before its line is written."""
        ...

    @property
    def answers_early(self) -> bool:
        """Whether `scan_line` answers lines during exec's input scan (`EarlyAnswers`)."""
        ...

    def scan_line(
        self, obj: dict[str, Any], raw: bytes, pending: bool, sorted_body: bytes | None, /
    ) -> Result | None:
        """A line's stored answer, looked up during the input scan (with `answers_early`):
        `obj` the decoded line, `raw` its bytes, `pending` whether it is still to send,
        `sorted_body` its body as key-sorted JSON (None when not pending)."""
        ...

    def settle_line(self, obj: dict[str, Any], /) -> Result | None:
        """A line `scan_line` deferred, looked up once the whole file is counted."""
        ...

    def refused(self, request: Request, result: Result, /) -> None:
        """A stored answer this store gave was refused by the checks: the request is sent."""
        ...

    def resume_into(self, output: str, /) -> None:
        """The run appends to `output`, which holds answers already."""
        ...

    def key_by(self, urls: Sequence[str], /) -> None:
        """The run's endpoint URLs, before the first lookup (`--cache-key-url`)."""
        ...

    def notes(self) -> list[str]:
        """Lines to show once the run starts."""
        ...

    def progress(self) -> str:
        """A few words for the progress bar."""
        ...

    def describe(self) -> str:
        """One line for the run's summary ("": nothing to say)."""
        ...

    def finish(self, output: str, /) -> None:
        """The run is over: seal what was stored."""
        ...


#: `AnswerStore`'s members beyond `SimpleStore`'s (what a partial store would lose).
EXTRA_MEMBERS = (
    "counts_copies", "deferred", "answers_early", "scan_line", "settle_line", "refused",
    "resume_into", "key_by", "notes", "progress", "describe", "finish",
)  # fmt: skip


class StoreBase:
    """`AnswerStore` with a do-nothing default for each member: override what you have."""

    counts_copies = False
    deferred = 0

    def lookup(self, request: Request, occurrence: int, /) -> Result | None:
        return None

    def store(self, request: Request, occurrence: int, result: Result, /) -> None:
        pass

    @property
    def answers_early(self) -> bool:
        return False

    def scan_line(
        self, obj: dict[str, Any], raw: bytes, pending: bool, sorted_body: bytes | None, /
    ) -> Result | None:
        return None

    def settle_line(self, obj: dict[str, Any], /) -> Result | None:
        return None

    def refused(self, request: Request, result: Result, /) -> None:
        pass

    def resume_into(self, output: str, /) -> None:
        pass

    def key_by(self, urls: Sequence[str], /) -> None:
        pass

    def notes(self) -> list[str]:
        return []

    def progress(self) -> str:
        return ""

    def describe(self) -> str:
        return ""

    def finish(self, output: str, /) -> None:
        pass


class _Plain(StoreBase):
    """A store with `lookup` and `store` only, with the defaults for the rest."""

    def __init__(self, store: SimpleStore) -> None:
        self._store = store

    def lookup(self, request: Request, occurrence: int, /) -> Result | None:
        return self._store.lookup(request, occurrence)

    def store(self, request: Request, occurrence: int, result: Result, /) -> None:
        self._store.store(request, occurrence, result)


def as_store(store: AnswerStore | SimpleStore) -> AnswerStore:
    """`store` with the whole interface: an `AnswerStore` (a `StoreBase` or a class with every
    member) as it is, a `SimpleStore` completed with the defaults.

    Raises TypeError for a store with only part of the rest (`notes` but no `describe`, ...):
    completing it would drop the members it has, so it must have them all or subclass
    `StoreBase`. This is the one place a store's members are looked at; the run then calls
    every member without asking."""
    if isinstance(store, AnswerStore):
        return store
    name = type(store).__name__
    if not isinstance(store, _Simple):
        raise TypeError(f"Seams.store: {name} has no lookup(request, occurrence) and "
                        "store(request, occurrence, result) (see AnswerStore)")  # fmt: skip
    some = [m for m in EXTRA_MEMBERS if hasattr(store, m)]
    if some:
        missing = [m for m in EXTRA_MEMBERS if m not in some]
        raise TypeError(
            f"Seams.store: {name} has {', '.join(some)} but not {', '.join(missing)}: a store "
            "with more than lookup and store needs every AnswerStore member (subclass "
            "jsonlbatch.exec.hooks.store_hook.StoreBase for the defaults), or those it has "
            "would be ignored"
        )
    return _Plain(store)


@runtime_checkable
class _Simple(SimpleStore, Protocol):
    """`SimpleStore`, checkable at run time (only `as_store` asks)."""


class Vetter:
    """The steps a stored answer takes before its line (`check_hook.vet`): a refused one is the
    store's to hear of, and its request is sent."""

    def __init__(self, store: AnswerStore, check: Check | None) -> None:
        self.store, self.check = store, check

    def __call__(self, request: Request, result: Result) -> bool:
        body = result.body
        raw = orjson.dumps(body) if isinstance(body, orjson.Fragment) else None  # its bytes
        if vet(self.check, request, result, raw) is None:
            return True
        self.store.refused(request, result)
        return False


def occurrences(path: str) -> dict[str, int]:
    """`custom_id -> occurrence` for the requests of `path` that repeat an earlier line (all
    others are occurrence 0, and left out to keep the table small)."""
    seen: dict[int, int] = {}
    out: dict[str, int] = {}
    for _, raw in iter_lines(path):
        try:
            obj = orjson.loads(raw)
            key = hash((obj["url"], orjson.dumps(obj["body"], option=orjson.OPT_SORT_KEYS)))
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue  # the input scan has already refused a bad line; blank lines are skipped
        n = seen.get(key, 0)
        seen[key] = n + 1
        if n:
            out[obj["custom_id"]] = n
    return out


async def answer_stored(
    store: AnswerStore,
    vetter: Vetter,
    source: str,
    pending: Sequence[int],
    repeats: Mapping[str, int],
    request_of: Callable[[bytes], Request],
    record: Callable[[Request, Result], None],
    stopping: asyncio.Event,
) -> array[int]:
    """Before anything is sent: `record` what the store answers, in file order, and return the
    offsets of the lines still to send. No router, queue or server is involved in a stored
    answer, so a run the store answers whole costs a read per request, not a request."""
    missed: array[int] = array("Q")
    for n, raw in enumerate(read_lines_at(source, pending)):
        request = request_of(raw)
        stored = store.lookup(request, repeats.get(request.custom_id, 0))
        if stored is not None:
            stored.custom_id = request.custom_id
        if stored is not None and vetter(request, stored):
            record(request, stored)
        else:
            missed.append(pending[n])
        if n % 1024 == 1023:
            await asyncio.sleep(0)  # progress, signals, the writer's flushes
            if stopping.is_set():
                missed.extend(pending[n + 1 :])
                break
    return missed


class EarlyAnswers:
    """Answers a store gives while exec scans its input (`scan_input(answer=...)`).

    The scan reads every line once anyway; a store that can look a line up there
    (`scan_line(obj, raw, pending) -> Result | None`, the answer cache's) saves a second pass
    and a second decoding of every line. Such a store looks every pending line up once, in the
    scan or in `settle` (`settle_line`, for lines whose answer needs the whole file counted),
    and counts its own misses: exec does not ask it again before sending. The output may not be
    touched before the
    whole input is checked and the servers are known to be fine, so the lines wait in a
    temporary file beside the output (named as `jsonl.remove_stale_rewrites` cleans up after a
    kill), appended to it once the run starts (`drain`).
    """

    def __init__(self, store: AnswerStore, vetter: Vetter, output: str, run_id: str) -> None:
        self._store = store
        self._vetter = vetter
        self._scan_line = store.scan_line
        self.output = output
        self.run_id = run_id
        self.count = 0
        self.valid = 0  # of them, answers the contract checked and accepted
        self._file: Any = None
        self.path = ""

    def __call__(self, obj: dict[str, Any], raw: bytes, pending: bool) -> bool:
        """`scan_input`'s `answer`: True if the store answered this (pending) line."""
        body = obj.get("body")
        # the request as sorted JSON: its fingerprint and the store's key are both over it
        ordered = orjson.dumps(body, option=orjson.OPT_SORT_KEYS) if pending else None
        result = self._scan_line(obj, raw, pending, ordered)
        if result is None or not self._vetted(result, obj):
            return False
        self._keep(result, obj, raw, ordered)
        return True

    def _vetted(self, result: Result, obj: dict[str, Any]) -> bool:
        return self._vetter(Request(obj["custom_id"], obj["url"], obj["body"]), result)

    def settle(self, scan: Any, source: str) -> None:
        """Once the scan is done: the pending lines it left because their draw was not known
        yet (later copies of sampled bodies: `settle_line`) are looked up, and those answered
        join the waiting lines, so a run the store answers whole needs no server."""
        if not self._store.deferred or not scan.pending:
            return
        settle_line, kept = self._store.settle_line, array("Q")
        for offset, raw in zip(scan.pending, read_lines_at(source, scan.pending), strict=True):
            obj = orjson.loads(raw)
            result = settle_line(obj)
            if result is None or not self._vetted(result, obj):
                kept.append(offset)
                continue
            self._keep(result, obj, raw, None)
            scan.answered += 1
            scan.urls[obj["url"]] -= 1
            if obj["body"].get("model") is not None:
                scan.models[obj["body"]["model"]] -= 1
        scan.pending, scan.urls, scan.models = kept, +scan.urls, +scan.models

    def _keep(self, result: Result, obj: dict[str, Any], raw: bytes, ordered: bytes | None) -> None:
        # as `Run._record` marks a line: this run, and the request's fingerprint, last
        result.metrics["run"] = self.run_id
        result.metrics["fingerprint"] = fingerprint(raw, obj["url"], obj["body"], ordered)
        if self._file is None:
            target = Path(os.path.realpath(self.output))
            fd, self.path = tempfile.mkstemp(
                prefix=f".{target.name}.", suffix=".tmp", dir=target.parent
            )
            self._file = open(fd, "wb", buffering=1 << 20)  # noqa: SIM115 (closed by drain)
        self._file.write(result.to_line())
        self.count += 1
        self.valid += "contract" in result.metrics  # only an accepted answer is kept

    def drain(self, chunk: int = 1 << 22) -> Iterator[bytes]:
        """The waiting lines, in chunks of whole lines; the file is removed afterwards."""
        if self._file is None:
            return
        self._file.close()
        try:
            with open(self.path, "rb") as f:
                rest = b""
                while data := f.read(chunk):
                    data = rest + data
                    cut = data.rfind(b"\n") + 1
                    rest = data[cut:]
                    yield data[:cut]
                if rest:
                    yield rest
        finally:
            self.discard()

    def discard(self) -> None:
        """Remove the waiting lines (a run that stops before writing them sends them later)."""
        if self._file is not None:
            self._file.close()
            self._file = None
            with contextlib.suppress(OSError):
                os.unlink(self.path)

"""The places a caller plugs into a run, gathered in one value: `Seams`.

Each seam is a small protocol in a module of its own, with a default that changes nothing:

- `check`: an on-answer check (`check_hook.py`): accept, reject or re-ask a usable answer;
- `store`: a before-send lookup and after-answer store (`store_hook.py`): an answer cache;
- `pools`: per-model endpoint pools (`model_pools.py`): a request goes where `body.model` says;
- `subscribers`: listeners of the event stream (`events.py`): viewers, metrics exporters;
- `concurrency`: a concurrency controller per endpoint (`endpoint_concurrency.py`);
- `source`: requests made while the run goes instead of read from its file
  (`request_source.py`): a rollout's turns.

    Job("requests.jsonl", "responses.jsonl", options, seams=Seams(check=my_check)).run()

docs/architecture.md ("Seams") has an example of each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jsonlbatch.exec.hooks.check_hook import AnswerCheck, Check, CheckFunction, as_check
from jsonlbatch.exec.hooks.request_source import RequestSource
from jsonlbatch.exec.hooks.store_hook import AnswerStore, SimpleStore, as_store
from jsonlbatch.exec.route.endpoint_concurrency import ConcurrencyController
from jsonlbatch.exec.route.model_pools import PoolSpec, check_specs


@dataclass(frozen=True)
class Seams:
    """What a run calls besides its own steps; every field's default is today's behaviour.

    A check or store given with the least of its interface (a plain function, `CheckFunction`;
    a store with only `lookup` and `store`, `SimpleStore`) is completed here, once, with the
    defaults (`as_check`, `as_store`), so the run calls every member of `AnswerCheck` and
    `AnswerStore` without asking what it has. One with part of the rest is refused here.

    A caller's `store` and `ExecOptions.cache` (`--cache`) are refused together (`Job`): both
    answer before sending, and which one wins would be a guess; a store of your own can
    consult the cache itself."""

    check: AnswerCheck | CheckFunction | None = None
    store: AnswerStore | SimpleStore | None = None
    pools: Sequence[PoolSpec] | None = None  # None: one pool over the run's URLs
    #: (callback, event types) pairs subscribed to the run's `EventBus` before it starts.
    subscribers: Sequence[tuple[Callable[[Any], None], tuple[type, ...]]] = field(
        default_factory=tuple
    )
    #: Makes each endpoint's controller, given the endpoint's name; None: a fixed limit.
    concurrency: Callable[[str], ConcurrencyController] | None = None
    #: Where the requests come from; None: the request file's pending lines.
    source: RequestSource | None = None

    def __post_init__(self) -> None:
        if self.check is not None:
            object.__setattr__(self, "check", as_check(self.check))
        if self.store is not None:
            object.__setattr__(self, "store", as_store(self.store))
        if self.pools is not None:
            if not self.pools:
                raise ValueError("Seams.pools, when given, needs at least one PoolSpec")
            check_specs(self.pools)

    @property
    def the_check(self) -> Check | None:
        """The caller's check, completed (see the class doc)."""
        return self.check if isinstance(self.check, Check) else None

    @property
    def the_store(self) -> AnswerStore | None:
        """The store, completed (see the class doc)."""
        return self.store  # type: ignore[return-value]  # completed in __post_init__


NO_SEAMS = Seams()

#: Why `--cache` (`ExecOptions.cache`) and a caller's `Seams.store` are refused together.
CACHE_AND_STORE = (
    "--cache and a store of your own (seams=Seams(store=...)) both answer requests before "
    "they are sent, and a run has one such store: drop one of them (your store may consult "
    "the answer cache itself: jsonlbatch.exec.hooks.answer_cache.RunCache)"
)

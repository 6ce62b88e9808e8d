"""The places a caller plugs into a run, gathered in one value: `Seams`.

Each seam is a small protocol in a module of its own, with a default that changes nothing:

- `check`: an on-answer check (`checks.py`): accept, reject or re-ask a usable answer;
- `store`: a before-send lookup and after-answer store (`lookup.py`): an answer cache;
- `pools`: per-model endpoint pools (`pools.py`): a request goes where `body.model` says;
- `subscribers`: listeners of the event stream (`events.py`): viewers, metrics exporters;
- `concurrency`: a concurrency controller per endpoint (`concurrency.py`).

    Job("requests.jsonl", "responses.jsonl", options, seams=Seams(check=my_check)).run()

docs/architecture.md ("Seams") has an example of each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jsonlbatch.exec.checks import AnswerCheck
from jsonlbatch.exec.concurrency import ConcurrencyController
from jsonlbatch.exec.lookup import AnswerStore
from jsonlbatch.exec.pools import PoolSpec, check_specs


@dataclass(frozen=True)
class Seams:
    """What a run calls besides its own steps; every field's default is today's behaviour."""

    check: AnswerCheck | None = None
    store: AnswerStore | None = None
    pools: Sequence[PoolSpec] | None = None  # None: one pool over the run's URLs
    #: (callback, event types) pairs subscribed to the run's `EventBus` before it starts.
    subscribers: Sequence[tuple[Callable[[Any], None], tuple[type, ...]]] = field(
        default_factory=tuple
    )
    #: Makes each endpoint's controller, given the endpoint's name; None: a fixed limit.
    concurrency: Callable[[str], ConcurrencyController] | None = None

    def __post_init__(self) -> None:
        if self.pools is not None:
            if not self.pools:
                raise ValueError("Seams.pools, when given, needs at least one PoolSpec")
            check_specs(self.pools)


NO_SEAMS = Seams()

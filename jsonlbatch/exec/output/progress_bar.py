"""The progress bar and the short notes printed around it (stderr; silenced by `quiet`).

The bar is a subscriber of the run's event stream (`events.py`): it draws each `Snapshot` and
takes streamed answers' time to first token from `Answered`; it never reaches into the run.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import deque

from tqdm import tqdm

from jsonlbatch.exec.output.events import Answered, EventBus, Snapshot
from jsonlbatch.exec.output.run_summary import RunSummary
from jsonlbatch.redact import redact
from jsonlbatch.stats import plural

_STATUS_EVERY = 10.0  # seconds between repeats of the same "waiting for server" line
_TTFT_WINDOW = 1000  # the running TTFT median is over this many latest streamed requests


class Progress:
    def __init__(self, total: int | None, *, quiet: bool = False, label: str = "exec") -> None:
        self.total = total
        self.label = label  # the bar's name: the command the user ran (exec, rollout)
        self.quiet = quiet
        self.bar: tqdm | None = None
        self._shown = 0
        self._last_status = (0.0, "")
        self._ttfts: deque[float] = deque(maxlen=_TTFT_WINDOW)

    def listen(self, bus: EventBus, *, streams: bool) -> None:
        """Subscribe to the run's events: the snapshots, and each answer's TTFT when answers
        are streamed (only then: no `Answered` is built for the bar alone, and a run the cache
        answers whole would have one per line)."""
        bus.subscribe(self.on_snapshot, Snapshot)
        if streams:
            bus.subscribe(self.on_answered, Answered)

    def record_ttft(self, seconds: float) -> None:
        """Note a streamed request's time to first token (bounded: only the latest are kept)."""
        self._ttfts.append(seconds)

    def on_snapshot(self, event: Snapshot) -> None:
        """Draw the run's counters (an `events.Snapshot`)."""
        try:
            self.update(event.summary, event.retrying, event.status, event.extra)
        except OSError:
            self._lost()

    def _lost(self) -> None:
        """stderr is gone (a pipe whose reader exited, a closed terminal): stop drawing. The
        run goes on, and a signal still stops it: its "stopping" note raised before it stopped
        anything, so `exec ... 2>&1 | head` ignored SIGTERM for the whole --ready-timeout."""
        self.quiet = True
        if self.bar is not None:
            self.bar.disable = True  # closing it writes nothing more
            self.bar = None

    def on_answered(self, event: Answered) -> None:
        ttft = event.metrics.get("ttft_s")
        if ttft is not None:
            self.record_ttft(ttft)

    def start(self) -> None:
        if self.quiet or self.bar is not None:
            return
        self.bar = tqdm(
            total=self.total,
            unit="req",
            desc=self.label,
            file=sys.stderr,
            dynamic_ncols=True,
            mininterval=0.5,
            smoothing=0.05,
        )

    def update(self, summary: RunSummary, retrying: int, status: str = "", extra: str = "") -> None:
        """Show the counters; `status` is what the run waits for, `extra` e.g. "paced: 3,000
        rpm spent=$0.12 of $5.00"."""
        if self.quiet:
            return
        if status:
            now = time.monotonic()
            when, last = self._last_status
            if status.split("(")[0] != last.split("(")[0] or now - when > _STATUS_EVERY:
                self._last_status = (now, status)
                waiting = summary.pending - summary.written  # how much a dead server holds up
                self.note(f"{status}; {plural(waiting, 'request')} waiting" if waiting > 0
                          else status)  # fmt: skip
        if self.bar is None:
            return
        written = summary.written
        if written > self._shown:
            self.bar.update(written - self._shown)
            self._shown = written
        elapsed = self.bar.format_dict["elapsed"] or 1e-9
        self.bar.set_postfix_str(
            f"ok={summary.succeeded} failed={summary.failed} retrying={retrying} "
            f"out_tok/s={summary.completion_tokens / elapsed:.0f}"
            + (f" ttft_p50={statistics.median(self._ttfts):.3f}s" if self._ttfts else "")
            + (
                f" per_endpoint={'/'.join(map(str, summary.endpoints.values()))}"
                if len(summary.endpoints) > 1
                else ""
            )
            + (f" {extra}" if extra else "")
            + (" [waiting for server]" if status else ""),
            refresh=True,
        )

    def note(self, message: str) -> None:
        """A line on stderr (status lines too), masked: servers' words and URLs end up here."""
        if self.quiet:
            return
        message = redact(message)
        try:
            if self.bar is not None:
                self.bar.write(message, file=sys.stderr)
            else:
                print(message, file=sys.stderr, flush=True)
        except OSError:
            self._lost()

    def close(self, summary: RunSummary | None = None) -> None:
        if self.bar is not None:
            if summary is not None:
                self.update(summary, 0)
            self.bar.close()
            self.bar = None

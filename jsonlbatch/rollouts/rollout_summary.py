"""What a rollout did: per conversation (`Tally`, saved in its line) and in all
(`RolloutSummary`, printed at the end and returned to a Python caller)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from jsonlbatch.stats import plural


@dataclass
class Tally:
    """One conversation's counts: model calls, tool calls and errors, tokens, call time."""

    turns: int = 0
    asks: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    usage: dict[str, int] = field(
        default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    )
    time_s: float = 0.0  # the calls' latencies summed

    def count(self, body: Any, metrics: dict[str, Any]) -> None:
        usage = body.get("usage") if isinstance(body, dict) else None
        if isinstance(usage, dict):
            for key in self.usage:
                value = usage.get(key)
                if type(value) is int:
                    self.usage[key] += value
        latency = metrics.get("latency_s")
        if isinstance(latency, (int, float)):
            self.time_s += latency


@dataclass
class RolloutSummary:
    """A rollout's outcome. `run` is the exec summary of its calls (set once it ends)."""

    output: str
    calls_path: str
    tools_path: str
    conversations: int = 0  # request lines
    already_done: int = 0  # ended in an earlier run
    statuses: Counter[str] = field(default_factory=Counter)  # of those ended in this run
    unfinished: int = 0  # stopped (Ctrl-C, a budget) before their end: the next run goes on
    turns: int = 0
    asks: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    replayed: int = 0  # calls read back from the calls file instead of sent (a resume)
    run: Any = None  # exec's RunSummary of the calls

    @property
    def ended(self) -> int:
        return sum(self.statuses.values())

    @property
    def failed(self) -> int:
        return self.statuses["failed"]

    @property
    def budget_stopped(self) -> bool:
        return bool(self.run is not None and self.run.budget_stopped)

    def add(self, status: str, tally: Tally) -> None:
        self.statuses[status] += 1
        self.turns += tally.turns
        self.asks += tally.asks
        self.tool_calls += tally.tool_calls
        self.tool_errors += tally.tool_errors

    def format(self) -> str:
        done = ", ".join(f"{n} {status}" for status, n in sorted(self.statuses.items()))
        lines = [
            f"{plural(self.conversations, 'conversation')}: "
            + (f"{self.already_done} ended before, " if self.already_done else "")
            + (done or "none ended in this run")
            + (f", {self.unfinished} unfinished (run again to go on)" if self.unfinished else ""),
            f"  {plural(self.turns, 'model turn')}, {plural(self.asks, 'ask')}, "
            f"{plural(self.tool_calls, 'tool call')} ({plural(self.tool_errors, 'tool error')})"
            + (f"; {self.replayed} answered calls read back" if self.replayed else ""),
            f"  conversations: {self.output}; calls: {self.calls_path}; "
            f"tool journal: {self.tools_path}",
        ]
        return "\n".join(lines)

"""What a run spends, and the one place a request is metered: rate limits and `--max-cost`.

`Meter` is all the executor's workers see of pacing and cost. Per request: `start` (its endpoint
group's rate limiter, `pacing.py`; estimate its tokens, reserve its worst-case cost), then per attempt `before_send` (wait for the rate limits)
and `after_answer` (learn from headers, slow down on a 429), and `finish` (settle the real
usage) or `abandon` (not sent after all). When nothing is limited or priced, each of these is a
few attribute checks.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Hashable, Mapping
from typing import Any

import orjson

from jsonlbatch.batch_format.records import Request, Result
from jsonlbatch.exec.output.run_summary import RunSummary
from jsonlbatch.exec.send.pacing import Pacing
from jsonlbatch.exec.send.rate_limits import RateLimiter
from jsonlbatch.exec.send.token_bucket import Cost
from jsonlbatch.file_io.jsonl import iter_lines
from jsonlbatch.pricing.cost import (
    UNCAPPED_OUTPUT_TOKENS,
    Price,
    estimate_prompt_tokens,
    max_output_tokens,
)

_UNIT = Cost()  # the cost of a request when no token count is needed


class BudgetReached(Exception):
    """The next request could take the spend past `--max-cost` even with nothing in flight."""


class Budget:
    """Spent dollars, and the worst case of what is in flight, against an optional cap.

    A request reserves what it may cost at most (its prompt estimate plus its output cap) before
    it is sent and settles at the real usage when it ends, so the cap holds even with hundreds of
    requests in flight. Worst cases are far above real costs (an output cap of 32k tokens is
    rarely used), so a reservation that does not fit *while others are in flight* waits for them
    to settle instead of ending the run: the run ends only when a request could pass the cap with
    nothing else in flight, that is when the budget is truly reached.
    """

    def __init__(self, price: Price, max_cost: float | None = None, spent: float = 0.0) -> None:
        self.price = price
        self.max_cost = max_cost
        self.spent = spent
        self.reserved = 0.0
        self.holders = 0  # reservations not yet settled (a count: float sums never reach 0.0)
        self.reached = False
        self.next_worst = 0.0  # the worst case of the request that found the budget reached
        self.waiting = 0  # requests held back until reservations settle (for the status line)
        self._changed: asyncio.Event | None = None  # set when a reservation settles

    def _fits(self, worst: float) -> bool:
        return self.max_cost is None or self.spent + self.reserved + worst <= self.max_cost

    def try_reserve(self, prompt: float, max_output: float) -> float | None:
        """Reserve now and return the amount, or None when it would have to wait; raises
        `BudgetReached` when it could not fit even with nothing in flight."""
        worst = self.price.of(prompt, max_output)
        if self.reached:
            raise BudgetReached
        if not self._fits(worst):
            if self.holders == 0:  # nothing in flight to wait for: the budget is reached
                self.next_worst = worst
                self._reach()
                raise BudgetReached
            return None
        self.reserved += worst
        self.holders += 1
        return worst

    async def reserve(self, prompt: float, max_output: float) -> float:
        """Reserve the worst case of one request, waiting while reservations in flight would
        push it past the cap; raises `BudgetReached` once the cap is truly reached."""
        worst = self.try_reserve(prompt, max_output)
        if worst is not None:
            return worst
        self.waiting += 1
        try:
            while worst is None:
                if self._changed is None:
                    self._changed = asyncio.Event()
                await self._changed.wait()
                worst = self.try_reserve(prompt, max_output)
        finally:
            self.waiting -= 1
        return worst

    def _reach(self) -> None:
        self.reached = True
        self._wake()

    def _wake(self) -> None:
        """Let every waiting request look again (each waiter holds the event it waits on)."""
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def settle(self, reserved: float, prompt: float, completion: float) -> None:
        self.spent += self.price.of(prompt, completion)
        self.release(reserved)

    def release(self, reserved: float) -> None:
        self.reserved -= reserved
        self.holders -= 1
        if self.holders == 0:
            self.reserved = 0.0  # no float residue once nothing is in flight
        self._wake()

    def status(self) -> str:
        shown = f"${self.spent:,.4f}" if self.spent < 1 else f"${self.spent:,.2f}"
        held = f" ({self.waiting} held for the budget)" if self.waiting else ""
        return f"spent={shown}" + (f" of ${self.max_cost:,.2f}" if self.max_cost else "") + held


def spent_in_output(path: str, price: Price) -> float:
    """Dollars the successful lines of an existing response file cost (for resuming under a
    budget): from the token counts exec writes in `metrics`, else the body's `usage`."""
    if not os.path.exists(path):
        return 0.0
    total = 0.0
    for _, raw in iter_lines(path):
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        paid = paid_usage(obj.get("metrics")) if isinstance(obj, dict) else None
        if paid is not None and not _from_cache(obj):
            total += price.of(*paid)
            continue
        if (
            not isinstance(obj, dict)
            or obj.get("error")
            or not isinstance(obj.get("response"), dict)
            or _from_cache(obj)  # taken from exec's answer cache: paid for by another run
        ):
            continue
        prompt, completion = _usage_of(obj)
        total += price.of(prompt, completion)
    return total


def paid_usage(metrics: Any) -> tuple[float, float] | None:
    """(prompt, completion) tokens paid for an answer under a schema (exec/hooks/contract_check.py):
    every ask's, the broken ones re-asked and a last one kept as a failure too; None for a line
    without the contract record."""
    record = metrics.get("contract") if isinstance(metrics, dict) else None
    if not isinstance(record, dict):
        return None
    usage = record.get("usage")
    if not isinstance(usage, dict):
        usage = metrics
    return _num(usage.get("prompt_tokens")), _num(usage.get("completion_tokens"))


def _from_cache(line: dict[str, Any]) -> bool:
    metrics = line.get("metrics")
    return isinstance(metrics, dict) and metrics.get("cache") == "hit"


def _usage_of(line: dict[str, Any]) -> tuple[float, float]:
    metrics = line.get("metrics")
    if isinstance(metrics, dict) and "prompt_tokens" in metrics:
        return _num(metrics.get("prompt_tokens")), _num(metrics.get("completion_tokens"))
    body = line["response"].get("body")
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return 0.0, 0.0
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    return _num(prompt), _num(completion)


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


class Ticket:
    """One request's metering state between `Meter.start` and `Meter.finish`."""

    __slots__ = ("body", "cost", "limiter", "raw_prompt", "reserved", "sent")

    def __init__(
        self, body: dict[str, Any], cost: Cost, limiter: RateLimiter, reserved: float = 0.0
    ) -> None:
        self.body = body
        self.limiter = limiter  # its endpoint group's
        self.cost = cost  # _UNIT until a token count is needed
        self.reserved = reserved
        self.raw_prompt = 0  # the character estimate, before the learned correction
        self.sent: tuple[int, float] = (0, 0.0)


class Meter:
    """Rate limits and budget for every worker of one run."""

    def __init__(self, pacing: Pacing, budget: Budget | None = None) -> None:
        self.pacing = pacing
        self.budget = budget

    async def start(self, req: Request, group: Hashable = None) -> Ticket:
        """Estimate a request sent to endpoint group `group` (its pool) and reserve its
        worst-case cost, waiting while requests in flight hold the rest of the budget; raises
        `BudgetReached`."""
        ticket = Ticket(req.body, _UNIT, self.pacing.group(group))
        budget = self.budget
        if budget is not None:
            cost = self._estimate(ticket)
            cap = max_output_tokens(req.body)
            output = cap if cap is not None else UNCAPPED_OUTPUT_TOKENS
            ticket.reserved = await budget.reserve(cost.input_tokens, output)
        return ticket

    def _estimate(self, ticket: Ticket) -> Cost:
        if ticket.cost is _UNIT:
            limiter = ticket.limiter
            ticket.raw_prompt = estimate_prompt_tokens(ticket.body)
            prompt = ticket.raw_prompt * limiter.prompt_scale
            cap = max_output_tokens(ticket.body)
            ticket.cost = Cost.of(prompt, cap if cap is not None else limiter.typical_output)
        return ticket.cost

    async def before_send(self, ticket: Ticket) -> None:
        limiter = ticket.limiter
        if limiter.active and limiter.gated:
            await limiter.first_answer()
        if limiter.active:
            if ticket.cost is _UNIT and limiter.needs_tokens():
                self._estimate(ticket)
            ticket.sent = await limiter.acquire(ticket.cost)
        else:
            ticket.sent = limiter.count_unpaced(ticket.cost)

    def after_answer(
        self, ticket: Ticket, status: int, headers: Mapping[str, str], retry_after: float | None
    ) -> None:
        ticket.limiter.answered(status, headers, ticket.sent, retry_after, ticket.cost)

    def no_answer(self, ticket: Ticket) -> None:
        """An attempt that got no HTTP answer (the limiter counts every request it sent)."""
        ticket.limiter.unanswered(ticket.sent)

    def finish(self, ticket: Ticket, result: Result) -> None:
        metrics = result.metrics
        prompt = metrics.get("prompt_tokens", 0) if result.ok else 0
        completion = metrics.get("completion_tokens", 0) if result.ok else 0
        if ticket.cost is not _UNIT:
            ticket.limiter.settle(ticket.cost, prompt, completion, ok=result.ok)
            if result.ok and ticket.raw_prompt and prompt:
                ticket.limiter.calibrate(ticket.raw_prompt, prompt)
        if self.budget is not None:  # under a schema: every ask is paid for, kept or not
            used = paid_usage(metrics) or (prompt, completion)
            self.budget.settle(ticket.reserved, *used)
            # the line's own cost at --price, so `view` and other tools show it without a price
            metrics["cost"] = round(self.budget.price.of(*used), 10)

    def abandon(self, ticket: Ticket) -> None:
        if self.budget is not None:
            self.budget.release(ticket.reserved)

    def summarize(self, summary: RunSummary) -> None:
        """Put what the meter saw into the run's summary: 429s, the limits in force, spend."""
        summary.rate_limited = self.pacing.rate_limited
        summary.limits = self.pacing.describe()
        if self.budget is not None:
            summary.spent = self.budget.spent

    def status(self) -> str:
        parts = [self.pacing.status()]
        if self.budget is not None:
            parts.append(self.budget.status())
        return " ".join(p for p in parts if p)

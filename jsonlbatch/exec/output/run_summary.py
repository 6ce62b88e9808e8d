"""What a run did, for the end-of-run report and for callers of the library."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from jsonlbatch.batch_format.records import Result
from jsonlbatch.exec.output.result_display import table
from jsonlbatch.exec.route.server_metrics import ServerStats
from jsonlbatch.stats import plural

if TYPE_CHECKING:
    from jsonlbatch.exec.output.run_outcome import Results


@dataclass(repr=False)
class RunSummary:
    """What a run did (counts, tokens, time); `format()` is the end-of-run report. Prints as one
    line; a small table in a notebook (`output/result_display.py`)."""

    output: str
    requests: int = 0  # in this job (this shard)
    already_done: int = 0  # had a result before this run
    failed_before: int = 0  # of those, failures (not retried: see --retry-failed)
    pending: int = 0  # to be sent by this run
    succeeded: int = 0
    failed: int = 0
    failures: Counter[str] = field(default_factory=Counter)  # by error code, e.g. http_400
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_s: float = 0.0
    started_at: float | None = None
    repaired_bytes: int = 0
    interrupted: bool = False
    endpoints: Counter[str] = field(default_factory=Counter)  # results written, by endpoint
    servers: list[ServerStats] = field(default_factory=list)  # from their /metrics, if any
    budget_stopped: bool = False  # --max-cost stopped sending; the same command resumes
    spent: float | None = None  # dollars, output file in total, when a price was given
    spent_before: float = 0.0  # of which, by earlier runs
    rate_limited: int = 0  # attempts answered 429
    limits: str = ""  # the rate limits in force at the end, e.g. "3,000 rpm (headers)"
    cache_hits: int = 0  # results taken from the answer cache (`--cache`), not sent
    cache: str = ""  # what the answer cache did, one line (hits, savings, misses, stored)
    schema_valid: int = 0  # lines whose answer held its request's schema
    schema_invalid: int = 0  # lines whose last answer did not
    reasks: int = 0  # asks beyond the first for answers that broke their schema, by this run
    reasks_before: int = 0  # of the lines this run wrote, re-asks answered by an earlier run

    def __repr__(self) -> str:
        parts = [plural(self.requests, "request"),
                 f"{self.written} written ({self.succeeded} ok, {self.failed} failed)"]  # fmt: skip
        if self.already_done:
            parts.append(f"{self.already_done} already done")
        if self.cache_hits:
            parts.append(f"{self.cache_hits} from the cache")
        if self.interrupted:
            parts.append("interrupted")
        if self.budget_stopped:
            parts.append("stopped by --max-cost")
        parts.append(f"{self.wall_s:.1f} s")
        return f"<RunSummary {self.output}: {', '.join(parts)}>"

    def _repr_html_(self) -> str:
        rows: list[tuple[str, object]] = [
            ("output", self.output),
            ("requests", self.requests),
            ("already done", self.already_done),
            ("written", f"{self.written} ({self.succeeded} ok, {self.failed} failed)"),
        ]
        if self.failures:
            rows.append(
                ("failures", ", ".join(f"{k} {n}" for k, n in self.failures.most_common(3)))
            )
        if self.cache_hits:
            rows.append(("from the cache", self.cache_hits))
        if self.schema_valid or self.schema_invalid:
            checked = self.schema_valid + self.schema_invalid
            rows.append(("schema held", f"{self.schema_valid} of {checked}"))
        rows.append(("tokens", f"{self.prompt_tokens:,} in, {self.completion_tokens:,} out"))
        rows.append(("wall time", f"{self.wall_s:.1f} s ({self.requests_per_s:.1f} req/s)"))
        if self.spent is not None:
            rows.append(("spent", f"${self.spent:.4f}"))
        if self.interrupted:
            rows.append(("interrupted", "yes: the same call resumes"))
        return table(rows)

    @property
    def results(self) -> Results:
        """The output's answers by custom_id, typed (read from the file on use)."""
        from jsonlbatch.exec.output.run_outcome import Results

        return Results(self.output)

    @property
    def written(self) -> int:
        return self.succeeded + self.failed

    @property
    def complete(self) -> bool:
        """Every request of the job has exactly one line in the output."""
        return self.already_done + self.written == self.requests

    @property
    def requests_per_s(self) -> float:
        return self.written / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def output_tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def count(self, result: Result) -> None:
        contract = result.metrics.get("contract")
        if contract is not None:  # stored answers pass the contract too (lookup.Vetter)
            held = contract.get("valid") is True
            self.schema_valid += held
            self.schema_invalid += not held
            before = contract.get("asks_before", 0)  # a re-ask resumed from the journal
            self.reasks += contract.get("asks", 1) - 1 - before
            self.reasks_before += before
        if result.metrics.get("cache") == "hit":  # not sent: no endpoint, no tokens paid
            self.succeeded += 1
            self.cache_hits += 1
            return
        if result.ok:
            self.succeeded += 1
        else:
            self.failed += 1
            self.failures[(result.error or {}).get("code", "error")] += 1
        endpoint = result.metrics.get("endpoint")
        if endpoint:
            self.endpoints[endpoint] += 1
        self.prompt_tokens += result.metrics.get("prompt_tokens", 0)
        self.completion_tokens += result.metrics.get("completion_tokens", 0)

    def format(self) -> str:
        parts = [f"{self.succeeded} ok", f"{self.failed} failed"]
        if self.already_done:
            parts.append(f"{self.already_done} already done")
        if self.failed_before:
            parts.append(f"{self.failed_before} of them failed")
        if self.remaining:
            parts.append(f"{self.remaining} not sent")
        lines = [f"{self.output}: {', '.join(parts)} (of {plural(self.requests, 'request')})"]
        if self.failures:
            lines.append(
                "  failures: " + ", ".join(f"{k} x{v}" for k, v in self.failures.most_common())
            )
        if self.limits or self.rate_limited:
            lines.append(
                f"  rate limits: {self.limits or 'none known'}; {self.rate_limited} attempts "
                "answered 429"
            )
        if self.cache:
            lines.append(f"  {self.cache}")
        if self.schema_valid or self.schema_invalid:
            lines.append(
                f"  answers under a schema: {self.schema_valid} valid, {self.schema_invalid} "
                f"invalid; {plural(self.reasks, 're-ask')}"
                + (f" (and {self.reasks_before} by an earlier run)" if self.reasks_before else "")
            )
        if self.spent is not None:
            before = f" (${self.spent_before:,.4f} before this run)" if self.spent_before else ""
            lines.append(f"  spent: ${self.spent:,.4f}{before}")
        if self.budget_stopped:
            lines.append(
                "  stopped by --max-cost before every request was sent; the same command with a "
                "higher --max-cost resumes"
            )
        if self.succeeded or self.failed:  # nothing sent: no rates of nothing to show
            lines.append(
                f"  {self.wall_s:.1f}s wall, {self.requests_per_s:.1f} req/s, "
                f"{plural(self.retries, 'retry', 'retries')}, tokens in/out "
                f"{self.prompt_tokens:,}/{self.completion_tokens:,} "
                f"({self.output_tokens_per_s:,.0f} out tok/s)"
            )
        lines += self._endpoint_lines()
        return "\n".join(lines)

    def _endpoint_lines(self) -> list[str]:
        """How the requests spread over the endpoints, and what each server's own metrics say
        (prefix cache hit rate, requests it counted); nothing for a lone endpoint without
        metrics."""
        servers = {s.endpoint: s for s in self.servers}
        names = list(self.endpoints) + [n for n in servers if n not in self.endpoints]
        if len(names) < 2 and not servers:
            return []
        total = sum(self.endpoints.values()) or 1
        lines = ["  endpoints:"]
        for name in names:
            sent = self.endpoints.get(name, 0)
            text = f"    {name}: {sent} requests ({sent / total:.0%})"
            server = servers.get(name)
            if server is not None:
                if server.prefix_cache_hit_rate is not None:
                    text += f", prefix cache hit rate {server.prefix_cache_hit_rate:.1%}"
                if server.requests is not None:
                    text += f", server counted {server.requests} requests"
            lines.append(text)
        return lines

    @property
    def remaining(self) -> int:
        return max(0, self.pending - self.written)

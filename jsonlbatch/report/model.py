"""The report's data model: what `build` produces and every renderer reads.

It lives apart from `build` so that the renderers and the builder both import it and neither
imports the other (`build` calls the renderers; the renderers only need the data).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jsonlbatch.report.load import RunData
from jsonlbatch.report.options import Price, Sla
from jsonlbatch.report.run_stats import RunStats
from jsonlbatch.report.servers import ServerFigures


@dataclass
class Report:
    """Stats of each run (first = baseline), with the columns the charts are drawn from."""

    runs: list[RunStats]
    data: list[RunData] = field(repr=False)
    sla: list[Sla] = field(default_factory=list)
    price: Price | None = None
    by: list[str] = field(default_factory=list)
    servers: list[list[ServerFigures]] = field(default_factory=list)  # per run, from /metrics
    sources: list[str] = field(default_factory=list)  # the files read: never written over

    @property
    def title(self) -> str:
        return "jsonlbatch report: " + " vs ".join(run.label for run in self.runs)

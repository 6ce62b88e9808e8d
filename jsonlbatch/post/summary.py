"""What a post-processor could not use, and why.

Every post-processor skips samples (failed requests, truncated answers, edits that do not
apply); silently shrinking the data would bias whatever is computed from the rest, so the
skips are counted per reason, shown with a few examples, and become an error under `--strict`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jsonlbatch.errors import JsonlbatchError
from jsonlbatch.redact import redact

# Reason labels shared by the post-processors, so summaries read the same everywhere.
FAILED = "failed request"
TRUNCATED = "truncated (finish_reason length)"
TORN = "torn last line (file still being written?)"

_EXAMPLES = 3


class UnusableSamplesError(JsonlbatchError):
    """`--strict` was given and some samples could not be used."""


@dataclass
class Unused:
    """A tally of skipped samples per reason, with the first few examples of each."""

    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, reason: str, sample_id: str, detail: str = "") -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        shown = self.examples.setdefault(reason, [])
        if len(shown) < _EXAMPLES:
            detail = redact(" ".join(detail.split()), limit=160)
            shown.append(f"{sample_id} ({detail})" if detail else sample_id)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def lines(self) -> list[str]:
        """One line per reason, most frequent first."""
        out = []
        for reason, count in sorted(self.counts.items(), key=lambda kv: -kv[1]):
            more = "" if count <= _EXAMPLES else ", ..."
            out.append(f"  {count} {reason}: {', '.join(self.examples[reason])}{more}")
        return out

    def section(self, title: str = "not used:") -> list[str]:
        """The summary's tail: `title` and one line per reason; nothing when nothing was skipped."""
        return [title, *self.lines()] if self.total else []

    def check(self, strict: bool, what: str) -> None:
        """Raise under `strict` when anything was skipped."""
        if strict and self.counts:
            raise UnusableSamplesError(
                f"--strict: {self.total} {what} could not be used (outputs were written):\n"
                + "\n".join(self.lines())
            )

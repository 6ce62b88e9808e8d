"""Majority votes per group, and maj@k / pass@k / mean@k against gold answers.

All choices of an `n>1` response and all samples of a group are pooled; several inputs can be
pooled with weights (hybrid voting: text answers plus answers computed by code). `INVALID`
(nothing extracted, failed request) counts in the total but never wins over a real answer.
Ties go to the answer seen first, in the group's sample order (inputs in command-line order,
then custom_id with numbers compared as numbers, then choice index).

Accuracy at k, over groups that have a gold answer, uses the first k samples of each group.
A group with fewer samples than the largest is padded with `INVALID` (a missing sample is a
wrong one), so every k is computed over the same groups:
- maj@k: the majority of the first k samples is right;
- pass@k: the unbiased estimator 1 - C(n-c, k) / C(n, k) (n samples, c right);
- mean@k: the share of the first k samples that are right.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from math import comb
from typing import Any

from jsonlbatch.answer_contract.contract import recorded_value
from jsonlbatch.errors import InputError, Problem, UsageError
from jsonlbatch.file_io.output_guard import check_output
from jsonlbatch.post.extract import (
    DEFAULT_EXTRACTORS,
    INVALID,
    Extractor,
    Normalizer,
    extract_answer,
    get_extractor,
    get_normalizer,
    normalize_answer,
)
from jsonlbatch.post.outputs import JsonlWriter
from jsonlbatch.post.responses import Group, KeyFunc, Sample, as_text, iter_groups, json_lines
from jsonlbatch.post.summary import FAILED, TRUNCATED, Unused
from jsonlbatch.stats import plural

NOTHING_EXTRACTED = "nothing extracted"
NO_RESPONSES = "gold id without responses (left out of the accuracy)"
TIE_BREAKS = ("first", "last", "shortest")
_GOLD_IDS = ("id", "custom_id", "group", "instance_id", "question_id")


@dataclass
class Tally:
    """The outcome of one vote."""

    answer: str
    votes: float
    total: float
    tally: dict[str, float]

    @property
    def agreement(self) -> float:
        return self.votes / self.total if self.total else 0.0


def _winner(counts: dict[str, float], tie_break: str) -> str:
    real = {a: round(c, 9) for a, c in counts.items() if a != INVALID}
    if not real:
        return INVALID
    best = max(real.values())
    tied = [a for a, c in real.items() if c == best]  # dict order: first seen first
    if tie_break == "last":
        return tied[-1]
    if tie_break == "shortest":
        return min(tied, key=len)
    return tied[0]


def vote(
    answers: Sequence[str], weights: Sequence[float] | None = None, *, tie_break: str = "first"
) -> Tally:
    """Weighted majority over normalized answers (weights default to 1 each)."""
    if tie_break not in TIE_BREAKS:
        raise UsageError(f"unknown tie-break {tie_break!r} (known: {', '.join(TIE_BREAKS)})")
    weights = [1.0] * len(answers) if weights is None else weights
    counts: dict[str, float] = {}
    for answer, weight in zip(answers, weights, strict=True):
        counts[answer] = counts.get(answer, 0.0) + weight
    answer = _winner(counts, tie_break)
    return Tally(answer, counts.get(answer, 0.0), sum(weights), counts)


@dataclass
class AtK:
    """Accuracy of one k, averaged over the groups with a gold answer."""

    k: int
    maj: float
    pass_: float
    mean: float


@dataclass
class _Scored:
    maj: list[bool]  # maj@k right, k = 1..n
    right: list[int]  # right answers among the first k, k = 1..n


class Accuracy:
    """Accumulates maj@k / pass@k / mean@k group by group (see the module docstring)."""

    def __init__(self) -> None:
        self._groups: list[_Scored] = []

    def add(
        self, answers: Sequence[str], weights: Sequence[float], gold: str, tie_break: str = "first"
    ) -> None:
        counts: dict[str, float] = {}
        maj, right, n_right = [], [], 0
        for answer, weight in zip(answers, weights, strict=True):
            counts[answer] = counts.get(answer, 0.0) + weight
            maj.append(_winner(counts, tie_break) == gold)
            n_right += answer == gold
            right.append(n_right)
        self._groups.append(_Scored(maj, right))

    @property
    def groups(self) -> int:
        return len(self._groups)

    def table(self) -> list[AtK]:
        if not self._groups:
            return []
        n = max(len(g.maj) for g in self._groups)
        rows = []
        for k in range(1, n + 1):
            maj = pass_ = mean = 0.0
            for g in self._groups:
                have = min(k, len(g.maj))
                if have:
                    maj += g.maj[have - 1]
                    mean += g.right[have - 1] / k
                c = g.right[-1] if g.right else 0
                pass_ += 1.0 - comb(n - c, k) / comb(n, k)
            count = len(self._groups)
            rows.append(AtK(k, maj / count, pass_ / count, mean / count))
        return rows


def format_table(rows: Sequence[AtK], groups: int) -> str:
    """The accuracy table as printed by `jsonlbatch post votes --gold`."""
    lines = [f"accuracy over {groups} groups with a gold answer", "    k   maj@k  pass@k  mean@k"]
    lines += [f"{r.k:5d}  {r.maj:6.3f}  {r.pass_:6.3f}  {r.mean:6.3f}" for r in rows]
    return "\n".join(lines)


def load_gold(path: str, normalize: Normalizer) -> dict[str, str]:
    """Gold answers from JSONL: `{"id": ..., "answer": ...}` or `{"<id>": <answer>}` per line."""
    gold: dict[str, str] = {}
    problems: list[Problem] = []
    for lineno, obj in json_lines(path, problems):
        if isinstance(obj, dict) and "answer" in obj:
            ids = [obj[k] for k in _GOLD_IDS if isinstance(obj.get(k), str)]
            pair = (ids[0], obj["answer"]) if ids else None
        elif isinstance(obj, dict) and len(obj) == 1:
            pair = next(iter(obj.items()))
        else:
            pair = None
        if pair is None or pair[1] is None:
            problems.append(Problem(path, lineno, None, 'want {"id": ..., "answer": ...}'))
            continue
        gold[pair[0]] = normalize(as_text(pair[1]))
    if problems:
        raise InputError("malformed gold file", problems)
    return gold


@dataclass
class GroupVote:
    """One line of the votes output."""

    id: str
    answer: str
    votes: float
    total: float
    agreement: float
    tally: dict[str, float]
    samples: int
    invalid: int
    gold: str | None = None
    correct: bool | None = None


def sample_answer(
    sample: Sample,
    extractors: Sequence[str | Extractor],
    normalize: Normalizer,
    *,
    use_truncated: bool = False,
) -> tuple[str, str]:
    """(normalized answer or INVALID, the reason it is INVALID or "")."""
    if sample.failed:
        return INVALID, FAILED
    if sample.truncated and not use_truncated:
        return INVALID, TRUNCATED
    if sample.answer is not None:
        found: str | None = sample.answer
    else:
        valid, value = recorded_value(sample.metrics, sample.index)
        found = extract_answer(sample.text, extractors, value=value if valid else None,
                               calls=sample.tool_calls)  # fmt: skip
    if found is None:
        return INVALID, NOTHING_EXTRACTED
    answer = normalize(found)
    return (answer, "") if answer else (INVALID, NOTHING_EXTRACTED)


def vote_group(
    group: Group,
    extractors: Sequence[str | Extractor] = DEFAULT_EXTRACTORS,
    normalize: Normalizer = normalize_answer,
    *,
    weights: Sequence[float] | None = None,
    tie_break: str = "first",
    use_truncated: bool = False,
    unused: Unused | None = None,
) -> tuple[GroupVote, list[str], list[float]]:
    """Vote over one group: its output line, and the per-sample answers and weights."""
    answers, sample_weights = [], []
    for sample in group.samples:
        answer, why = sample_answer(sample, extractors, normalize, use_truncated=use_truncated)
        if why and unused is not None:
            unused.add(why, sample.sample_id, sample.error or "")
        answers.append(answer)
        sample_weights.append(weights[sample.source] if weights else 1.0)
    t = vote(answers, sample_weights, tie_break=tie_break)
    line = GroupVote(
        group.key,
        t.answer,
        _num(t.votes),
        _num(t.total),
        round(t.agreement, 6),
        {a: _num(c) for a, c in t.tally.items()},
        len(answers),
        answers.count(INVALID),
    )
    return line, answers, sample_weights


def _num(x: float) -> Any:
    return int(x) if float(x).is_integer() else round(x, 9)


@dataclass
class VotesSummary:
    """Counts of one run, the accuracy table (with gold), and what could not be used."""

    groups: int = 0
    samples: int = 0
    accuracy: list[AtK] = field(default_factory=list)
    scored: int = 0
    unused: Unused = field(default_factory=Unused)

    def lines(self) -> list[str]:
        return [
            f"votes: {plural(self.samples, 'sample')} in {plural(self.groups, 'group')}",
            *self.unused.section("not used (samples count as [invalid] in their vote):"),
        ]


def run_votes(
    paths: str | Sequence[str],
    out: str,
    *,
    extractors: Sequence[str | Extractor] = DEFAULT_EXTRACTORS,
    normalize: str | Normalizer = "default",
    weights: Sequence[float] | None = None,
    gold: str | None = None,
    key: KeyFunc | None = None,
    tie_break: str = "first",
    use_truncated: bool = False,
    strict: bool = False,
) -> VotesSummary:
    """Vote per group and write one JSON line per group to `out` (`weights`: one per input)."""
    paths = [paths] if isinstance(paths, str) else list(paths)
    check_output(out, [*paths, gold])
    if weights is not None and len(weights) != len(paths):
        raise UsageError(f"give one --weight per input ({len(paths)}), got {len(weights)}")
    if weights is not None and not all(math.isfinite(w) and w >= 0 for w in weights):
        raise UsageError(f"weights must be finite and not negative, got {list(weights)}")
    if tie_break not in TIE_BREAKS:
        raise UsageError(f"unknown tie-break {tie_break!r} (known: {', '.join(TIE_BREAKS)})")
    extractors = [get_extractor(e) for e in extractors or DEFAULT_EXTRACTORS]
    norm = get_normalizer(normalize)
    gold_answers = load_gold(gold, norm) if gold else {}
    summary = VotesSummary()
    accuracy = Accuracy()
    seen_gold: set[str] = set()
    with JsonlWriter(out) as writer:
        for group in iter_groups(paths, key, summary.unused):
            line, answers, sample_weights = vote_group(
                group,
                extractors,
                norm,
                weights=weights,
                tie_break=tie_break,
                use_truncated=use_truncated,
                unused=summary.unused,
            )
            if group.key in gold_answers:
                seen_gold.add(group.key)
                line.gold = gold_answers[group.key]
                line.correct = line.answer == line.gold
                accuracy.add(answers, sample_weights, line.gold, tie_break)
            writer.write(line.__dict__)
            summary.groups += 1
            summary.samples += line.samples
    summary.accuracy = accuracy.table()
    summary.scored = accuracy.groups
    for gold_id in sorted(gold_answers.keys() - seen_gold):
        summary.unused.add(NO_RESPONSES, gold_id)
    summary.unused.check(strict, "samples")
    return summary

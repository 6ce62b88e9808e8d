"""Judge rounds: score each answer, answer again what fails, keep the passing or best answer.

A round is four files, all plain Batch files the other commands read:

    round-1/judge-requests.jsonl    a judge prompt per answer (gen over responses-as-data)
    round-1/judge-responses.jsonl   executed (a `RunSpec`, as `jsonlbatch exec`: resumable, crash-safe)
    round-2/requests.jsonl          the failing items asked again: a new seed, and the judge's
    round-2/responses.jsonl         feedback as a new user turn when `feedback` is on
    ...

A score is extracted from each judge answer with the `post votes` extractors (`json:score`,
`regex:...`, `last-number`, ...) and a `PassRule` decides. An item stops at the round it passes;
after `rounds` rounds the rest keep their best-scored answer. `judge.jsonl` says per item what
was chosen and the rounds it took; `final.jsonl` holds the chosen response lines, so `post` and
`report` read the outcome like any response file.

Running again on the same inputs sends nothing (every round's exec finds its results); an
interrupted run resumes in the round it was in. A changed configuration or input clears the old
rounds first (`judge-state.json` holds the hash they were made with).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from jsonlbatch.batch_format.samples import Sample, samples_of
from jsonlbatch.errors import UsageError
from jsonlbatch.exec.front_door import Target, Urls
from jsonlbatch.experiment.exec_runs import send
from jsonlbatch.experiment.rules import PassRule, coerce
from jsonlbatch.experiment.state import file_digest
from jsonlbatch.file_io.jsonl import iter_lines_at
from jsonlbatch.gen import RequestWriter
from jsonlbatch.gen.response_rows import RequestIndex, response_rows
from jsonlbatch.gen.sources import Row
from jsonlbatch.gen.templates import Prompt, RowTemplate
from jsonlbatch.post.extract import extract_answer, get_extractor
from jsonlbatch.post.outputs import JsonlWriter
from jsonlbatch.stats import plural

DEFAULT_RETRY = (
    "A reviewer scored your answer {{ score }}.\n\nTheir feedback:\n{{ feedback }}\n\n"
    "Please answer the original request again, improving on your previous answer."
)


@dataclass
class JudgeConfig:
    """What a judge step does. Templates are Jinja2 text (read files yourself, or use the
    experiment file), rendered per answer with the responses-as-data fields plus `round`."""

    template: str
    extract: Mapping[str, Sequence[str]] = field(default_factory=lambda: {"score": ["json:score"]})
    rule: str = "score >= 6"
    rounds: int = 3
    system: str | None = None
    model: str | None = None  # the judge's model; default: the answer's
    body: Mapping[str, Any] = field(default_factory=lambda: {"temperature": 0})
    feedback: bool = True  # the judge's answer goes into the next round's prompt
    retry_template: str = DEFAULT_RETRY
    seed_step: int = 1  # round r asks again with seed + (r - 1) * seed_step

    def __post_init__(self) -> None:
        if isinstance(self.extract, (str, list, tuple)):
            specs = [self.extract] if isinstance(self.extract, str) else list(self.extract)
            self.extract = {"score": specs}
        if not self.extract:
            raise UsageError("the judge needs at least one extractor (e.g. json:score)")
        self.extract = {
            name: [specs] if isinstance(specs, str) else list(specs)
            for name, specs in self.extract.items()
        }
        for specs in self.extract.values():
            for spec in specs:
                get_extractor(spec)  # unknown names fail now, not after a round was paid for
        if self.rounds < 1:
            raise UsageError(f"judge rounds must be at least 1, got {self.rounds}")
        self.pass_rule = PassRule(self.rule, [*self.extract, "round"])
        names = ("judge template", "judge system", "retry template")
        for text, name in zip(
            (self.template, self.system, self.retry_template), names, strict=True
        ):
            if text is not None:
                RowTemplate(text, name=name)  # syntax errors now

    def fingerprint(self) -> str:
        data = {k: v for k, v in asdict(self).items() if k != "pass_rule"}
        return hashlib.sha256(orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass
class Verdict:
    """The judge's view of one answer. Texts stay in the files (found again by byte offset),
    so memory grows with the number of items, not with the length of answers."""

    round: int
    values: dict[str, Any]
    passed: bool
    path: str = ""  # the round's response file holding the answer
    offset: int = -1  # byte offset of the answer's line there; -1: no answer this round
    judge_path: str = ""
    judge_offset: int = -1  # the judge's response line; -1: not judged (the answer failed)

    def answer(self) -> str:
        return _text_at(self.path, self.offset)[0] if self.offset >= 0 else ""

    def feedback(self) -> str:
        """What the judge said (or why there is no judgement), for the next round's prompt."""
        if self.judge_offset >= 0:
            text, error = _text_at(self.judge_path, self.judge_offset)
            return text or f"(the judge failed: {error})"
        if self.offset >= 0:
            return f"(the answer failed: {_text_at(self.path, self.offset)[1]})"
        return "(no answer)"


@dataclass
class JudgeSummary:
    items: int = 0
    passed: int = 0
    passed_by_round: list[int] = field(default_factory=list)  # newly passing per round
    rounds_run: int = 0
    requests_written: int = 0

    @property
    def mean_rounds(self) -> float:
        return self._rounds_total / self.items if self.items else 0.0

    _rounds_total: int = 0

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if not k.startswith("_")}
        return out | {"mean_rounds": round(self.mean_rounds, 4)}


def run_judge(
    requests: str,
    responses: str,
    out_dir: str,
    config: JudgeConfig,
    *,
    urls: Sequence[str] = (),
    judge_urls: Sequence[str] | None = None,
    target: Target | None = None,
    join: str | None = None,
    on: str | None = None,
    exec_options: Mapping[str, Any] | None = None,
    quiet: bool = False,
    note: Callable[[str], None] | None = None,
) -> JudgeSummary:
    """Judge the answers in `responses` (to `requests`), re-asking failures up to the rounds.

    `urls` answer the re-asked requests, `judge_urls` (default: `urls`) the judge's; both go
    through exec's front door with `exec_options` (concurrency, timeouts, ...). `target`, when
    given, is where the re-asked requests (and, without `judge_urls`, the judge's) go instead
    of `urls`: the experiment runner's launched servers (`serve.target.KeptLaunch`).
    """
    say = note or (lambda _msg: None)
    os.makedirs(out_dir, exist_ok=True)
    _reset_if_changed(out_dir, config, requests, responses, join, on)
    run_exec = _executor(exec_options, quiet)
    answers_at: Target = target if target is not None else Urls(tuple(urls))
    judged_at: Target = Urls(tuple(judge_urls)) if judge_urls else answers_at
    with RequestIndex(requests) as originals:
        items = _item_ids(requests)
        history: dict[str, list[Verdict]] = {cid: [] for cid in items}
        open_ids = set(items)
        answers_req, answers_resp = requests, responses
        summary = JudgeSummary(items=len(items))
        for r in range(1, config.rounds + 1):
            here = os.path.join(out_dir, f"round-{r}")
            os.makedirs(here, exist_ok=True)
            if r > 1:
                answers_req = os.path.join(here, "requests.jsonl")
                answers_resp = os.path.join(here, "responses.jsonl")
                summary.requests_written += _write_retries(
                    answers_req, [c for c in items if c in open_ids], history, originals, config, r
                )
                say(f"round {r}: asking {plural(len(open_ids), 'item')} again")
                run_exec(answers_req, answers_resp, answers_at)
            verdicts = _judge_round(
                here, r, answers_req, answers_resp, open_ids, config, join, on,
                lambda q, o: run_exec(q, o, judged_at),
            )  # fmt: skip
            newly = 0
            for cid, verdict in verdicts.items():
                history[cid].append(verdict)
                if verdict.passed:
                    open_ids.discard(cid)
                    newly += 1
            for cid in open_ids - verdicts.keys():  # no answer at all this round (not even failed)
                history[cid].append(Verdict(r, {}, False))
            summary.passed_by_round.append(newly)
            summary.rounds_run = r
            say(f"round {r}: {newly} passed, {len(open_ids)} still failing")
            if not open_ids:
                break
        _write_final(out_dir, items, history, config, summary)
    return summary


def _executor(
    exec_options: Mapping[str, Any] | None, quiet: bool
) -> Callable[[str, str, Target], None]:
    options = dict(exec_options or {})

    def run(requests: str, output: str, target: Target) -> None:
        send(requests, output, target, options, quiet=quiet)

    return run


def _item_ids(requests: str) -> list[str]:
    ids = []
    for _, _, raw in iter_lines_at(requests):
        ids.append(orjson.loads(raw)["custom_id"])
    return ids


def _judge_round(
    here: str,
    r: int,
    answers_req: str,
    answers_resp: str,
    open_ids: set[str],
    config: JudgeConfig,
    join: str | None,
    on: str | None,
    run_exec: Callable[[str, str], None],
) -> dict[str, Verdict]:
    """Judge this round's answers of the open items; {custom_id: verdict}."""
    prompt = Prompt(
        user=RowTemplate(config.template, name="judge template"),
        system=RowTemplate(config.system, name="judge system") if config.system else None,
    )
    offsets = _offsets(answers_resp)
    judge_req = os.path.join(here, "judge-requests.jsonl")
    judge_resp = os.path.join(here, "judge-responses.jsonl")
    verdicts: dict[str, Verdict] = {}
    answered: set[str] = set()
    with RequestWriter(judge_req, force=True, body=config.body) as writer:
        for row in response_rows(answers_resp, requests=answers_req, join=join, on=on):
            cid = row.data["custom_id"]
            if cid not in open_ids or cid in answered:
                continue
            answered.add(cid)
            if row.data["failed"]:
                verdicts[cid] = Verdict(r, {}, False, answers_resp, offsets[cid])
                continue
            row = Row(row.source, row.index, row.line, {**row.data, "round": r}, key=cid)
            model = config.model or row.data.get("model") or row.data["body"].get("model")
            writer.add(cid, prompt.build(row), model=model)
    if writer.summary.requests:
        run_exec(judge_req, judge_resp)
    else:
        open(judge_resp, "ab").close()
    for cid, start, sample in _first_samples(judge_resp):
        if cid not in answered or cid in verdicts:
            continue
        text = "" if sample.failed else sample.text
        values: dict[str, Any] = {
            name: coerce(extract_answer(text, specs)) if text else None
            for name, specs in config.extract.items()
        }
        passed = config.pass_rule({**values, "round": r})
        verdicts[cid] = Verdict(r, values, passed, answers_resp, offsets[cid], judge_resp, start)
    return verdicts


def _write_retries(
    path: str,
    ids: list[str],
    history: dict[str, list[Verdict]],
    originals: RequestIndex,
    config: JudgeConfig,
    r: int,
) -> int:
    """The round-`r` requests of the items still failing: the original request with a new seed,
    and (with `feedback`) the previous answer and the judge's feedback as two more turns."""
    retry = RowTemplate(config.retry_template, name="retry template")
    first = originals.get(ids[0]) if ids else None
    url = first["url"] if first else "/v1/chat/completions"
    with RequestWriter(path, force=True, url=url) as writer:
        for cid in ids:
            original = originals.get(cid)
            assert original is not None
            body = dict(original["body"])
            seed = body.get("seed")
            if not isinstance(seed, int):
                seed = 0
            body["seed"] = seed + (r - 1) * config.seed_step
            last = history[cid][-1] if history[cid] else None
            messages = body.pop("messages", None)
            prompt_field = "prompt" if "prompt" in body else "input" if "input" in body else None
            content: Any = body.pop(prompt_field) if prompt_field else messages
            answer = last.answer() if last else ""
            if config.feedback and isinstance(messages, list) and last and answer:
                fields = {**last.values, "feedback": last.feedback(), "answer": answer}
                row = Row(path, 0, None, fields | {"round": r, "custom_id": cid}, key=cid)
                content = [
                    *messages,
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": retry.render(row)},
                ]
            writer.add(cid, content, **body)
    return writer.summary.requests


def _best(verdicts: list[Verdict], primary: str) -> Verdict | None:
    """The passing verdict, else the best-scored answer (the earliest of equals)."""
    real = [v for v in verdicts if v.offset >= 0]
    for v in real:
        if v.passed:
            return v

    def key(v: Verdict) -> tuple[int, float, int]:
        score = v.values.get(primary)
        if isinstance(score, (int, float)) and not isinstance(score, bool):
            return (1, float(score), -v.round)
        return (0, 0.0, -v.round)

    return max(real, key=key) if real else None


def _write_final(
    out_dir: str,
    items: list[str],
    history: dict[str, list[Verdict]],
    config: JudgeConfig,
    summary: JudgeSummary,
) -> None:
    primary = next(iter(config.extract))
    final_tmp = os.path.join(out_dir, ".final.jsonl.tmp")
    with (
        JsonlWriter(os.path.join(out_dir, "judge.jsonl")) as report,
        open(final_tmp, "wb") as final,
    ):
        for cid in items:
            verdicts = history[cid]
            chosen = _best(verdicts, primary)
            passed = bool(chosen and chosen.passed)
            rounds = len(verdicts)
            summary.passed += passed
            summary._rounds_total += rounds
            report.write(
                {
                    "custom_id": cid,
                    "passed": passed,
                    "score": chosen.values.get(primary) if chosen else None,
                    "values": chosen.values if chosen else {},
                    "round": chosen.round if chosen else None,
                    "rounds": rounds,
                    "history": [
                        {"round": v.round, "passed": v.passed, **v.values} for v in verdicts
                    ],
                    "answer": chosen.answer() if chosen else None,
                }
            )
            if chosen is not None:
                final.write(_line_at(chosen.path, chosen.offset).rstrip(b"\n") + b"\n")
        final.flush()
        os.fsync(final.fileno())
    os.replace(final_tmp, os.path.join(out_dir, "final.jsonl"))
    with open(os.path.join(out_dir, "judge-summary.json"), "wb") as f:
        f.write(orjson.dumps(summary.as_dict(), option=orjson.OPT_INDENT_2))


def _first_samples(path: str) -> Iterator[tuple[str, int, Sample]]:
    """(custom_id, byte offset, first sample) of each line of a response file exec wrote."""
    for _, start, raw in iter_lines_at(path):
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue  # a torn tail of an interrupted write: exec re-sends it
        if isinstance(obj, dict) and isinstance(obj.get("custom_id"), str):
            yield obj["custom_id"], start, samples_of(obj)[0]


def _line_at(path: str, offset: int) -> bytes:
    with open(path, "rb") as f:  # a small buffer: one line is wanted, not a 1 MiB read
        f.seek(offset)
        return f.readline()


def _text_at(path: str, offset: int) -> tuple[str, str]:
    """(answer text, error) of the response line at `offset`."""
    sample = samples_of(orjson.loads(_line_at(path, offset)))[0]
    return ("", sample.error or "") if sample.failed else (sample.text, "")


def _offsets(path: str) -> dict[str, int]:
    """custom_id -> byte offset of its line (a retried id: the later line, as exec keeps it)."""
    if not os.path.exists(path):
        return {}
    return {cid: start for cid, start, _ in _first_samples(path)}


def _reset_if_changed(out_dir: str, config: JudgeConfig, *inputs: str | None) -> None:
    """Clear old rounds made with another configuration or other inputs."""
    digest = hashlib.sha256(config.fingerprint().encode())
    for path in inputs:
        digest.update(
            b"\0" + (file_digest(path) if path and os.path.isfile(path) else str(path)).encode()
        )
    state = os.path.join(out_dir, "judge-state.json")
    want = digest.hexdigest()
    try:
        with open(state, "rb") as f:
            have = orjson.loads(f.read()).get("hash")
    except (OSError, orjson.JSONDecodeError):
        have = None
    if have == want:
        return
    for name in os.listdir(out_dir):
        if name.startswith("round-"):
            shutil.rmtree(os.path.join(out_dir, name))
    with open(state, "wb") as f:
        f.write(orjson.dumps({"hash": want}))

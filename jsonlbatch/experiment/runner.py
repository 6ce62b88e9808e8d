"""`jsonlbatch run experiment.yaml`: every condition through gen -> exec -> judge -> post, then
one report comparing them.

Each condition gets a folder of plain files that the other commands read:

    runs/<experiment id>/<condition>/
        requests.jsonl     gen: the data rows through the prompt, with the condition's settings
        responses.jsonl    exec: resumable, crash-safe (a `RunSpec` started as `jsonlbatch exec` is)
        judge/             judge rounds: round-K/..., judge.jsonl, final.jsonl
        votes.jsonl        post votes over final.jsonl (after a judge) or responses.jsonl;
        files/, predictions.jsonl   post files, post patches (same input)
        steps.json         per step: content hash, running/done, summary
    runs/<experiment id>/report.md, report.json (+ report.html)

Steps are skipped when their hash (settings + input bytes, see `state`) is unchanged, resumed when
they were interrupted, and started over when their inputs changed. Servers a condition asks to
`serve` are launched only when a step of it has something to send, and torn down after it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from jsonlbatch.batch_format.records import CHAT_URL, RESPONSES_URL
from jsonlbatch.errors import UsageError
from jsonlbatch.exec.front_door import Target, Urls
from jsonlbatch.experiment.code_interpreter import interpreter_tools
from jsonlbatch.experiment.compare import write_comparison
from jsonlbatch.experiment.exec_runs import send
from jsonlbatch.experiment.judge import JudgeConfig, run_judge
from jsonlbatch.experiment.posting import (
    PARTS,
    describe,
    export_inputs,
    export_results,
    input_files,
)
from jsonlbatch.experiment.spec import Condition, Experiment, Step, load_experiment
from jsonlbatch.experiment.state import StepState, step_hash
from jsonlbatch.extras import require
from jsonlbatch.file_io.filecheck import read_text
from jsonlbatch.gen import RequestWriter, write_requests
from jsonlbatch.gen.row_requests import row_custom_id
from jsonlbatch.gen.sources import Row, iter_rows, select
from jsonlbatch.gen.templates import Prompt, RowTemplate, compile_condition
from jsonlbatch.post.outputs import JsonlWriter
from jsonlbatch.redact import register_secret
from jsonlbatch.report.charts import charts_missing
from jsonlbatch.serve.fleet import serve_options
from jsonlbatch.serve.target import KeptLaunch

#: Condition keys that shape the requests (the rest say where they go).
_GEN_KEYS = (
    "model", "system", "suffix", "temperature", "top_p", "top_k", "min_p", "max_tokens", "seed",
    "stop", "n", "samples", "greedy_first", "no_think", "think_budget", "params",
)  # fmt: skip
_EXEC_KEYS = ("concurrency", "timeout", "max_retries", "ready_timeout", "stream",
              "require_files", "reask")  # fmt: skip
#: The field of rows.jsonl holding each data row's custom_id (its group, with samples).
ROW_ID = "_row_id"


@dataclass
class StepOutcome:
    """What one step of one condition did: ran, resumed, or skipped (its inputs unchanged)."""

    condition: str
    step: str
    status: str  # ran, resumed, skipped
    detail: str = ""


@dataclass
class ExperimentResult:
    directory: str
    outcomes: list[StepOutcome] = field(default_factory=list)
    reports: list[str] = field(default_factory=list)
    table: str = ""  # the conditions side by side, when the file has a report step
    failed: dict[str, int] = field(default_factory=dict)  # failed first-round requests

    def sent_anything(self) -> bool:
        return any(o.status != "skipped" and o.step in ("exec", "judge") for o in self.outcomes)


def run_experiment(
    experiment: str | Experiment,
    *,
    runs_dir: str = "runs",
    only: Sequence[str] = (),
    quiet: bool = False,
    echo: Callable[[str], None] | None = None,
) -> ExperimentResult:
    """Run (or resume, or skip) every step of every condition, then write the comparison."""
    exp = load_experiment(experiment) if isinstance(experiment, str) else experiment
    say = echo or (lambda _msg: None)
    _check_extras(exp, say)
    names = [c.name for c in exp.conditions]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise UsageError(f"no condition {unknown[0]!r} in {exp.path} (have: {', '.join(names)})")
    root = os.path.join(runs_dir, exp.id)
    result = ExperimentResult(root)
    for condition in exp.conditions:
        if only and condition.name not in only:
            continue
        runner = _ConditionRun(exp, condition, os.path.join(root, condition.name), quiet, say)
        result.outcomes += runner.run()
        failed = (runner.state.summary("exec") or {}).get("failed", 0)
        if failed:
            result.failed[condition.name] = failed
    report = exp.step("report")
    if report is not None:
        compared = report.settings.get("compare") or names
        comparison = write_comparison(
            exp, root, compared, formats=report.settings.get("formats") or ["md", "json"]
        )
        result.reports, result.table = comparison.paths, comparison.table
        say(f"report: {', '.join(result.reports)}")
    return result


def _check_extras(exp: Experiment, say: Callable[[str], None]) -> None:
    """Steps that need an optional extra: checked before the first one runs, not after an exec
    of hours (gen checks a Parquet data file itself, and it is the first step; a server to
    launch is checked for when it starts, which is the first thing the exec step does)."""
    export = exp.step("export")
    if export and (export.settings.get("format") == "parquet" or export.settings.get("into")):
        require("pyarrow.parquet", extra="parquet", for_what="the export step")
    report = exp.step("report")
    if report and "html" in (report.settings.get("formats") or []):
        missing = charts_missing()
        if missing is not None:
            say(f"note: report.html will have no charts: {missing}")


class _ConditionRun:
    def __init__(
        self,
        exp: Experiment,
        condition: Condition,
        directory: str,
        quiet: bool,
        say: Callable[[str], None],
    ) -> None:
        self.exp, self.cond, self.dir, self.quiet = exp, condition, directory, quiet
        self.say = lambda msg: say(f"[{condition.name}] {msg}")
        os.makedirs(directory, exist_ok=True)
        self.state = StepState(directory)
        self.stack = contextlib.ExitStack()
        self._target: Target | None = None
        self.requests = os.path.join(directory, "requests.jsonl")
        self.responses = os.path.join(directory, "responses.jsonl")
        self.rows = os.path.join(directory, "rows.jsonl")
        self.api_key = None
        if condition.settings.get("api_key_env"):
            self.api_key = os.environ.get(condition.settings["api_key_env"])
            register_secret(self.api_key)

    def run(self) -> list[StepOutcome]:
        outcomes = []
        with self.stack:
            outcomes.append(self.gen())
            for step in self.exp.steps:
                if step.kind == "post":
                    outcomes += self.post(step)
                elif step.kind != "report":
                    outcomes.append(getattr(self, step.kind)(step))
        return outcomes

    # -- servers -------------------------------------------------------------------------------

    def target(self) -> Target:
        """Where the condition's requests go: its `url`s, and the servers it asks to `serve`
        (launched by the first step that has something to send, kept for its later steps,
        torn down when the condition ends: `serve.target.KeptLaunch`)."""
        if self._target is None:
            urls = self.cond.settings.get("url") or []
            given = (urls,) if isinstance(urls, str) else tuple(urls)
            serve = self.cond.settings.get("serve")
            if serve is None:
                self._target = Urls(given)
                return self._target
            options = {"backend": serve} if isinstance(serve, str) else dict(serve)
            if options["backend"] == "mock" and not options.get("served_model_name"):
                judge = self.exp.step("judge")
                names = [self.cond.settings["model"]]
                if judge and judge.settings.get("model"):
                    names.append(judge.settings["model"])
                options["served_model_name"] = list(dict.fromkeys(names))
            entry = serve_options(options)
            # the logs: responses.jsonl.server.log, as exec names them
            self._target = KeptLaunch(entry.options, self.stack, given, log_stem=self.responses)
        return self._target

    def exec_options(self) -> dict[str, Any]:
        step = self.exp.step("exec")
        options = {k: v for k, v in (step.settings if step else {}).items() if k in _EXEC_KEYS}
        if self.api_key:
            options["api_key"] = self.api_key
        if self.exp.cache is not None:  # one answer cache for every condition and judge round
            options["cache"] = self.exp.cache
        if step and step.settings.get("files_dir"):  # code interpreter deliverables, per task
            options["files_dir"] = os.path.join(os.path.dirname(self.responses), "container_files")
        return options

    # -- steps ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _step(self, name: str, digest: str, outputs: Sequence[str]) -> Iterator[StepOutcome | None]:
        """Yields None when the step must run (after clearing stale outputs), else the skip."""
        status = self.state.status(name, digest)
        if status == "done":
            self.say(f"{name}: unchanged, skipped")
            yield StepOutcome(self.cond.name, name, "skipped")
            return
        if status == "new":
            for path in outputs:
                if os.path.isdir(path):
                    shutil.rmtree(path)
                elif os.path.lexists(path):
                    os.remove(path)
        self.state.start(name, digest)
        yield None

    def gen(self) -> StepOutcome:
        data, prompt = self.exp.data, self.exp.prompt
        settings = {
            "data": {k: v for k, v in data.items() if k != "file"},
            "prompt": {k: prompt.get(k) for k in ("text", "system")},
            "condition": {k: self.cond.settings.get(k) for k in _GEN_KEYS},
        }
        files = [data["file"], prompt.get("template"), prompt.get("messages")]
        digest = step_hash("gen", settings, files)
        with self._step("gen", digest, [self.requests, self.rows]) as skipped:
            if skipped:
                return skipped
            summary = self._write_requests()
            self.state.finish("gen", digest, summary)
            self.say(f"gen: {summary['requests']} requests")
            return StepOutcome(self.cond.name, "gen", "ran", f"{summary['requests']} requests")

    def _write_requests(self) -> dict[str, Any]:
        data, spec, c = self.exp.data, self.exp.prompt, self.cond.settings
        where = compile_condition(data["where"]) if data.get("where") else None
        rows = select(
            iter_rows(data["file"], data.get("format")),
            where=where,
            limit=data.get("limit"),
            sample=data.get("sample"),
            seed=data.get("seed", 0),
        )
        system = c.get("system", spec.get("system"))
        prompt = Prompt(
            user=RowTemplate.from_file(spec["template"])
            if spec.get("template")
            else RowTemplate(spec["text"], name="prompt.text")
            if spec.get("text") is not None
            else None,
            messages=RowTemplate.from_file(spec["messages"]) if spec.get("messages") else None,
            system=RowTemplate(system, name="system") if system is not None else None,
        )
        body: dict[str, Any] = {
            k: c[k]
            for k in ("temperature", "top_p", "top_k", "min_p", "max_tokens", "n", "seed")
            if k in c
        }
        if c.get("stop") is not None:
            body["stop"] = [c["stop"]] if isinstance(c["stop"], str) else c["stop"]
        custom_id = RowTemplate(data["id"], name="data.id") if data.get("id") else None
        columns = c.get("code_interpreter")
        columns = [columns] if isinstance(columns, str) else columns
        tools = interpreter_tools(columns, data["file"]) if columns is not None else None
        with (
            JsonlWriter(self.rows) as kept,
            RequestWriter(
                self.requests,
                model=c["model"],
                force=True,
                samples=c.get("samples"),
                greedy_first=c.get("greedy_first", False),
                no_think=c.get("no_think", False),
                think_budget=c.get("think_budget"),
                suffix=c.get("suffix"),
                body={**(c.get("params") or {}), **body},
                url=RESPONSES_URL if tools is not None else CHAT_URL,
            ) as writer,
        ):

            def keep(rows: Iterable[Row]) -> Iterator[Row]:
                for row in rows:  # the rows asked about, for the judge to join on ROW_ID
                    kept.write({**row.data, ROW_ID: row_custom_id(row, custom_id)})
                    yield row

            write_requests(keep(rows), writer, prompt, custom_id=custom_id, extra=tools)
        s = writer.summary
        return {"requests": s.requests, "prompts": s.prompts}

    def exec(self, step: Step) -> StepOutcome:
        digest = step_hash("exec", {}, [self.requests])
        with self._step("exec", digest, [self.responses]) as skipped:
            if skipped:
                return skipped
            resuming = os.path.exists(self.responses)
            self.say("exec: resuming" if resuming else "exec: sending")
            summary = send(
                self.requests, self.responses, self.target(), self.exec_options(), quiet=self.quiet
            )
            done = {
                "requests": summary.requests,
                "sent": summary.written - summary.cache_hits,
                "from_cache": summary.cache_hits,
                "already_done": summary.already_done,
                "failed": summary.failed + summary.failed_before,
                "wall_s": round(summary.wall_s, 3),
            }
            self.state.finish("exec", digest, done)
            status = "resumed" if resuming else "ran"
            sent = f"{summary.written - summary.cache_hits} sent"
            if summary.cache_hits:
                sent += f", {summary.cache_hits} from the answer cache"
            return StepOutcome(self.cond.name, "exec", status, sent)

    def judge(self, step: Step) -> StepOutcome:
        s = step.settings
        texts = {k: read_text(s[k], "template") for k in ("template", "retry_template") if s.get(k)}
        body: dict[str, Any] = {**(s.get("params") or {}), "temperature": s.get("temperature", 0)}
        if s.get("max_tokens") is not None:
            body["max_tokens"] = s["max_tokens"]
        options: dict[str, Any] = {
            "template": texts.get("template", s.get("text")),
            "system": s.get("system"),
            "rule": s.get("pass", "score >= 6"),
            "rounds": s.get("rounds", 3),
            "feedback": s.get("feedback", True),
            "model": s.get("model"),
            "body": body,
        }
        if s.get("extract") is not None:
            options["extract"] = s["extract"]
        if "retry_template" in texts:
            options["retry_template"] = texts["retry_template"]
        config = JudgeConfig(**options)
        out = os.path.join(self.dir, "judge")
        judge_urls = s.get("url")
        settings = {"config": config.fingerprint(), "judge_url_given": bool(judge_urls)}
        digest = step_hash("judge", settings, [self.requests, self.responses])
        with self._step("judge", digest, [out]) as skipped:
            if skipped:
                return skipped
            summary = run_judge(
                self.requests,
                self.responses,
                out,
                config,
                target=self.target(),
                judge_urls=[judge_urls] if isinstance(judge_urls, str) else judge_urls,
                join=self.rows,
                on=ROW_ID,
                exec_options=self.exec_options(),
                quiet=self.quiet,
                note=lambda msg: self.say(f"judge: {msg}"),
            )
            self.state.finish("judge", digest, summary.as_dict())
            detail = f"{summary.passed}/{summary.items} passed in {summary.rounds_run} rounds"
            self.say(f"judge: {detail}")
            return StepOutcome(self.cond.name, "judge", "ran", detail)

    @property
    def answers(self) -> str:
        """The answers post and export read: the judged ones after a judge step."""
        judged = self.exp.step("judge") is not None
        return os.path.join(self.dir, "judge", "final.jsonl") if judged else self.responses

    def export(self, step: Step) -> StepOutcome:
        s = step.settings
        out = os.path.join(self.dir, f"results.{s.get('format', 'jsonl')}")
        files = [self.answers, *export_inputs(self.dir, self.requests), s.get("into")]
        digest = step_hash("export", s, files)
        with self._step("export", digest, [out]) as skipped:
            if skipped:
                return skipped
            summary = export_results(self.answers, out, self.requests, self.dir, s)
            self.state.finish("export", digest, summary)
            self.say(f"export: {summary['rows']} rows -> {out}")
            return StepOutcome(self.cond.name, "export", "ran", f"{summary['rows']} rows")

    def post(self, step: Step) -> list[StepOutcome]:
        source = self.answers
        outcomes = []
        for key, part in PARTS.items():
            settings = step.settings.get(key)
            if settings is None:
                continue
            name = f"post.{key}"
            out = os.path.join(self.dir, part.output)
            digest = step_hash(name, settings, [source, *input_files(part, settings)])
            with self._step(name, digest, [out]) as skipped:
                if skipped:
                    outcomes.append(skipped)
                    continue
                summary = part.run(source, out, settings)
                self.state.finish(name, digest, summary)
                self.say(f"{name}: {describe(summary)}")
                outcomes.append(StepOutcome(self.cond.name, name, "ran"))
        return outcomes

"""The experiment file: read it (YAML), check all of it, and say where each mistake is.

Everything is checked before anything runs: unknown or missing keys, wrong types, files that do
not exist, templates and `where` conditions that do not compile, extractors and pass rules that
do not parse, steps out of order. Every problem names the key path and its line in the file
(`experiment.yaml:12: conditions.b.temperature: must be a number, got 'hot'`), all of them at
once. YAML nodes carry their line marks; the file is composed with PyYAML's safe loader (no
Python tags) and walked here, so a duplicated key is an error rather than a silent overwrite.

Paths in the file are relative to the file's own folder.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from jsonlbatch.errors import InputError, Problem
from jsonlbatch.file_io.filecheck import (
    ANY,
    BOOL,
    EXTRACT,
    INT,
    MAP,
    NUM,
    PATH,
    STR,
    STRS,
    URLS,
    FileChecker,
)

STEP_KINDS = ("exec", "judge", "post", "export", "report")
REPORT_FORMATS = ("md", "html", "json", "text")

_NUM, _INT, _STR, _BOOL, _PATH = NUM, INT, STR, BOOL, PATH
_MAP, _STRS, _URLS, _ANY, _EXTRACT = MAP, STRS, URLS, ANY, EXTRACT

_TOP = {
    "experiment": _MAP,
    "data": _MAP,
    "prompt": _MAP,
    "defaults": _MAP,
    "conditions": _MAP,
    "steps": "list",
    # an answer cache folder (exec --cache) shared by every condition and judge round: requests
    # that conditions share (the same greedy baseline) are paid for once
    "cache": _STR,
}
_EXPERIMENT = {"id": _STR, "description": _STR}
_DATA = {
    "file": _PATH,
    "format": _STR,
    "where": _STR,
    "sample": _INT,
    "limit": _INT,
    "seed": _INT,
    "id": _STR,
}
_PROMPT = {"template": _PATH, "text": _STR, "messages": _PATH, "system": _STR}
#: What a condition may set: where it runs, and how its requests are written (gen's options).
_CONDITION = {
    "model": _STR,
    "url": _URLS,
    "serve": _ANY,
    "api_key_env": _STR,
    "system": _STR,
    "suffix": _STR,
    "temperature": _NUM,
    "top_p": _NUM,
    "top_k": _INT,
    "min_p": _NUM,
    "max_tokens": _INT,
    "seed": _INT,
    "stop": _STRS,
    "n": _INT,
    "samples": _INT,
    "greedy_first": _BOOL,
    "no_think": _BOOL,
    "think_budget": _INT,
    "params": _MAP,
    # the Responses API with a code interpreter; the data columns holding reference files
    "code_interpreter": _STRS,
}
_STEPS: dict[str, dict[str, str]] = {
    "exec": {
        "concurrency": _INT,
        "timeout": _NUM,
        "max_retries": _INT,
        "ready_timeout": _NUM,
        "stream": _BOOL,
        "files_dir": _BOOL,  # collect code interpreter deliverables into <condition>/files/
        "require_files": _BOOL,
        "reask": _INT,
    },
    "judge": {
        "template": _PATH,
        "text": _STR,
        "system": _STR,
        "extract": _EXTRACT,
        "pass": _STR,
        "rounds": _INT,
        "feedback": _BOOL,
        "retry_template": _PATH,
        "model": _STR,
        "url": _URLS,
        "temperature": _NUM,
        "max_tokens": _INT,
        "params": _MAP,
    },
    "post": {"votes": _MAP, "files": _MAP, "patches": _MAP},
    "export": {"format": _STR, "per": _STR, "columns": _STRS, "into": _PATH, "on": _STR},
    "report": {"compare": "list", "formats": "list"},
}
_VOTES = {"extract": _STRS, "gold": _PATH, "normalize": _STR, "tie_break": _STR}
_FILES = {
    "max_files": _INT,
    "max_file_mb": _NUM,
    "max_total_mb": _NUM,
    "run": _BOOL,
    "script": _STR,
    "timeout": _NUM,
    "memory_mb": _INT,
    "use_truncated": _BOOL,
}
_PATCHES = {
    "repo_root": "folder",
    "repo": _STR,
    "files_json": _STR,
    "model_name": _STR,
    "vote": _BOOL,
    "strip_prefix": _STRS,
    "partial": _BOOL,
    "use_truncated": _BOOL,
}


@dataclass
class Step:
    kind: str
    settings: dict[str, Any]
    line: int | None


@dataclass
class Condition:
    name: str
    settings: dict[str, Any]  # the condition's keys, `defaults` merged under them


@dataclass
class Experiment:
    """A checked experiment file: paths made absolute, defaults merged into conditions."""

    id: str
    path: str
    data: dict[str, Any]
    prompt: dict[str, Any]
    conditions: list[Condition]
    steps: list[Step]
    raw: dict[str, Any] = field(repr=False, default_factory=dict)
    cache: str | None = None  # answer cache folder (absolute), from the file's `cache:` key

    def step(self, kind: str) -> Step | None:
        return next((s for s in self.steps if s.kind == kind), None)


def load_experiment(path: str) -> Experiment:
    """Read and check an experiment file; `InputError` lists every problem with its line."""
    checker = _Checker(path)
    value = checker.load("experiment file")
    if not isinstance(value, dict):
        raise InputError("bad experiment file", [Problem(path, 1, None, "must be a mapping")])
    experiment = checker.experiment(value)
    checker.raise_problems("experiment file")
    assert experiment is not None
    return experiment


class _Checker(FileChecker):
    """The experiment file's own rules, over the shared line-aware checker."""

    # -- the file ------------------------------------------------------------------------------

    def experiment(self, raw: dict[str, Any]) -> Experiment | None:
        from jsonlbatch.gen.templates import RowTemplate, compile_condition

        top = self.keys(raw, (), _TOP, required=("experiment", "data", "prompt", "conditions"))
        head = self.keys(top.get("experiment"), ("experiment",), _EXPERIMENT, required=("id",))
        exp_id = head.get("id")
        if exp_id is not None and not isinstance(exp_id, str):
            self.problem(("experiment", "id"), "must be a string (a folder name)")
        elif isinstance(exp_id, str) and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", exp_id):
            self.problem(
                ("experiment", "id"), "use letters, digits, '.', '_' and '-' (a folder name)"
            )
        data = self.keys(top.get("data"), ("data",), _DATA, required=("file",))
        if data.get("format") is not None:
            from jsonlbatch.gen.sources import FORMATS

            if data["format"] not in FORMATS:
                self.problem(("data", "format"), f"one of {', '.join(FORMATS)}")
        if data.get("where"):
            self.guard(("data", "where"), compile_condition, data["where"])
        for key in ("sample", "limit"):
            if isinstance(data.get(key), int) and data[key] < (1 if key == "sample" else 0):
                self.problem(
                    ("data", key), "must be at least 1" if key == "sample" else "must be >= 0"
                )
        if data.get("id"):
            self.guard(("data", "id"), RowTemplate, data["id"], name="data.id")
        prompt = self.keys(top.get("prompt"), ("prompt",), _PROMPT)
        given = [k for k in ("template", "text", "messages") if k in prompt]
        if len(given) != 1:
            self.problem(("prompt",), "give exactly one of template, text or messages")
        for key in ("template", "messages"):
            if prompt.get(key) and os.path.isfile(prompt[key]):
                self.guard(("prompt", key), RowTemplate.from_file, prompt[key])
        for key in ("text", "system"):
            if isinstance(prompt.get(key), str):
                self.guard(("prompt", key), RowTemplate, prompt[key], name=f"prompt.{key}")
        conditions = self.conditions(top)
        steps = self.steps(top.get("steps"), [c.name for c in conditions])
        cache = top.get("cache")
        if isinstance(cache, str) and not cache.strip():
            self.problem(("cache",), "must name a folder")
        if self.problems or not isinstance(exp_id, str):
            return None
        if isinstance(cache, str):
            cache = os.path.join(self.base, os.path.expanduser(cache))
        return Experiment(
            exp_id, os.path.abspath(self.path), data, prompt, conditions, steps, raw, cache
        )

    def conditions(self, top: dict[str, Any]) -> list[Condition]:
        defaults = self.keys(top.get("defaults"), ("defaults",), _CONDITION)
        if defaults.get("serve") is not None:  # checked once, at its own line
            self.serve(defaults["serve"], ("defaults", "serve"))
        raw = top.get("conditions")
        if not isinstance(raw, dict) or not raw:
            if "conditions" in top:
                self.problem(("conditions",), "must name at least one condition")
            return []
        out = []
        for name, settings in raw.items():
            at = ("conditions", name)
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
                self.problem(at, "a condition name is a folder name: letters, digits, . _ -")
            own = self.keys(settings, at, _CONDITION)
            merged = {**defaults, **own}
            if not merged.get("model"):
                self.problem(at, "missing 'model' (here or in defaults)")
            if not merged.get("url") and not merged.get("serve"):
                self.problem(at, "give 'url' (a running server) or 'serve' (one to launch)")
            if own.get("serve") is not None:
                self.serve(own["serve"], (*at, "serve"))
            if merged.get("system") is not None:
                from jsonlbatch.gen.templates import RowTemplate

                self.guard((*at, "system"), RowTemplate, merged["system"], name="system")
            for key in ("n", "samples", "max_tokens"):
                if isinstance(merged.get(key), int) and merged[key] < 1:
                    self.problem((*at, key), "must be at least 1")
            out.append(Condition(name, merged))
        return out

    def serve(self, value: Any, at: tuple[str, ...]) -> None:
        from jsonlbatch.serve.fleet import check_serve  # the fleet file's parser and names

        if isinstance(value, dict) and "node" in value:
            self.problem((*at, "node"), "a condition's server runs here: leave node out")
        check_serve(self, value, at)

    def steps(self, raw: Any, conditions: list[str]) -> list[Step]:
        if raw is None:
            return [Step("exec", {}, None)]
        out: list[Step] = []
        for i, item in enumerate(raw):
            at = ("steps", str(i))
            if isinstance(item, str):
                item = {item: None}
            if not isinstance(item, dict) or len(item) != 1:
                self.problem(at, f"a step is one of {', '.join(STEP_KINDS)} with its settings")
                continue
            kind, settings = next(iter(item.items()))
            if kind not in _STEPS:
                self.problem((*at, kind), f"unknown step (known: {', '.join(STEP_KINDS)})")
                continue
            if any(s.kind == kind for s in out):
                self.problem((*at, kind), "appears twice")
                continue
            checked = self.keys(settings, (*at, kind), _STEPS[kind])
            getattr(self, f"step_{kind}")(checked, (*at, kind), conditions)
            out.append(Step(kind, checked, self.lines.get(at)))
        kinds = [s.kind for s in out]
        for kind in ("judge", "post", "export"):
            if kind in kinds and ("exec" not in kinds or kinds.index("exec") > kinds.index(kind)):
                self.problem(("steps",), f"{kind} needs an exec step before it")
        for first, then, why in (
            ("judge", "post", "it reads the judged answers"),
            ("judge", "export", "it exports the judged answers"),
            ("post", "export", "it joins what post wrote"),
        ):
            if first in kinds and then in kinds and kinds.index(then) < kinds.index(first):
                self.problem(("steps",), f"{then} comes after {first} ({why})")
        return out

    def step_exec(self, settings: dict[str, Any], at: tuple[str, ...], _: list[str]) -> None:
        if isinstance(settings.get("concurrency"), int) and settings["concurrency"] < 1:
            self.problem((*at, "concurrency"), "must be at least 1")

    def step_judge(self, settings: dict[str, Any], at: tuple[str, ...], _: list[str]) -> None:
        from jsonlbatch.experiment.judge import JudgeConfig

        if ("template" in settings) == ("text" in settings):
            self.problem(at, "give exactly one of template (a file) or text (inline)")
            return
        from jsonlbatch.file_io.filecheck import read_text

        texts = {}
        for key in ("template", "retry_template"):
            if settings.get(key) and os.path.isfile(settings[key]):
                texts[key] = self.guard((*at, key), read_text, settings[key], "template")
        template = texts.get("template", settings.get("text"))
        if template is None:
            return
        options = {
            "template": template,
            "system": settings.get("system"),
            "rounds": settings.get("rounds", 3),
            "rule": settings.get("pass", "score >= 6"),
        }
        if settings.get("extract") is not None:
            options["extract"] = settings["extract"]
        if "retry_template" in texts:
            options["retry_template"] = texts["retry_template"]
        self.guard(at, JudgeConfig, **options)

    def step_post(self, settings: dict[str, Any], at: tuple[str, ...], _: list[str]) -> None:
        from jsonlbatch.post.extract import get_extractor, get_normalizer

        if not settings:
            self.problem(at, "say what to post-process: votes, files and/or patches")
            return
        if "votes" in settings:
            votes = self.keys(settings["votes"], (*at, "votes"), _VOTES)
            extract = votes.get("extract") or []
            for spec in [extract] if isinstance(extract, str) else extract:
                self.guard((*at, "votes", "extract"), get_extractor, spec)
            if isinstance(votes.get("normalize"), str):
                self.guard((*at, "votes", "normalize"), get_normalizer, votes["normalize"])
            settings["votes"] = votes
        if "files" in settings:
            settings["files"] = self.keys(settings["files"], (*at, "files"), _FILES)
        if "patches" in settings:
            patches = self.keys(settings["patches"], (*at, "patches"), _PATCHES)
            if ("repo_root" in patches) == ("files_json" in patches):
                self.problem((*at, "patches"), "give either repo_root (with repo) or files_json")
            if isinstance(patches.get("files_json"), str):  # may be a template: not checked
                patches["files_json"] = os.path.join(self.base, patches["files_json"])
            settings["patches"] = patches

    def step_export(self, settings: dict[str, Any], at: tuple[str, ...], _: list[str]) -> None:
        from jsonlbatch.post.export import PER
        from jsonlbatch.post.table_io import TABLE_FORMATS

        if settings.get("format", "jsonl") not in TABLE_FORMATS:
            self.problem((*at, "format"), f"one of {', '.join(TABLE_FORMATS)}")
        if settings.get("per", "request") not in PER:
            self.problem((*at, "per"), f"one of {', '.join(PER)}")
        if ("into" in settings) != ("on" in settings):
            self.problem(at, "into (a dataset table) and on (its key column) go together")

    def step_report(
        self, settings: dict[str, Any], at: tuple[str, ...], conditions: list[str]
    ) -> None:
        for i, name in enumerate(settings.get("compare") or []):
            if name not in conditions:
                self.problem(
                    (*at, "compare", str(i)),
                    f"no condition {name!r} (have: {', '.join(conditions)})",
                )
        for i, fmt in enumerate(settings.get("formats") or []):
            if fmt not in REPORT_FORMATS:
                self.problem((*at, "formats", str(i)), f"one of {', '.join(REPORT_FORMATS)}")

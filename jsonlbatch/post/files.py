"""Deliverable files out of responses: `OUT/<custom_id>/<path>` plus a manifest.

Files come from fenced blocks that name a file (a `title=`/`filename=` info string, a
`### path` or `# file: path` first line, or such a heading right above the block) or from a
JSON spec `{"files": [{"path", "content"}]}` (content may be base64). Names are untrusted:
see `jsonlbatch.post.paths`. Every file found is listed in the manifest, including the ones
refused and why. With `run`, a generated Python script is executed (`jsonlbatch.post.sandbox`)
and the files it creates are collected too.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from jsonlbatch.post.markdown import Fence, file_name_in, iter_fences, json_chunks
from jsonlbatch.post.outputs import JsonlWriter
from jsonlbatch.post.paths import UnsafePathError, safe_relpath, write_inside
from jsonlbatch.post.render import SpecError, format_of, require_libraries
from jsonlbatch.post.render import render as render_spec
from jsonlbatch.post.responses import Sample, check_responses, read_responses
from jsonlbatch.post.sandbox import RunLimits, run_script
from jsonlbatch.post.summary import FAILED, TRUNCATED, Unused
from jsonlbatch.stats import plural

NO_FILES = "no files found"
REFUSED = "file refused"
RUN_FAILED = "script run failed"
NO_SCRIPT = "no script to run"

_ATTR = re.compile(r"""\b(?:title|filename|file|path)\s*=\s*(?:"([^"]+)"|'([^']+)'|([^\s"']+))""")
_PYTHON = frozenset({"python", "py", "python3"})
MANIFEST = "manifest.jsonl"


@dataclass(frozen=True)
class FileSpec:
    """A file an answer asks for; `problem` says why its content could not be decoded."""

    path: str
    content: bytes
    source: str  # fence:info | fence:first-line | fence:heading | json | render:<format> | run
    problem: str = ""


@dataclass
class Limits:
    """Caps on what one sample may write."""

    max_file_bytes: int = 10 * 1024**2
    max_files: int = 100
    max_total_bytes: int = 50 * 1024**2


@dataclass
class FileRecord:
    """One manifest line. `status`: written, refused, replaced (a later block won), ran, failed."""

    id: str
    choice: int
    path: str
    source: str
    status: str
    bytes: int | None = None
    sha256: str | None = None
    reason: str = ""
    isolation: str | None = None  # of a run: "bwrap" or "launcher" (see post.sandbox)


def _fence_file(fence: Fence) -> FileSpec | None:
    m = _ATTR.search(fence.info)
    if m:
        return FileSpec(m[1] or m[2] or m[3], fence.text.encode(), "fence:info")
    if (
        fence.lines
        and (name := file_name_in(fence.lines[0]))
        and fence.lines[0].lstrip()[:1] in "#/-;<"
    ):
        return FileSpec(
            name, "".join(x + "\n" for x in fence.lines[1:]).encode(), "fence:first-line"
        )
    if fence.before and fence.before.lstrip()[:1] in "#*`" and (name := file_name_in(fence.before)):
        return FileSpec(name, fence.text.encode(), "fence:heading")
    return None


def _json_files(text: str, fences: list[Fence], render: bool) -> list[FileSpec] | None:
    for spec in json_chunks(text, fences):
        if isinstance(spec, dict) and isinstance(spec.get("files"), list):
            return [_json_file(item, render) for item in spec["files"]]
    return None


def _json_file(item: object, render: bool = False) -> FileSpec:
    if not isinstance(item, dict):
        return FileSpec("?", b"", "json", "a files entry must be an object")
    name = item.get("path") or item.get("filename") or item.get("name")
    name = name if isinstance(name, str) else "?"
    if "spec" in item:
        return _rendered(name, item, render)
    encoded = item.get("content_base64")
    if encoded is None and item.get("encoding") == "base64":
        encoded = item.get("content")
    if encoded is not None:
        try:
            return FileSpec(name, base64.b64decode(str(encoded), validate=True), "json")
        except (binascii.Error, ValueError):
            return FileSpec(name, b"", "json", "content is not valid base64")
    content = item.get("content")
    if not isinstance(content, str):
        return FileSpec(name, b"", "json", "no string content")
    return FileSpec(name, content.encode(), "json")


def _rendered(name: str, item: dict[str, object], render: bool) -> FileSpec:
    """A file described by a render spec (`{"path", "format"?, "spec"}`), drawn to memory."""
    if not render:
        return FileSpec(name, b"", "render", "a render spec: pass --render to render it")
    try:
        fmt = format_of(name, item.get("format"))
        return FileSpec(name, render_spec(name, item["spec"], fmt), f"render:{fmt}")
    except SpecError as exc:
        return FileSpec(name, b"", "render", str(exc))


def find_files(text: str, *, render: bool = False) -> list[FileSpec]:
    """The files an answer names, in order (a JSON spec wins over fenced blocks). With `render`,
    entries carrying a `spec` are rendered (see `jsonlbatch.post.render`)."""
    fences = list(iter_fences(text))
    from_json = _json_files(text, fences, render)
    if from_json is not None:
        return from_json
    return [spec for spec in map(_fence_file, fences) if spec is not None]


def _rel(name: str) -> str | None:
    try:
        return safe_relpath(name)
    except UnsafePathError:
        return None


def script_of(
    text: str, specs: Sequence[FileSpec], script: str | None = None
) -> tuple[str | None, str | None]:
    """Which file `--run` executes, and the code of an unnamed block when that is what runs:
    `script`, else the only .py file, else `main.py`, else (no .py file at all) the last unnamed
    python block, run as `main.py`. (None, None) when there is nothing to run.

    The unnamed block is only a fallback for answers without named .py files: a named script
    that is then refused (too large, a planted symlink...) is never replaced by it.
    """
    names = {name for s in specs if not s.problem and (name := _rel(s.path)) is not None}
    if script:
        return _named_script(script, names), None
    python = [n for n in names if n.endswith(".py")]
    if len(python) == 1:
        return python[0], None
    if python:  # several .py files ("main.py" among them is one)
        return ("main.py" if "main.py" in names else None), None
    code = _unnamed_python(text)
    return ("main.py", code) if code is not None else (None, None)


def _named_script(script: str, names: set[str]) -> str | None:
    """The file `--script` names: as written (`./render.py` too), else the one file of that
    name in a folder (`--script render.py` for `src/render.py`)."""
    wanted = _rel(script) or script
    if wanted in names:
        return wanted
    same = [n for n in names if os.path.basename(n) == wanted]
    return same[0] if len(same) == 1 else None


def no_script_reason(specs: Sequence[FileSpec], script: str | None) -> str:
    """Why `--run` found nothing to run in an answer, naming its .py files."""
    python = sorted(
        {
            n
            for s in specs
            if not s.problem and (n := _rel(s.path)) is not None and n.endswith(".py")
        }
    )
    listed = ", ".join(python[:5]) + (", ..." if len(python) > 5 else "")
    if script:
        return f"no file {script} in the answer" + (f" (its .py files: {listed})" if python else "")
    if python:
        return f"several .py files ({listed}) and no main.py; pick one with --script"
    return "no .py file and no python block"


def _unnamed_python(text: str) -> str | None:
    blocks = [f for f in iter_fences(text) if f.language in _PYTHON and _fence_file(f) is None]
    return blocks[-1].text if blocks else None


def sample_dir(sample: Sample) -> str:
    """`OUT/<custom_id>` (plus `/choice-<i>` for n>1), made safe: odd characters replaced and a
    short hash added so two ids never share a folder."""
    name = re.sub(r"[^A-Za-z0-9._|#=+@-]", "_", sample.custom_id)[:120]
    if name != sample.custom_id or name.strip(".") == "" or name == MANIFEST:
        name += "-" + hashlib.sha256(sample.custom_id.encode()).hexdigest()[:8]
    return name if sample.choices == 1 else f"{name}/choice-{sample.index}"


def save_files(
    specs: Sequence[FileSpec],
    out_dir: str,
    folder: str,
    ids: tuple[str, int],
    limits: Limits,
    *,
    written: int = 0,
    total: int = 0,
) -> list[FileRecord]:
    """Write `specs` under `out_dir/folder`; one record per spec, refused ones with a reason.

    `written` and `total` are the files and bytes this sample has already written (the caps
    are per sample, whatever the number of calls).
    """
    os.makedirs(out_dir, exist_ok=True)
    records: list[FileRecord] = []
    clean = [_rel(spec.path) for spec in specs]
    last = {rel: n for n, rel in enumerate(clean) if rel is not None}
    for n, (spec, rel) in enumerate(zip(specs, clean, strict=True)):
        record = FileRecord(
            ids[0], ids[1], rel or spec.path, spec.source, "refused", len(spec.content),
            hashlib.sha256(spec.content).hexdigest(),
        )  # fmt: skip
        records.append(record)
        if rel is None or spec.problem:
            record.reason = spec.problem or _unsafe_reason(spec.path)
        elif last[rel] != n:
            record.status, record.reason = "replaced", "a later block names the same file"
        elif written >= limits.max_files:
            record.reason = f"over the limit of {limits.max_files} files"
        elif len(spec.content) > limits.max_file_bytes:
            record.reason = f"larger than {limits.max_file_bytes} bytes"
        elif total + len(spec.content) > limits.max_total_bytes:
            record.reason = f"over {limits.max_total_bytes} bytes in all"
        else:
            try:
                write_inside(out_dir, f"{folder}/{rel}", spec.content)
                record.status = "written"
                written += 1
                total += len(spec.content)
            except (UnsafePathError, OSError) as exc:
                record.reason = str(exc)
    return records


def _unsafe_reason(name: str) -> str:
    try:
        safe_relpath(name)
    except UnsafePathError as exc:
        return str(exc)
    return "unusable name"


@dataclass
class FilesSummary:
    """Counts of one run, and what could not be used."""

    samples: int = 0
    written: int = 0
    runs: int = 0
    isolation: str | None = None  # how the scripts ran, if any did
    unused: Unused = field(default_factory=Unused)

    def lines(self) -> list[str]:
        head = (
            f"files: {plural(self.written, 'file')} written from {plural(self.samples, 'sample')}"
        )
        if self.runs:
            how = "in a bwrap sandbox" if self.isolation == "bwrap" else "WITHOUT a sandbox"
            head += f", {plural(self.runs, 'script')} run {how}"
        return [head, *self.unused.section()]


def extract_files(
    paths: str | Sequence[str],
    out_dir: str,
    *,
    limits: Limits | None = None,
    run: bool = False,
    run_limits: RunLimits | None = None,
    script: str | None = None,
    use_truncated: bool = False,
    strict: bool = False,
    render: bool = False,
) -> FilesSummary:
    """Write every sample's files under `out_dir` and the manifest `out_dir/manifest.jsonl`.

    With `render`, JSON entries that carry a `spec` are rendered into xlsx, docx, pdf, pptx, csv
    or md files (`jsonlbatch.post.render`); it needs the `render` extra, checked up front.

    Under `strict` the files and manifest are still written, then `UnusableSamplesError` is
    raised if any sample or file was not used.
    """
    check_responses(paths)  # bad input stops the run before anything is written
    if render:
        require_libraries()
    limits = limits or Limits()
    job = _Job(
        out_dir,
        limits,
        run,
        run_limits
        or RunLimits(
            file_bytes=limits.max_file_bytes,
            max_files=limits.max_files,
            max_total_bytes=limits.max_total_bytes,
        ),
        script,
        use_truncated,
        render,
    )
    with JsonlWriter(f"{out_dir}/{MANIFEST}") as manifest:
        for sample in read_responses(paths, job.summary.unused):
            job.summary.samples += 1
            for record in job.sample(sample):
                manifest.write(asdict(record))
    job.summary.unused.check(strict, "samples or files")
    return job.summary


@dataclass
class _Job:
    out_dir: str
    limits: Limits
    run: bool
    run_limits: RunLimits
    script: str | None
    use_truncated: bool
    render: bool
    summary: FilesSummary = field(default_factory=FilesSummary)

    def sample(self, sample: Sample) -> list[FileRecord]:
        unused = self.summary.unused
        if sample.failed:
            unused.add(FAILED, sample.sample_id, sample.error or "")
            return []
        if sample.truncated and not self.use_truncated:
            unused.add(TRUNCATED, sample.sample_id)
            return []
        specs = find_files(sample.text, render=self.render)
        to_run, fallback = script_of(sample.text, specs, self.script) if self.run else (None, None)
        if not specs and not to_run:
            unused.add(NO_FILES, sample.sample_id)
            return []
        folder, ids = sample_dir(sample), (sample.custom_id, sample.index)
        records = save_files(specs, self.out_dir, folder, ids, self.limits)
        if to_run:
            records += self._run(sample, specs, records, to_run, fallback, folder, ids)
        elif self.run:
            unused.add(NO_SCRIPT, sample.sample_id, no_script_reason(specs, self.script))
        for r in records:
            if r.status == "refused":
                unused.add(REFUSED, sample.sample_id, f"{r.path}: {r.reason}")
        self.summary.written += sum(r.status == "written" for r in records)
        return records

    def _run(
        self,
        sample: Sample,
        specs: Sequence[FileSpec],
        records: Sequence[FileRecord],
        to_run: str,
        fallback: str | None,
        folder: str,
        ids: tuple[str, int],
    ) -> list[FileRecord]:
        written = {
            r.path: s.content for r, s in zip(records, specs, strict=True) if r.status == "written"
        }
        used = (len(written), sum(len(data) for data in written.values()))  # this sample's so far
        if fallback is not None:  # an unnamed block, chosen because no .py file was named
            written[to_run] = fallback.encode()
        code = written.get(to_run, b"")
        record = FileRecord(
            ids[0], ids[1], to_run, "run", "failed", len(code), hashlib.sha256(code).hexdigest()
        )
        if to_run not in written:
            record.reason = "the script file was refused"
            self.summary.unused.add(RUN_FAILED, sample.sample_id, record.reason)
            return [record]
        result = run_script(to_run, written, self.run_limits)
        self.summary.runs += 1
        self.summary.isolation = record.isolation = result.isolation
        if not result.ok:
            record.reason = result.reason
            self.summary.unused.add(RUN_FAILED, sample.sample_id, result.reason)
            return [record]
        record.status = "ran"
        made = [FileSpec(path, data, "run") for path, data in result.files.items()]
        refused = [
            FileRecord(ids[0], ids[1], path, "run", "refused", reason=why)
            for path, why in result.refused
        ]
        collected = save_files(
            made, self.out_dir, folder, ids, self.limits, written=used[0], total=used[1]
        )
        return [record, *collected, *refused]

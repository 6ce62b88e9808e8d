"""`jsonlbatch post patches` end to end: realistic answers -> SWE-bench predictions that real
`git apply` accepts, voting over normalized patches, and the reasons for unusable samples."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest
from postutil import chat_line, post, read_jsonl, vllm_error_line, write_jsonl

from jsonlbatch.post import (
    Group,
    MappedFiles,
    PatchSample,
    Sample,
    choose_patch,
    instance_sources,
    make_patches,
)
from jsonlbatch.post.paths import UnsafePathError

CORE = '''"""Core helpers."""

import os


def parse(value):
    """Parse a value."""
    if value is None:
        return None
    return value.strip()


def render(items):
    return ", ".join(items)
'''

FIX = """I looked at the traceback: `parse` crashes on integers.

```python
### pkg/core.py
<<<<<<< SEARCH
    if value is None:
        return None
    return value.strip()
=======
    if value is None:
        return None
    return str(value).strip()
>>>>>>> REPLACE
```
"""

SAME_FIX_COSMETIC = """<think>Maybe str() first.</think>
```python
### pkg/core.py
<<<<<<< SEARCH
    return value.strip()
=======
    # integers have no strip(): convert first

    return str(value).strip()
>>>>>>> REPLACE
```
"""

OTHER_FIX = """```python
### pkg/core.py
<<<<<<< SEARCH
    return value.strip()
=======
    return value.strip() if isinstance(value, str) else value
>>>>>>> REPLACE
```
"""

BROKEN = """```python
### pkg/core.py
<<<<<<< SEARCH
    return value.strip()
=======
    return str(value.strip(
>>>>>>> REPLACE
```
"""

TRAVERSAL = """```python
### ../../outside.py
<<<<<<< SEARCH
=======
import os; os.system("echo pwned")
>>>>>>> REPLACE
```
"""

NO_MATCH = """```python
### pkg/core.py
<<<<<<< SEARCH
def parse(value, strict=False):
=======
def parse(value, strict=True):
>>>>>>> REPLACE
```
"""

DIFF_ANSWER = """Here is a patch (line numbers may be off):

```diff
--- a/pkg/core.py
+++ b/pkg/core.py
@@ -99,3 +99,3 @@
 def render(items):
-    return ", ".join(items)
+    return ", ".join(str(i) for i in items)
--- /dev/null
+++ b/tests/test_render.py
@@ -0,0 +1,2 @@
+def test_render():
+    assert True
```
"""


def tree_hash(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return digest.hexdigest()


@pytest.fixture
def repos(tmp_path: Path) -> Path:
    root = tmp_path / "repos"
    for instance in ("proj__proj-1", "proj__proj-2"):
        (root / instance / "pkg").mkdir(parents=True)
        (root / instance / "pkg" / "core.py").write_text(CORE)
    return root


def git_apply(repo: Path, patch: str, tmp_path: Path) -> Path:
    """Apply a patch with real git in a throwaway copy of the repo; return the copy."""
    work = tmp_path / "work"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(repo, work)
    run = {"cwd": work, "capture_output": True, "text": True, "timeout": 30}
    subprocess.run(["git", "init", "-q"], **run, check=True)
    check = subprocess.run(["git", "apply", "--check", "-"], input=patch, **run)
    assert check.returncode == 0, check.stderr + patch
    subprocess.run(["git", "apply", "-"], input=patch, **run, check=True)
    return work


def test_patches_cli_vote_and_git_apply(tmp_path: Path, repos: Path) -> None:
    responses = write_jsonl(
        tmp_path / "responses.jsonl",
        [
            chat_line("proj__proj-1|0", OTHER_FIX),
            chat_line("proj__proj-1|1", FIX),
            chat_line("proj__proj-1|2", SAME_FIX_COSMETIC),
            chat_line("proj__proj-1|3", BROKEN),
            chat_line("proj__proj-1|4", TRAVERSAL),
            chat_line("proj__proj-1|5", NO_MATCH),
            vllm_error_line("proj__proj-1|6"),
            chat_line("proj__proj-1|7", FIX, finish="length"),
            chat_line("proj__proj-2|0", DIFF_ANSWER),
        ],
    )
    before = tree_hash(repos)
    preds, samples = tmp_path / "preds.jsonl", tmp_path / "samples.jsonl"
    result = post(
        "patches", responses, "--repo-root", repos, "--repo", "{{ instance_id }}",
        "--model-name", "my-model", "-o", preds, "--samples-out", samples, "--vote",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert tree_hash(repos) == before  # the user's checkouts were only read
    assert not (tmp_path / "outside.py").exists()

    p1, p2 = read_jsonl(preds)
    assert p1.keys() == {"instance_id", "model_name_or_path", "model_patch"}
    assert (p1["instance_id"], p1["model_name_or_path"]) == ("proj__proj-1", "my-model")
    # |1 and |2 are the same fix (|2 only adds a comment and a blank line): 2 votes beat |0's 1;
    # the winner's own (original) patch is output: the first sample of the winning group.
    per_sample = {s["custom_id"]: s for s in read_jsonl(samples)}
    assert per_sample["proj__proj-1|1"]["selected"]
    assert p1["model_patch"] == per_sample["proj__proj-1|1"]["patch"]
    normalized = [per_sample[f"proj__proj-1|{i}"]["normalized_patch"] for i in range(3)]
    assert normalized[1] == normalized[2] != normalized[0]
    assert per_sample["proj__proj-1|1"]["patch"] != per_sample["proj__proj-1|2"]["patch"]
    work = git_apply(repos / "proj__proj-1", p1["model_patch"], tmp_path)
    assert "    return str(value).strip()\n" in (work / "pkg" / "core.py").read_text()

    statuses = {cid: (s["status"], s["reasons"]) for cid, s in per_sample.items()}
    assert statuses["proj__proj-1|3"][0] == "edited Python file no longer parses"
    assert statuses["proj__proj-1|3"][1][0].startswith("pkg/core.py: line 10:")
    assert statuses["proj__proj-1|4"] == (
        "edit did not apply",
        ["'..' in file name '../../outside.py'"],
    )
    assert statuses["proj__proj-1|5"][0] == "edit did not apply"
    assert "text to replace not found" in statuses["proj__proj-1|5"][1][0]
    assert statuses["proj__proj-1|6"] == (
        "failed request",
        ["HTTP 400: maximum context length is 4096"],
    )
    assert statuses["proj__proj-1|7"][0] == "truncated (finish_reason length)"

    # instance 2: a diff with a wrong hunk header and a new file
    assert p2["instance_id"] == "proj__proj-2"
    work = git_apply(repos / "proj__proj-2", p2["model_patch"], tmp_path)
    assert 'return ", ".join(str(i) for i in items)' in (work / "pkg" / "core.py").read_text()
    assert (
        work / "tests" / "test_render.py"
    ).read_text() == "def test_render():\n    assert True\n"

    assert "patches: 9 samples of 2 instances, 4 usable; 2 with a patch" in result.stderr
    assert "2 edit did not apply: proj__proj-1|4 ('..' in file name" in result.stderr


def test_without_vote_the_first_usable_sample_wins(tmp_path: Path, repos: Path) -> None:
    responses = write_jsonl(
        tmp_path / "r.jsonl",
        [chat_line("proj__proj-1|0", NO_MATCH), chat_line("proj__proj-1|1", OTHER_FIX),
         chat_line("proj__proj-1|2", FIX), chat_line("proj__proj-1|3", FIX)],
    )  # fmt: skip
    preds = tmp_path / "p.jsonl"
    assert post("patches", responses, "--repo-root", repos, "-o", preds).returncode == 0
    [pred] = read_jsonl(preds)
    assert "isinstance(value, str)" in pred["model_patch"]
    assert pred["model_name_or_path"] == "Qwen/Qwen3-8B"  # from the responses


def test_strict_fails_after_writing_and_unknown_repo(tmp_path: Path, repos: Path) -> None:
    responses = write_jsonl(
        tmp_path / "r.jsonl",
        [chat_line("proj__proj-1|0", FIX), chat_line("missing__repo-9|0", FIX)],
    )
    preds = tmp_path / "p.jsonl"
    result = post("patches", responses, "--repo-root", repos, "-o", preds, "--strict")
    assert result.returncode == 1
    assert "Error: --strict: 1 samples could not be used" in result.stderr
    assert (
        "original files not available: missing__repo-9|0 (no repository directory" in result.stderr
    )
    assert "Traceback" not in result.stderr
    missing = read_jsonl(preds)[1]
    assert missing == {
        "instance_id": "missing__repo-9", "model_name_or_path": "Qwen/Qwen3-8B", "model_patch": ""
    }  # fmt: skip


def test_repo_template_cannot_escape_the_root(tmp_path: Path, repos: Path) -> None:
    sources = instance_sources(str(repos), "{{ instance_id }}")
    with pytest.raises(UnsafePathError, match="outside"):
        sources("../../etc")


def test_files_json_source_and_tool_calls(tmp_path: Path) -> None:
    files = tmp_path / "files.json"
    files.write_text(orjson.dumps({"inst-1": {"pkg/core.py": CORE}}).decode())
    call = {
        "type": "function",
        "function": {
            "name": "str_replace_based_edit_tool",
            "arguments": orjson.dumps(
                {"command": "str_replace", "path": "/testbed/pkg/core.py",
                 "old_str": 'return ", ".join(items)', "new_str": 'return "; ".join(items)'}
            ).decode(),
        },
    }  # fmt: skip
    responses = write_jsonl(tmp_path / "r.jsonl", [chat_line("inst-1#0", "", tool_calls=[call])])
    preds = tmp_path / "p.jsonl"
    result = post(
        "patches", responses, "--files-json", files, "--strip-prefix", "/testbed/", "-o", preds
    )
    assert result.returncode == 0, result.stderr
    [pred] = read_jsonl(preds)
    assert '-    return ", ".join(items)\n+    return "; ".join(items)\n' in pred["model_patch"]


def test_bad_options_are_clean_errors(tmp_path: Path, repos: Path) -> None:
    responses = write_jsonl(tmp_path / "r.jsonl", [chat_line("a|0", FIX)])
    both = post("patches", responses, "-o", tmp_path / "p.jsonl")
    assert both.returncode == 2 and "give either --repo-root" in both.stderr
    bad = post(
        "patches", responses, "--repo-root", repos, "--repo", "{{ oops", "-o", tmp_path / "p"
    )
    assert bad.returncode == 2 and "template '{{ oops'" in bad.stderr
    assert "Traceback" not in both.stderr + bad.stderr


def test_vote_ties_go_to_the_first_group() -> None:
    def sample(cid: str, norm: str) -> PatchSample:
        return PatchSample("i", cid, patch=f"patch {cid}", normalized_patch=norm)

    samples = [sample("i|0", "B"), sample("i|1", "A"), sample("i|2", "A"), sample("i|3", "B")]
    assert choose_patch(samples, vote=True).custom_id == "i|0"
    assert choose_patch(samples[1:], vote=True).custom_id == "i|1"
    assert choose_patch([PatchSample("i", "x", status="no edits found")], vote=True) is None


def test_partial_keeps_the_edits_that_apply() -> None:
    text = FIX + "\n" + NO_MATCH
    group = Group("i", [Sample("i|0", text=text)])
    strict = make_patches(group, MappedFiles({"pkg/core.py": CORE}))
    partial = make_patches(group, MappedFiles({"pkg/core.py": CORE}), partial=True)
    assert strict[0].status == "edit did not apply"
    assert partial[0].usable and "str(value).strip()" in partial[0].patch
    assert "text to replace not found" in partial[0].reasons[0]


def test_same_output_for_predictions_and_samples_is_sane(tmp_path: Path, repos: Path) -> None:
    responses = write_jsonl(tmp_path / "r.jsonl", [chat_line("proj__proj-1|0", FIX)])
    out = tmp_path / "out"
    same = out / "both.jsonl"
    result = post("patches", responses, "--repo-root", repos, "-o", same, "--samples-out", same)
    assert result.returncode == 0, result.stderr
    [pred] = read_jsonl(same)  # the predictions, complete: they are closed last
    assert pred["instance_id"] == "proj__proj-1" and "str(value)" in pred["model_patch"]
    assert [p.name for p in out.iterdir()] == ["both.jsonl"]  # no temporary file left


def test_writers_to_one_folder_use_their_own_temporary_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jsonlbatch.post.outputs import JsonlWriter

    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    with JsonlWriter(str(a)) as wa, JsonlWriter(str(b)) as wb:
        for i in range(3):
            wa.write({"a": i})
            wb.write({"b": i})
        assert len(list(tmp_path.iterdir())) == 2  # two temporary files, nothing final yet
    assert read_jsonl(a) == [{"a": i} for i in range(3)]
    assert read_jsonl(b) == [{"b": i} for i in range(3)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.jsonl"]
    assert len(synced) == 2  # each output reached the disk before its rename
    with JsonlWriter(str(b)) as outer, JsonlWriter(str(b)) as inner:  # one path twice
        outer.write({"outer": 1})
        inner.write({"inner": 1})
    assert read_jsonl(b) == [{"outer": 1}]  # the last closed wins, whole
    umask = os.umask(0o022)
    os.umask(umask)
    assert a.stat().st_mode & 0o777 == 0o666 & ~umask
    with pytest.raises(RuntimeError), JsonlWriter(str(a)) as again:
        again.write({"new": 1})
        raise RuntimeError("midway")
    assert read_jsonl(a) == [{"a": i} for i in range(3)]  # the previous output is kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.jsonl"]


def test_patches_without_a_source_says_repo_is_optional(tmp_path: Path) -> None:
    """Issue 26: the message said --repo is needed ("--repo-root (with --repo)"); it has a
    default."""
    responses = write_jsonl(tmp_path / "r.jsonl", [chat_line("i1|0", "no diff here")])
    proc = post("patches", responses, "-o", tmp_path / "p.jsonl")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--repo, optional," in proc.stderr and "--files-json" in proc.stderr
    assert not (tmp_path / "p.jsonl").exists()


def test_a_malformed_response_file_counts_one_problem_as_one(tmp_path: Path) -> None:
    bad = tmp_path / "r.jsonl"
    bad.write_bytes(orjson.dumps(chat_line("i1|0", "x")) + b"\n{oops\n")
    proc = post("votes", bad, "-o", tmp_path / "v.jsonl")
    assert proc.returncode == 1 and "(1 problem)" in proc.stderr, proc.stderr

"""Deliverable files: every way an answer names a file, untrusted names, caps, the manifest,
and `--run` of a generated script."""

from __future__ import annotations

import base64
import hashlib
import os
import re
from pathlib import Path

import pytest
from postutil import ENV, chat_line, post, read_jsonl, write_jsonl

from jsonlbatch.post import Limits, extract_files, find_files

REPORT = """Here are the deliverables.

```python title="make_report.py"
import csv
print("hello")
```

```csv filename=data/table.csv
a,b
1,2
```

````markdown
### docs/README.md
# Usage

```bash
pip install thing
```
````

```javascript
// file: web/app.js
console.log(1);
```

### notes.txt
```
plain notes
```

```python
print("an unnamed block is not a file")
```
"""


def test_find_files_in_every_form() -> None:
    found = {f.path: (f.source, f.content.decode()) for f in find_files(REPORT)}
    assert found == {
        "make_report.py": ("fence:info", 'import csv\nprint("hello")\n'),
        "data/table.csv": ("fence:info", "a,b\n1,2\n"),
        "docs/README.md": ("fence:first-line", "# Usage\n\n```bash\npip install thing\n```\n"),
        "web/app.js": ("fence:first-line", "console.log(1);\n"),
        "notes.txt": ("fence:heading", "plain notes\n"),
    }


def test_json_spec_with_base64() -> None:
    blob = bytes(range(256))
    text = (
        '```json\n{"files": [{"path": "out/a.txt", "content": "hi"},'
        f' {{"path": "img.bin", "content": "{base64.b64encode(blob).decode()}",'
        ' "encoding": "base64"},'
        ' {"path": "bad.bin", "content_base64": "!!!"}]}\n```'
    )
    files = find_files(text)
    assert [(f.path, f.content, f.problem) for f in files] == [
        ("out/a.txt", b"hi", ""),
        ("img.bin", blob, ""),
        ("bad.bin", b"", "content is not valid base64"),
    ]


def test_extract_writes_files_and_manifest(tmp_path: Path) -> None:
    responses = write_jsonl(
        tmp_path / "r.jsonl",
        [chat_line("task-1", REPORT), chat_line("task/2", "no files here", "```txt title=a.txt\nA\n```")],
    )  # fmt: skip
    out = tmp_path / "deliverables"
    summary = extract_files(str(responses), str(out))
    assert (out / "task-1" / "data" / "table.csv").read_text() == "a,b\n1,2\n"
    assert (out / "task-1" / "docs" / "README.md").read_text().startswith("# Usage\n")
    # an id that is not a safe folder name gets a cleaned name plus a hash; n>1 gets choice folders
    [folder] = [p.name for p in out.iterdir() if p.name.startswith("task_2-")]
    assert (out / folder / "choice-1" / "a.txt").read_text() == "A\n"
    manifest = read_jsonl(out / "manifest.jsonl")
    table = next(m for m in manifest if m["path"] == "data/table.csv")
    assert table == {
        "id": "task-1", "choice": 0, "path": "data/table.csv", "source": "fence:info",
        "status": "written", "bytes": 8, "sha256": hashlib.sha256(b"a,b\n1,2\n").hexdigest(),
        "reason": "", "isolation": None,
    }  # fmt: skip
    assert summary.written == 6
    assert summary.unused.counts == {"no files found": 1}


def test_untrusted_names_and_planted_symlinks(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("original\n")
    out = tmp_path / "out"
    (out / "evil").mkdir(parents=True)
    os.symlink(outside, out / "evil" / "linkdir")  # planted by someone, e.g. a previous run
    os.symlink(outside / "victim.txt", out / "evil" / "report.txt")
    answer = "\n".join(
        f'```text title="{name}"\nPWNED\n```'
        for name in ["../escape.txt", "/tmp/abs.txt", "a/../../b.txt", "linkdir/x.txt",
                     "report.txt", "ok/fine.txt"]
    )  # fmt: skip
    responses = write_jsonl(tmp_path / "r.jsonl", [chat_line("evil", answer)])
    result = post("files", responses, "--out-dir", out)
    assert result.returncode == 0, result.stderr
    assert (outside / "victim.txt").read_text() == "original\n"
    assert list(outside.iterdir()) == [outside / "victim.txt"]
    assert not (tmp_path / "escape.txt").exists() and not Path("/tmp/abs.txt").exists()
    assert (out / "evil" / "ok" / "fine.txt").read_text() == "PWNED\n"
    reasons = {m["path"]: (m["status"], m["reason"]) for m in read_jsonl(out / "manifest.jsonl")}
    assert reasons == {
        "../escape.txt": ("refused", "'..' in file name '../escape.txt'"),
        "/tmp/abs.txt": ("refused", "absolute file name '/tmp/abs.txt'"),
        "a/../../b.txt": ("refused", "'..' in file name 'a/../../b.txt'"),
        "linkdir/x.txt": ("refused", "evil/linkdir/x.txt: 'linkdir' is a symlink"),
        "report.txt": ("refused", "evil/report.txt is a symlink"),
        "ok/fine.txt": ("written", ""),
    }
    assert "5 file refused: evil (../escape.txt:" in result.stderr
    strict = post("files", responses, "--out-dir", out, "--strict")
    assert strict.returncode == 1 and "Error: --strict" in strict.stderr


def test_malformed_input_writes_nothing(tmp_path: Path) -> None:
    responses = write_jsonl(tmp_path / "r.jsonl", [chat_line("ok", REPORT)])
    with responses.open("a") as fh:
        fh.write('{"custom_id": "bad", "response": {"status_code": "200"}}\n')
    out = tmp_path / "out"
    result = post("files", responses, "--out-dir", out)
    assert result.returncode == 1
    assert f"{responses}:2: response.status_code: missing or not an integer" in result.stderr
    assert not (out / "ok").exists() and not (out / "manifest.jsonl").exists()


def test_caps_on_count_and_size(tmp_path: Path) -> None:
    answer = "\n".join(f'```text title="f{i}.txt"\n{"x" * (10 * i)}\n```' for i in range(1, 5))
    answer += '\n```text title="f1.txt"\nreplaced\n```'
    responses = write_jsonl(tmp_path / "r.jsonl", [chat_line("cap", answer)])
    out = tmp_path / "out"
    extract_files(str(responses), str(out), limits=Limits(max_file_bytes=35, max_files=2))
    status = [(m["path"], m["status"], m["reason"]) for m in read_jsonl(out / "manifest.jsonl")]
    assert status == [
        ("f1.txt", "replaced", "a later block names the same file"),
        ("f2.txt", "written", ""),
        ("f3.txt", "written", ""),
        ("f4.txt", "refused", "over the limit of 2 files"),
        ("f1.txt", "refused", "over the limit of 2 files"),
    ]
    assert not (out / "cap" / "f4.txt").exists()
    tiny = tmp_path / "tiny"
    extract_files(str(responses), str(tiny), limits=Limits(max_file_bytes=25))
    sizes = {m["path"]: m["reason"] for m in read_jsonl(tiny / "manifest.jsonl") if m["reason"]}
    assert sizes["f3.txt"] == "larger than 25 bytes"


SCRIPT = """I will write code that renders the deliverables.

```python
import os, pathlib
pathlib.Path("out").mkdir()
pathlib.Path("out/table.csv").write_text(open("input.csv").read().upper())
names = sorted(k for k in os.environ)
pathlib.Path("env.txt").write_text("\\n".join(names) + "\\n" + os.environ.get("HOME", ""))
os.symlink("/etc/passwd", "leak.txt")
```

```csv title="input.csv"
a,b
```
"""


def test_run_collects_created_files_with_a_clean_env(tmp_path: Path) -> None:
    responses = write_jsonl(tmp_path / "r.jsonl", [chat_line("gen", SCRIPT)])
    out = tmp_path / "out"
    env = {**ENV, "OPENAI_API_KEY": "sk-test-secret-123", "HF_TOKEN": "hf_abc", "MY_SECRET": "s"}
    result = post("files", responses, "--out-dir", out, "--run", env=env)
    assert result.returncode == 0, result.stderr
    assert (out / "gen" / "out" / "table.csv").read_text() == "A,B\n"
    env_names = (out / "gen" / "env.txt").read_text()
    assert "PATH" in env_names.split("\n")
    assert not re.search("KEY|TOKEN|SECRET", env_names) and "sk-test" not in env_names
    assert not env_names.endswith(str(Path.home()))  # HOME is the temporary directory
    assert not (out / "gen" / "leak.txt").exists()
    manifest = {m["path"]: m for m in read_jsonl(out / "manifest.jsonl")}
    assert manifest["main.py"]["status"] == "ran" and manifest["main.py"]["source"] == "run"
    assert manifest["out/table.csv"]["source"] == "run"
    assert manifest["leak.txt"]["reason"] == "the script made a symlink; not followed"
    assert "input.csv" in manifest and manifest["input.csv"]["source"] == "fence:info"


def _alive_with(marker: str) -> list[int]:
    """Live (non-zombie) processes whose command line contains `marker`."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read()
            with open(f"/proc/{entry}/stat") as fh:
                state = fh.read().rsplit(")", 1)[-1].split()[0]
        except (FileNotFoundError, NotADirectoryError, PermissionError, ProcessLookupError):
            continue
        if marker.encode() in cmdline and state != "Z":
            pids.append(int(entry))
    return pids


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="checks processes through /proc")
def test_run_timeout_kills_the_process_group(tmp_path: Path) -> None:
    marker = f"jsonlbatch-orphan-check-{os.getpid()}-{tmp_path.name}"
    hang = (
        "```python\nimport subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', '{marker}'])\n"
        "print('child started', flush=True)\nwhile True:\n    time.sleep(0.1)\n```"
    )
    responses = write_jsonl(tmp_path / "r.jsonl", [chat_line("hang", hang)])
    out = tmp_path / "out"
    summary = extract_files(str(responses), str(out), run=True, run_limits=_limits(timeout=3))
    [record] = read_jsonl(out / "manifest.jsonl")
    assert record["status"] == "failed" and record["reason"].startswith("timed out")
    assert _alive_with(marker) == []  # the script's child died with it
    assert summary.unused.counts == {"script run failed": 1}


def test_run_memory_limit_and_bad_exit(tmp_path: Path) -> None:
    hog = "```python\nx = bytearray(2 * 1024**3)\nopen('never.txt', 'w').write('x')\n```"
    crash = "```python title=main.py\nraise SystemExit('bad input')\n```"
    responses = write_jsonl(
        tmp_path / "r.jsonl", [chat_line("hog", hog), chat_line("crash", crash)]
    )
    out = tmp_path / "out"
    extract_files(
        str(responses), str(out), run=True, run_limits=_limits(memory_bytes=512 * 1024**2)
    )
    records = {m["id"]: m for m in read_jsonl(out / "manifest.jsonl") if m["source"] == "run"}
    assert records["hog"]["status"] == "failed" and "MemoryError" in records["hog"]["reason"]
    assert records["crash"]["reason"] == "exit status 1; bad input"
    assert not (out / "hog").exists()


def test_run_collection_is_capped(tmp_path: Path) -> None:
    many = "```python\nfor i in range(50):\n    open(f'f{i:02d}.txt', 'w').write('x')\n```"
    responses = write_jsonl(tmp_path / "r.jsonl", [chat_line("many", many)])
    out = tmp_path / "out"
    extract_files(str(responses), str(out), run=True, run_limits=_limits(max_files=3))
    records = [(m["path"], m["status"]) for m in read_jsonl(out / "manifest.jsonl")]
    assert records == [
        ("main.py", "ran"), ("f00.txt", "written"), ("f01.txt", "written"),
        ("f02.txt", "written"), ("f03.txt", "refused"),
    ]  # fmt: skip
    assert sorted(p.name for p in (out / "many").iterdir()) == ["f00.txt", "f01.txt", "f02.txt"]


def _limits(**fields: float):
    from jsonlbatch.post import RunLimits

    return RunLimits(**fields)  # type: ignore[arg-type]


def test_refused_named_script_is_not_replaced_by_an_unnamed_block(tmp_path: Path) -> None:
    big = "```python title=main.py\n" + "# padding\n" * 20 + "open('named.txt', 'w')\n```"
    unnamed = "```python\nopen('unnamed.txt', 'w').write('ran')\n```"
    responses = write_jsonl(tmp_path / "r.jsonl", [chat_line("s", big + "\n" + unnamed)])
    out = tmp_path / "out"
    summary = extract_files(str(responses), str(out), limits=Limits(max_file_bytes=100), run=True)
    records = [(m["path"], m["source"], m["status"]) for m in read_jsonl(out / "manifest.jsonl")]
    assert records == [("main.py", "fence:info", "refused"), ("main.py", "run", "failed")]
    [run] = [m for m in read_jsonl(out / "manifest.jsonl") if m["source"] == "run"]
    assert run["reason"] == "the script file was refused"
    assert summary.runs == 0 and not (out / "s" / "unnamed.txt").exists()


def test_script_of_uses_the_unnamed_block_only_without_named_scripts() -> None:
    from jsonlbatch.post.files import script_of

    unnamed = "```python\nprint(1)\n```"
    assert script_of(unnamed, find_files(unnamed)) == ("main.py", "print(1)\n")
    named = "```python title=main.py\nprint(2)\n```\n" + unnamed
    assert script_of(named, find_files(named)) == ("main.py", None)
    assert script_of("no code", []) == (None, None)


def test_script_option_finds_the_file_among_several_and_says_what_it_saw(tmp_path: Path) -> None:
    answer = (
        "```python title=src/render.py\nopen('done.txt', 'w').write('ok')\n```\n"
        "```python title=helper.py\nX = 1\n```\n"
    )
    responses = write_jsonl(tmp_path / "r.jsonl", [chat_line("s", answer)])
    for given in ("src/render.py", "./src/render.py", "render.py"):
        out = tmp_path / given.replace("/", "_")
        result = post("files", responses, "--out-dir", out, "--run", "--script", given)
        assert result.returncode == 0, result.stderr
        assert (out / "s" / "done.txt").read_text() == "ok", given
    result = post("files", responses, "--out-dir", tmp_path / "x", "--run", "--script", "nope.py")
    assert (
        "no file nope.py in the answer (its .py files: helper.py, src/render.py)" in result.stderr
    )
    result = post("files", responses, "--out-dir", tmp_path / "y", "--run")
    assert "several .py files (helper.py, src/render.py) and no main.py" in result.stderr


@pytest.mark.timeout(20)
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_planted_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "fifo").mkdir(parents=True)
    os.mkfifo(out / "fifo" / "report.txt")  # nobody reads it: a blocking open would hang
    answer = '```text title="report.txt"\nhello\n```\n```text title="ok.txt"\nfine\n```'
    responses = write_jsonl(tmp_path / "r.jsonl", [chat_line("fifo", answer)])
    summary = extract_files(str(responses), str(out))
    reasons = {m["path"]: (m["status"], m["reason"]) for m in read_jsonl(out / "manifest.jsonl")}
    assert reasons == {
        "report.txt": ("refused", "fifo/report.txt is not a regular file"),
        "ok.txt": ("written", ""),
    }
    assert summary.written == 1


def test_run_collection_shares_the_per_sample_caps(tmp_path: Path) -> None:
    named = "".join(f'```text title="given{i}.txt"\n{"g" * 9}\n```\n' for i in range(2))
    make = "```python\nfor i in range(5):\n    open(f'made{i}.txt', 'w').write('m' * 9)\n```"
    responses = write_jsonl(tmp_path / "r.jsonl", [chat_line("cap", named + make)])
    out = tmp_path / "count"
    extract_files(str(responses), str(out), limits=Limits(max_files=3), run=True)
    written = [m["path"] for m in read_jsonl(out / "manifest.jsonl") if m["status"] == "written"]
    assert written == ["given0.txt", "given1.txt", "made0.txt"]
    reasons = {m["path"]: m["reason"] for m in read_jsonl(out / "manifest.jsonl")}
    assert reasons["made1.txt"] == "over the limit of 3 files"
    out = tmp_path / "bytes"
    extract_files(str(responses), str(out), limits=Limits(max_total_bytes=45), run=True)
    written = [m["path"] for m in read_jsonl(out / "manifest.jsonl") if m["status"] == "written"]
    assert written == ["given0.txt", "given1.txt", "made0.txt", "made1.txt"]
    reasons = {m["path"]: m["reason"] for m in read_jsonl(out / "manifest.jsonl")}
    assert reasons["made2.txt"] == "over 45 bytes in all"


PROBE = """```python
import os, pathlib, socket
seen = {"parent_env": open(f"/proc/{os.getppid()}/environ", "rb").read().decode("utf-8", "replace")}
try:
    socket.create_connection(("127.0.0.1", PORT), timeout=2).close()
    seen["net"] = "connected"
except OSError as exc:
    seen["net"] = f"refused: {exc}"
try:
    seen["outside"] = open(OUTSIDE).read()
except OSError as exc:
    seen["outside"] = f"unreadable: {exc}"
try:
    open(OUTSIDE + ".new", "w").write("x")
    seen["write_outside"] = "written"
except OSError as exc:
    seen["write_outside"] = f"refused: {exc}"
seen["processes"] = len([p for p in os.listdir("/proc") if p.isdigit()])
pathlib.Path("seen.txt").write_text(repr(seen))
```
"""


def _probe_run(
    tmp_path: Path, *options: str, path_env: str | None = None
) -> tuple[dict, dict, str]:
    """Run PROBE under `post files --run` with a key in jsonlbatch's environment and a server
    listening on loopback; returns (what the script saw, its manifest line, stderr)."""
    import ast
    import socket

    outside = tmp_path / "outside-secret.txt"
    outside.write_text("private data")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        script = PROBE.replace("PORT)", f"{port})").replace("OUTSIDE", repr(str(outside)))
        responses = write_jsonl(tmp_path / "r.jsonl", [chat_line("probe", script)])
        env = {**ENV, "OPENAI_API_KEY": "sk-parent-env-7Hq2Lx9", "JSONLBATCH_TEST": "1"}
        if path_env is not None:
            env["PATH"] = path_env
        out = tmp_path / "out"
        result = post("files", responses, "--out-dir", out, "--run", *options, env=env)
    assert result.returncode == 0, result.stderr
    seen = ast.literal_eval((out / "probe" / "seen.txt").read_text())
    manifest = {m["path"]: m for m in read_jsonl(out / "manifest.jsonl")}
    return seen, manifest["main.py"], result.stderr


def test_run_parent_has_only_the_whitelisted_environment(tmp_path: Path) -> None:
    """Item 15: `/proc/$PPID/environ` was jsonlbatch's own, API keys included. The script's
    parent is now a launcher that has nothing but the whitelist."""
    seen, run, stderr = _probe_run(tmp_path, "--sandbox", "launcher")
    assert "sk-parent-env" not in seen["parent_env"] and "JSONLBATCH_TEST" not in seen["parent_env"]
    assert "PATH=" in seen["parent_env"]
    assert run["status"] == "ran" and run["isolation"] == "launcher"
    assert "1 script run WITHOUT a sandbox" in stderr
    assert seen["net"] == "connected"  # what remains possible without bwrap (docs/post.md)


def test_run_without_bwrap_on_path_falls_back_or_refuses(tmp_path: Path) -> None:
    """The path without bubblewrap, tested even where it is installed: auto falls back to the
    launcher (and says so); --sandbox bwrap refuses cleanly."""
    empty = tmp_path / "bin"
    empty.mkdir()
    seen, run, _ = _probe_run(tmp_path, path_env=str(empty))
    assert run["isolation"] == "launcher" and "sk-parent-env" not in seen["parent_env"]
    responses = write_jsonl(tmp_path / "r2.jsonl", [chat_line("x", "```python\nprint(1)\n```")])
    refused = post(
        "files", responses, "--out-dir", tmp_path / "o2", "--run", "--sandbox", "bwrap",
        env={**ENV, "PATH": str(empty)},
    )  # fmt: skip
    assert refused.returncode == 2
    assert "--sandbox bwrap: bubblewrap (bwrap) is not installed" in refused.stderr


def _bwrap_problem() -> str | None:
    from jsonlbatch.post.sandbox import bwrap_problem

    return bwrap_problem()


@pytest.mark.skipif(_bwrap_problem() is not None, reason=f"needs bwrap: {_bwrap_problem()}")
def test_run_in_bwrap_has_no_network_no_outside_files_and_no_other_processes(
    tmp_path: Path,
) -> None:
    seen, run, stderr = _probe_run(tmp_path)  # auto: bwrap, since it works here
    assert run["isolation"] == "bwrap"
    assert "1 script run in a bwrap sandbox" in stderr
    assert "sk-parent-env" not in seen["parent_env"]
    assert seen["net"].startswith("refused")  # a loopback server outside is not reachable
    assert seen["outside"].startswith("unreadable")  # nothing outside the system and its folder
    assert seen["write_outside"].startswith("refused")
    assert not (tmp_path / "outside-secret.txt.new").exists()
    assert seen["processes"] <= 3  # its own PID namespace

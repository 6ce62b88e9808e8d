"""Hosted code interpreter runs: `file://` reference files uploaded once, generated files
collected into --files-dir, --require-files, on the mock's Files and Containers APIs over HTTP."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path

import openai
import pytest
from batchutil import cli, read_results, start_cli

from jsonlbatch.mock import BackgroundMock, MockConfig
from jsonlbatch.mock.containers import deliverables


def ci_line(cid: str, prompt: str, refs: list[str], url: str = "/v1/responses") -> dict:
    tool = {"type": "code_interpreter", "container": {"type": "auto", "file_ids": refs}}
    return {"custom_id": cid, "method": "POST", "url": url,
            "body": {"model": "mock", "input": prompt, "tools": [tool]}}  # fmt: skip


def write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.fixture
def mock():
    with BackgroundMock(MockConfig()) as server:
        yield server


def refs(tmp_path: Path) -> list[str]:
    paths = []
    for i in range(3):
        p = tmp_path / f"ref{i}.txt"
        p.write_bytes(f"reference {i}\n".encode() * (i + 1))
        paths.append(f"file://{p}")
    return paths


def uploads(mock: BackgroundMock) -> int:
    return mock.stats.requests.get("/v1/files", 0)


def test_uploads_once_per_content_and_collects_every_file(tmp_path, mock):
    files = refs(tmp_path)
    lines = [ci_line(f"t{i}", f"task {i}", files) for i in range(12)]
    req = write(tmp_path / "req.jsonl", lines)
    before = req.read_bytes()
    out, fdir = tmp_path / "out.jsonl", tmp_path / "files"
    done = cli("exec", str(req), "-o", str(out), "--url", mock.url, "-c", "8",
               "--files-dir", str(fdir), "-q")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert uploads(mock) == 3
    assert req.read_bytes() == before  # the request file is never changed
    results = read_results(out)
    inputs = [(f"ref{i}.txt", f"reference {i}\n".encode() * (i + 1)) for i in range(3)]
    for i in range(12):
        got = results[f"t{i}"]["metrics"]["files"]
        want = deliverables(f"task {i}", inputs)
        assert [g["name"] for g in got] == [w.name for w in want]
        for g, w in zip(got, want, strict=True):
            data = (fdir / f"t{i}" / g["name"]).read_bytes()
            assert data == w.data
            assert g["sha256"] == hashlib.sha256(data).hexdigest() and g["bytes"] == len(data)
            assert g["container_id"].startswith("cntr_") and g["file_id"].startswith("cfile_")
    # a later run on the same output reuses the uploads (checked, not sent again)
    sidecar = json.loads((tmp_path / "out.jsonl.files.json").read_text())
    assert len(sidecar["uploads"]) == 3
    more = write(tmp_path / "req.jsonl", [*lines, ci_line("t12", "task 12", files)])
    assert more
    again = cli("exec", str(req), "-o", str(out), "--url", mock.url, "--files-dir", str(fdir), "-q")
    assert again.returncode == 0, again.stderr
    assert uploads(mock) == 3
    assert mock.stats.requests["/v1/files/{file_id}"] == 3  # each remembered id checked once
    assert (fdir / "t12" / "deliverable_1.txt").exists()


def test_the_fingerprint_sees_the_files_content_not_its_path(tmp_path, mock):
    ref = tmp_path / "a.txt"
    ref.write_text("one")
    req = write(tmp_path / "req.jsonl", [ci_line("x", "go", [f"file://{ref}"])])
    out = tmp_path / "out.jsonl"
    assert cli("exec", str(req), "-o", str(out), "--url", mock.url, "-q").returncode == 0
    ref.write_text("two")  # the same path, another content: the request changed
    again = cli("exec", str(req), "-o", str(out), "--url", mock.url, "-q")
    assert again.returncode != 0 and "changed" in again.stderr
    assert "Traceback" not in again.stderr


def test_uncited_file_is_collected_and_azure_paths_work(tmp_path):
    with BackgroundMock(MockConfig(uncited_file=True)) as server:
        base = server.url.removesuffix("/v1") + "/openai?api-version=2025-04-01-preview"
        req = write(tmp_path / "req.jsonl", [ci_line("a/b", "make it", refs(tmp_path)[:1])])
        out, fdir = tmp_path / "out.jsonl", tmp_path / "files"
        done = cli("exec", str(req), "-o", str(out), "--url", base, "--files-dir", str(fdir), "-q")
        assert done.returncode == 0, done.stderr
        names = [f["name"] for f in read_results(out)["a/b"]["metrics"]["files"]]
        assert names == ["deliverable_1.txt", "deliverable_2.txt", "notes.txt"]
        (folder,) = [p for p in fdir.iterdir() if p.name != ".partial"]
        assert sorted(p.name for p in folder.iterdir()) == sorted(names)
        assert server.stats.requests.get("/openai/files", 0) == 1


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: p / "missing.txt", "No such file"),
        (lambda p: p, "is a directory"),
        (lambda p: _sparse(p / "big.bin", 3 << 30), "over the Files API's limit"),
        (lambda p: _unreadable(p / "secret.txt"), "Permission denied"),
    ],
)
def test_unusable_reference_is_refused_before_sending(tmp_path, mock, make, words):
    path = make(tmp_path)
    if words == "Permission denied" and os.geteuid() == 0:
        pytest.skip("root reads every file")
    req = write(
        tmp_path / "req.jsonl", [ci_line("ok", "x", []), ci_line("bad", "y", [f"file://{path}"])]
    )
    out = tmp_path / "out.jsonl"
    done = cli("exec", str(req), "-o", str(out), "--url", mock.url, "-q")
    assert done.returncode == 1
    assert words in done.stderr and ":2" in done.stderr and "file_ids[0]" in done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists() and sum(mock.stats.requests.values()) == 0


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def _unreadable(path: Path) -> Path:
    path.write_text("secret")
    path.chmod(0)
    return path


@pytest.mark.parametrize(
    "prompt, code, words",
    [
        ("mock:foreign-citation", "foreign_citation", "which it did not use"),
        ("mock:files=10000", "too_many_files", "over the cap"),
        ("mock:bytes=10000000000", "file_too_large", "over the cap"),
        ("mock:stall", "download_failed", "stalled"),
    ],
)
def test_hostile_container_fails_the_request_naming_the_file(tmp_path, mock, prompt, code, words):
    req = write(tmp_path / "req.jsonl", [ci_line("r1", prompt, [])])
    out, fdir = tmp_path / "out.jsonl", tmp_path / "files"
    done = cli("exec", str(req), "-o", str(out), "--url", mock.url, "--files-dir", str(fdir),
               "--stream-stall-timeout", "1", "-q")  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    line = read_results(out)["r1"]
    assert line["error"]["code"] == code and words in line["error"]["message"]
    assert "r1" in line["error"]["message"]
    assert line["response"]["status_code"] == 200  # the answer is kept: nothing lost
    assert [p.name for p in fdir.iterdir()] == [".partial"]
    assert not [p for p in (fdir / ".partial").rglob("*") if p.is_file()]


@pytest.mark.parametrize("name", ["../../evil.txt", "a%00b.txt", "..", "/etc/passwd"])
def test_server_chosen_names_stay_inside_dir(tmp_path, mock, name):
    req = write(tmp_path / "req.jsonl", [ci_line("../x", f"mock:name={name}", [])])
    out, fdir = tmp_path / "out.jsonl", tmp_path / "files"
    done = cli("exec", str(req), "-o", str(out), "--url", mock.url, "--files-dir", str(fdir), "-q")
    assert done.returncode == 0, done.stderr
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.parent.parent == fdir]
    assert len(written) == 2
    assert {p.parent.parent for p in written} == {fdir}
    assert not (tmp_path / "evil.txt").exists()
    for f in read_results(out)["../x"]["metrics"]["files"]:
        assert "/" not in f["name"] and "\0" not in f["name"] and f["name"] not in (".", "..")


def test_require_files_fails_no_files_then_reask_and_retry_failed(tmp_path):
    with BackgroundMock(MockConfig(record_bodies=8)) as mock:
        _require_files_then_reask(tmp_path, mock)


def _require_files_then_reask(tmp_path: Path, mock: BackgroundMock) -> None:
    req = write(tmp_path / "req.jsonl", [ci_line("n", "mock:no-files please", [])])
    out, fdir = tmp_path / "out.jsonl", tmp_path / "files"
    args = ("exec", str(req), "-o", str(out), "--url", mock.url, "--files-dir", str(fdir), "-q")
    done = cli(*args, "--require-files")
    assert done.returncode == 3
    error = read_results(out)["n"]["error"]
    assert error["code"] == "no_files" and "n:" in error["message"]
    # a re-ask carries a feedback turn; the mock still writes nothing for this prompt
    before = mock.stats.requests["/v1/responses"]
    done = cli(*args, "--require-files", "--retry-failed", "--reask", "2")
    assert done.returncode == 3
    assert mock.stats.requests["/v1/responses"] - before == 3
    assert read_results(out)["n"]["metrics"]["attempts"] == 3
    asked = list(mock.stats.bodies)[-3:]
    assert asked[0]["input"] == "mock:no-files please"  # the first ask, as the line says
    for body in asked[1:]:  # each re-ask: the input, then one short feedback turn
        assert body["input"][0] == {"role": "user", "content": "mock:no-files please"}
        assert body["input"][-1]["role"] == "user"
        assert "did not produce a file" in body["input"][-1]["content"]


def test_batch_api_refuses_files_dir_saying_why(tmp_path, mock):
    req = write(tmp_path / "req.jsonl", [ci_line("a", "x", [])])
    done = cli("exec", str(req), "-o", str(tmp_path / "o.jsonl"), "--url", mock.url,
               "--batch-api", "--files-dir", str(tmp_path / "f"))  # fmt: skip
    assert done.returncode == 2 and "expires" in done.stderr and "Traceback" not in done.stderr


def test_expired_container_fails_the_request(tmp_path):
    with BackgroundMock(MockConfig(container_ttl=0.0, latency=0.05)) as server:
        req = write(tmp_path / "req.jsonl", [ci_line("e", "x", [])])
        out = tmp_path / "out.jsonl"
        done = cli("exec", str(req), "-o", str(out), "--url", server.url,
                   "--files-dir", str(tmp_path / "f"), "-q")  # fmt: skip
        assert done.returncode == 3
        assert read_results(out)["e"]["error"]["code"] == "container_gone"


def test_mock_serves_the_sdk(tmp_path, mock):
    client = openai.OpenAI(base_url=mock.url, api_key="x")
    uploaded = client.files.create(file=("r.txt", b"hi"), purpose="user_data")
    assert client.files.retrieve(uploaded.id).bytes == 2
    tool = {"type": "code_interpreter", "container": {"type": "auto", "file_ids": [uploaded.id]}}
    answer = client.responses.create(model="mock", input="go", tools=[tool])
    container = answer.output[0].container_id
    listed = list(client.containers.files.list(container))
    assert [f.source for f in listed] == ["user", "assistant", "assistant"]
    data = client.containers.files.content.retrieve(listed[1].id, container_id=container).read()
    assert data == deliverables("go", [("r.txt", b"hi")])[0].data


@pytest.mark.slow
def test_kill_9_then_resume_collects_each_file_exactly_once(tmp_path):
    with BackgroundMock(MockConfig(latency=0.2)) as server:
        lines = [ci_line(f"k{i}", f"task {i}", refs(tmp_path)) for i in range(200)]
        req = write(tmp_path / "req.jsonl", lines)
        out, fdir = tmp_path / "out.jsonl", tmp_path / "files"
        args = ("exec", str(req), "-o", str(out), "--url", server.url, "-c", "16",
                "--files-dir", str(fdir), "-q")  # fmt: skip
        proc = start_cli(*args)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not out.exists() or out.stat().st_size < 20000):
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert proc.returncode == -signal.SIGKILL
        assert 0 < len(out.read_bytes().splitlines()) < 200  # killed mid-run
        done = cli(*args)
        assert done.returncode == 0, done.stderr
        results = read_results(out)
        assert len(results) == 200 and len(out.read_text().splitlines()) == 200
        for cid, line in results.items():
            names = sorted(f["name"] for f in line["metrics"]["files"])
            assert sorted(p.name for p in (fdir / cid).iterdir()) == names
        assert server.stats.requests.get("/v1/files", 0) == 3


def test_export_report_and_viewer_list_the_collected_files(tmp_path, mock):
    from jsonlbatch.view.detail import describe

    req = write(tmp_path / "req.jsonl", [ci_line(f"v{i}", f"task {i}", []) for i in range(3)])
    out, fdir = tmp_path / "out.jsonl", tmp_path / "files"
    done = cli("exec", str(req), "-o", str(out), "--url", mock.url, "--files-dir", str(fdir), "-q")
    assert done.returncode == 0, done.stderr
    table = tmp_path / "table.jsonl"
    assert cli("export", str(out), "-o", str(table)).returncode == 0
    rows = [json.loads(x) for x in table.read_text().splitlines()]
    for row in rows:
        assert row["container_files"] == [f"{row['custom_id']}/deliverable_{k}.txt" for k in (1, 2)]
        assert all((fdir / p).is_file() for p in row["container_files"])
        assert row["container_file_bytes"] == sum(
            (fdir / p).stat().st_size for p in row["container_files"]
        )
    report = cli("report", str(out), "--by", "model")
    assert report.returncode == 0, report.stderr
    assert "files collected" in report.stdout and " 6" in report.stdout
    first = out.read_bytes().splitlines()[0]
    shown = describe(first)["files"]
    assert [f["bytes"] for f in shown] == [(fdir / f["path"]).stat().st_size for f in shown]


def test_experiment_example_runs_a_condition_in_code_interpreter_mode(tmp_path):
    example = Path(__file__).parent.parent / "examples/experiments/code_interpreter/experiment.yaml"
    done = cli("run", str(example), "-q", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    root = tmp_path / "runs" / "exp-ci"
    for condition in ("a", "b"):
        results = read_results(root / condition / "responses.jsonl")
        assert len(results) == 4
        for cid, line in results.items():
            assert len(line["metrics"]["files"]) == 2
            for record in line["metrics"]["files"]:
                assert (root / condition / "container_files" / record["path"]).is_file()
            assert cid in {p.name for p in (root / condition / "container_files").iterdir()}
        sidecar = json.loads((root / condition / "responses.jsonl.files.json").read_text())
        assert len(sidecar["uploads"]) == 3  # ledger.csv, targets.csv, style.txt
    assert "files collected" in (root / "report.md").read_text()


def test_batch_api_refuses_file_references_before_submitting(tmp_path, mock):
    ref = tmp_path / "r.txt"
    ref.write_text("x")
    req = write(tmp_path / "req.jsonl", [ci_line("a", "x", [f"file://{ref}"])])
    done = cli("exec", str(req), "-o", str(tmp_path / "o.jsonl"), "--url", mock.url, "--batch-api")
    assert done.returncode == 2, done.stderr
    assert "direct run only" in done.stderr and "Traceback" not in done.stderr
    assert uploads(mock) == 0


def test_validate_names_a_reference_file_that_cannot_be_sent(tmp_path):
    req = write(tmp_path / "req.jsonl", [ci_line("a", "x", [f"file://{tmp_path}/gone.csv"])])
    done = cli("validate", str(req))
    assert done.returncode == 1
    assert "req.jsonl:1" in done.stderr + done.stdout and "gone.csv" in done.stderr + done.stdout


def test_a_failed_upload_fails_its_request_naming_the_file(tmp_path):
    from aiohttp import web
    from batchutil import serve_app

    from jsonlbatch.mock import create_app

    @web.middleware
    async def refuse_uploads(request, handler):
        if request.method == "POST" and request.path == "/v1/files":
            return web.json_response({"error": {"message": "storage full"}}, status=500)
        return await handler(request)

    app = create_app(MockConfig())
    app.middlewares.append(refuse_uploads)
    url, stop = serve_app(app)
    try:
        ref = tmp_path / "ref.csv"
        ref.write_text("a,b\n")
        req = write(tmp_path / "req.jsonl", [ci_line("u1", "x", [f"file://{ref}"])])
        out = tmp_path / "out.jsonl"
        done = cli("exec", str(req), "-o", str(out), "--url", url, "-q")
        assert done.returncode == 3 and "Traceback" not in done.stderr
        error = read_results(out)["u1"]["error"]
        assert error["code"] == "upload_failed"
        assert "u1" in error["message"] and "ref.csv" in error["message"]
    finally:
        stop()


def test_a_reference_gone_between_scan_and_send_fails_its_request(tmp_path):
    import asyncio

    import aiohttp

    from jsonlbatch.batch_format.records import Request
    from jsonlbatch.exec.prepare.file_refs import FileRefs
    from jsonlbatch.exec.route.endpoints import parse_endpoint
    from jsonlbatch.exec.send.file_uploads import UploadFailed, Uploads

    ref = tmp_path / "ref.csv"
    ref.write_text("a")
    refs = FileRefs()
    body = ci_line("g", "x", [f"file://{ref}"])["body"]
    ref.unlink()  # the scan would have refused it; here it goes after the scan
    assert refs.resolve(body)

    async def send() -> None:
        async with aiohttp.ClientSession() as session:
            uploads = Uploads(refs, [str(tmp_path / "side.json")], session, 5.0)
            endpoint = parse_endpoint("http://127.0.0.1:9/v1")
            await uploads.swap(Request("g", "/v1/responses", body), endpoint, {})

    with pytest.raises(UploadFailed, match="No such file"):
        asyncio.run(send())


def test_an_input_file_part_is_sent_with_the_uploads_id(tmp_path):
    with BackgroundMock(MockConfig(record_bodies=4)) as server:
        ref = tmp_path / "brief.pdf"
        ref.write_bytes(b"%PDF-1.4 brief")
        part = {"type": "input_file", "file_id": f"file://{ref}"}
        body = {"model": "mock", "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "summarise"}, part]}]}  # fmt: skip
        line = {"custom_id": "p", "method": "POST", "url": "/v1/responses", "body": body}
        req = write(tmp_path / "req.jsonl", [line])
        done = cli("exec", str(req), "-o", str(tmp_path / "o.jsonl"), "--url", server.url, "-q")
        assert done.returncode == 0, done.stderr
        (sent,) = list(server.stats.bodies)
        file_id = sent["input"][0]["content"][1]["file_id"]
        assert file_id.startswith("file-")
        client = openai.OpenAI(base_url=server.url, api_key="x")
        assert client.files.content(file_id).read() == b"%PDF-1.4 brief"


def test_the_cache_key_sees_the_content_not_the_path(tmp_path, mock):
    first, second = tmp_path / "a.csv", tmp_path / "copy.csv"
    first.write_text("same bytes")
    second.write_text("same bytes")
    cache = tmp_path / "cache"
    for i, path in enumerate((first, second)):
        req = write(tmp_path / f"req{i}.jsonl", [ci_line("c", "go", [f"file://{path}"])])
        done = cli("exec", str(req), "-o", str(tmp_path / f"out{i}.jsonl"), "--url", mock.url,
                   "--cache", str(cache), "-q")  # fmt: skip
        assert done.returncode == 0, done.stderr
    assert mock.stats.requests["/v1/responses"] == 1  # the second run: a cache hit
    assert uploads(mock) == 1


def test_files_dir_that_cannot_be_made_is_refused_before_sending(tmp_path, mock):
    req = write(tmp_path / "req.jsonl", [ci_line("a", "x", [])])
    (tmp_path / "taken").write_text("a file, not a folder")
    out = tmp_path / "out.jsonl"
    done = cli("exec", str(req), "-o", str(out), "--url", mock.url,
               "--files-dir", str(tmp_path / "taken" / "sub"))  # fmt: skip
    assert done.returncode != 0 and "--files-dir" in done.stderr
    assert "Traceback" not in done.stderr
    assert mock.stats.requests.get("/v1/responses", 0) == 0 and not out.exists()

"""`jsonlbatch exec` against the built-in mock over real HTTP on 127.0.0.1."""

from __future__ import annotations

import orjson
import pytest
from batchutil import cli, content, exec_cli, failures, read_results, write_requests

import jsonlbatch
from jsonlbatch.errors import InputError
from jsonlbatch.mock import reply_text


def test_one_line_per_request_and_each_belongs_to_its_request(tmp_path, mock_server):
    url = mock_server()
    requests = write_requests(tmp_path / "req.jsonl", 300)
    out = tmp_path / "out.jsonl"
    proc = exec_cli(tmp_path / "req.jsonl", out, "--url", url, "-c", "32")
    assert proc.returncode == 0, proc.stderr
    results = read_results(out)
    assert set(results) == {r["custom_id"] for r in requests}
    for r in requests:
        line = results[r["custom_id"]]
        assert line["error"] is None
        assert line["response"]["status_code"] == 200
        assert line["id"].startswith("batch_req_")
        assert content(line) == reply_text(r["body"], 0)
        assert line["metrics"]["attempts"] == 1
        assert line["metrics"]["endpoint"] == url
    assert "300 ok, 0 failed" in proc.stderr


def test_library_api_returns_a_summary(tmp_path, mock_server):
    url = mock_server()
    write_requests(tmp_path / "req.jsonl", 20, n=2)
    summary = jsonlbatch.execute(
        tmp_path / "req.jsonl", tmp_path / "out.jsonl", urls=[url], quiet=True
    )
    assert (summary.succeeded, summary.failed, summary.complete) == (20, 0, True)
    assert summary.completion_tokens > 0
    results = read_results(tmp_path / "out.jsonl")
    body = {"model": "mock", "messages": [{"role": "user", "content": "question 3"}], "n": 2}
    assert content(results["req-3"], 1) == reply_text(body, 1)


async def test_async_api(tmp_path, mock_server):
    url = mock_server()
    write_requests(tmp_path / "req.jsonl", 10)
    summary = await jsonlbatch.aexecute(
        tmp_path / "req.jsonl", tmp_path / "out.jsonl", urls=[url], quiet=True
    )
    assert summary.succeeded == 10


async def test_a_job_run_twice_resumes_instead_of_resending(tmp_path, mock_server):
    url = mock_server()
    write_requests(tmp_path / "req.jsonl", 3)
    out = tmp_path / "out.jsonl"
    job = jsonlbatch.Job(
        tmp_path / "req.jsonl", out, jsonlbatch.ExecOptions(urls=[url], quiet=True)
    )
    assert (await job.run()).written == 3
    assert (await job.run()).written == 0
    assert len(out.read_bytes().splitlines()) == 3


async def test_a_request_file_gone_before_sending_is_a_clean_error(tmp_path, mock_server):
    """With --serve, minutes can pass between the checks and the sending."""
    url = mock_server()
    write_requests(tmp_path / "req.jsonl", 3)
    job = jsonlbatch.Job(
        tmp_path / "req.jsonl", tmp_path / "out.jsonl", jsonlbatch.ExecOptions(urls=[url])
    )
    job.prepare()
    (tmp_path / "req.jsonl").unlink()
    with pytest.raises(InputError, match=r"cannot read .*req\.jsonl"):
        await job.run()


def test_resume_skips_done_and_keeps_existing_lines_byte_for_byte(tmp_path, mock_server):
    url = mock_server()
    write_requests(tmp_path / "req.jsonl", 50)
    out = tmp_path / "out.jsonl"
    assert exec_cli(tmp_path / "req.jsonl", out, "--url", url).returncode == 0
    lines = out.read_bytes().splitlines(keepends=True)
    kept = b"".join(lines[:20])
    out.write_bytes(kept)
    proc = exec_cli(tmp_path / "req.jsonl", out, "--url", url)
    assert proc.returncode == 0, proc.stderr
    assert "20 of 50 requests already have a result" in proc.stderr
    assert out.read_bytes().startswith(kept)
    assert len(read_results(out)) == 50


def test_torn_last_line_is_cut_and_said(tmp_path, mock_server):
    url = mock_server()
    write_requests(tmp_path / "req.jsonl", 30)
    out = tmp_path / "out.jsonl"
    assert exec_cli(tmp_path / "req.jsonl", out, "--url", url).returncode == 0
    data = out.read_bytes()
    lines = data.splitlines(keepends=True)
    torn = b"".join(lines[:10]) + lines[10][: len(lines[10]) // 2]
    out.write_bytes(torn)
    proc = exec_cli(tmp_path / "req.jsonl", out, "--url", url)
    assert proc.returncode == 0, proc.stderr
    assert "torn last line" in proc.stderr
    results = read_results(out)
    assert len(results) == 30
    assert not failures(results)


def test_corrupt_line_mid_file_is_an_error_and_nothing_changes(tmp_path, mock_server):
    url = mock_server()
    write_requests(tmp_path / "req.jsonl", 5)
    out = tmp_path / "out.jsonl"
    assert exec_cli(tmp_path / "req.jsonl", out, "--url", url).returncode == 0
    lines = out.read_bytes().splitlines(keepends=True)
    broken = b"".join(lines[:2]) + b"{not json\n" + b"".join(lines[2:4])
    out.write_bytes(broken)
    proc = exec_cli(tmp_path / "req.jsonl", out, "--url", url)
    assert proc.returncode == 1
    assert f"{out}:3" in proc.stderr and "Traceback" not in proc.stderr
    assert out.read_bytes() == broken


@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [
        (b"{oops\n", ":3: bad JSON"),
        (
            b'{"custom_id": "req-0", "method": "POST", "url": "/v1/chat/completions", '
            b'"body": {"model": "mock", "messages": [{"role": "user", "content": "x"}]}}\n',
            ":3: custom_id: 'req-0' repeats line 1",
        ),
        (b'{"custom_id": "x", "method": "POST", "url": "/v1/chat", "body": {}}\n', ":3: url:"),
        (
            b'{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": []}\n',
            ":3: body: must be an object",
        ),
        (
            b'{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", '
            b'"body": {"model": "mock", "messages": [{"content": "hi"}]}}\n',
            ":3: body.messages[0].role",
        ),
    ],
)
def test_bad_input_refused_before_sending_with_line_numbers(
    tmp_path, mock_server, bad_line, expected
):
    url = mock_server()
    req = tmp_path / "req.jsonl"
    write_requests(req, 2)
    req.write_bytes(req.read_bytes() + bad_line)
    out = tmp_path / "out.jsonl"
    proc = exec_cli(req, out, "--url", url)
    assert proc.returncode == 1
    assert f"{req}{expected}" in proc.stderr, proc.stderr
    assert "nothing was sent" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_validate_lists_every_problem(tmp_path):
    req = tmp_path / "req.jsonl"
    write_requests(req, 3)
    req.write_bytes(req.read_bytes() + b"[1]\n" + req.read_bytes().splitlines(True)[0])
    proc = cli("validate", str(req))
    assert proc.returncode == 1
    assert f"{req}:4: line: must be a JSON object" in proc.stdout
    assert f"{req}:5: custom_id: 'req-0' repeats line 1" in proc.stdout
    good = tmp_path / "good.jsonl"
    write_requests(good, 3)
    proc = cli("validate", str(good))
    assert proc.returncode == 0 and "ok (3 request lines)" in proc.stdout


def test_validate_response_file(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(
        orjson.dumps({"custom_id": "a", "response": None, "error": None})
        + b"\n"
        + orjson.dumps(
            {"custom_id": "b", "response": {"status_code": 200, "body": {}}, "error": None}
        )
        + b"\n"
    )
    proc = cli("validate", str(out))
    assert proc.returncode == 1
    assert (
        f"{out}:1: error: a line without a response must carry an error object (or vLLM"
        in proc.stdout
    )


def test_validate_names_a_torn_last_line_and_what_exec_does(tmp_path, mock_server):
    out = tmp_path / "out.jsonl"
    write_requests(tmp_path / "req.jsonl", 3)
    assert exec_cli(tmp_path / "req.jsonl", out, "--url", mock_server(), "-q").returncode == 0
    out.write_bytes(out.read_bytes()[:-30])  # a crash in the middle of the last write
    proc = cli("validate", str(out))
    assert proc.returncode == 1
    assert f"{out}:3: torn last line (no newline at its end: a write cut short); exec cuts it" in (
        proc.stdout
    )
    assert "1 problem in responses" in proc.stderr
    req = tmp_path / "req.jsonl"
    req.write_bytes(req.read_bytes()[:-30])
    proc = cli("validate", str(req))
    assert proc.returncode == 1
    assert f"{req}:3: torn last line (no newline at its end: a write cut short); exec refuses" in (
        proc.stdout
    )


def test_validate_refuses_n_0_and_hints_only_at_options_that_exist(tmp_path):
    req = tmp_path / "req.jsonl"
    body = {"messages": [{"role": "user", "content": "hi"}], "n": 0, "max_tokens": 0}
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body}
    req.write_bytes(orjson.dumps(line) + b"\n")
    proc = cli("validate", str(req))
    assert proc.returncode == 1
    assert f"{req}:1: body.n: must be a number of at least 1, got 0" in proc.stdout
    assert f"{req}:1: body.max_tokens: must be a number of at least 1, got 0" in proc.stdout
    # issue 26: "missing (give it here, ...)" did not say what to give or where
    assert 'body.model: missing: the request names no model; add "model" to its body' in proc.stdout
    assert "or run exec with --model NAME" in proc.stdout


def test_wrong_model_fails_up_front_listing_served_names(tmp_path, mock_server):
    url = mock_server(served_models=("Qwen/Qwen3-8B",))
    write_requests(tmp_path / "req.jsonl", 5, model="gpt-3.5-turbo")
    out = tmp_path / "out.jsonl"
    proc = exec_cli(tmp_path / "req.jsonl", out, "--url", url)
    assert proc.returncode == 1
    assert "'gpt-3.5-turbo' (5 requests use it) is not served" in proc.stderr
    assert "Qwen/Qwen3-8B" in proc.stderr
    assert not out.exists() or out.read_bytes() == b""
    for model_opt in ("auto", "Qwen/Qwen3-8B"):
        out.unlink(missing_ok=True)
        proc = exec_cli(tmp_path / "req.jsonl", out, "--url", url, "--model", model_opt)
        assert proc.returncode == 0, proc.stderr
        results = read_results(out)
        assert {r["response"]["body"]["model"] for r in results.values()} == {"Qwen/Qwen3-8B"}


def test_model_option_allows_bodies_without_model(tmp_path, mock_server):
    url = mock_server()
    req = tmp_path / "req.jsonl"
    req.write_bytes(
        orjson.dumps(
            {
                "custom_id": "a",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user", "content": "hi"}]},
            }
        )
        + b"\n"
    )
    assert exec_cli(req, tmp_path / "o.jsonl", "--url", url).returncode == 1
    proc = exec_cli(req, tmp_path / "o.jsonl", "--url", url, "--model", "mock")
    assert proc.returncode == 0, proc.stderr


def test_completions_and_embeddings_pass_through(tmp_path, mock_server):
    url = mock_server()
    req = tmp_path / "req.jsonl"
    req.write_bytes(
        orjson.dumps(
            {
                "custom_id": "c",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"model": "mock", "prompt": "once upon"},
            }
        )
        + b"\n"
        + orjson.dumps(
            {
                "custom_id": "e",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": "mock", "input": ["a", "b"]},
            }
        )
        + b"\n"
    )
    out = tmp_path / "out.jsonl"
    proc = exec_cli(req, out, "--url", url)
    assert proc.returncode == 0, proc.stderr
    results = read_results(out)
    assert results["c"]["response"]["body"]["choices"][0]["text"]
    assert len(results["e"]["response"]["body"]["data"]) == 2


def test_output_must_not_be_the_input(tmp_path, mock_server):
    write_requests(tmp_path / "req.jsonl", 1)
    proc = exec_cli(
        tmp_path / "req.jsonl",
        tmp_path / "req.jsonl",
        "--url",
        mock_server(),
    )
    assert proc.returncode == 2 and "is also an input" in proc.stderr

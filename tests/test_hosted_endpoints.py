"""/v1/responses, /v1/messages and /v1/moderations end to end: request checks, gen writing them,
the mock answering them, exec's answer rules and usage, post's and report's reading, Anthropic's
headers, and the refusal of --stream for them."""

from __future__ import annotations

import http.server
import json
import threading

import orjson
import pytest
from batchutil import cli, exec_cli, failures, read_results

from jsonlbatch.batch_format.samples import samples_of
from jsonlbatch.exec.route.endpoints import auth_headers, parse_endpoint
from jsonlbatch.mock import reply_text
from jsonlbatch.mock.hosted import as_chat

RESPONSES, MESSAGES, MODERATIONS = "/v1/responses", "/v1/messages", "/v1/moderations"


def _line(cid: str, url: str, body: dict) -> bytes:
    return orjson.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body}) + b"\n"


def _bodies(i: int) -> dict[str, dict]:
    return {
        RESPONSES: {"model": "mock", "instructions": "be brief", "input": f"question {i}",
                    "max_output_tokens": 4 + i % 2 * 20},
        MESSAGES: {"model": "mock", "system": "be brief", "max_tokens": 30,
                   "messages": [{"role": "user", "content": [{"type": "text",
                                                              "text": f"question {i}"}]}]},
        MODERATIONS: {"input": [f"question {i}", "I will attack"]},
    }  # fmt: skip


def _write(path, n: int = 4) -> dict[str, tuple[str, dict]]:
    lines, requests = [], {}
    for i in range(n):
        for url, body in _bodies(i).items():
            cid = f"{url.rsplit('/', 1)[1]}-{i}"
            requests[cid] = (url, body)
            lines.append(_line(cid, url, body))
    path.write_bytes(b"".join(lines))
    return requests


def test_each_endpoint_runs_through_exec_with_its_text_and_usage(tmp_path, mock_server):
    url = mock_server()
    requests = _write(tmp_path / "req.jsonl")
    out = tmp_path / "out.jsonl"
    proc = exec_cli(tmp_path / "req.jsonl", out, "--url", url, "-q")
    assert proc.returncode == 0, proc.stderr
    results = read_results(out)
    assert sorted(results) == sorted(requests) and not failures(results)
    for cid, (endpoint, body) in requests.items():
        line = results[cid]
        samples = samples_of(line)
        answer = line["response"]["body"]
        if endpoint == MODERATIONS:
            assert [s.text for s in samples] == ["not flagged", "flagged: violence"]
            continue
        (sample,) = samples
        assert sample.text == reply_text(as_chat(body))  # the chat request it means
        usage = answer["usage"]
        assert line["metrics"]["prompt_tokens"] == usage["input_tokens"] > 0
        assert line["metrics"]["completion_tokens"] == usage["output_tokens"] > 0
        if endpoint == RESPONSES:
            parts = answer["output"][0]["content"]
            assert parts[0]["type"] == "output_text" and parts[0]["text"] == sample.text
            cut = body["max_output_tokens"] == 4
            assert sample.finish_reason == ("length" if cut else "stop")
        else:
            assert answer["content"][0] == {"type": "text", "text": sample.text}
            assert sample.finish_reason == "stop"


def test_report_reads_their_usage_and_finish_reasons(tmp_path, mock_server):
    url = mock_server()
    _write(tmp_path / "req.jsonl")
    out = tmp_path / "out.jsonl"
    assert exec_cli(tmp_path / "req.jsonl", out, "--url", url, "-q").returncode == 0
    report = cli("report", str(out), "--format", "json")
    assert report.returncode == 0, report.stderr
    run = json.loads(report.stdout)["runs"][0]
    bodies = [line["response"]["body"] for line in read_results(out).values()]
    usages = [b["usage"] for b in bodies if "usage" in b]
    assert run["prompt_tokens"] == sum(u["input_tokens"] for u in usages)
    assert run["completion_tokens"] == sum(u["output_tokens"] for u in usages)
    assert run["finish_reasons"]["length"] == 2  # the Responses requests capped at 4 tokens
    assert run["succeeded"] == 12


@pytest.mark.parametrize(
    ("url", "body", "field"),
    [
        (MESSAGES, {"model": "m", "messages": [{"role": "user", "content": "x"}]}, "body.max_tokens"),
        (MESSAGES, {"model": "m", "max_tokens": 5,
                    "messages": [{"role": "system", "content": "x"}]}, "body.messages[0].role"),
        (RESPONSES, {"model": "m", "input": []}, "body.input"),
        (RESPONSES, {"model": "m", "input": [{"content": "x"}]}, "body.input[0]"),
        (RESPONSES, {"model": "m", "input": "x", "max_output_tokens": 0}, "body.max_output_tokens"),
        (MODERATIONS, {"input": 7}, "body.input"),
    ],
)  # fmt: skip
def test_bad_requests_are_refused_with_file_line_and_field(tmp_path, url, body, field):
    good = _line("ok", MODERATIONS, {"input": "fine"})
    (tmp_path / "req.jsonl").write_bytes(good + _line("bad", url, body))
    proc = exec_cli(tmp_path / "req.jsonl", tmp_path / "out.jsonl", "--url", "http://127.0.0.1:9")
    assert proc.returncode == 1
    assert "req.jsonl:2" in proc.stderr and field in proc.stderr
    assert not (tmp_path / "out.jsonl").exists()


class _WrongShape(http.server.BaseHTTPRequestHandler):
    """A server that answers every POST with 200 and a chat body: no answer for the new kinds."""

    def do_GET(self) -> None:
        self._send({"object": "list", "data": [{"id": "mock"}]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self._send({"id": "x", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ]})  # fmt: skip

    def _send(self, body: dict) -> None:
        data = orjson.dumps(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def wrong_shape_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _WrongShape)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_a_200_without_the_endpoints_answer_is_invalid(tmp_path, wrong_shape_server):
    bodies = _bodies(0)
    (tmp_path / "req.jsonl").write_bytes(b"".join(_line(u, u, b) for u, b in bodies.items()))
    out = tmp_path / "out.jsonl"
    proc = exec_cli(tmp_path / "req.jsonl", out, "--url", wrong_shape_server, "--max-retries",
                    "1", "--backoff", "0.01")  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    results = read_results(out)
    for url in bodies:
        line = results[url]
        assert line["response"] is None and line["error"]["code"] == "invalid_response"
        assert line["metrics"]["attempts"] == 2


def test_anthropic_hosts_get_x_api_key_and_a_version():
    headers = auth_headers(parse_endpoint("https://api.anthropic.com/v1"), "sk-ant-secret")
    assert headers["x-api-key"] == "sk-ant-secret"
    assert headers["anthropic-version"] == "2023-06-01"
    assert "Authorization" not in headers
    openai = auth_headers(parse_endpoint("https://api.openai.com/v1"), "sk-secret")
    assert openai["Authorization"] == "Bearer sk-secret" and "x-api-key" not in openai
    # a proxy that speaks Anthropic's protocol: said with --header
    proxy = parse_endpoint("http://127.0.0.1:9/v1")
    given = auth_headers(proxy, "k", {"anthropic-version": "2024-01-01"})
    assert given["x-api-key"] == "k" and given["anthropic-version"] == "2024-01-01"
    assert "Authorization" not in given


def test_the_key_reaches_a_server_as_x_api_key(tmp_path, mock_server):
    url = mock_server(api_key="sk-ant-test")
    (tmp_path / "req.jsonl").write_bytes(
        _line("m", MESSAGES, {"model": "mock", "max_tokens": 5,
                              "messages": [{"role": "user", "content": "hi"}]})
    )  # fmt: skip
    out = tmp_path / "out.jsonl"
    proc = exec_cli(tmp_path / "req.jsonl", out, "--url", url, "--api-key", "sk-ant-test",
                    "--header", "anthropic-version=2023-06-01")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert not failures(read_results(out))
    assert "sk-ant-test" not in proc.stderr + out.read_text()


def test_stream_is_refused_for_endpoints_it_cannot_read(tmp_path):
    _write(tmp_path / "req.jsonl", 1)
    proc = exec_cli(tmp_path / "req.jsonl", tmp_path / "out.jsonl", "--url",
                    "http://127.0.0.1:9/v1", "--stream")  # fmt: skip
    assert proc.returncode == 2
    assert "--stream is not supported for /v1/messages, /v1/responses" in proc.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_gen_writes_each_endpoint(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"q": "what is 2+2"}\n')
    expected = {
        RESPONSES: {"model": "m", "max_output_tokens": 50,
                    "input": [{"role": "system", "content": "be brief"},
                              {"role": "user", "content": "what is 2+2"}]},
        MESSAGES: {"model": "m", "max_tokens": 50, "system": "be brief",
                   "messages": [{"role": "user", "content": "what is 2+2"}]},
    }  # fmt: skip
    for url, body in expected.items():
        out = tmp_path / f"{url.rsplit('/', 1)[1]}.jsonl"
        proc = cli("gen", "--data", str(data), "--prompt", "{{ q }}", "--system", "be brief",
                   "--model", "m", "--max-tokens", "50", "--url", url, "-o", str(out))  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        line = orjson.loads(out.read_bytes())
        assert line["url"] == url and line["body"] == body
    out = tmp_path / "moderations.jsonl"
    proc = cli("gen", "--data", str(data), "--prompt", "{{ q }}", "--url", MODERATIONS,
               "-o", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert orjson.loads(out.read_bytes())["body"] == {"input": "what is 2+2"}
    refused = cli("gen", "--data", str(data), "--prompt", "{{ q }}", "--url", MODERATIONS,
                  "--max-tokens", "5", "-o", str(tmp_path / "x.jsonl"))  # fmt: skip
    assert refused.returncode != 0 and "no meaning" in refused.stderr


def test_export_shows_every_usable_kind_as_succeeded_with_its_own_columns(tmp_path, mock_server):
    """Issue 26: export marked successful embeddings as failed ("response body has no
    choices") with empty model and token columns."""
    lines = [
        _line("emb", "/v1/embeddings", {"model": "mock", "input": ["a", "b"], "dimensions": 8}),
        _line("emb64", "/v1/embeddings",
              {"model": "mock", "input": "c", "dimensions": 4, "encoding_format": "base64"}),
        *(_line(f"{u.rsplit('/', 1)[1]}-0", u, b) for u, b in _bodies(0).items()),
    ]  # fmt: skip
    (tmp_path / "req.jsonl").write_bytes(b"".join(lines))
    out = tmp_path / "out.jsonl"
    assert exec_cli(tmp_path / "req.jsonl", out, "--url", mock_server(), "-q").returncode == 0
    table = tmp_path / "table.jsonl"
    done = cli("export", str(out), "-o", str(table), "--per", "choice")
    assert done.returncode == 0, done.stderr
    rows = [orjson.loads(x) for x in table.read_bytes().splitlines()]
    assert {r["status"] for r in rows} == {"ok"}, rows
    emb = [r for r in rows if r["custom_id"] == "emb"]
    assert [(r["choice"], r["dimensions"]) for r in emb] == [(0, 8), (1, 8)]
    assert emb[0]["model"] == "mock" and emb[0]["prompt_tokens"] > 0 and emb[0]["answer"] is None
    assert next(r for r in rows if r["custom_id"] == "emb64")["dimensions"] == 4
    moderation = [r for r in rows if r["custom_id"] == "moderations-0"]
    assert [(r["flagged"], r["categories"]) for r in moderation] == [
        (False, []),
        (True, ["violence"]),
    ]
    chat_only = tmp_path / "chat.jsonl"
    chat_only.write_bytes(b"".join(x + b"\n" for x in out.read_bytes().splitlines()
                                   if b'"responses-0"' in x))  # fmt: skip
    assert cli("export", str(chat_only), "-o", str(tmp_path / "c.jsonl")).returncode == 0
    (row,) = [orjson.loads(x) for x in (tmp_path / "c.jsonl").read_bytes().splitlines()]
    assert "dimensions" not in row and "flagged" not in row  # text answers keep their columns

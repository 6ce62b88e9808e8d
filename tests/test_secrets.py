"""Secrets against hostile servers: whatever a server echoes, wherever the text goes (stderr,
status lines, saved bodies and messages, reports), no key and no head of a key comes out."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from batchutil import ENV, cli, exec_cli, read_results
from conftest import free_port

from jsonlbatch import redact as redact_module
from jsonlbatch.redact import redact, redact_line, register_secret

USER_KEY = "sk-user-Q7w9Zt4Kp2Xv8Lm3"
HEADER_VALUE = "hdr-R5n2Bq8Wc6Jy1Df4"  # a --header whose name says nothing secret
LOCAL_KEY = "local-H3k8Vn1Ps6Gt9Yb2"


def windows(secret: str, size: int = 6) -> list[str]:
    """Every `size`-character piece of `secret`: none may show, not even a cut-off head."""
    return [secret[i : i + size] for i in range(len(secret) - size + 1)]


def assert_hidden(text: str | bytes, *secrets: str) -> None:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    for secret in secrets:
        shown = [w for w in windows(secret) if w in text]
        assert not shown, f"{secret!r} leaks: {shown} in {text[:2000]!r}"


class Hostile:
    """A real server on 127.0.0.1 that echoes our credentials back in every way a careless or
    hostile server can; the request's first message picks the way."""

    def __init__(self, model: str = "mock") -> None:
        self.model = model
        self.auth_seen: list[str | None] = []
        self._loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/v1"
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    async def _models(self, request: web.Request) -> web.Response:
        self.auth_seen.append(request.headers.get("Authorization"))
        return web.json_response({"object": "list", "data": [{"id": self.model}]})

    async def _health(self, request: web.Request) -> web.Response:
        await asyncio.sleep(1.5)  # slow and unhealthy: a set-aside endpoint stays aside a while
        return web.Response(status=503)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.auth_seen.append(request.headers.get("Authorization"))
        body = await request.json()
        kind = body["messages"][0]["content"]
        echoed = dict(request.headers)
        auth = request.headers.get("Authorization", "")
        if kind == "echo-400":  # an error body that lists the request's headers
            error = {"message": "bad request", "type": "invalid_request_error"}
            return web.json_response({"error": error, "headers": echoed}, status=400)
        if kind == "cut-400":  # plain text whose echo of the key straddles our 500-char cut
            text = "x" * 470 + f" rejected Authorization={auth[7:]} and X-Trace={HEADER_VALUE}"
            return web.Response(text=text, status=400)
        if kind == "stream-echo":
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            error = {"error": {"message": f"auth header {auth} refused", "code": 401}}
            await resp.write(b"data: " + orjson.dumps(error) + b"\n\n")
            await resp.write_eof()
            return resp
        message = {"role": "assistant", "content": f"ok (you sent {echoed})"}
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "model": self.model,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    server = Hostile()
    yield server
    server.close()


def write_kinds(path: Path, *kinds: str) -> None:
    lines = [
        {
            "custom_id": f"{kind}-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "mock", "messages": [{"role": "user", "content": kind}]},
        }
        for i, kind in enumerate(kinds)
    ]
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))


def exec_with_user_credentials(tmp_path, hostile, kinds, *args, **kwargs):
    """exec of one request per kind against `hostile`, with USER_KEY and an X-Trace header."""
    write_kinds(tmp_path / "req.jsonl", *kinds)
    out = tmp_path / "out.jsonl"
    credentials = ("--api-key", USER_KEY, "--header", f"X-Trace={HEADER_VALUE}")
    proc = exec_cli(
        tmp_path / "req.jsonl", out, "--url", hostile.url, *credentials, *args, **kwargs
    )
    return proc, out


def test_echoed_credentials_never_reach_output_stderr_or_report(tmp_path, hostile):
    """Items 12 and 13: a 4xx body echoing our headers is saved masked (the rest of it kept);
    a key cut by the server's or our own truncation leaves no head behind; every --header value
    is a secret whatever its name; a 200 that echoes the key is masked too."""
    proc, out = exec_with_user_credentials(tmp_path, hostile, ["echo-400", "cut-400", "fine"])
    assert proc.returncode == 3, proc.stderr
    assert_hidden(proc.stderr + proc.stdout, USER_KEY, HEADER_VALUE)
    assert_hidden(out.read_bytes(), USER_KEY, HEADER_VALUE)
    results = read_results(out)
    echo = results["echo-400-0"]["response"]["body"]
    assert echo["error"]["message"] == "bad request"
    assert echo["headers"]["Authorization"] == "***"
    assert echo["headers"]["X-Trace"] == "***"
    assert results["cut-400-1"]["error"]["code"] == "http_400"
    assert (
        "ok (you sent" in results["fine-2"]["response"]["body"]["choices"][0]["message"]["content"]
    )
    report = cli("report", str(out), "--format", "json")
    assert report.returncode == 0, report.stderr
    assert_hidden(report.stdout + report.stderr, USER_KEY, HEADER_VALUE)


def test_stream_error_echoing_the_authorization_header(tmp_path, hostile):
    """Item 11: an error event that echoes `Authorization` is masked in the saved message and in
    the "waiting for a server" status that quotes why the endpoint was set aside."""
    write_kinds(tmp_path / "req.jsonl", *(["stream-echo"] * 4))
    out = tmp_path / "out.jsonl"
    proc = exec_cli(
        tmp_path / "req.jsonl",
        out,
        "--url",
        hostile.url,
        "--stream",
        "--max-retries",
        "50",
        "--backoff",
        "0.2",
        "--ready-timeout",
        "3",
        env={**ENV, "OPENAI_API_KEY": USER_KEY},
    )
    assert proc.returncode == 1, proc.stderr  # set aside, then never healthy again
    assert "failures in a row (error event in the stream: auth header Bearer ***" in proc.stderr
    assert_hidden(proc.stderr, USER_KEY)


@pytest.fixture
def not_http() -> Iterator[int]:
    """A port that answers every connection with bytes that are not HTTP."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1)
                try:
                    conn.recv(4096)
                    conn.sendall(b"HELLO\r\n\r\n")
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    server.close()


def test_waiting_status_and_aiohttp_errors_hide_secret_query_parameters(tmp_path, not_http):
    """Items 11 and 13: aiohttp's error text quotes the URL with its query; the "waiting for a
    server" status and the final error show neither `api_key` nor Azure Functions' `code`."""
    write_kinds(tmp_path / "req.jsonl", "fine")
    secret_code = "AzFn-Code-M4t8Rw2Ye6"
    url = f"http://127.0.0.1:{not_http}/v1?api-version=2024-06-01&code={secret_code}&api_key={USER_KEY}"
    proc = exec_cli(
        tmp_path / "req.jsonl", tmp_path / "out.jsonl", "--url", url, "--ready-timeout", "2"
    )
    assert proc.returncode == 1, proc.stderr
    assert "waiting for http://127.0.0.1" in proc.stderr  # the status was shown...
    assert "not an HTTP answer" in proc.stderr  # aiohttp >= 3.14 adds (Bad status line)
    assert_hidden(proc.stderr, USER_KEY, secret_code)  # ...masked
    assert "api-version=2024-06-01" in proc.stderr  # what is no secret stays readable


def test_each_endpoint_gets_its_own_key_with_serve(tmp_path, hostile):
    """Item 14: with --serve, the launched mock gets its --server-api-key and the given --url the
    user's --api-key; neither key is sent where it does not belong."""
    proc, out = exec_with_user_credentials(
        tmp_path,
        hostile,
        ["fine"] * 12,
        "--serve",
        "mock",
        "--port",
        str(free_port()),  # not the default 8000, which other runs on the machine may hold
        "--server-api-key",
        LOCAL_KEY,
        "-c",
        "4",
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr  # the mock refuses any other key: it got its own
    assert hostile.auth_seen and set(hostile.auth_seen) == {f"Bearer {USER_KEY}"}
    endpoints = {line["metrics"]["endpoint"] for line in read_results(out).values()}
    assert hostile.url in endpoints and len(endpoints) == 2  # both were used
    assert_hidden(proc.stderr + out.read_text(), USER_KEY, LOCAL_KEY, HEADER_VALUE)
    log = next(tmp_path.glob("out.jsonl.server*.log")).read_text()
    assert_hidden(log, USER_KEY, HEADER_VALUE)  # the user's credentials never reach the mock


def test_a_malformed_header_is_not_quoted_back(tmp_path):
    write_kinds(tmp_path / "req.jsonl", "fine")
    proc = exec_cli(
        tmp_path / "req.jsonl",
        tmp_path / "out.jsonl",
        "--url",
        "http://127.0.0.1:9/v1",
        "--header",
        f"X-Trace: {HEADER_VALUE}",  # a colon for the `=`
    )
    assert proc.returncode == 2
    assert "--header wants KEY=VALUE" in proc.stderr
    assert_hidden(proc.stderr, HEADER_VALUE)


# -- the rules themselves ---------------------------------------------------------------------


@pytest.fixture
def registered() -> Iterator[None]:
    saved = set(redact_module._secrets), redact_module._secret_bytes
    forms = getattr(redact_module, "_secret_forms", ())
    register_secret(USER_KEY)
    yield
    redact_module._secrets, redact_module._secret_bytes = saved
    redact_module._secret_forms = forms


@pytest.mark.usefixtures("registered")
def test_masking_comes_before_cutting():
    text = "y" * 90 + USER_KEY
    assert redact(text, limit=100) == "y" * 90 + "***"
    assert_hidden(redact(text[:100]), USER_KEY)  # a head another program cut is masked too


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("Authorization: Bearer abc.def-ghi", "Authorization: Bearer ***"),
        ('{"api-key": "zz-99-yy"}', '{"api-key": "***"}'),
        ("x-api-key=qwerty123", "x-api-key=***"),
        ("GET /x?sig=AbC%2Bd&sv=2020", "GET /x?sig=***&sv=2020"),
        ("https://h/api?code=abcdef==&name=x", "https://h/api?code=***&name=x"),
        (
            "https://h/?X-Amz-Credential=AKIA/2024&X-Amz-Signature=ff00",
            "https://h/?X-Amz-Credential=***&X-Amz-Signature=***",
        ),
        ("cookie: session=abc123", "cookie: ***"),
    ],
)
def test_credential_shapes_are_masked_wherever_they_come_from(text, masked):
    assert redact(text) == masked


@pytest.mark.parametrize(
    "text",
    [
        "max_tokens=100 prompt_tokens: 20 error code: 400",
        "the bearer of bad news",
        "Basic idea",
        "see https://h/v1?api-version=2024-06-01&page=2",
    ],
)
def test_ordinary_text_is_left_alone(text):
    assert redact(text) == text


@pytest.mark.usefixtures("registered")
def test_saved_lines_keep_their_bytes_unless_a_secret_is_in_them():
    clean = b'{"a":1.50,"n":123456789012345678901234567890}\n'
    assert redact_line(clean, thorough=False) is clean
    assert redact_line(clean, thorough=True) is clean
    leaky = b'{"n":123456789012345678901234567890,"t":"' + USER_KEY.encode() + b'"}\n'
    assert redact_line(leaky, thorough=False) == b'{"n":123456789012345678901234567890,"t":"***"}\n'
    assert redact_line(b'{"t":"Bearer abcdefgh"}\n', thorough=False) == b'{"t":"Bearer abcdefgh"}\n'
    assert redact_line(b'{"t":"Bearer abcdefgh"}\n', thorough=True) == b'{"t":"Bearer ***"}\n'


@pytest.mark.usefixtures("registered")
def test_library_errors_are_masked_wherever_they_are_printed():
    """A library user may log our exceptions as they are: their text is masked too."""
    from jsonlbatch.errors import InputError, Problem, ServerUnavailableError

    error = ServerUnavailableError(
        f"no server answered (url='http://h/v1?code=abc123&k={USER_KEY}')"
    )
    assert "abc123" not in str(error) and USER_KEY not in str(error)
    problem = InputError("bad input", [Problem("f.jsonl", 3, "body", f"echoes Bearer {USER_KEY}")])
    assert_hidden(str(problem), USER_KEY)


@pytest.mark.usefixtures("registered")
def test_encoded_forms_of_a_registered_secret_are_masked():
    """base64 (at each of its three alignments, standard and URL-safe) and %-encoding: a server
    that echoes `Basic base64(user:key)`, a JSON blob encoded whole, or a key in a URL path."""
    import base64
    import urllib.parse

    for before in ("", "u", "us", "user:", '{"key": "'):
        blob = base64.b64encode((before + USER_KEY + '"}').encode()).decode()
        for text in (blob, blob.replace("+", "-").replace("/", "_")):
            masked = redact(f"token blob {text} end")
            assert "***" in masked and text not in masked, (before, text)
    quoted = urllib.parse.quote(USER_KEY + "/+ x", safe="")
    register_secret(USER_KEY + "/+ x")
    assert quoted not in redact(f"GET /files/{quoted}/content") and "***" in redact(quoted)
    encoded = base64.b64encode(b"me:" + USER_KEY.encode()).decode()
    saved = redact_line(('{"error": "' + encoded + '"}\n').encode(), thorough=False)
    assert encoded not in saved.decode() and b"***" in saved  # a saved line too
    assert redact("an ordinary answer: dGhpcyBpcyBmaW5l") == "an ordinary answer: dGhpcyBpcyBmaW5l"

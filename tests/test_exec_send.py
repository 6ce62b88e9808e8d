"""`Sender.send` (exec/send/sender.py) in-process: one request's attempts against a scripted server.

Each test scripts the server's answers (`sendutil.ScriptedServer`: real HTTP on 127.0.0.1 in
the test's own loop) and checks what `send` returns, what reached the server and which events
were emitted. Only the public behaviour is tested (the result, the events, the summary's retry
count), so the attempt loop's inner layers may be rearranged freely.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest
from conftest import free_port
from sendutil import Reply, ScriptedServer, chat_answer, request, sender

from jsonlbatch.errors import AuthenticationError
from jsonlbatch.exec.hooks.check_hook import Accept, AnswerToCheck, AskAgain, CheckVerdict, Reject
from jsonlbatch.exec.output.events import RateLimited, Retried, Sent
from jsonlbatch.exec.send.body_caps import TOO_LARGE
from jsonlbatch.exec.send.sender import Stop


def line(result) -> dict:
    """The output line a result makes, decoded."""
    return orjson.loads(result.to_line())


async def test_a_usable_answer_is_kept_byte_for_byte_with_its_metrics() -> None:
    big = 2**70  # beyond 64 bits: re-encoding through a float would change it
    raw = orjson.dumps(chat_answer("hello", prompt_tokens=7, completion_tokens=2))
    raw = raw[:-1] + b',"seed":' + str(big).encode() + b"}"
    async with (
        ScriptedServer(Reply(body=raw, headers={"x-request-id": "req-abc"})) as server,
        sender([server.url]) as s,
    ):
        result = await s.send(request("a"))
    assert result.ok and result.status_code == 200 and result.request_id == "req-abc"
    assert f'"seed":{big}'.encode() in result.to_line()
    assert result.metrics["attempts"] == 1
    assert result.metrics["endpoint"] == server.url
    assert result.metrics["prompt_tokens"] == 7 and result.metrics["completion_tokens"] == 2
    assert server.posts == [request("a").body]
    assert [type(e) for e in s.events] == [Sent] and s.events[0].attempt == 1
    assert s.summary.retries == 0


async def test_transient_errors_are_retried_until_an_answer() -> None:
    script = [Reply(500, {"error": {"message": "boom"}}), Reply(502, b"bad gateway"), Reply()]
    async with ScriptedServer(*script) as server, sender([server.url]) as s:
        result = await s.send(request("a"))
    assert result.ok and result.metrics["attempts"] == 3
    assert len(server.posts) == 3 and s.summary.retries == 2
    retried = [e for e in s.events if isinstance(e, Retried)]
    assert [(e.attempt, e.reason) for e in retried] == [(1, "http_500"), (2, "http_502")]
    assert [e.attempt for e in s.events if isinstance(e, Sent)] == [1, 2, 3]


async def test_the_last_transient_error_is_written_after_max_retries() -> None:
    script = [Reply(500, {"error": {"message": f"boom {i}"}}) for i in range(3)]
    async with (
        ScriptedServer(*script, Reply()) as server,
        sender([server.url], max_retries=2) as s,
    ):
        result = await s.send(request("a"))
    assert len(server.posts) == 3  # the answer scripted fourth is never asked for
    out = line(result)
    assert out["error"] == {"code": "http_500", "message": "boom 2"}
    assert out["response"]["status_code"] == 500 and result.metrics["attempts"] == 3


async def test_a_client_error_is_final_at_once() -> None:
    refusal = {"error": {"message": "temperature must be at most 2"}}
    async with ScriptedServer(Reply(400, refusal)) as server, sender([server.url]) as s:
        result = await s.send(request("a"))
    assert len(server.posts) == 1 and s.summary.retries == 0
    assert result.error == {"code": "http_400", "message": "temperature must be at most 2"}
    assert result.body == refusal  # the server's body is kept beside the error


async def test_a_context_length_error_dressed_as_a_500_is_final() -> None:
    words = {"error": {"message": "This model's maximum context length is 4096 tokens"}}
    async with ScriptedServer(Reply(500, words)) as server, sender([server.url]) as s:
        result = await s.send(request("a"))
    assert len(server.posts) == 1 and result.error["code"] == "http_500"


async def test_rejected_credentials_stop_the_run() -> None:
    async with (
        ScriptedServer(Reply(401, {"error": "Unauthorized"})) as server,
        sender([server.url]) as s,
    ):
        with pytest.raises(AuthenticationError, match=r"rejected the credentials \(HTTP 401\)"):
            await s.send(request("a"))
    assert len(server.posts) == 1


async def test_a_429_is_retried_and_reported_with_its_retry_after() -> None:
    limited = Reply(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "0"})
    async with ScriptedServer(limited, Reply()) as server, sender([server.url]) as s:
        result = await s.send(request("a"))
    assert result.ok and result.metrics["attempts"] == 2
    rate_limited = [e for e in s.events if isinstance(e, RateLimited)]
    assert [(e.custom_id, e.retry_after) for e in rate_limited] == [("a", 0.0)]


async def test_a_200_without_an_answer_is_retried_then_written_without_a_response() -> None:
    empty = [Reply(200, {}), Reply(200, {"error": {"message": "upstream failed"}})]
    async with ScriptedServer(*empty) as server, sender([server.url], max_retries=1) as s:
        result = await s.send(request("a"))
    assert len(server.posts) == 2
    out = line(result)
    assert out["response"] is None and out["error"]["code"] == "invalid_response"
    assert "upstream failed" in out["error"]["message"]


async def test_an_answer_too_large_is_final_without_a_retry() -> None:
    huge = chat_answer("x" * 4096)
    async with (
        ScriptedServer(Reply(body=huge)) as server,
        sender([server.url], max_response_bytes=1024) as s,
    ):
        result = await s.send(request("a"))
    assert len(server.posts) == 1 and result.error["code"] == TOO_LARGE
    assert result.status_code is None and s.summary.retries == 0


async def test_one_dropped_keep_alive_connection_costs_no_attempt_a_second_does() -> None:
    # rate_limits off: the learning limiter holds a retry until a first answer came (2 s)
    async with (
        ScriptedServer(Reply(drop=True), Reply()) as server,
        sender([server.url], rate_limits=False) as s,
    ):
        result = await s.send(request("a"))
    assert result.ok and result.metrics["attempts"] == 1 and len(server.posts) == 2
    script = [Reply(drop=True), Reply(drop=True), Reply()]
    async with ScriptedServer(*script) as server, sender([server.url], rate_limits=False) as s:
        result = await s.send(request("b"))
    assert result.ok and result.metrics["attempts"] == 2 and len(server.posts) == 3
    assert [e.reason for e in s.events if isinstance(e, Retried)] == ["connection_error"]


async def test_a_refused_connection_waits_for_the_server_without_using_an_attempt() -> None:
    port = free_port()
    async with sender([f"http://127.0.0.1:{port}/v1"], max_retries=0, rate_limits=False) as s:
        sending = asyncio.ensure_future(s.send(request("a")))
        await asyncio.sleep(0.3)  # refused meanwhile: the endpoint is set aside and probed
        assert not sending.done()
        async with ScriptedServer(port=port) as server:
            result = await asyncio.wait_for(sending, 10)
    assert result.ok and result.metrics["attempts"] == 1  # max_retries 0: one attempt allowed
    assert len(server.posts) == 1 and "/health" in server.gets


async def test_a_check_rejects_or_asks_again_with_a_new_body() -> None:
    def check(answer: AnswerToCheck) -> CheckVerdict:
        req = answer.request
        assert answer.body()["choices"][0]["message"]["content"] == "hi"
        if req.custom_id == "bad":
            return Reject("not JSON", code="schema_mismatch")
        if len(req.body["messages"]) == 1:
            more = [*req.body["messages"], {"role": "user", "content": "in JSON, please"}]
            return AskAgain({**req.body, "messages": more}, "not JSON yet")
        return Accept()

    async with ScriptedServer() as server, sender([server.url], check=check) as s:
        rejected = await s.send(request("bad"))
        asked = await s.send(request("good"))
    assert line(rejected)["response"] is None
    assert rejected.error == {"code": "schema_mismatch", "message": "not JSON"}
    assert asked.ok and asked.metrics["attempts"] == 2
    assert [len(body["messages"]) for body in server.posts] == [1, 1, 2]
    assert [e.reason for e in s.events if isinstance(e, Retried)] == ["not JSON yet"]


async def test_asking_again_ends_as_the_checks_failure_after_max_retries() -> None:
    def never(answer: AnswerToCheck) -> CheckVerdict:
        return AskAgain(answer.request.body, "still wrong")

    async with ScriptedServer() as server, sender([server.url], max_retries=2, check=never) as s:
        result = await s.send(request("a"))
    assert result.error == {"code": "check_failed", "message": "still wrong"}
    assert result.metrics["attempts"] == 3 and len(server.posts) == 3


async def test_fit_context_resends_once_with_the_output_cap_that_fits() -> None:
    words = (
        "This model's maximum context length is 100 tokens. However, you requested 130 tokens "
        "(30 in the messages, 100 in the completion)."
    )
    async with (
        ScriptedServer(Reply(400, {"error": {"message": words}}), Reply()) as server,
        sender([server.url], fit_context=True) as s,
    ):
        fitted = await s.send(request("a", max_tokens=100))
    assert fitted.ok and [body["max_tokens"] for body in server.posts] == [100, 70]
    assert fitted.metrics["fit_context"] == {"max_tokens": 70, "asked": 100}
    # the cut request is refused again, as if the prompt took more than the server said
    tighter = words.replace("(30 in the messages", "(40 in the messages")
    script = [Reply(400, {"error": {"message": m}}) for m in (words, tighter)]
    async with (
        ScriptedServer(*script) as server,
        sender([server.url], fit_context=True) as s,
    ):
        again = await s.send(request("b", max_tokens=100))
        other = await s.send(request("c", max_tokens=100))
    # b: cut once, and the cut request's refusal is final (no second cut); c keeps its own cap
    assert again.error["code"] == "http_400" and again.metrics["fit_context"]["max_tokens"] == 70
    assert [body["max_tokens"] for body in server.posts] == [100, 70, 100]
    assert other.ok and "fit_context" not in other.metrics


async def test_a_stopping_run_sends_nothing_more() -> None:
    async with ScriptedServer() as server, sender([server.url]) as s:
        s.stopping.set()
        with pytest.raises(Stop):
            await s.send(request("a"))
    assert server.posts == []


async def test_a_stopping_run_gives_up_a_backoff_at_once() -> None:
    async with (
        ScriptedServer(Reply(500)) as server,
        sender([server.url], backoff_base=30.0, backoff_cap=60.0) as s,
    ):
        sending = asyncio.ensure_future(s.send(request("a")))
        while not server.posts:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # in its 15-30 s backoff now
        s.stopping.set()
        with pytest.raises(Stop):
            await asyncio.wait_for(sending, 5)
    assert len(server.posts) == 1 and s.sender.retrying == 0

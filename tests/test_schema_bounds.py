"""Schemas as hostile input (issue 37): checked once, up front, with bounds; refused with file,
line and field before anything is sent; an answer check that cannot finish in time is that
answer's failure, not a hang.

The bombs are small: limits are lowered through `JSONLBATCH_SCHEMA_LIMITS` where a default
limit would need a big file, and the subprocesses that hung on the old code have a timeout.
"""

from __future__ import annotations

import gc
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from batchutil import ENV, cli, exec_cli, odd_server, read_results, start_cli

from jsonlbatch.answer_contract.contract import SchemaError, check_choice, compile_schema
from jsonlbatch.answer_contract.schema_bounds import ENV_VAR, parse_limits
from jsonlbatch.answer_contract.schema_forms import with_schema
from jsonlbatch.batch_format.records import CHAT_URL
from jsonlbatch.errors import UsageError

SLOW = "^(a|aa)+$"  # backtracks without end on "aaa...ab" (in `re` as in `regex`)
LOOP = {"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}]}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}},
        "$ref": "#/$defs/a"}  # fmt: skip


def nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def request(cid: str, schema: dict[str, Any]) -> bytes:
    body = {"model": "mock", "messages": [{"role": "user", "content": cid}], "max_tokens": 20}
    line = {"custom_id": cid, "method": "POST", "url": CHAT_URL,
            "body": with_schema(CHAT_URL, body, schema)}  # fmt: skip
    return json.dumps(line).encode() + b"\n"  # orjson writes at most 255 levels


class Counter:
    """A server on 127.0.0.1 that counts GETs (a remote $ref's fetch) and answers chat
    completions with `content`; `asked` is set at the first chat request."""

    def __init__(self, content: str = "{}") -> None:
        from aiohttp import web

        self.fetched = 0
        self.chats = 0
        self.asked = threading.Event()

        async def chat(request: web.Request) -> web.Response:
            self.chats += 1
            self.asked.set()
            message = {"role": "assistant", "content": content}
            return web.json_response({"id": "c", "object": "chat.completion", "model": "mock",
                                      "choices": [{"index": 0, "message": message,
                                                   "finish_reason": "stop"}],
                                      "usage": {"prompt_tokens": 1, "completion_tokens": 1}})  # fmt: skip

        async def schema(request: web.Request) -> web.Response:
            self.fetched += 1
            return web.json_response({"type": "object"})

        self.url, self.stop = odd_server(chat)
        # a second route on the same app is not offered by odd_server: a second server
        self.ref_url, self.ref_stop = _getter(schema)


def _getter(handler: Any) -> tuple[str, Any]:
    from aiohttp import web
    from batchutil import serve_app

    app = web.Application()
    app.router.add_get("/{name}", handler)
    return serve_app(app)


def test_schema_bombs_are_refused_up_front_with_file_line_and_field(tmp_path: Path):
    """A $ref loop (sent, paid for, then a RecursionError traceback), a schema 150 objects
    deep (a traceback in validate and exec), a remote $ref (fetched by exec, twice), an enum
    and a pattern past their limits: each line refused by validate and exec, nothing sent,
    nothing fetched."""
    server = Counter()
    try:
        remote = {"type": "object", "properties": {"x": {"$ref": f"{server.ref_url}/s.json"}}}
        bombs = [("loop", LOOP), ("deep", nested(150)), ("remote", remote),
                 ("enum", {"enum": [f"v{i}" for i in range(300)]}),
                 ("pattern", {"type": "string", "pattern": "a" * 80}),
                 ("ok", {"type": "object"})]  # fmt: skip
        req = tmp_path / "req.jsonl"
        req.write_bytes(b"".join(request(cid, schema) for cid, schema in bombs))
        env = {**ENV, ENV_VAR: "enum=200,pattern=50"}
        field = "body.response_format.json_schema.schema"
        for proc in (
            cli("validate", str(req), env=env, timeout=60),
            exec_cli(req, tmp_path / "out.jsonl", "--url", server.url, env=env, timeout=60),
        ):
            assert proc.returncode == 1, proc.stderr
            assert "Traceback" not in proc.stderr
            text = proc.stdout + proc.stderr
            for line, says in ((1, "a $ref loop"), (2, "the schema nests more than 48 levels"),
                               (3, f"$ref '{server.ref_url}/s.json' points outside"),
                               (4, "an enum of 300 entries, more than the 200 allowed"),
                               (5, "a pattern of 80 characters, more than the 50 allowed")):  # fmt: skip
                assert f"req.jsonl:{line}: {field}: {says}" in text, text
            assert "req.jsonl:6" not in text
        assert server.chats == 0 and server.fetched == 0
        assert not (tmp_path / "out.jsonl").exists()
        gen_schema = tmp_path / "loop.json"
        gen_schema.write_bytes(orjson.dumps(LOOP))
        data = tmp_path / "d.jsonl"
        data.write_bytes(b'{"q": "x"}\n')
        gen = cli("gen", "--data", str(data), "--prompt", "{{ q }}", "--model", "m", "--schema",
                  str(gen_schema), "-o", str(tmp_path / "g.jsonl"))  # fmt: skip
        assert gen.returncode == 1 and "loop.json: a $ref loop" in gen.stderr, gen.stderr
        assert "Traceback" not in gen.stderr
    finally:
        server.stop()
        server.ref_stop()


def test_bounds_in_process():
    with pytest.raises(SchemaError, match="a \\$ref loop"):
        compile_schema({"$ref": "#"})
    with pytest.raises(SchemaError, match="nests more than 48"):
        compile_schema(nested(30))  # 61 levels of objects
    with pytest.raises(SchemaError, match="points nowhere"):
        compile_schema({"$ref": "#/$defs/gone"})
    with pytest.raises(SchemaError, match="not a valid pattern"):
        compile_schema({"pattern": "(unclosed"})
    # recursive schemas that go down into the answer, anchors, Pydantic's $defs: all fine
    tree = compile_schema({"type": "object", "properties": {"kids": {"items": {"$ref": "#"}}}})
    assert tree.check({"kids": [{"kids": []}]}) is None
    assert "is not of type" in (tree.check({"kids": [1]}) or "")
    anchored = compile_schema({"$defs": {"s": {"$anchor": "S", "type": "string"}},
                               "properties": {"p": {"$ref": "#S"}}})  # fmt: skip
    assert anchored.check({"p": 1}) is not None and anchored.check({"p": "x"}) is None
    matched = compile_schema({"type": "object", "patternProperties": {"^x": {"type": "integer"}},
                              "additionalProperties": False})  # fmt: skip
    assert matched.check({"x1": 1}) is None
    assert "is not of type" in (matched.check({"x1": "s"}) or "")
    assert "not allowed" in (matched.check({"y": 1}) or "")
    # an answer is hostile too: nested past what a reader recurses through. Earlier tests'
    # garbage is collected first: a finalizer run deep in the recursion below (an unclosed
    # client's warning) fails to format its own traceback, a failure of the test, not of jsonlbatch
    gc.collect()
    deep = compile_schema({"type": "array", "items": {"$ref": "#"}})
    assert check_choice(deep, "Here: " + "[" * 5000 + "]" * 5000).error == (
        "the JSON value nests too deeply to be read"
    )
    assert "nests too deeply" in (check_choice(deep, "[" * 1000 + "]" * 1000).error or "")
    assert parse_limits("enum=5, seconds=0.5").enum == 5
    for bad in ("enum=lots", "seconds=nan", "seconds=inf", "depth=0", "size=5"):
        with pytest.raises(UsageError, match=ENV_VAR):
            parse_limits(bad)


def test_a_pattern_that_backtracks_is_that_answer_s_failure(tmp_path: Path):
    """`^(a|aa)+$` against 50 a's and a b hung exec at 100% CPU, deaf to SIGTERM; now the check
    ends at its time limit and the answer is a failure saying why."""
    server = Counter(orjson.dumps({"s": "a" * 50 + "b"}).decode())
    try:
        req = tmp_path / "req.jsonl"
        schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": SLOW}}}
        req.write_bytes(request("slow", schema))
        out = tmp_path / "out.jsonl"
        env = {**ENV, ENV_VAR: "seconds=0.2"}
        proc = exec_cli(req, out, "--url", server.url, env=env, timeout=90)
        assert "Traceback" not in proc.stderr
        line = read_results(out)["slow"]
        assert line["error"]["code"] == "schema_invalid", line
        assert "did not finish within 0.2 s" in line["error"]["message"]
    finally:
        server.stop()
        server.ref_stop()


def test_sigterm_stops_a_run_checking_a_slow_pattern(tmp_path: Path):
    """SIGTERM while an answer's pattern is being checked: the check ends at its limit, then
    the run stops (the old code never ended); the requests not sent yet are left."""
    server = Counter(orjson.dumps({"s": "a" * 60 + "b"}).decode())
    try:
        req = tmp_path / "req.jsonl"
        schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": SLOW}}}
        req.write_bytes(b"".join(request(f"slow{i}", schema) for i in range(3)))
        env = {**ENV, ENV_VAR: "seconds=1"}
        proc = start_cli("exec", str(req), "-o", str(tmp_path / "out.jsonl"), "--url",
                         server.url, "-c", "1", env=env)  # fmt: skip
        assert server.asked.wait(60)
        time.sleep(0.3)  # the answer is being checked
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode != 0 and "Traceback" not in stderr, stderr
        assert "interrupted" in stderr and server.chats < 3, stderr
    finally:
        server.stop()
        server.ref_stop()


def test_unique_items_over_objects_is_one_pass():
    """jsonschema compares objects pairwise for uniqueItems, inside one keyword where no clock
    looks: 20,000 of them took minutes. One pass with a set, JSON's equality kept."""
    from jsonlbatch.answer_contract.contract import Contract

    slow = Contract({"type": "array", "uniqueItems": True}, fast=False)
    assert slow.check([{"i": i, "tags": [i, "x"]} for i in range(20_000)]) is None
    assert "non-unique" in (slow.check([{"a": 1, "b": [1.0]}, {"b": [1], "a": 1}]) or "")
    assert slow.check([{"a": True}, {"a": 1}]) is None  # true is not 1
    assert slow.check([[1, 2], [2, 1]]) is None and slow.check([None, False]) is None


MEASURE = """
import resource, subprocess, sys
subprocess.run([sys.executable, "-m", "jsonlbatch", "validate", sys.argv[1]], check=True,
               capture_output=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss in KB is Linux's")
def test_a_big_enum_is_not_compiled_to_code(tmp_path: Path):
    """The fast validator compiled a 200,000-entry enum into 1.4 GB; 30,000 entries took
    227 MB and 6 s in `validate`. Big schemas go to jsonschema (26 MB here)."""
    pytest.importorskip("fastjsonschema")
    req = tmp_path / "req.jsonl"
    req.write_bytes(request("big", {"enum": [f"value-{i}" for i in range(30_000)]}))
    done = subprocess.run([sys.executable, "-c", MEASURE, str(req)], capture_output=True,
                          text=True, timeout=120, env=ENV)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) < 120 * 1024, f"{int(done.stdout) // 1024} MB"

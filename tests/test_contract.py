"""The answer contract's core: schema forms per endpoint, stripping rules, validation, the mock's
JSON answers and `gen --schema` (real files, the real CLI in a subprocess)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import orjson
import pytest
from batchutil import cli
from contractutil import GOOD, SCHEMA

from jsonlbatch.answer_contract.contract import (
    SchemaError,
    check_choice,
    check_choices,
    compile_schema,
    strip_json,
)
from jsonlbatch.answer_contract.schema_forms import ANY_OBJECT, declared_schema, with_schema
from jsonlbatch.batch_format.records import (
    CHAT_URL,
    COMPLETIONS_URL,
    MESSAGES_URL,
    RESPONSES_URL,
    parse_request,
)
from jsonlbatch.gen import RequestWriter
from jsonlbatch.mock.content import BREAKS, compose, json_answer

#: Nested objects, a `$ref` into `$defs`, an optional (nullable) field, an enum, an array.


@pytest.mark.parametrize("url", [CHAT_URL, COMPLETIONS_URL, RESPONSES_URL, MESSAGES_URL])
def test_every_endpoint_form_round_trips(url):
    body = with_schema(url, {"model": "m"}, SCHEMA, name="rec")
    found = declared_schema(url, body)
    assert found is not None and found.schema == SCHEMA
    where = {CHAT_URL: "response_format", COMPLETIONS_URL: "response_format",
             RESPONSES_URL: "text", MESSAGES_URL: "output_config"}[url]  # fmt: skip
    assert found.field.startswith(f"body.{where}")
    if url == MESSAGES_URL:
        assert body["output_config"] == {"format": {"type": "json_schema", "schema": SCHEMA}}
    elif url == RESPONSES_URL:
        assert body["text"]["format"]["name"] == "rec" and body["text"]["format"]["strict"]


def test_other_declarations_are_honoured():
    assert (
        declared_schema(CHAT_URL, {"response_format": {"type": "json_object"}}).schema == ANY_OBJECT
    )
    assert declared_schema(CHAT_URL, {"response_format": {"type": "text"}}) is None
    assert (
        declared_schema(
            CHAT_URL, {"structured_outputs": {"json": orjson.dumps(SCHEMA).decode()}}
        ).schema
        == SCHEMA
    )
    assert declared_schema(CHAT_URL, {"guided_json": SCHEMA}).schema == SCHEMA
    tool = {
        "tools": [{"name": "rec", "input_schema": SCHEMA}],
        "tool_choice": {"type": "tool", "name": "rec"},
    }
    found = declared_schema(MESSAGES_URL, tool)
    assert found.schema == SCHEMA and found.tool == "rec"
    assert declared_schema("/v1/embeddings", {"response_format": {"type": "json_object"}}) is None
    with pytest.raises(SchemaError) as info:
        declared_schema(
            CHAT_URL, {"response_format": {"type": "json_schema", "json_schema": {"schema": 3}}}
        )
    assert info.value.field == "body.response_format.json_schema.schema"
    with pytest.raises(SchemaError):
        with_schema("/v1/embeddings", {}, SCHEMA)


@pytest.mark.parametrize(
    ("text", "valid", "says"),
    [
        (orjson.dumps(GOOD).decode(), True, None),
        ("```json\n" + orjson.dumps(GOOD).decode() + "\n```", True, None),
        ("```\n" + orjson.dumps(GOOD).decode() + "\n```\n", True, None),
        ("Sure [1]! Here it is:\n" + orjson.dumps(GOOD).decode(), True, None),
        ("<think>a {draft}</think>\n" + orjson.dumps(GOOD).decode(), True, None),
        ("<think>still thinking", False, "only reasoning"),
        (orjson.dumps(GOOD).decode() + "\nHope this helps!", False, "text after the JSON value"),
        (
            "```json\n" + orjson.dumps(GOOD).decode() + "\n```\nAnything else?",
            False,
            "after the JSON code block",
        ),
        (orjson.dumps(GOOD).decode()[:25], False, "cut short"),
        (
            '{"label": "pos", "score": "high", "who": {"name": "A", "age": 1}, "tags": []}',
            False,
            "$.score",
        ),
        (
            '{"label": "pos", "score": 1, "who": {"name": "A", "age": "x"}, "tags": []}',
            False,
            "$.who.age",
        ),
        (
            '{"label": "pos", "score": 1, "who": {"name": "A", "age": 1}}',
            False,
            "'tags' is a required",
        ),
        ("no json at all", False, "no JSON value"),
        ("", False, "empty"),
    ],
)
def test_stripping_rules_and_validation(text, valid, says):
    verdict = check_choice(compile_schema(SCHEMA), text)
    assert verdict.valid is valid, verdict
    if says:
        assert says in verdict.error
    if valid:
        assert verdict.value == GOOD


def test_invalid_schema_and_compile_once():
    with pytest.raises(SchemaError, match="not a valid JSON Schema"):
        compile_schema({"type": "objekt"})
    assert compile_schema(dict(SCHEMA)) is compile_schema(orjson.loads(orjson.dumps(SCHEMA)))
    assert strip_json("[1, 2]", "array") == [1, 2]


def test_choices_of_each_endpoint_are_judged():
    contract = compile_schema(SCHEMA)
    text = orjson.dumps(GOOD).decode()
    chat = {"choices": [{"message": {"content": text}}, {"message": {"content": "nope"}}]}
    assert [v.valid for v in check_choices(contract, chat)] == [True, False]
    responses = {
        "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}]
    }
    messages = {"type": "message", "content": [{"type": "text", "text": text}]}
    tool = {
        "type": "message",
        "content": [{"type": "tool_use", "id": "t", "name": "rec", "input": GOOD}],
    }
    for body in (responses, messages, tool):
        assert [
            v.valid for v in check_choices(contract, body, "rec" if body is tool else None)
        ] == [True]


def test_mock_answers_hold_the_schema_and_breaks_are_deterministic():
    contract = compile_schema(SCHEMA)
    kinds: Counter[str] = Counter()
    for i in range(600):
        body = with_schema(
            CHAT_URL, {"model": "m", "messages": [{"role": "user", "content": str(i)}]}, SCHEMA
        )
        clean = json_answer(SCHEMA, body)
        assert check_choice(contract, clean).valid
        broken = json_answer(SCHEMA, body, break_json=0.5)
        assert broken == json_answer(SCHEMA, body, break_json=0.5)  # same request, same answer
        if broken != clean:
            kinds[check_choice(contract, broken).valid] += 1
        assert json_answer(SCHEMA, {**body, "seed": 7}) != clean or i > 3  # a new seed draws anew
    broken_share = (kinds[True] + kinds[False]) / 600
    assert 0.4 < broken_share < 0.6
    assert 0.2 < kinds[True] / (kinds[True] + kinds[False]) < 0.45  # fences and prose: recovered
    assert len(BREAKS) == 6
    reply = compose(with_schema(CHAT_URL, {"model": "m", "messages": [], "max_tokens": 3}, SCHEMA))
    assert reply.finish_reason == "length" and len(reply.content) == 3


def test_writer_takes_schema_and_pydantic_model(tmp_path):
    pydantic = pytest.importorskip("pydantic")

    class Item(pydantic.BaseModel):
        name: str
        qty: int

    out = tmp_path / "r.jsonl"
    with RequestWriter(out, model="m", url=RESPONSES_URL, schema=Item) as w:
        w.add("a", "hi")
        w.add("b", "hi", schema=SCHEMA)
        w.add("c", "hi", schema=orjson.dumps(SCHEMA).decode())
    lines = [parse_request(raw, path=str(out), line=1) for raw in out.read_bytes().splitlines()]
    forms = [line.body["text"]["format"] for line in lines]
    assert forms[0]["schema"]["properties"]["qty"] == {"title": "Qty", "type": "integer"}
    assert forms[0]["strict"] is False  # pydantic's schema is not closed: strict would be a 400
    assert forms[1]["schema"] == forms[2]["schema"] == SCHEMA and forms[1]["strict"] is True


def test_gen_cli_schema_file_row_schemas_and_bad_schemas(tmp_path):
    (tmp_path / "s.json").write_bytes(orjson.dumps(SCHEMA))
    rows = [{"q": "a", "s": ""}, {"q": "b", "s": orjson.dumps({"type": "integer"}).decode()}]
    data = tmp_path / "d.jsonl"
    data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    out = tmp_path / "r.jsonl"
    proc = cli("gen", "--data", data, "--prompt", "{{ q }}", "--model", "m", "--url", MESSAGES_URL,
               "--max-tokens", "50", "--schema", tmp_path / "s.json", "--schema-field", "s", "-o", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    bodies = [orjson.loads(x)["body"] for x in out.read_bytes().splitlines()]
    assert [b["output_config"]["format"]["schema"] for b in bodies] == [SCHEMA, {"type": "integer"}]

    (tmp_path / "bad.json").write_bytes(b'{"type": "objekt"}')
    proc = cli("gen", "--data", data, "--prompt", "x", "--model", "m", "--schema",
               tmp_path / "bad.json", "-o", tmp_path / "r2.jsonl")  # fmt: skip
    assert proc.returncode == 1 and "bad.json: not a valid JSON Schema" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "r2.jsonl").exists()

    data.write_bytes(b'{"q": "a", "s": "{\\"type\\": 5}"}\n')
    proc = cli("gen", "--data", data, "--prompt", "x", "--model", "m", "--schema-field", "s",
               "-o", tmp_path / "r3.jsonl")  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "d.jsonl:1: s: row 0: not a valid JSON Schema" in proc.stderr


def test_fast_path_agrees_with_jsonschema():
    """fastjsonschema (the `fast` extra) only speeds the check up: every verdict is jsonschema's."""
    pytest.importorskip("fastjsonschema")
    from jsonlbatch.answer_contract.contract import Contract
    from jsonlbatch.answer_contract.schema_bounds import fast_safe

    fast, slow = Contract(SCHEMA), Contract(SCHEMA, fast=False)
    assert fast._fast is not None and slow._fast is None
    for i in range(300):
        body = {"model": "m", "messages": [{"role": "user", "content": str(i)}]}
        verdicts = [
            check_choice(c, json_answer(SCHEMA, body, break_json=0.8)) for c in (fast, slow)
        ]
        assert verdicts[0] == verdicts[1]
    assert not fast_safe({"type": "string", "format": "date"})  # formats: jsonschema alone
    assert not fast_safe({"enum": [1, True]})
    assert not fast_safe({"$ref": "#/$defs/a", "minimum": 1})
    assert fast_safe(SCHEMA)


@pytest.mark.parametrize(
    ("message", "room"),
    [
        # OpenAI's older wording (and the mock's), its newer one, SGLang's, Anthropic's
        (
            "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
            "(1000 in the messages, 4000 in the completion). Please reduce the length.",
            3096,
        ),
        (
            "This model's maximum context length is 4096 tokens. However, your messages resulted in "
            "1096 tokens. Please reduce the length of the messages.",
            3000,
        ),
        (
            "Requested token count exceeds the model's maximum context length of 4096 tokens. You "
            "requested a total of 5096 tokens: 96 tokens from the input messages and 5000 tokens for "
            "the completion. Please reduce the number of tokens in the input messages or the completion.",
            4000,
        ),
        (
            "input length and `max_tokens` exceed context limit: 189136 + 20000 > 204648, decrease "
            "input length or `max_tokens` and try again",
            15512,
        ),
        ("The input (5000 tokens) is longer than the model's context length (4096 tokens).", None),
        ("something else went wrong", None),
    ],
)
def test_fit_to_context_reads_each_servers_wording(message, room):
    from jsonlbatch.exec.hooks.contract_check import fit_to_context

    body = {"model": "m", "messages": [], "max_tokens": 20000}
    found = fit_to_context(CHAT_URL, body, {"error": {"message": message}})
    if room is None:
        assert found is None
    else:
        assert found == ({**body, "max_tokens": room}, {"max_tokens": room, "asked": 20000})
    responses = fit_to_context(RESPONSES_URL, {"max_output_tokens": 20000}, {"message": message})
    assert (responses is None) == (room is None)


def test_reask_needs_the_attempts():
    from jsonlbatch.errors import UsageError
    from jsonlbatch.exec.exec_options import ExecOptions

    with pytest.raises(UsageError, match="--reask 9 needs --max-retries 9"):
        ExecOptions(reask=9)
    assert ExecOptions(reask=9, max_retries=9).reask == 9
    with pytest.raises(UsageError, match="--reask-feedback says how to re-ask: give --reask N"):
        ExecOptions(reask_feedback=True)  # alone it would change nothing


def test_reask_journal_resumes_pending_requests_only(tmp_path):
    """Entries of requests whose line is written (a failure `--retry-failed` sends again, a
    success) are dropped at the start; a torn last entry is cut; a pending one resumes at the
    ask after the journaled one, unless the request changed since (its fingerprint)."""
    from jsonlbatch.batch_format.idset import IdSet
    from jsonlbatch.batch_format.records import Request
    from jsonlbatch.exec.hooks.contract_check import AnswerChecker, journal_path

    out = tmp_path / "out.jsonl"
    journal = journal_path(str(out))
    entries = [{"custom_id": cid, "fingerprint": "f", "asks": 2, "answer": "{}", "error": "bad"}
               for cid in ("done", "pending", "edited")]  # fmt: skip
    with open(journal, "wb") as f:
        f.write(b"".join(orjson.dumps(e) + b"\n" for e in entries) + b'{"custom_id": "to')
    done = IdSet()
    done.add("done")
    checker = AnswerChecker(str(out), reask=3, done=(done,))
    kept = [orjson.loads(x)["custom_id"] for x in Path(journal).read_bytes().splitlines()]
    assert kept == ["pending", "edited"]
    body = {"model": "m", "messages": [{"role": "user", "content": "q"}], "seed": 5}
    resumed = checker.begin(Request("pending", CHAT_URL, body, fingerprint="f"))
    assert resumed.body["seed"] != 5 and checker._states["pending"].asks == 3
    fresh = checker.begin(Request("edited", CHAT_URL, body, fingerprint="g"))
    assert fresh.body is body and checker._states["edited"].asks == 1
    checker.close(complete=True)
    assert not os.path.exists(journal)

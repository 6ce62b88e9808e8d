"""A provider's answers pass exec's checks before their line (batchapi/client/batch_result_check.py).

The lines are what `merge.merged_lines` yields for a finished batch (OpenAI Batch output lines
under the request file's ids, the fingerprint last); the checks are exec's (`checks.vet`: the
endpoint's shape, then the answer contract against the schema the request declared, as the
part's marks keep it: `parts.declares`).
"""

from __future__ import annotations

import orjson
from contractutil import GOOD, SCHEMA

from jsonlbatch.answer_contract.schema_forms import with_schema
from jsonlbatch.batch_format.records import CHAT_URL, is_failure
from jsonlbatch.batchapi.client.batch_parts import declares
from jsonlbatch.batchapi.client.batch_result_check import ResultChecks
from jsonlbatch.batchapi.client.result_merge import Merged
from jsonlbatch.exec.hooks.contract_check import AnswerChecker

ASKED_BODY = with_schema(CHAT_URL, {"model": "m", "messages": [{"role": "user", "content": "?"}]},
                         SCHEMA)  # fmt: skip


def merged(cid: str, body: object) -> Merged:
    line = {
        "id": "batch_req_x",
        "custom_id": cid,
        "response": {"status_code": 200, "request_id": f"req_{cid}", "body": body},
        "error": None,
        "metrics": {"batch_id": "batch_1", "fingerprint": f"fp-{cid}"},
    }
    return Merged(orjson.dumps(line) + b"\n", False, 0.01)


def chat(text: str) -> dict:
    return {"id": "c", "object": "chat.completion", "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    ]}  # fmt: skip


def test_results_are_checked_like_exec_answers(tmp_path) -> None:
    asked = {
        "good": (CHAT_URL, declares(ASKED_BODY)["declares"]),
        "broken": (CHAT_URL, declares(ASKED_BODY)["declares"]),
        "plain": (CHAT_URL, declares({"model": "m", "messages": []}).get("declares", {})),
        "empty": (CHAT_URL, {}),
    }
    assert "messages" not in asked["good"][1]  # the prompt is not kept, only the schema's fields
    checks = ResultChecks(AnswerChecker(str(tmp_path / "out.jsonl")), asked)
    items = [
        merged("good", chat(orjson.dumps(GOOD).decode())),
        merged("broken", chat('{"label": "maybe"}')),
        merged("plain", chat("just words")),
        merged("empty", {"object": "chat.completion", "choices": []}),
    ]
    out = {}
    for item in checks(iter(items)):
        line = orjson.loads(item.line)
        out[line["custom_id"]] = (item, line)
        assert list(line["metrics"])[-1] == "fingerprint"  # last, where a resume reads it
        assert line["metrics"]["fingerprint"] == f"fp-{line['custom_id']}"
        assert item.cost == 0.01  # billed, whatever the checks say
    good, line = out["good"]
    assert not good.failed and line["error"] is None
    assert line["metrics"]["contract"]["valid"] is True
    broken, line = out["broken"]
    assert broken.failed and is_failure(line) and line["error"]["code"] == "schema_invalid"
    assert line["response"]["body"]["choices"]  # the answer that broke it is kept
    plain, line = out["plain"]
    assert not plain.failed and "contract" not in line["metrics"]
    empty, line = out["empty"]
    assert empty.failed and line["error"]["code"] == "invalid_response"


def test_failures_and_unknown_ids_pass_unchanged(tmp_path) -> None:
    checks = ResultChecks(AnswerChecker(str(tmp_path / "out.jsonl")), {})
    failure = Merged(b'{"custom_id":"x","response":null,"error":{"code":"e"}}\n', True, None)
    unknown = merged("not-in-marks", chat("x"))
    assert list(checks(iter([failure, unknown]))) == [failure, unknown]


def test_the_runs_check_honours_no_schema_check_and_adds_the_callers(tmp_path) -> None:
    """A merge checks with the job's own checks (`Job.checks`): the contract as the run's
    options say (`--no-schema-check`), then `Seams.check`."""
    from jsonlbatch.exec.exec_options import ExecOptions
    from jsonlbatch.exec.hooks.check_hook import Reject
    from jsonlbatch.exec.hooks.seams import Seams
    from jsonlbatch.exec.job import Job

    requests = tmp_path / "in.jsonl"
    line = {"custom_id": "broken", "method": "POST", "url": CHAT_URL, "body": ASKED_BODY}
    requests.write_bytes(orjson.dumps(line) + b"\n")
    asked = {"broken": (CHAT_URL, declares(ASKED_BODY)["declares"])}
    broken = merged("broken", chat('{"label": "maybe"}'))

    def code(options: ExecOptions, seams: Seams | None = None) -> str | None:
        with Job(requests, tmp_path / "out.jsonl", options, seams=seams) as job:
            job.prepare()
            (item,) = ResultChecks(job.checks(schemas=True), asked)(iter([broken]))
        return (orjson.loads(item.line)["error"] or {}).get("code")

    assert code(ExecOptions()) == "schema_invalid"
    assert code(ExecOptions(schema_check=False)) is None  # --no-schema-check: taken as is
    refuse = Seams(check=lambda answer: Reject("no", code="caller"))
    assert code(ExecOptions(schema_check=False), refuse) == "caller"


def test_a_part_marked_before_marks_kept_what_was_asked_is_read_from_the_requests(tmp_path) -> None:
    """Marks of an older release name only the ids: what was asked is read again from the
    request file, as it was sent (a chat line to Anthropic as a Messages request), so those
    answers take the shape and contract checks too (before: written unchecked)."""
    from jsonlbatch.batch_format.records import MESSAGES_URL
    from jsonlbatch.batchapi.client.batch_parts import marks_path, read_asked
    from jsonlbatch.batchapi.client.providers import PROVIDERS
    from jsonlbatch.batchapi.client.submit_state import Part

    requests = tmp_path / "in.jsonl"
    plain = {"model": "m", "messages": [{"role": "user", "content": "?"}], "max_tokens": 9}
    lines = [
        {"custom_id": "asked", "method": "POST", "url": CHAT_URL, "body": ASKED_BODY},
        {"custom_id": "plain", "method": "POST", "url": CHAT_URL, "body": plain},
        {"custom_id": "other", "method": "POST", "url": CHAT_URL, "body": plain},
    ]
    requests.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines) + b"not json\n")
    part = Part("t", 0, "part-t-0000.jsonl", MESSAGES_URL, 2, 0)
    old_marks = [{"custom_id": c, "sent_as": c, "fingerprint": "f"} for c in ("asked", "plain")]
    (tmp_path / marks_path(part)).write_bytes(b"".join(orjson.dumps(m) + b"\n" for m in old_marks))
    asked = read_asked(tmp_path, part, str(requests), PROVIDERS["anthropic"])
    assert set(asked) == {"asked", "plain"}  # the part's ids only
    assert asked["asked"][0] == MESSAGES_URL and asked["asked"][1]  # a schema, as sent
    assert asked["plain"] == (MESSAGES_URL, {})
    # and the shape check then refuses a chat answer where a Messages answer was asked for
    checks = ResultChecks(AnswerChecker(str(tmp_path / "out.jsonl")), asked)
    (item,) = checks(iter([merged("plain", chat("words"))]))
    assert item.failed and orjson.loads(item.line)["error"]["code"] == "invalid_response"

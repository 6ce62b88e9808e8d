"""`exec` under the answer contract, as a user runs it: real mock servers over HTTP, the real CLI in
subprocesses, kill -9 in the middle of re-asks; then `export`, `post votes` and `report` on what
it wrote."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
from batchutil import cli, exec_cli, read_results, start_exec
from contractutil import SCHEMA

from jsonlbatch.answer_contract.contract import check_choice, compile_schema
from jsonlbatch.answer_contract.schema_forms import with_schema
from jsonlbatch.batch_format.records import CHAT_URL, COMPLETIONS_URL, MESSAGES_URL, RESPONSES_URL
from jsonlbatch.exec.hooks.contract_check import FEEDBACK, journal_path
from jsonlbatch.exec.send.budget import spent_in_output
from jsonlbatch.gen import response_rows
from jsonlbatch.mock.content import json_answer
from jsonlbatch.pricing.cost import parse_price


def schema_requests(path: Path, count: int, url: str = CHAT_URL, **extra) -> list[dict]:
    lines = []
    for i in range(count):
        text = f"review {i}: label it"
        if url == COMPLETIONS_URL:
            body = {"model": "mock", "prompt": text}
        elif url == RESPONSES_URL:
            body = {"model": "mock", "input": text}
        else:
            body = {"model": "mock", "messages": [{"role": "user", "content": text}]}
        if url == MESSAGES_URL:
            body["max_tokens"] = 200
        body = with_schema(url, {**body, **extra}, SCHEMA)
        lines.append({"custom_id": f"r{i}", "method": "POST", "url": url, "body": body})
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return lines


def chat_form(url: str, body: dict) -> dict:
    """The chat body the mock answers for a request of `url` (see mock/hosted.py)."""
    if url == RESPONSES_URL:
        messages = [{"role": "user", "content": body["input"]}]
    elif url == COMPLETIONS_URL:
        return body
    else:
        messages = body["messages"]
    return {
        "model": body["model"],
        "messages": messages,
        **({"seed": body["seed"]} if "seed" in body else {}),
    }


def test_every_endpoint_form_is_checked_on_arrival(tmp_path, mock_server):
    """One request file with every form: chat (two choices each), completions, Responses,
    Messages; each answer's value is the mock's answer to exactly that request."""
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = []
    for url in (CHAT_URL, COMPLETIONS_URL, RESPONSES_URL, MESSAGES_URL):
        made = schema_requests(
            tmp_path / "part.jsonl", 3, url, **({"n": 2} if url == CHAT_URL else {})
        )
        lines += [{**x, "custom_id": f"{url}#{x['custom_id']}"} for x in made]
    requests.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    proc = exec_cli(requests, out, "--url", mock_server(), "--quiet")
    assert proc.returncode == 0, proc.stderr
    results = read_results(out)
    for line in lines:
        record = results[line["custom_id"]]["metrics"]["contract"]
        assert record["valid"] is True and record["asks"] == 1 and record["schema"] == SCHEMA
        choices = 2 if line["url"] == CHAT_URL else 1
        expected = [
            orjson.loads(json_answer(SCHEMA, chat_form(line["url"], line["body"]), i))
            for i in range(choices)
        ]
        assert [c["value"] for c in record["choices"]] == expected
        assert all(c["valid"] and c["error"] is None for c in record["choices"])


def test_no_schema_no_change(tmp_path, mock_server):
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    requests.write_bytes(
        orjson.dumps(
            {
                "custom_id": "a",
                "url": CHAT_URL,
                "body": {"model": "mock", "messages": [{"role": "user", "content": "hi"}]},
            }
        )
        + b"\n"
    )
    assert exec_cli(requests, out, "--url", mock_server(break_json=1.0), "-q").returncode == 0
    assert "contract" not in read_results(out)["a"]["metrics"]


def test_invalid_schema_stops_before_anything_is_sent(tmp_path, mock_server):
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    schema_requests(requests, 3)
    lines = requests.read_bytes().splitlines()
    bad = orjson.loads(lines[1])
    bad["body"]["response_format"]["json_schema"]["schema"] = {"type": "objekt"}
    lines[1] = orjson.dumps(bad)
    requests.write_bytes(b"\n".join(lines) + b"\n")
    proc = exec_cli(requests, out, "--url", mock_server())
    assert proc.returncode == 1, proc.stderr
    assert (
        "in.jsonl:2: body.response_format.json_schema.schema: not a valid JSON Schema"
        in proc.stderr
    )
    assert "Traceback" not in proc.stderr and not out.exists()


def test_broken_answers_fail_then_retry_failed_reasks_them(tmp_path, mock_server):
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    schema_requests(requests, 30)
    contract = compile_schema(SCHEMA)
    proc = exec_cli(requests, out, "--url", mock_server(break_json=1.0), "-q")
    assert proc.returncode == 3, proc.stderr  # those whose answer broke the schema failed
    results = read_results(out)
    failed = {cid for cid, r in results.items() if r["error"]}
    for cid, line in results.items():
        choice = line["metrics"]["contract"]["choices"][0]
        text = line["response"]["body"]["choices"][0]["message"]["content"]
        # the recorded verdict is the answer's
        assert choice == check_choice(contract, text).as_json()
        assert (cid in failed) == (not choice["valid"])
        if cid in failed:
            assert (
                line["error"]["code"] == "schema_invalid" and line["response"]["status_code"] == 200
            )
            assert choice["error"] in line["error"]["message"]
    assert 10 < len(failed) < 30  # a third only wrapped in fences or prose: recovered
    again = exec_cli(requests, out, "--url", mock_server(), "-q")  # the same command: nothing to do
    assert again.returncode == 3 and read_results(out).keys() == results.keys()
    fixed = exec_cli(requests, out, "--url", mock_server(), "--retry-failed", "-q")
    assert fixed.returncode == 0, fixed.stderr
    assert all(r["metrics"]["contract"]["valid"] for r in read_results(out).values())


def test_reask_fresh_samples_until_valid(tmp_path, mock_server):
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = {x["custom_id"]: x for x in schema_requests(requests, 40)}
    price = "in=1000000,out=1000000"  # a dollar a token: the spend counts tokens
    proc = exec_cli(requests, out, "--url", mock_server(break_json=0.6), "--reask", "4",
                    "--price", price)  # fmt: skip
    results = read_results(out)
    asks = [r["metrics"]["contract"]["asks"] for r in results.values()]
    assert max(asks) > 1 and len(results) == 40
    paid = 0
    for cid, line in results.items():
        record = line["metrics"]["contract"]
        if record["valid"]:
            assert not line["error"] and record["asks"] <= 5
        else:  # five broken answers in a row: the last is kept, failed
            assert line["error"]["code"] == "schema_invalid" and record["asks"] == 5
        # every ask is paid for: the first ask's answer is the mock's to the request as written
        first = json_answer(SCHEMA, lines[cid]["body"], 0, 0.6)
        last = line["metrics"]["completion_tokens"]
        usage = record.get("usage", {"completion_tokens": last})
        assert usage["completion_tokens"] >= last + (
            len(first.split()) if record["asks"] > 1 else 0
        )
        paid += usage["completion_tokens"] + usage.get(
            "prompt_tokens", line["metrics"]["prompt_tokens"]
        )
    assert proc.returncode == (3 if any(r["error"] for r in results.values()) else 0)
    assert f"spent: ${paid:,.4f}" in proc.stderr  # re-asks and kept failures included
    assert spent_in_output(str(out), parse_price(price)) == paid  # what a resume counts
    summary = cli("report", str(out), "--format", "md")
    assert summary.returncode == 0, summary.stderr
    assert "schema valid" in summary.stdout and "requests re-asked" in summary.stdout


def test_reask_with_feedback_quotes_the_error(tmp_path, mock_server):
    """With --reask-feedback the next ask is the conversation plus the broken answer and the
    validator's message: the answer that came back is the mock's answer to exactly that body."""
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = schema_requests(requests, 20)
    contract = compile_schema(SCHEMA)
    proc = exec_cli(
        requests,
        out,
        "--url",
        mock_server(break_json=0.5),
        "--reask",
        "1",
        "--reask-feedback",
        "-q",
    )
    assert proc.returncode in (0, 3), proc.stderr
    results = read_results(out)
    reasked = 0
    for line in lines:
        first = json_answer(SCHEMA, line["body"], 0, 0.5)
        verdict = check_choice(contract, first)
        record = results[line["custom_id"]]["metrics"]["contract"]
        if verdict.valid:
            assert record["asks"] == 1
            continue
        reasked += 1
        assert record["asks"] == 2
        turn = [
            {"role": "assistant", "content": first},
            {"role": "user", "content": FEEDBACK.format(error=verdict.error)},
        ]
        second = {**line["body"], "messages": [*line["body"]["messages"], *turn]}
        got = results[line["custom_id"]]["response"]["body"]["choices"][0]["message"]["content"]
        # the re-ask's seed is exec's own (crc32 of id and ask); the rest is the conversation
        assert got == json_answer(SCHEMA, {**second, "seed": _sent_seed(line, 1)}, 0, 0.5)
    assert reasked > 3


def _sent_seed(line: dict, ask: int) -> int:
    import zlib

    return zlib.crc32(f"{line['custom_id']}\0{ask}".encode()) % (1 << 31)


@pytest.mark.slow
def test_kill_9_mid_reask_keeps_exactly_once_and_finished_reasks(tmp_path, mock_server):
    requests, out, ref = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "ref.jsonl"
    schema_requests(requests, 40)
    args = ("--reask", "5", "-c", "4", "-q")
    reference = exec_cli(requests, ref, "--url", mock_server(break_json=0.7), *args)
    expected = {cid: r["metrics"]["contract"]["asks"] for cid, r in read_results(ref).items()}
    assert sum(expected.values()) > 60  # plenty of re-asks to land in
    slow = mock_server(break_json=0.7, latency=0.05)
    journal = Path(journal_path(str(out)))
    kills = 0
    for _ in range(6):  # bounded: each round kills once, after some re-asks were journaled
        proc = start_exec(requests, out, "--url", slow, *args)
        deadline = time.monotonic() + 20
        while proc.poll() is None and time.monotonic() < deadline:
            if journal.exists() and journal.stat().st_size > 400 * (kills + 1):
                break
            time.sleep(0.02)
        if proc.poll() is not None:
            break
        proc.kill()
        proc.wait(timeout=10)
        kills += 1
    assert kills >= 1
    final = exec_cli(requests, out, "--url", slow, *args)
    assert final.returncode == reference.returncode, final.stderr
    results = read_results(out)  # one line per id, whole lines only
    assert results.keys() == expected.keys()
    # every request took exactly the asks an unbroken run took: none repeated, none skipped
    assert {cid: r["metrics"]["contract"]["asks"] for cid, r in results.items()} == expected
    # the attempts of the killed runs count too: never fewer attempts than asks (issue 40)
    assert all(r["metrics"]["attempts"] >= r["metrics"]["contract"]["asks"]
               for r in results.values())  # fmt: skip
    assert not journal.exists()  # gone once every request has its line


def test_fit_context_cuts_max_tokens_once(tmp_path, mock_server):
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    body = {
        "model": "mock",
        "messages": [{"role": "user", "content": "one two three four five"}],
        "max_tokens": 100,
    }
    requests.write_bytes(orjson.dumps({"custom_id": "a", "url": CHAT_URL, "body": body}) + b"\n")
    url = mock_server(max_model_len=40)
    plain = exec_cli(requests, out, "--url", url, "-q")
    assert plain.returncode == 3 and read_results(out)["a"]["error"]["code"] == "http_400"
    fitted = exec_cli(requests, out, "--url", url, "--fit-context", "--retry-failed", "-q")
    assert fitted.returncode == 0, fitted.stderr
    line = read_results(out)["a"]
    assert line["metrics"]["fit_context"] == {"max_tokens": 35, "asked": 100}
    assert line["response"]["body"]["usage"]["completion_tokens"] <= 35


def test_export_fields_and_votes_read_the_recorded_value(tmp_path, mock_server):
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = schema_requests(requests, 12)
    # the votes group r0|k by id: give every request three samples under one group
    proc = exec_cli(requests, out, "--url", mock_server(break_json=0.3), "-q")
    assert proc.returncode in (0, 3)
    table = tmp_path / "rows.parquet"
    done = cli(
        "export", str(out), "-o", str(table), "--fields", "label,score", "--fields", "person=who"
    )
    assert done.returncode == 0, done.stderr
    rows = pq.read_table(table)
    types = {f.name: str(f.type) for f in rows.schema}
    assert types["label"] == "string" and types["score"] == "double" and types["person"] == "string"
    results = read_results(out)
    for row in rows.to_pylist():
        record = results[row["custom_id"]]["metrics"]["contract"]
        if record["valid"]:
            value = record["choices"][0]["value"]
            assert (row["label"], row["score"]) == (value["label"], float(value["score"]))
            assert orjson.loads(row["person"]) == value["who"]
        else:
            assert row["label"] is None and row["score"] is None
    everything = cli("export", str(out), "-o", str(tmp_path / "all.csv"))
    assert (
        everything.returncode == 0 and "tags" in (tmp_path / "all.csv").read_text().splitlines()[0]
    )
    wrong = cli("export", str(out), "-o", str(tmp_path / "x.csv"), "--fields", "nope")
    assert wrong.returncode == 2 and "no top-level field 'nope'" in wrong.stderr
    votes = tmp_path / "votes.jsonl"
    voted = cli(
        "post", "votes", str(out), "--extract", "json:label", "--no-split", "-o", str(votes)
    )
    assert voted.returncode == 0, voted.stderr
    for vote in map(orjson.loads, votes.read_bytes().splitlines()):
        record = results[vote["id"]]["metrics"]["contract"]
        if record["valid"] and not results[vote["id"]]["error"]:
            assert vote["answer"] == record["choices"][0]["value"]["label"]
    assert len(lines) == 12
    for row in response_rows(str(out)):  # a check_choice or repair prompt reads the value as data
        record = results[row.data["custom_id"]]["metrics"]["contract"]
        assert row.data["valid"] is record["valid"]
        assert row.data["json"] == (record["choices"][0]["value"] if record["valid"] else None)

"""Small pure pieces of the executor: retry verdicts, backoff, Retry-After, ids, URLs, tails."""

from __future__ import annotations

import random

import pytest

from jsonlbatch.batch_format.idset import IdSet
from jsonlbatch.batch_format.records import Result
from jsonlbatch.errors import UsageError
from jsonlbatch.exec.prepare import input_scan as scan
from jsonlbatch.exec.prepare import resume_scan as resume
from jsonlbatch.exec.route.endpoints import auth_headers, parse_endpoint
from jsonlbatch.exec.send.retry import Backoff, Verdict, classify, parse_retry_after
from jsonlbatch.redact import redact


@pytest.mark.parametrize(
    ("status", "body", "verdict"),
    [
        (200, b"{}", Verdict.OK),
        (400, b'{"error": {"message": "bad"}}', Verdict.FINAL),
        (404, b"{}", Verdict.FINAL),
        (401, b'{"error": "Unauthorized"}', Verdict.ABORT),
        (403, b"", Verdict.ABORT),
        (408, b"", Verdict.RETRY),
        (429, b"", Verdict.RETRY),
        (500, b"", Verdict.RETRY),
        (503, b"", Verdict.RETRY),
        (400, b"This model's maximum context length is 4096 tokens", Verdict.FINAL),
        (500, b"maximum context length exceeded", Verdict.FINAL),
    ],
)
def test_classify(status, body, verdict):
    assert classify(status, body) is verdict


def test_backoff_grows_with_jitter_and_honours_retry_after():
    b = Backoff(base=1.0, cap=8.0, rng=random.Random(0))
    delays = [b.delay(n) for n in range(1, 7)]
    assert 0.5 <= delays[0] <= 1.0 and 1.0 <= delays[1] <= 2.0
    assert all(4.0 <= d <= 8.0 for d in delays[3:])  # capped
    assert b.delay(1, retry_after=30.0) == 30.0
    assert b.delay(1, retry_after=10_000.0) == 40.0  # a silly header cannot stall for hours


def test_parse_retry_after():
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    now = 1_700_000_000.0
    assert parse_retry_after("Tue, 14 Nov 2023 22:13:30 GMT", now=now) == pytest.approx(10.0)


def test_idset_membership_and_duplicates():
    ids = IdSet()
    for i in range(10_000):
        ids.add(f"id-{i}")
    ids.add("id-42")
    assert "id-9999" in ids and "id-10000" not in ids
    assert ids.colliding_hashes() == {hash("id-42")}
    more = IdSet()
    more.update(f"id-{i}" for i in range(3))
    more.add("id-1")
    assert "id-2" in more and "id-3" not in more and more.colliding_hashes() == {hash("id-1")}


def test_scan_output_reads_ids_and_outcomes_of_every_line_shape(tmp_path, monkeypatch):
    """Own lines are read from their fixed places (in batches); every other shape is decoded.
    Both ways must agree on which ids succeeded and which only failed."""
    monkeypatch.setattr(resume, "BATCH_LINES", 2)  # exercise the batched hashing
    vllm_line = (
        b'{"id": "vllm-1", "custom_id": "theirs", "response": {"status_code": 200, '
        b'"request_id": "r", "body": {}}, "error": null}\n'
    )
    lines = [
        Result("ok-1", 200, {"choices": []}).to_line(),
        Result("bad-1", 500, {"error": {"message": "boom"}}).to_line(),
        Result("ok-\u00e9", 200, {}).to_line(),
        Result('quote"d', 200, {}).to_line(),  # escaped: decoded in full
        Result("gone", None, error={"code": "timeout", "message": "t"}).to_line(),
        vllm_line,
        Result("bad-1", 200, {}).to_line(),  # retried later and succeeded: a success wins
        b"\n",
        Result("ok-2", 201, {}).to_line(),
        Result("ok-3", 200, {}).to_line()[:-20],  # torn last line
    ]
    assert resume._OWN_LINE.match(lines[0]) and resume._OWN_LINE.match(lines[1])
    assert not resume._OWN_LINE.match(lines[3]) and resume._OWN_LINE.match(lines[4])
    path = tmp_path / "out.jsonl"
    path.write_bytes(b"".join(lines))
    found = scan.scan_output(path)
    for cid in ["ok-1", "ok-\u00e9", 'quote"d', "theirs", "bad-1", "ok-2"]:
        assert cid in found.ok, cid
    assert "gone" not in found.ok and "ok-3" not in found.ok
    assert "gone" in found.failed and len(found.failed) == 1  # "bad-1": a success wins
    assert found.lines == 8
    assert found.cut_bytes == len(lines[-1]) and found.torn


@pytest.mark.parametrize(
    ("base", "path", "url"),
    [
        (
            "http://localhost:8000/v1",
            "/v1/chat/completions",
            "http://localhost:8000/v1/chat/completions",
        ),
        ("http://localhost:8000/v1/", "/v1/embeddings", "http://localhost:8000/v1/embeddings"),
        (
            "http://localhost:8000",
            "/v1/chat/completions",
            "http://localhost:8000/v1/chat/completions",
        ),
        (
            "https://res.openai.azure.com/openai/deployments/gpt4o?api-version=2024-10-21",
            "/v1/chat/completions",
            "https://res.openai.azure.com/openai/deployments/gpt4o/chat/completions?api-version=2024-10-21",
        ),
    ],
)
def test_endpoint_urls(base, path, url):
    assert parse_endpoint(base).url_for(path) == url


def test_azure_uses_api_key_header_and_keys_are_redacted():
    azure = parse_endpoint("https://res.openai.azure.com/openai/deployments/d?api-version=1")
    assert auth_headers(azure, "sk-azure-secret")["api-key"] == "sk-azure-secret"
    plain = parse_endpoint("http://localhost:8000/v1")
    headers = auth_headers(
        plain, "sk-plain-secret", {"X-Api-Token": "tok-extra-secret", "X-Title": "my-run-title"}
    )
    assert headers["Authorization"] == "Bearer sk-plain-secret"
    assert headers["X-Api-Token"] == "tok-extra-secret"
    text = redact("key sk-plain-secret and tok-extra-secret and sk-azure-secret, my-run-title")
    assert "secret" not in text
    assert "my-run-title" not in text  # every --header value is a secret, whatever its name


def test_secret_query_values_are_redacted():
    parse_endpoint("http://localhost:8000/v1?key=QUERYSECRET1&api-version=2024-10-21")
    assert redact("url ...?key=QUERYSECRET1&api-version=2024-10-21") == (
        "url ...?key=***&api-version=2024-10-21"
    )


def test_backoff_does_not_overflow():
    assert Backoff(base=1.0, cap=60.0).delay(5000) <= 60.0


def test_url_credentials_are_not_shown():
    ep = parse_endpoint("http://user:pw-hidden-1@localhost:8000/v1")
    assert "pw-hidden-1" not in ep.name
    assert redact("http://user:pw-hidden-1@x") == "http://user:***@x"


def test_bad_url_is_a_usage_error():
    with pytest.raises(UsageError):
        parse_endpoint("localhost:8000")


def test_resume_scan_names_ids_the_input_repeats_among_done_and_pending_lines(tmp_path):
    """Done ids are checked by one probe of the output's set, pending ids by a set of their
    own: a repeat is found either way, with both line numbers, and nothing else is reported."""
    from batchutil import write_requests

    from jsonlbatch.errors import InputError

    req, out = tmp_path / "req.jsonl", tmp_path / "out.jsonl"
    write_requests(req, 6)
    lines = req.read_bytes().splitlines(keepends=True)
    out.write_bytes(
        Result("req-0", 200, {}).to_line()
        + Result("req-1", 500, {}).to_line()  # a failure, kept without --retry-failed
        + Result("req-2", 200, {}).to_line()
    )
    existing = scan.scan_output(out)
    found = scan.scan_input(req, existing=existing)
    assert (found.total, found.already_done, found.failed_before) == (6, 3, 1)
    assert len(found.pending) == 3
    req.write_bytes(b"".join(lines) + lines[0] + lines[1] + lines[4])
    with pytest.raises(InputError) as caught:
        scan.scan_input(req, existing=existing)
    assert [str(p) for p in caught.value.problems] == [
        f"{req}:7: custom_id: 'req-0' repeats line 1",
        f"{req}:8: custom_id: 'req-1' repeats line 2",
        f"{req}:9: custom_id: 'req-4' repeats line 5",
    ]


def test_an_idset_with_values_keeps_the_first_value_of_each_id():
    ids = IdSet(values=True)
    ids.add_keys(map(hash, ["a", "b", "a"]), [1, 2, 3])
    assert ids.value_at(ids.slot("a")) == 1 and ids.value_at(ids.slot("b")) == 2
    assert ids.colliding_hashes() == {hash("a")}
    with pytest.raises(TypeError):
        ids.add("c")
    with pytest.raises(TypeError):
        ids.add_keys([hash("c")])

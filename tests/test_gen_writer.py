"""RequestWriter: request bodies, samples and ids, thinking switches, atomic writes."""

from __future__ import annotations

import os
import stat

import orjson
import pytest

import jsonlbatch
from jsonlbatch.batch_format.records import check_request, parse_request
from jsonlbatch.errors import InputError, OutputError, UsageError
from jsonlbatch.gen.body_fields import merge_patch, parse_param
from jsonlbatch.gen.row_requests import write_requests
from jsonlbatch.gen.sources import Row
from jsonlbatch.gen.templates import Prompt, RowTemplate
from jsonlbatch.gen.writer import RequestError, RequestWriter

MSG = [{"role": "user", "content": "hi"}]


def read(path) -> list[dict]:
    lines = path.read_bytes().splitlines()
    for number, raw in enumerate(lines, 1):
        parse_request(raw, path=str(path), line=number)  # what exec checks
    return [orjson.loads(raw) for raw in lines]


def leftovers(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(".tmp"))


def test_the_issue_example_and_the_top_level_export(tmp_path):
    out = tmp_path / "requests.jsonl"
    with jsonlbatch.RequestWriter(out, model="Qwen/Qwen3-8B", temperature=0.6) as w:
        for task_id in ("a", "b"):
            w.add(task_id, [{"role": "user", "content": f"fix {task_id}"}], n=3)
    lines = read(out)
    assert lines[0] == {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "Qwen/Qwen3-8B",
            "temperature": 0.6,
            "n": 3,
            "messages": [{"role": "user", "content": "fix a"}],
        },
    }
    assert next(iter(lines[0]["body"])) == "model"
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert w.summary.requests == 2 and w.summary.prompts == 2


def test_string_prompt_is_the_user_message_and_overrides_win(tmp_path):
    out = tmp_path / "r.jsonl"
    with RequestWriter(out, model="m", temperature=0.7, seed=1, max_tokens=10) as w:
        w.add("x", "hello", temperature=0.1, seed=None)
    (line,) = read(out)
    assert line["body"] == {
        "model": "m",
        "temperature": 0.1,
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "hello"}],
    }


def test_samples_ids_greedy_first_and_seeds(tmp_path):
    out = tmp_path / "r.jsonl"
    with RequestWriter(
        out, model="m", samples=4, greedy_first=True, temperature=0.8, seed=10, n=2
    ) as w:
        assert w.add("django__django-11099", MSG) == [f"django__django-11099|{k}" for k in range(4)]
    lines = read(out)
    assert [x["custom_id"] for x in lines] == [f"django__django-11099|{k}" for k in range(4)]
    bodies = [x["body"] for x in lines]
    assert [b["temperature"] for b in bodies] == [0, 0.8, 0.8, 0.8]
    assert [b["seed"] for b in bodies] == [10, 11, 12, 13]
    assert [b.get("n") for b in bodies] == [None, 2, 2, 2]  # one greedy choice is enough


def test_samples_without_seed_or_greedy_and_custom_separator(tmp_path):
    out = tmp_path / "r.jsonl"
    with RequestWriter(out, model="m", samples=2, sample_sep="__pass", temperature=1.0) as w:
        w.add("q1", MSG)
    lines = read(out)
    assert [x["custom_id"] for x in lines] == ["q1__pass0", "q1__pass1"]
    assert all("seed" not in x["body"] and x["body"]["temperature"] == 1.0 for x in lines)


def test_thinking_switches_merge_with_existing_template_kwargs(tmp_path):
    out = tmp_path / "r.jsonl"
    with RequestWriter(
        out,
        model="m",
        no_think=True,
        think_budget=512,
        chat_template_kwargs={"custom": 1},
    ) as w:
        w.add("a", MSG)
    (line,) = read(out)
    assert line["body"]["chat_template_kwargs"] == {
        "custom": 1,
        "enable_thinking": False,
        "thinking_budget": 512,
    }
    assert line["body"]["thinking_token_budget"] == 512


def test_no_think_suffix_goes_on_the_last_user_message_without_touching_the_caller(tmp_path):
    out = tmp_path / "r.jsonl"
    conversation = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "look"}]},
        {"role": "assistant", "content": "prefill"},
    ]
    original = orjson.dumps(conversation)
    with RequestWriter(out, model="m", no_think_suffix=True) as w:
        w.add("parts", conversation)
        w.add("text", "plain")
    parts, text = read(out)
    assert parts["body"]["messages"][3]["content"] == [
        {"type": "text", "text": "look"},
        {"type": "text", "text": "/no_think"},
    ]
    assert parts["body"]["messages"][1]["content"] == "first"
    assert text["body"]["messages"][0]["content"] == "plain /no_think"
    assert "chat_template_kwargs" not in text["body"]
    assert orjson.dumps(conversation) == original
    w = RequestWriter(tmp_path / "s.jsonl", model="m", no_think_suffix=True)
    with pytest.raises(RequestError, match="no user message"):
        w.add("sys", [{"role": "system", "content": "only"}])
    w.abort()


def test_completions_and_embeddings_bodies(tmp_path):
    with RequestWriter(tmp_path / "c.jsonl", model="m", url="/v1/completions", max_tokens=5) as w:
        w.add("c", "Once upon")
        with pytest.raises(RequestError, match="not chat messages"):
            w.add("chat", MSG)
    (c,) = read(tmp_path / "c.jsonl")
    assert c["url"] == "/v1/completions"
    assert c["body"] == {"model": "m", "max_tokens": 5, "prompt": "Once upon"}
    with RequestWriter(tmp_path / "e.jsonl", model="e5", url="/v1/embeddings") as w:
        w.add("e", ["one", "two"])
    (e,) = read(tmp_path / "e.jsonl")
    assert e["body"] == {"model": "e5", "input": ["one", "two"]}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"url": "/v1/embeddings", "temperature": 0.5}, "temperature: no meaning"),
        ({"url": "/v1/embeddings", "samples": 2}, "embeddings are deterministic"),
        ({"url": "/v1/completions", "no_think": True}, "thinking switches"),
        ({"url": "/v1/rerank"}, "cannot write requests for"),
        ({"greedy_first": True}, "needs samples"),
        ({"samples": 0}, "samples must be >= 1"),
        ({"samples": 2, "sample_sep": ""}, "separator"),
    ],
)
def test_option_errors(tmp_path, kwargs, message):
    with pytest.raises(UsageError, match=message):
        RequestWriter(tmp_path / "r.jsonl", model="m", **kwargs)
    assert os.listdir(tmp_path) == []


def test_duplicate_ids_and_invalid_requests_are_errors(tmp_path):
    with RequestWriter(tmp_path / "r.jsonl", model="m", samples=2) as w:
        w.add("a", MSG)
        with pytest.raises(
            RequestError, match=r"request 'a\|0': custom_id: 'a\|0' repeats the id of prompt 1"
        ):
            w.add("a", MSG)
        with pytest.raises(RequestError, match=r"messages\[0\]\.role: unknown role"):
            w.add("b", [{"role": "human", "content": "x"}])
        with pytest.raises(RequestError, match="not JSON-serializable"):
            w.add("c", MSG, logit_bias={1: object()})
        with pytest.raises(RequestError, match="non-empty string"):
            w.add("", MSG)
    # the failed adds wrote nothing: only a's two samples
    assert [x["custom_id"] for x in read(tmp_path / "r.jsonl")] == ["a|0", "a|1"]
    with RequestWriter(tmp_path / "nomodel.jsonl") as w:
        with pytest.raises(RequestError, match=r"body\.model: missing"):
            w.add("a", MSG)
        w.add("a", MSG, model="late")


def test_an_exception_inside_the_block_leaves_no_file(tmp_path):
    out = tmp_path / "r.jsonl"
    with pytest.raises(RuntimeError), RequestWriter(out, model="m") as w:
        w.add("a", MSG)
        raise RuntimeError("pipeline broke")
    assert os.listdir(tmp_path) == []
    out.write_text("old\n")
    with pytest.raises(KeyboardInterrupt), RequestWriter(out, model="m", force=True) as w:
        w.add("a", MSG)
        raise KeyboardInterrupt
    assert out.read_text() == "old\n"
    assert leftovers(tmp_path) == []


def test_refuses_to_overwrite_unless_forced(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text("keep\n")
    with pytest.raises(OutputError, match="exists; refusing to overwrite"):
        RequestWriter(out, model="m")
    with RequestWriter(out, model="m", force=True) as w:
        w.add("a", MSG)
    assert read(out)[0]["custom_id"] == "a"
    # a file that appears while the writer works is not clobbered either
    late = tmp_path / "late.jsonl"
    w = RequestWriter(late, model="m")
    w.add("a", MSG)
    late.write_text("someone else's\n")
    with pytest.raises(OutputError):
        w.close()
    assert late.read_text() == "someone else's\n"
    assert leftovers(tmp_path) == []
    with RequestWriter(tmp_path / "new" / "dir" / "r.jsonl", model="m") as w:
        w.add("a", MSG)
    assert read(tmp_path / "new" / "dir" / "r.jsonl")[0]["custom_id"] == "a"
    with pytest.raises(OutputError, match="cannot write"):
        RequestWriter(tmp_path / "late.jsonl" / "r.jsonl", model="m")  # under a file


def test_closed_writer_refuses_more(tmp_path):
    w = RequestWriter(tmp_path / "r.jsonl", model="m")
    w.close()
    with pytest.raises(OutputError, match="closed"):
        w.add("a", MSG)


def test_summary_estimates_prompt_tokens_from_characters(tmp_path):
    with RequestWriter(tmp_path / "r.jsonl", model="m", samples=3) as w:
        w.add("a", [{"role": "system", "content": "x" * 10}, {"role": "user", "content": "y" * 30}])
        w.add(
            "b",
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "z" * 40},
                        {"type": "image_url", "image_url": {"url": "http://" + "i" * 100}},
                    ],
                }
            ],
        )
    s = w.summary
    assert (s.prompts, s.requests, s.prompt_chars) == (2, 6, 3 * (40 + 40))
    assert s.prompt_tokens_estimate == 60


def test_merge_patch_and_param_parsing():
    base = {"a": 1, "kw": {"x": 1, "y": 2}, "stop": ["s"]}
    assert merge_patch(base, {"kw": {"y": None, "z": 3}, "a": None, "stop": ["t"]}) == {
        "kw": {"x": 1, "z": 3},
        "stop": ["t"],
    }
    assert base == {"a": 1, "kw": {"x": 1, "y": 2}, "stop": ["s"]}
    assert parse_param("repetition_penalty=1.05") == {"repetition_penalty": 1.05}
    assert parse_param("chat_template_kwargs.thinking=true") == {
        "chat_template_kwargs": {"thinking": True}
    }
    assert parse_param('response_format={"type": "json_object"}') == {
        "response_format": {"type": "json_object"}
    }
    assert parse_param("reasoning_effort=low") == {"reasoning_effort": "low"}
    assert parse_param("seed=null") == {"seed": None}
    for bad in ("noequals", "=1", "a..b=1"):
        with pytest.raises(UsageError, match="KEY=JSON"):
            parse_param(bad)


def test_write_requests_names_the_row_on_errors(tmp_path):
    rows = [Row("t.csv", i, i + 2, {"k": k}) for i, k in enumerate(["a", "b", "a"])]
    prompt = Prompt(user=RowTemplate("say {{ k }}"))
    with pytest.raises(InputError) as exc, RequestWriter(tmp_path / "r.jsonl", model="m") as w:
        write_requests(rows, w, prompt, custom_id=RowTemplate("{{ k }}"))
    assert "t.csv:4: custom_id: row 2: 'a' repeats the id of row 0" in str(exc.value)
    assert os.listdir(tmp_path) == []
    with RequestWriter(tmp_path / "r.jsonl", model="m") as w:
        write_requests(rows, w, prompt)  # default ids: the row index
    assert [x["custom_id"] for x in read(tmp_path / "r.jsonl")] == ["0", "1", "2"]
    empty = r"t\.csv:2: custom_id: row 0: the id rendered empty"
    with pytest.raises(InputError, match=empty), RequestWriter(tmp_path / "e.jsonl") as w:
        write_requests(rows, w, prompt, custom_id=RowTemplate("  "))
    system = Prompt(user=RowTemplate("x"), system=RowTemplate("s"))
    chat = r"--system builds chat messages, but /v1/completions takes a prompt string"
    with (
        pytest.raises(UsageError, match=chat),  # up front, before any row is read
        RequestWriter(tmp_path / "c.jsonl", model="m", url="/v1/completions") as w,
    ):
        write_requests(rows, w, system)


def test_every_line_passes_check_request(tmp_path):
    out = tmp_path / "r.jsonl"
    with RequestWriter(out, model="m", samples=2, no_think=True, stop=["\n\n"]) as w:
        for i in range(50):
            w.add(f"id-{i}", f"prompt {i}")
    lines = read(out)
    assert len(lines) == 100
    assert all(check_request(x) == [] for x in lines)

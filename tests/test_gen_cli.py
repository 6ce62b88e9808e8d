"""`jsonlbatch gen` as a user runs it: real files, real subprocesses, and a round trip through exec."""

from __future__ import annotations

import csv
import os
import subprocess

import orjson
import pytest
from batchutil import cli, read_results
from conftest import free_port

from jsonlbatch.batch_format.records import parse_request

TASKS = [
    {"instance_id": "astropy__astropy-12907", "problem": "Separability matrix is wrong."},
    {
        "instance_id": "django__django-11099",
        "problem": "UsernameValidator allows a trailing newline.",
    },
    {"instance_id": "sympy__sympy-20590", "problem": "Symbol instances have __dict__."},
]


def write_jsonl(path, rows):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def read(path) -> list[dict]:
    raw_lines = path.read_bytes().splitlines()
    for number, raw in enumerate(raw_lines, 1):
        parse_request(raw, path=str(path), line=number)
    return [orjson.loads(raw) for raw in raw_lines]


def gen(*args, stdin: str | None = None) -> subprocess.CompletedProcess:
    return cli("gen", *map(str, args), timeout=60, input=stdin)


def assert_clean_failure(proc, code, out_dir):
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.startswith("Error: ")
    assert "Traceback" not in proc.stderr
    assert not [n for n in os.listdir(out_dir) if n.endswith(".tmp")]


def test_issue_example_agentless_samples(tmp_path):
    data = write_jsonl(tmp_path / "tasks.jsonl", TASKS)
    (tmp_path / "prompt.j2").write_text("Fix this issue in {{ instance_id }}:\n{{ problem }}\n")
    out = tmp_path / "requests.jsonl"
    proc = gen(
        "--data", data, "--template", tmp_path / "prompt.j2", "--system", "You are a careful engineer.",
        "--model", "Qwen/Qwen3-8B", "--id", "{{ instance_id }}", "--samples", 11, "--greedy-first",
        "--temperature", 0.8, "--max-tokens", 32768, "--no-think", "-o", out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = read(out)
    assert len(lines) == 33
    assert [x["custom_id"] for x in lines[:12]] == [
        *(f"astropy__astropy-12907|{k}" for k in range(11)),
        "django__django-11099|0",
    ]
    first, second = lines[0]["body"], lines[1]["body"]
    assert (first["temperature"], second["temperature"]) == (0, 0.8)
    assert first["max_tokens"] == 32768 and first["model"] == "Qwen/Qwen3-8B"
    assert first["chat_template_kwargs"] == {"enable_thinking": False}
    assert first["messages"] == [
        {"role": "system", "content": "You are a careful engineer."},
        {
            "role": "user",
            "content": f"Fix this issue in {TASKS[0]['instance_id']}:\n{TASKS[0]['problem']}",
        },
    ]
    assert "wrote 33 requests (3 rows x 11 samples)" in proc.stderr
    assert "prompt tokens (estimated as characters / 4" in proc.stderr


def test_agentless_skip_greedy_numbering_from_one(tmp_path):
    """Agentless's batch generation numbers samples `<instance_id>|<i>` from 0 (0 greedy) and,
    with `--skip_greedy`, from 1 (issue 38: the same request file must come out of gen)."""
    data = write_jsonl(tmp_path / "tasks.jsonl", TASKS[:2])
    out = tmp_path / "requests.jsonl"
    proc = gen(
        "--data", data, "--prompt", "Fix {{ problem }}", "--model", "Qwen/Qwen3-8B",
        "--id", "{{ instance_id }}", "--samples", 10, "--first-sample", 1,
        "--temperature", 0.8, "--seed", 7, "-o", out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = read(out)
    assert [x["custom_id"] for x in lines[:10]] == [
        f"astropy__astropy-12907|{k}" for k in range(1, 11)
    ]
    assert lines[10]["custom_id"] == "django__django-11099|1"
    assert {x["body"]["temperature"] for x in lines} == {0.8}  # no greedy sample
    assert [x["body"]["seed"] for x in lines[:10]] == [7 + k for k in range(1, 11)]
    both = gen("--data", data, "--prompt", "x", "--model", "m", "--samples", 2, "--first-sample",
               1, "--greedy-first", "-o", tmp_path / "bad.jsonl")  # fmt: skip
    assert_clean_failure(both, 2, tmp_path)
    assert "skip_greedy" in both.stderr and not (tmp_path / "bad.jsonl").exists()


def test_issue_example_csv_with_n_choices(tmp_path):
    data = tmp_path / "questions.csv"
    with open(data, "w", newline="") as f:
        csv.writer(f).writerows([["question"], ["What is 2+2?"], ["Name a prime."]])
    out = tmp_path / "req.jsonl"
    proc = gen(
        "--data", data, "--prompt", "Q: {{ question }}\\nA:", "--model", "m", "--n", 3,
        "--temperature", 0.6, "-o", out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = read(out)
    assert [x["custom_id"] for x in lines] == ["0", "1"]
    assert lines[1]["body"] == {
        "model": "m",
        "temperature": 0.6,
        "n": 3,
        "messages": [{"role": "user", "content": "Q: Name a prime.\nA:"}],
    }


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_stdin(tmp_path, fmt):
    text = "q\nhello\nworld\n" if fmt == "csv" else '{"q": "hello"}\n{"q": "world"}\n'
    out = tmp_path / "r.jsonl"
    args = ["--format", fmt] if fmt == "csv" else []
    proc = gen("--data", "-", *args, "--prompt", "{{ q }}", "--model", "m", "-o", out, stdin=text)
    assert proc.returncode == 0, proc.stderr
    assert [x["body"]["messages"][0]["content"] for x in read(out)] == ["hello", "world"]


def test_json_list_and_parquet_files(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    (tmp_path / "d.json").write_bytes(orjson.dumps(TASKS, option=orjson.OPT_INDENT_2))
    pq.write_table(pa.Table.from_pylist(TASKS), tmp_path / "d.parquet")
    for name in ("d.json", "d.parquet"):
        out = tmp_path / f"{name}.requests.jsonl"
        proc = gen("--data", tmp_path / name, "--prompt", "{{ problem }}", "--id", "{{ instance_id }}",
                   "--model", "m", "-o", out)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert [x["custom_id"] for x in read(out)] == [t["instance_id"] for t in TASKS]


def test_messages_template_body_options_and_completions(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"q": 'say "hi"', "img": "http://x/a.png"}])
    (tmp_path / "chat.j2").write_text(
        '[{"role": "user", "content": [{"type": "text", "text": {{ q | tojson }}},\n'
        ' {"type": "image_url", "image_url": {"url": {{ img | tojson }}}}]}]\n'
    )
    (tmp_path / "body.json").write_text('{"model": "from-file", "temperature": 1.0, "top_k": 5}')
    out = tmp_path / "r.jsonl"
    proc = gen(
        "--data", data, "--messages", tmp_path / "chat.j2", "--body-file", tmp_path / "body.json",
        "--temperature", 0.2, "--param", "repetition_penalty=1.05", "--param", "top_k=null",
        "--param", "chat_template_kwargs.thinking=true", "--stop", "END", "--stop", "\n\n",
        "--think-budget", 64, "--no-think-suffix", "--seed", 3, "-o", out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (line,) = read(out)
    assert line["body"] == {
        "model": "from-file",
        "temperature": 0.2,
        "seed": 3,
        "stop": ["END", "\n\n"],
        "repetition_penalty": 1.05,
        "chat_template_kwargs": {"thinking": True, "thinking_budget": 64},
        "thinking_token_budget": 64,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": 'say "hi"'},
                    {"type": "image_url", "image_url": {"url": "http://x/a.png"}},
                    {"type": "text", "text": "/no_think"},
                ],
            }
        ],
    }
    out = tmp_path / "c.jsonl"
    proc = gen("--data", data, "--prompt", "{{ q }}", "--url", "/v1/completions", "--model", "m",
               "--max-tokens", 7, "-o", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (line,) = read(out)
    assert line["url"] == "/v1/completions"
    assert line["body"] == {"model": "m", "max_tokens": 7, "prompt": 'say "hi"'}


def test_where_limit_and_seeded_sample(tmp_path):
    rows = [{"i": i, "split": "test" if i % 3 else "train"} for i in range(300)]
    data = write_jsonl(tmp_path / "d.jsonl", rows)

    def ids(*extra):
        out = tmp_path / "r.jsonl"
        proc = gen(
            "--data", data, "--prompt", "{{ i }}", "--model", "m", "--force", "-o", out, *extra
        )
        assert proc.returncode == 0, proc.stderr
        return [x["custom_id"] for x in read(out)]

    assert ids("--where", "split == 'train'", "--limit", 3) == ["0", "3", "6"]
    first = ids("--where", "split == 'test'", "--where", "i > 100", "--sample", 5, "--seed", 7)
    assert len(first) == 5
    assert all(int(i) > 100 and int(i) % 3 for i in first)
    assert first == sorted(first, key=int)
    assert (
        ids("--where", "split == 'test'", "--where", "i > 100", "--sample", 5, "--seed", 7) == first
    )


def test_missing_field_names_the_row_and_writes_nothing(tmp_path):
    data = write_jsonl(tmp_path / "tasks.jsonl", TASKS)
    (tmp_path / "p.j2").write_text("{{ problem }}\n{{ hints }}\n")
    out = tmp_path / "r.jsonl"
    proc = gen("--data", data, "--template", tmp_path / "p.j2", "--model", "m", "-o", out)
    assert_clean_failure(proc, 1, tmp_path)
    assert f"cannot render {tmp_path / 'p.j2'} (template line 2)" in proc.stderr
    assert (
        f"{data}:1: hints: row 0: has no field 'hints' (it has: instance_id, problem)"
        in proc.stderr
    )
    assert not out.exists()


def test_repeated_id_is_an_error_naming_the_row(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"k": "a"}, {"k": "b"}, {"k": "a"}])
    proc = gen(
        "--data",
        data,
        "--prompt",
        "x",
        "--id",
        "{{ k }}",
        "--model",
        "m",
        "-o",
        tmp_path / "r.jsonl",
    )
    assert_clean_failure(proc, 1, tmp_path)
    assert f"{data}:3: custom_id: row 2: 'a' repeats the id of row 0" in proc.stderr
    assert not (tmp_path / "r.jsonl").exists()


def test_overwrite_needs_force(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"q": "new"}])
    out = tmp_path / "r.jsonl"
    out.write_text("precious\n")
    proc = gen("--data", data, "--prompt", "{{ q }}", "--model", "m", "-o", out)
    assert_clean_failure(proc, 1, tmp_path)
    assert "exists; refusing to overwrite it (--force replaces it)" in proc.stderr
    assert out.read_text() == "precious\n"
    assert (
        gen("--data", data, "--prompt", "{{ q }}", "--model", "m", "-o", out, "--force").returncode
        == 0
    )
    assert read(out)[0]["body"]["messages"][0]["content"] == "new"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "m"], "exactly one of --template, --prompt or --messages"),
        (["--prompt", "x", "--greedy-first"], "greedy-first needs samples"),
        (["--prompt", "x", "--where", "a =="], "bad condition"),
        (["--prompt", "x", "--param", "novalue"], "--param wants KEY=JSON"),
        (["--prompt", "x", "--url", "/v1/embeddings", "--temperature", "1"], "no meaning"),
        (
            ["--prompt", "x", "--system", "s", "--url", "/v1/completions"],
            "--system builds chat messages, but /v1/completions takes a prompt string",
        ),
    ],
)
def test_usage_errors_exit_2(tmp_path, args, message):
    data = write_jsonl(tmp_path / "d.jsonl", [{"q": 1}])
    proc = gen("--data", data, *args, "-o", tmp_path / "r.jsonl")
    assert_clean_failure(proc, 2, tmp_path)
    assert message in proc.stderr
    assert not (tmp_path / "r.jsonl").exists()


def test_option_combinations_are_checked_before_the_data_is_read(tmp_path):
    # The data file does not even exist: the usage error comes first, once, not once per row.
    proc = gen(
        "--data", tmp_path / "absent.jsonl", "--prompt", "x", "--system", "s",
        "--url", "/v1/completions", "--model", "m", "-o", tmp_path / "r.jsonl",
    )  # fmt: skip
    assert_clean_failure(proc, 2, tmp_path)
    assert "--system builds chat messages" in proc.stderr and "row" not in proc.stderr


def test_summary_counts_read_as_english(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"q": 1}])
    out = tmp_path / "r.jsonl"
    proc = gen("--data", data, "--prompt", "{{ q }}", "--model", "m", "--samples", "2", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "wrote 2 requests (1 row x 2 samples)" in proc.stderr
    proc = gen("--data", data, "--prompt", "{{ q }}", "--model", "m", "-o", out, "--force")
    assert "wrote 1 request to" in proc.stderr


def test_round_trip_gen_then_exec_on_the_mock(tmp_path):
    data = write_jsonl(tmp_path / "tasks.jsonl", TASKS)
    requests = tmp_path / "requests.jsonl"
    proc = gen("--data", data, "--prompt", "{{ problem }}", "--id", "{{ instance_id }}",
               "--samples", 3, "--greedy-first", "--n", 2, "--temperature", 0.7, "--seed", 1,
               "--max-tokens", 64, "--no-think", "--model", "mock", "-o", requests)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    sent = {x["custom_id"]: x for x in read(requests)}
    assert len(sent) == 9
    out = tmp_path / "responses.jsonl"
    port = str(free_port())  # not the default 8000, which other runs on the machine may hold
    proc = cli(
        "exec", str(requests), "-o", str(out), "--serve", "mock", "--port", port, "-q", timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    results = read_results(out)  # one line per id, none repeated
    assert set(results) == set(sent)
    for cid, line in results.items():
        assert line["error"] is None and line["response"]["status_code"] == 200
        choices = line["response"]["body"]["choices"]
        assert len(choices) == sent[cid]["body"].get("n", 1)


def test_force_through_a_symlink_writes_the_real_file(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"q": "new"}])
    real = tmp_path / "store" / "r.jsonl"
    real.parent.mkdir()
    real.write_text("old\n")
    link = tmp_path / "r.jsonl"
    link.symlink_to(real)
    proc = gen("--data", data, "--prompt", "{{ q }}", "--model", "m", "-o", link, "--force")
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink()
    assert read(real)[0]["body"]["messages"][0]["content"] == "new"
    assert sorted(p.name for p in real.parent.iterdir()) == ["r.jsonl"]


def test_a_prompt_that_names_a_file_is_pointed_out(tmp_path):
    """Issue 26: `gen --prompt prompt.j2` silently used the literal text "prompt.j2"."""
    data = write_jsonl(tmp_path / "d.jsonl", [{"q": 1}])
    template = tmp_path / "ask.txt"
    template.write_text("Answer: {{ q }}")
    for value, instead in ((tmp_path / "prompt.j2", "use --template"), (template, "--template")):
        proc = gen("--data", data, "--prompt", value, "--model", "m", "-o", tmp_path / "r.jsonl")
        assert_clean_failure(proc, 2, tmp_path)
        assert f"--prompt takes the template text itself, but '{value}' names a file" in proc.stderr
        assert instead in proc.stderr and not (tmp_path / "r.jsonl").exists()
    system = gen("--data", data, "--prompt", "{{ q }}", "--system", "system.jinja", "--model",
                 "m", "-o", tmp_path / "r.jsonl")  # fmt: skip
    assert_clean_failure(system, 2, tmp_path)
    ok = gen("--data", data, "--prompt", "prompt.j2?", "--model", "m", "-o", tmp_path / "r.jsonl")
    assert ok.returncode == 0, ok.stderr  # not a file name: a one-word prompt stays a prompt

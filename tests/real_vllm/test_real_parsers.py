"""Every command line the launcher builds, parsed by vLLM's own CLI parser and SGLang's own
`ServerArgs` parser (in the setup's venv). A flag a real parser rejects fails here."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Any

import pytest
from standins.harness import standin_parser

from jsonlbatch.serve.backends import ServeOptions
from jsonlbatch.serve.launch import plan_servers
from real_vllm.vllmtier import free_port, parse_with_real_parsers

REPLICA_PORT = free_port()  # an explicit --port for the replicas case, free now
SGLANG_PROGRAM = (sys.executable, "-m", "sglang.launch_server")

# Everything ServeOptions maps, for both servers.
FULL: dict[str, Any] = {
    "host": "0.0.0.0",
    "api_key": "sk-parse-secret-1",
    "gpu_memory_utilization": 0.88,
    "context_length": 32768,
    "reasoning_parser": "qwen3",
    "tool_call_parser": "hermes",
    "seed": 7,
}
PASS_THROUGH = {
    "vllm": (
        "--max-num-seqs",
        "64",
        "--enforce-eager",
        "--trust-remote-code",
        "--default-chat-template-kwargs",
        '{"enable_thinking": false}',
        "-O0",
        "--max-num-batched-tokens=8192",
    ),
    "sglang": (
        "--log-level",
        "warning",
        "--trust-remote-code",
        "--skip-server-warmup",
        "--load-balance-method",
        "round_robin",
        "--default-chat-template-kwargs",
        '{"enable_thinking": false}',
    ),
}


def _cases(backend: str, model: str, template: str) -> list[tuple[str, ServeOptions]]:
    names = ("a", "b") if backend == "vllm" else ("a",)
    base = {"backend": backend, "model_path": model}
    return [
        ("minimal", ServeOptions(**base)),
        ("tp2", ServeOptions(**base, tp_size=2, gpus=("0", "1"))),
        (
            "tp2-dp4-native",
            ServeOptions(
                **base,
                tp_size=2,
                dp_size=4,
                gpus=tuple("01234567"),
                served_model_name=names,
                chat_template=template,
                **FULL,
            ),
        ),
        (
            "tp2-dp2-replicas",
            ServeOptions(
                **base,
                tp_size=2,
                dp_size=2,
                dp_mode="replicas",
                gpus=tuple("0123"),
                served_model_name=names[:1],
                port=REPLICA_PORT,
                **FULL,
            ),
        ),
        (
            "pass-through",
            ServeOptions(**base, served_model_name=names[:1], server_args=PASS_THROUGH[backend]),
        ),
    ]


#: A fleet file whose entries set every key a fleet entry (or an experiment's `serve:`) takes.
FLEET = """\
models:
  - backend: vllm
    model_path: {model}
    served_model_name: [a, b]
    tp_size: 2
    dp_size: 2
    dp_mode: replicas
    gpus: [0, 1, 2, 3]
    gpu_memory_utilization: 0.88
    context_length: 2048
    chat_template: {template}
    reasoning_parser: qwen3
    tool_call_parser: hermes
    server_seed: 7
    server_args: {vllm_args}
    env: {{VLLM_LOGGING_LEVEL: WARNING}}
    host: 0.0.0.0
    port: {port}
    api_key_env: JSONLBATCH_FLEET_PARSE_KEY
    restart: 1
    ready_timeout: 60
    caches: true
  - {{backend: vllm, model_path: {model}, served_model_name: c, tp_size: 2, dp_size: 2,
     gpu_count: 4}}
  - backend: sglang
    model_path: {model}
    served_model_name: d
    dp_size: 2
    gpu_count: 2
    gpu_memory_utilization: 0.8
    context_length: 2048
    chat_template: {template}
    reasoning_parser: qwen3
    tool_call_parser: hermes
    server_seed: 7
    server_args: {sglang_args}
    api_key_env: JSONLBATCH_FLEET_PARSE_KEY
"""


def _fleet_servers(folder: Any, model: str, template: str) -> list[tuple[str, Any]]:
    """Every server a fleet with every entry key plans, labelled `model/index`."""
    from jsonlbatch.serve.fleet import load_fleet
    from jsonlbatch.serve.fleetrun import plan_fleet

    path = folder / "fleet.yaml"
    path.write_text(
        FLEET.format(
            model=model, template=template, port=free_port(),
            vllm_args=json.dumps(list(PASS_THROUGH["vllm"])),
            sglang_args=json.dumps(list(PASS_THROUGH["sglang"])),
        )
    )  # fmt: skip
    os.environ["JSONLBATCH_FLEET_PARSE_KEY"] = "sk-fleet-parse-secret"
    try:
        fleet = plan_fleet(load_fleet(str(path)), gpus=(",".join("0123456789"),))
    finally:
        del os.environ["JSONLBATCH_FLEET_PARSE_KEY"]
    return [(p.label, p) for _, group in fleet.groups for p in group.processes]


def _argv(backend: str, argv: tuple[str, ...]) -> list[str]:
    """The arguments after the program: `serve M ...` for vLLM, `--model-path M ...`."""
    if backend == "vllm":
        assert argv[0] == "vllm"
        return list(argv[1:])
    assert argv[: len(SGLANG_PROGRAM)] == SGLANG_PROGRAM
    return list(argv[len(SGLANG_PROGRAM) :])


@pytest.fixture(scope="module")
def parsed(vllm_setup: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """(backend, case, server index) -> the real parser's verdict, for every planned server."""
    folder = tmp_path_factory.mktemp("parse")
    template = folder / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    items, keys, options = [], [], {}
    for backend in ("vllm", "sglang"):
        for name, opts in _cases(backend, vllm_setup["model"], str(template)):
            for server in plan_servers(opts, log_stem=str(folder / name)):
                items.append({"kind": backend, "argv": _argv(backend, server.command.argv)})
                keys.append((backend, name, server.index))
                options[keys[-1]] = (opts, server)
        for bad in (["--no-such-flag"], ["--served-model-name"]):
            model = ["serve", vllm_setup["model"]] if backend == "vllm" else ["--model-path", "m"]
            items.append({"kind": backend, "argv": model + bad})
            keys.append((backend, "bad", bad[0]))
        items.append({"kind": backend, "argv": ["--list-options"]})
        keys.append((backend, "options", 0))
    for label, server in _fleet_servers(folder, vllm_setup["model"], str(template)):
        backend = "vllm" if server.command.argv[0] == "vllm" else "sglang"
        items.append({"kind": backend, "argv": _argv(backend, server.command.argv)})
        keys.append((backend, "fleet", label))
        options[keys[-1]] = (None, server)
    results = dict(zip(keys, parse_with_real_parsers(vllm_setup, items), strict=True))
    return {"results": results, "options": options}


def test_every_vllm_and_sglang_command_line_parses(parsed: dict) -> None:
    results = parsed["results"]
    launched = {k: v for k, v in results.items() if k[1] not in ("bad", "options", "fleet")}
    assert len(launched) == 12  # 5 cases each, the replicas case planning two servers
    refused = {
        k: (v["error"], shlex.join(parsed["options"][k][1].command.argv))
        for k, v in launched.items()
        if not v["ok"]
    }
    assert not refused


def test_a_flag_the_real_parser_does_not_know_is_refused(parsed: dict) -> None:
    """The check above can fail: these are refused with the servers' own messages."""
    for backend in ("vllm", "sglang"):
        unknown = parsed["results"][(backend, "bad", "--no-such-flag")]
        assert not unknown["ok"] and "unrecognized arguments: --no-such-flag" in unknown["error"]
        missing = parsed["results"][(backend, "bad", "--served-model-name")]
        assert not missing["ok"] and "expected" in missing["error"]


def test_vllm_reads_each_mapped_option_as_meant(parsed: dict, vllm_setup: dict) -> None:
    results = parsed["results"]
    native = results[("vllm", "tp2-dp4-native", 0)]["args"]
    assert native["model_tag"] == vllm_setup["model"]  # positional, as `vllm serve M`
    assert (native["tensor_parallel_size"], native["data_parallel_size"]) == (2, 4)
    assert native["served_model_name"] == ["a", "b"]
    assert native["host"] == "0.0.0.0" and native["gpu_memory_utilization"] == 0.88
    assert native["max_model_len"] == 32768 and native["seed"] == 7
    assert native["reasoning_parser"] == "qwen3" and native["tool_call_parser"] == "hermes"
    assert native["enable_auto_tool_choice"] is True
    assert native["api_key"] is None  # the key travels in VLLM_API_KEY, not in argv
    replicas = [results[("vllm", "tp2-dp2-replicas", i)]["args"] for i in (0, 1)]
    assert [r["data_parallel_size"] for r in replicas] == [1, 1]
    assert [r["tensor_parallel_size"] for r in replicas] == [2, 2]
    assert replicas[0]["port"] == REPLICA_PORT and replicas[1]["port"] > REPLICA_PORT
    through = results[("vllm", "pass-through", 0)]["args"]
    assert through["max_num_seqs"] == 64 and through["enforce_eager"] is True
    assert through["default_chat_template_kwargs"] == {"enable_thinking": False}
    assert through["max_num_batched_tokens"] == 8192


def test_sglang_reads_each_mapped_option_as_meant(parsed: dict) -> None:
    results = parsed["results"]
    native = results[("sglang", "tp2-dp4-native", 0)]["args"]
    assert (native["tp_size"], native["dp_size"]) == (2, 4)
    assert native["served_model_name"] == "a" and native["api_key"] == "sk-parse-secret-1"
    assert native["mem_fraction_static"] == 0.88 and native["context_length"] == 32768
    assert native["random_seed"] == 7 and native["reasoning_parser"] == "qwen3"
    assert native["tool_call_parser"] == "hermes" and native["host"] == "0.0.0.0"
    replicas = [results[("sglang", "tp2-dp2-replicas", i)]["args"] for i in (0, 1)]
    assert [r["dp_size"] for r in replicas] == [1, 1]
    assert replicas[1]["port"] - replicas[0]["port"] >= 1024  # beyond SGLang's side ports
    through = results[("sglang", "pass-through", 0)]["args"]
    assert through["log_level"] == "warning" and through["skip_server_warmup"] is True


def test_every_flag_a_fleet_entry_produces_parses(parsed: dict) -> None:
    results = parsed["results"]
    fleet = {k: v for k, v in results.items() if k[1] == "fleet"}
    assert sorted(k[2] for k in fleet) == ["a/0", "a/1", "c/0", "d/0"]
    refused = {
        k: (v["error"], shlex.join(parsed["options"][k][1].command.argv))
        for k, v in fleet.items()
        if not v["ok"]
    }
    assert not refused
    a = [results[("vllm", "fleet", f"a/{i}")]["args"] for i in (0, 1)]
    assert [(r["tensor_parallel_size"], r["data_parallel_size"]) for r in a] == [(2, 1)] * 2
    assert a[0]["served_model_name"] == ["a", "b"] and a[0]["seed"] == 7
    assert a[0]["gpu_memory_utilization"] == 0.88 and a[0]["max_model_len"] == 2048
    assert a[0]["tool_call_parser"] == "hermes" and a[0]["enable_auto_tool_choice"] is True
    assert a[0]["max_num_seqs"] == 64 and a[0]["host"] == "0.0.0.0"
    assert a[1]["port"] > a[0]["port"]
    c = results[("vllm", "fleet", "c/0")]["args"]
    assert (c["tensor_parallel_size"], c["data_parallel_size"]) == (2, 2)
    d = results[("sglang", "fleet", "d/0")]["args"]
    assert d["dp_size"] == 2 and d["random_seed"] == 7 and d["api_key"] == "sk-fleet-parse-secret"
    assert d["mem_fraction_static"] == 0.8 and d["log_level"] == "warning"
    env = dict(parsed["options"][("vllm", "fleet", "a/0")][1].command.env)
    assert env["VLLM_LOGGING_LEVEL"] == "WARNING" and env["VLLM_API_KEY"] == "sk-fleet-parse-secret"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["VLLM_CACHE_ROOT"].endswith("/a/0/vllm")


def _standin_options(kind: str) -> set[str]:
    parser = standin_parser(kind)
    for action in parser._actions:  # vLLM's stand-in: the `serve` subcommand
        if isinstance(action, argparse._SubParsersAction):
            parser = action.choices["serve"]
    return {s for s in parser._option_string_actions if s.startswith("-")} - {"-h", "--help"}


def test_the_standins_know_only_flags_the_real_servers_know(parsed: dict) -> None:
    """The stand-ins the default suite launches accept nothing the real servers would refuse."""
    real_vllm = set(parsed["results"][("vllm", "options", 0)]["options"])
    real_sglang = set(parsed["results"][("sglang", "options", 0)]["options"])
    assert _standin_options("vllm") - real_vllm == set()
    assert _standin_options("sglang") - real_sglang == set()

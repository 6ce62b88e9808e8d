"""Server command lines, GPU plans and ports: everything decided before a server starts."""

from __future__ import annotations

import re
import socket
import sys
import threading
from pathlib import Path

import click
import pytest
from standins.harness import SERVERS_MD, standin_parser

from jsonlbatch.cli.serve_options import serve_options, serve_options_from_kwargs
from jsonlbatch.errors import UsageError
from jsonlbatch.serve.backends import ServeOptions, build_command
from jsonlbatch.serve.gpus import gpu_groups, gpu_holders, pick_ports, port_is_free, visible_gpus
from jsonlbatch.serve.launch import log_paths, plan_servers

FULL = {
    "model_path": "/ckpt/model",
    "tp_size": 2,
    "dp_size": 4,
    "host": "0.0.0.0",
    "api_key": "sk-test-secret-123",
    "gpu_memory_utilization": 0.88,
    "context_length": 32768,
    "chat_template": "/t/chat.jinja",
    "reasoning_parser": "qwen3",
    "tool_call_parser": "hermes",
    "seed": 7,
    "server_args": ("--trust-remote-code",),
}


def test_vllm_command_line_is_exact_and_keeps_the_key_out_of_argv() -> None:
    cmd = build_command(
        ServeOptions("vllm", served_model_name=("a", "b"), **FULL), port=8123, data_parallel=4
    )
    assert cmd.argv == (
        "vllm", "serve", "/ckpt/model", "--host", "0.0.0.0", "--port", "8123",
        "--served-model-name", "a", "b", "--tensor-parallel-size", "2",
        "--data-parallel-size", "4", "--gpu-memory-utilization", "0.88",
        "--max-model-len", "32768", "--chat-template", "/t/chat.jinja",
        "--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser",
        "hermes", "--seed", "7", "--trust-remote-code",
    )  # fmt: skip
    assert dict(cmd.env) == {"VLLM_API_KEY": "sk-test-secret-123"}
    parsed = standin_parser("vllm").parse_args(cmd.argv[1:])
    assert parsed.data_parallel_size == 4 and parsed.served_model_name == ["a", "b"]


def test_sglang_command_line_is_exact() -> None:
    cmd = build_command(
        ServeOptions("sglang", served_model_name=("qwen",), **FULL), port=30000, data_parallel=4
    )
    program = (sys.executable, "-m", "sglang.launch_server")
    assert cmd.argv == (
        *program, "--model-path", "/ckpt/model", "--host", "0.0.0.0", "--port", "30000",
        "--served-model-name", "qwen", "--tp-size", "2", "--dp-size", "4",
        "--api-key", "sk-test-secret-123", "--mem-fraction-static", "0.88",
        "--context-length", "32768", "--chat-template", "/t/chat.jinja",
        "--reasoning-parser", "qwen3", "--tool-call-parser", "hermes", "--random-seed", "7",
        "--trust-remote-code",
    )  # fmt: skip
    assert cmd.env == ()
    assert "sk-test-secret-123" not in cmd.display()  # what gets logged is masked
    parser = standin_parser("sglang")
    assert parser.parse_args(cmd.argv[3:]).dp_size == 4


def test_flags_we_emit_are_the_documented_ones() -> None:
    if not SERVERS_MD.exists():
        pytest.skip("the shared reference is not available here")
    doc = SERVERS_MD.read_text()
    for backend in ("vllm", "sglang"):
        cmd = build_command(ServeOptions(backend, **FULL), port=1, data_parallel=2)
        flags = {a for a in cmd.argv if a.startswith("--")} - {"--trust-remote-code"}
        for flag in flags:
            assert re.search(re.escape(flag) + r"\b", doc), f"{backend}: {flag} not in servers.md"


def test_mock_command_and_minimal_commands() -> None:
    mock = build_command(
        ServeOptions("mock", served_model_name=("m1", "m2"), api_key="k-secret-9"),
        port=9,
        data_parallel=1,
    )
    assert mock.argv == (
        sys.executable, "-m", "jsonlbatch.mock", "--host", "127.0.0.1", "--port", "9",
        "--served-model-name", "m1", "m2",
    )  # fmt: skip
    assert dict(mock.env) == {"JSONLBATCH_MOCK_API_KEY": "k-secret-9"}
    plain = build_command(ServeOptions("vllm", model_path="M"), port=8000, data_parallel=1)
    assert plain.argv == (
        "vllm", "serve", "M", "--host", "127.0.0.1", "--port", "8000",
        "--tensor-parallel-size", "1",
    )  # fmt: skip


def test_executable_override_is_split_like_a_shell() -> None:
    opts = ServeOptions("sglang", model_path="M", executable="/opt/py -m sglang.launch_server")
    assert build_command(opts, port=1, data_parallel=1).argv[:3] == (
        "/opt/py",
        "-m",
        "sglang.launch_server",
    )
    opts = ServeOptions("vllm", model_path="M", executable="/opt/my vllm/bin/vllm")
    assert build_command(opts, port=1, data_parallel=1).argv[:1] == ("/opt/my",)
    opts = ServeOptions("vllm", model_path="M", executable="'/opt/my vllm/bin/vllm'")
    assert build_command(opts, port=1, data_parallel=1).argv[:2] == (
        "/opt/my vllm/bin/vllm",
        "serve",
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend": "tgi"}, "unknown server"),
        ({"backend": "vllm"}, "needs --model-path"),
        ({"backend": "sglang", "model_path": "M", "served_model_name": ("a", "b")}, "one name"),
        ({"backend": "vllm", "model_path": "M", "dp_mode": "ray"}, "--dp-mode"),
        ({"backend": "vllm", "model_path": "M", "tp_size": 0}, "at least 1"),
        ({"backend": "vllm", "model_path": "M", "gpu_memory_utilization": 1.5}, "within"),
        ({"backend": "vllm", "model_path": "M", "restart": -1}, "--restart-server"),
    ],
)
def test_bad_options_are_usage_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        ServeOptions(**kwargs)


def test_replicas_are_pinned_to_their_own_gpu_groups_and_ports() -> None:
    opts = ServeOptions(
        "vllm", model_path="M", tp_size=2, dp_size=4, dp_mode="replicas", gpus=("0,1,2,3,4,5,6,7",)
    )
    servers = plan_servers(opts, log_stem="out/resp.jsonl")
    assert [dict(s.command.env)["CUDA_VISIBLE_DEVICES"] for s in servers] == [
        "0,1",
        "2,3",
        "4,5",
        "6,7",
    ]
    ports = [int(s.command.argv[s.command.argv.index("--port") + 1]) for s in servers]
    assert len(set(ports)) == 4 and ports == sorted(ports)
    assert [s.url for s in servers] == [f"http://127.0.0.1:{p}/v1" for p in ports]
    assert all("--data-parallel-size" not in s.command.argv for s in servers)
    assert [s.log_path for s in servers] == [f"out/resp.jsonl.server-{i}.log" for i in range(4)]


def test_native_dp_is_one_server_over_all_its_gpus_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opts = ServeOptions("sglang", model_path="M", tp_size=2, dp_size=2)
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7,8"}
    gpus = visible_gpus(None, env)
    assert gpus is not None and gpus.ids == ("4", "5", "6", "7", "8")
    assert gpu_groups(gpus, 2, 2, replicas=False) == [("4", "5", "6", "7")]
    assert gpu_groups(gpus, 2, 2, replicas=True) == [("4", "5"), ("6", "7")]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    (server,) = plan_servers(opts)
    assert dict(server.command.env)["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert server.command.argv[-4:] == ("--tp-size", "2", "--dp-size", "2")
    assert server.log_path == "jsonlbatch-sglang.server.log"


def test_tp_times_dp_beyond_the_gpus_is_refused_before_anything_starts() -> None:
    opts = ServeOptions("vllm", model_path="M", tp_size=2, dp_size=4, gpus=("0", "1", "2"))
    with pytest.raises(UsageError, match=r"needs 8 GPUs, but --gpus gives 3 \(0,1,2\)"):
        plan_servers(opts)
    with pytest.raises(UsageError, match="names GPU 1 twice"):
        visible_gpus(["0,1", "1"])


def test_replicas_without_a_gpu_list_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi
    opts = ServeOptions("vllm", model_path="M", dp_size=2, dp_mode="replicas")
    with pytest.raises(UsageError, match="give --gpus or set CUDA_VISIBLE_DEVICES"):
        plan_servers(opts)
    # the mock needs no GPU: it ignores the environment and is never pinned
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    mock = ServeOptions("mock", served_model_name=("m",), dp_size=3, dp_mode="replicas")
    assert [s.command.env for s in plan_servers(mock)] == [(), (), ()]


def test_ports_skip_taken_ones_and_an_explicit_taken_port_is_an_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        assert not port_is_free("127.0.0.1", taken)
        ports = pick_ports("127.0.0.1", 2, taken, stride=10)
        assert taken not in ports and ports[1] - ports[0] >= 10
        with pytest.raises(UsageError, match=f"--port {taken} is not available"):
            pick_ports("127.0.0.1", 1, taken, exact=True)
        opts = ServeOptions("mock", served_model_name=("m",), port=taken)
        with pytest.raises(UsageError, match="a leftover server"):
            plan_servers(opts)


def test_a_port_bound_but_not_yet_listening_is_not_picked() -> None:
    """vLLM binds its port at start and listens only after loading the model: meanwhile the
    port must not look free to a second launcher (seen with two real vLLMs on one machine)."""
    with socket.socket() as loading:
        loading.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as vLLM does
        loading.bind(("127.0.0.1", 0))
        held = loading.getsockname()[1]
        assert port_is_free("127.0.0.1", held)  # what a SO_REUSEADDR bind alone would say
        assert not port_is_free("127.0.0.1", held, strict=True)
        assert held not in pick_ports("127.0.0.1", 1, held)
        assert pick_ports("127.0.0.1", 1, held, exact=True) == [held]  # the user's own choice


def test_sglang_replicas_leave_room_for_side_ports() -> None:
    opts = ServeOptions("sglang", model_path="M", dp_size=2, dp_mode="replicas", gpus=("0", "1"))
    a, b = (int(s.url.rsplit(":", 1)[1].split("/")[0]) for s in plan_servers(opts))
    assert b - a >= 1000


def test_log_paths() -> None:
    opts = ServeOptions("mock", served_model_name=("m",), log_dir="/logs")
    assert log_paths(opts, 1, "/data/out.jsonl") == ["/logs/out.jsonl.server.log"]
    assert log_paths(opts, 2, None) == [
        "/logs/jsonlbatch-mock.server-0.log",
        "/logs/jsonlbatch-mock.server-1.log",
    ]


def _fake_nvidia_smi(folder: Path) -> None:
    script = folder / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        '  --query-gpu=index,uuid) printf "0, GPU-aaa\\n1, GPU-bbb\\n" ;;\n'
        '  --query-gpu=index) printf "0\\n1\\n" ;;\n'
        '  *) printf "4242, python3, 70000 MiB, GPU-bbb\\n" ;;\n'
        "esac\n"
    )
    script.chmod(0o755)


def test_gpu_holders_are_found_with_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_nvidia_smi(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    (holder,) = gpu_holders(["1"])
    assert (holder.pid, holder.name, holder.used_memory, holder.gpu) == (
        4242,
        "python3",
        "70000 MiB",
        "1",
    )
    assert gpu_holders(["0"]) == []
    gpus = visible_gpus(None, {})
    assert gpus is not None and (gpus.ids, gpus.source) == (("0", "1"), "nvidia-smi")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert gpu_holders(None) == [] and visible_gpus(None, {}) is None


def _options_of(*args: str) -> ServeOptions | None:
    seen: list[ServeOptions | None] = []

    @click.command()
    @serve_options
    @click.option("--ready-timeout", type=float, default=1800.0)
    def cmd(**kwargs: object) -> None:
        seen.append(serve_options_from_kwargs(kwargs))
        assert kwargs == {"ready_timeout": kwargs["ready_timeout"]}  # ours were taken out

    cmd.main(list(args), standalone_mode=False)
    return seen[0]


def test_click_options_map_onto_serve_options() -> None:
    opts = _options_of(
        "--serve", "vllm", "--model-path", "M", "--tensor-parallel-size", "2", "--dp-size", "2",
        "--dp-mode", "replicas", "--gpus", "2,3,4,5", "--server-arg=--max-num-seqs=512",
        "--server-arg", "--enforce-eager --swap-space 4", "--mem-fraction-static", "0.8",
        "--max-model-len", "4096", "--server-seed", "3", "--restart-server", "2",
        "--ready-timeout", "60",
    )  # fmt: skip
    assert opts == ServeOptions(
        "vllm",
        model_path="M",
        tp_size=2,
        dp_size=2,
        dp_mode="replicas",
        gpus=("2", "3", "4", "5"),
        server_args=("--max-num-seqs=512", "--enforce-eager", "--swap-space", "4"),
        gpu_memory_utilization=0.8,
        context_length=4096,
        seed=3,
        restart=2,
        ready_timeout=60.0,
    )
    assert _options_of() is None
    with pytest.raises(
        UsageError, match=r"--tp-size is an option of a server `[a-z]+` launches: it needs --serve"
    ):
        _options_of("--tp-size", "2")
    with pytest.raises(
        UsageError, match=r"--server-api-key is an option of a server `[a-z]+` launches"
    ):
        _options_of("--server-api-key", "abcd")


def test_a_server_key_in_the_environment_is_no_error_without_serve(monkeypatch) -> None:
    monkeypatch.setenv("JSONLBATCH_SERVER_API_KEY", "from-the-environment")
    assert _options_of() is None
    assert _options_of("--serve", "mock").api_key == "from-the-environment"


def test_readiness_probe_of_a_port_that_does_not_speak_http_is_no_crash() -> None:
    """Something else on the port (an SSH banner): the probe says so instead of raising."""
    from jsonlbatch.serve.launch import _get

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        def answer() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        status, body = _get(f"http://127.0.0.1:{port}/health", None)
        thread.join(10)
    assert body is None and status == "no answer (BadStatusLine)"

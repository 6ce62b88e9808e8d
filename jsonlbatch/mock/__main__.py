"""`python -m jsonlbatch.mock`: the mock server as a process.

Flags mirror `vllm serve` where one exists (`--served-model-name`, `--api-key`,
`--max-model-len`, `--seed`), so a launcher can treat the mock as a stand-in server.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from collections.abc import Callable
from typing import Any

from jsonlbatch.errors import JsonlbatchError, UsageError
from jsonlbatch.mock import MockConfig, gpu, serve
from jsonlbatch.mock.app import MOCK_API_KEY_ENV


def _seconds_or_none(value: str) -> float | None:
    return None if value.strip().lower() == "none" else float(value)


# (flag, MockConfig field, type, metavar, help); defaults come from MockConfig itself.
_OPTIONS: tuple[tuple[str, str, Callable[[str], Any], str, str], ...] = (
    ("--latency", "latency", float, "S", "seconds before answering (streams: the first chunk)"),
    ("--latency-jitter", "latency_jitter", float, "S", "uniform +- jitter on --latency, seeded"),
    ("--tokens-per-second", "tokens_per_second", float, "R",
     "pace output tokens per sequence (default: instant)"),
    ("--default-max-tokens", "default_max_tokens", int, "N",
     "reply length in words when a request sets no max_tokens"),
    ("--fail-rate", "fail_rate", float, "F", "share of requests answered 500"),
    ("--rate-limit-rate", "rate_limit_rate", float, "F",
     "share of requests answered 429 with Retry-After"),
    ("--retry-after", "retry_after", _seconds_or_none, "S",
     "Retry-After seconds on injected 429s; 'none' sends no Retry-After"),
    ("--drop-rate", "drop_rate", float, "F",
     "share of requests whose connection is closed without a response"),
    ("--hang-rate", "hang_rate", float, "F",
     "share of requests never answered (held until the client gives up)"),
    ("--record-bodies", "record_bodies", int, "N",
     "keep the last N request bodies received, for GET /mock/bodies"),
    ("--stream-error-rate", "stream_error_rate", float, "F",
     "share of streams cut by an error event halfway"),
    ("--break-json", "break_json", float, "F",
     "share of answers to schema requests broken (fences, prose, a missing field, a wrong "
     "type, cut short, trailing text), drawn per request and seed"),
    ("--tool-rate", "tool_rate", float, "F",
     "share of requests offering tools with tool_choice auto that call one (drawn per request: "
     "a test conversation ends by itself)"),
    ("--api-key", "api_key", str, "KEY",
     f"require this key on /v1/* (default: ${MOCK_API_KEY_ENV}, else none)"),
    ("--max-model-len", "max_model_len", int, "N",
     "refuse prompt + max_tokens above N with a context-length 400"),
    ("--warmup", "warmup", float, "S",
     "answer /health and generation 503 for S seconds after binding"),
    ("--seed", "seed", int, "N", "seed of fault injection and jitter"),
    ("--rpm", "rpm", float, "N", "enforce N requests per minute (429 + rate-limit headers)"),
    ("--tpm", "tpm", float, "N", "enforce N tokens per minute (prompt + output cap)"),
    ("--rate-limit-burst", "rate_limit_burst", float, "S",
     "the --rpm/--tpm buckets hold S seconds of their rate"),
    ("--rate-limit-headers", "rate_limit_headers", str, "STYLE",
     "header family sent with --rpm/--tpm: openai (also Azure) or anthropic"),
    ("--tool-call-format", "tool_call_format", str, "FORMAT",
     "how tool calls are written: structured (tool_calls) or hermes (<tool_call> text in "
     "the content, as a model served without a tool parser)"),
    ("--container-ttl", "container_ttl", float, "S",
     "code interpreter containers expire S seconds after their last use (default: never)"),
)  # fmt: skip
_SWITCHES = (
    ("--accept-any-model", "accept_any_model", "answer whatever model a request names"),
    ("--reasoning", "reasoning", "add reasoning text (reasoning_content and reasoning)"),
    ("--uncited-file", "uncited_file", "the code interpreter writes one file it does not cite"),
)


def build_parser() -> argparse.ArgumentParser:
    defaults = MockConfig()
    p = argparse.ArgumentParser(
        prog="python -m jsonlbatch.mock",
        description="A deterministic OpenAI-compatible mock server (vLLM's shapes and errors).",
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (default: 8000)")
    p.add_argument(
        "--served-model-name", nargs="+", default=list(defaults.served_models), metavar="NAME",
        help="model names listed by /v1/models and accepted in requests (default: mock)",
    )  # fmt: skip
    for flag, name, kind, metavar, text in _OPTIONS:
        p.add_argument(flag, dest=name, type=kind, default=getattr(defaults, name),
                       metavar=metavar, help=text)  # fmt: skip
    for flag, name, text in _SWITCHES:
        p.add_argument(flag, dest=name, action="store_true", help=text)
    p.add_argument("--startup-delay", type=float, default=0.0, metavar="S",
                   help="wait S seconds before binding the port (a cold start)")  # fmt: skip
    gpu.add_arguments(p)
    return p


def config_from_args(args: argparse.Namespace) -> MockConfig:
    """The `MockConfig` the parsed flags describe (the key falls back to the environment)."""
    names = [option[1] for option in _OPTIONS] + [switch[1] for switch in _SWITCHES]
    fields: dict[str, Any] = {name: getattr(args, name) for name in names}
    fields["api_key"] = fields["api_key"] or os.environ.get(MOCK_API_KEY_ENV) or None
    fields["gpu"] = gpu.from_args(args)
    try:
        return MockConfig(served_models=tuple(args.served_model_name), **fields)
    except UsageError as exc:  # MockConfig names its fields; a command-line user typed flags
        message = str(exc)
        flags = [option[:2] for option in _OPTIONS] + [switch[:2] for switch in _SWITCHES]
        for flag, name in flags:
            message = re.sub(rf"\b{name}\b", flag, message)
        raise UsageError(message) from None


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    # Until the server's loop takes signals over, SIGTERM stops us as quietly as SIGINT does.
    signal.signal(signal.SIGTERM, _interrupt)
    args = build_parser().parse_args(argv)
    try:
        if args.startup_delay < 0:
            raise UsageError(f"--startup-delay must not be negative, got {args.startup_delay}")
        serve(config_from_args(args), args.host, args.port, startup_delay=args.startup_delay)
    except JsonlbatchError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:  # a SIGINT that arrived before the loop took signals over
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

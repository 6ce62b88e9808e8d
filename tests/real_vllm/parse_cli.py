"""Parse server command lines with the servers' own parsers; run with the vLLM venv's Python.

Reads a JSON list of {"kind": "vllm" | "sglang", "argv": [...]} on stdin (argv without the
program: `serve MODEL ...` for vLLM, `--model-path M ...` for SGLang's launch_server) and prints
a JSON list of {"ok": bool, "error": str, "args": {...}} in the same order. The argv
["--list-options"] lists the flags instead ({"options": [...]}: `vllm serve`'s, launch_server's).

vLLM: the parser is built as `vllm`'s own main() builds it (every subcommand), then the
subcommand's `validate` runs, as before a server starts. SGLang: `ServerArgs.add_cli_args` on a
plain ArgumentParser, as `sglang.launch_server` does (its `__post_init__` wants a GPU, so the
parsed namespace is not turned into a ServerArgs).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys


def _vllm_parser() -> tuple[argparse.ArgumentParser, dict]:
    import vllm.entrypoints.cli.openai
    import vllm.entrypoints.cli.run_batch
    import vllm.entrypoints.cli.serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    commands = {}
    for module in (
        vllm.entrypoints.cli.openai,
        vllm.entrypoints.cli.serve,
        vllm.entrypoints.cli.run_batch,
    ):
        for cmd in module.cmd_init():
            cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
            commands[cmd.name] = cmd
    return parser, commands


def _sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    return parser


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(s for s in parser._option_string_actions if s.startswith("-"))


def _parse(kind: str, argv: list[str], cache: dict) -> dict:
    if kind not in cache:
        cache[kind] = _vllm_parser() if kind == "vllm" else (_sglang_parser(), {})
    parser, commands = cache[kind]
    if argv == ["--list-options"]:  # every flag `vllm serve` / launch_server knows
        if kind == "vllm":
            sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            parser = sub.choices["serve"]
        return {"ok": True, "error": "", "options": _options(parser)}
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
            command = commands.get(getattr(args, "subparser", None))
            if command is not None:
                command.validate(args)
    except SystemExit as exc:
        lines = err.getvalue().strip().splitlines() or [""]
        said = [line for line in lines if "error:" in line] or lines[-1:]
        return {"ok": False, "error": f"exit {exc.code}: {said[-1]}"}
    except Exception as exc:  # a validate() refusal: the server would exit the same way
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    values = {k: v for k, v in vars(args).items() if k != "dispatch_function"}
    return {"ok": True, "error": "", "args": json.loads(json.dumps(values, default=repr))}


def main() -> int:
    cache: dict = {}
    results = [_parse(item["kind"], item["argv"], cache) for item in json.load(sys.stdin)]
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Drop-in for the Agentless batch workflow's `scripts/serve_and_process_batch_requests.py`.

    python scripts/serve_and_process_batch_requests.py --input_file requests.jsonl \
        --output_file responses.jsonl --url http://127.0.0.1:8000/v1/chat/completions \
        --concurrency 32 --timeout 3600 \
        --serve --tp-size 1 --dp-size 8 --model-path /ckpt/model --reasoning-parser deepseek-r1

`--serve` launches SGLang (`--serve vllm` or `--serve mock` pick another server) on the host and
port of `--url`, waits until it serves, runs the requests, and always stops it. Flags this
script does not know go to the server unchanged; `--dp-mode replicas`, `--restart-server N` and
`--ready-timeout S` work as in `jsonlbatch exec --serve`. The server log is written beside the
output file. Without `--serve` it is `process_batch_requests.py`.
"""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from collections.abc import Sequence

from process_batch_requests import base_url, build_parser, process, report_errors

from jsonlbatch.serve.backends import BACKEND_NAMES, DP_MODES, ServeOptions
from jsonlbatch.serve.start import serving


def server_parser() -> argparse.ArgumentParser:
    """The server flags this script reads itself; every other flag goes to the server."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--model-path")
    p.add_argument("--served-model-name", nargs="+", default=())
    p.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    p.add_argument("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    p.add_argument("--dp-mode", choices=DP_MODES, default="native")
    p.add_argument("--gpus", default=None)
    p.add_argument("--restart-server", dest="restart", type=int, default=0)
    p.add_argument("--ready-timeout", type=float, default=1800.0)
    return p


def serve_options(
    args: argparse.Namespace, server: argparse.Namespace, rest: list[str]
) -> ServeOptions:
    """Where to serve comes from --url, what to serve from the server flags."""
    split = urllib.parse.urlsplit(args.url)
    host = split.hostname or "127.0.0.1"
    return ServeOptions(
        backend=args.serve,
        model_path=server.model_path,
        served_model_name=tuple(server.served_model_name),
        tp_size=server.tp_size,
        dp_size=server.dp_size,
        dp_mode=server.dp_mode,
        host="127.0.0.1" if host == "localhost" else host,
        port=split.port,
        gpus=tuple(server.gpus.split(",")) if server.gpus else None,
        server_args=tuple(rest),
        ready_timeout=server.ready_timeout,
        restart=server.restart,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(__doc__)
    parser.add_argument(
        "--serve",
        nargs="?",
        const="sglang",
        choices=BACKEND_NAMES,
        help="launch a server first (default when given alone: sglang)",
    )
    args, unknown = parser.parse_known_args(argv)
    if not args.serve:
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)} (server flags need --serve)")
        return report_errors(lambda: process(args, [base_url(args.url)]))
    server, rest = server_parser().parse_known_args(unknown)

    def run() -> int:
        options = serve_options(args, server, rest)
        with serving(options, log_stem=args.output_file) as servers:
            return process(args, servers.urls, watchdog=servers.check)

    return report_errors(run)


if __name__ == "__main__":
    sys.exit(main())

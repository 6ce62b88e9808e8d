"""Stand-in for `python -m sglang.launch_server --model-path M [flags]` (see standin.py).

Accepts the flags listed in /work/shared/reference/servers.md and exits 2 on any other. Like
the real server it logs its arguments, API key included, so tests can prove the log is masked.
"""

from __future__ import annotations

import argparse
import sys

import standin

from jsonlbatch.mock import MockConfig


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="launch_server.py")
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--dp-size", "--data-parallel-size", type=int, default=1)
    p.add_argument("--served-model-name")
    p.add_argument("--api-key")
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--context-length", type=int)
    p.add_argument("--chat-template")
    p.add_argument("--reasoning-parser")
    p.add_argument("--tool-call-parser")
    p.add_argument("--random-seed", type=int)
    p.add_argument("--log-level", default="info")
    p.add_argument("--base-gpu-id", type=int, default=0)
    p.add_argument("--gpu-id-step", type=int, default=1)
    p.add_argument("--load-balance-method", default="round_robin")
    p.add_argument("--default-chat-template-kwargs")
    p.add_argument("--skip-server-warmup", action="store_true")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr")
    p.add_argument("--trust-remote-code", action="store_true")
    return p


def main() -> int:
    args = parser().parse_args()
    config = MockConfig(
        served_models=(args.served_model_name or args.model_path,),
        api_key=args.api_key,
        max_model_len=args.context_length,
        reasoning=bool(args.reasoning_parser),
    )
    shown = ", ".join(f"{k}={v!r}" for k, v in vars(args).items())
    return standin.run(
        config,
        args.host,
        args.port,
        banner=[f"server_args=ServerArgs({shown})"],
        ready_line="The server is fired up and ready to roll!",
    )


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Drop-in for the Agentless batch workflow's `scripts/process_batch_requests.py`.

    python scripts/process_batch_requests.py --input_file requests.jsonl \
        --output_file responses.jsonl --url http://localhost:30000/v1/chat/completions \
        --concurrency 64

The same flags as that script, run by `jsonlbatch.execute`: the output is OpenAI Batch response
JSONL (`line["response"]["body"]["choices"][0]["message"]["content"]`), and running the same
command again after a crash resumes instead of starting over. Exit status: 0 all ok, 3 some
requests failed (their lines say why), 130 interrupted, 1-2 an error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

import jsonlbatch
from jsonlbatch.redact import redact

EXIT_SOME_FAILED = 3
_ENDPOINT_SUFFIXES = ("/chat/completions", "/completions", "/embeddings")


def build_parser(description: str | None = __doc__) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--input_file", required=True, help="OpenAI Batch request JSONL")
    p.add_argument("--output_file", required=True, help="response JSONL (resumed if it exists)")
    p.add_argument(
        "--url",
        default="http://127.0.0.1:30000/v1/chat/completions",
        help="server URL, the endpoint or its base (default: %(default)s)",
    )
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight (default: 64)")
    p.add_argument(
        "--timeout", type=float, default=1800.0, help="seconds per request (default: 1800)"
    )
    p.add_argument(
        "--model",
        default="auto",
        help="model sent in every request (default: the one model the server serves, as SGLang, "
        "which ignores the request's model, behaved)",
    )
    return p


def base_url(url: str) -> str:
    """The workflow passes the chat endpoint itself; the executor wants the /v1 base."""
    url = url.rstrip("/")
    for suffix in _ENDPOINT_SUFFIXES:
        if url.endswith(suffix):
            return url[: -len(suffix)]
    return url


def process(
    args: argparse.Namespace,
    urls: Sequence[str],
    watchdog: Callable[[], None] | None = None,
) -> int:
    """Run the request file; returns the exit status."""
    summary = jsonlbatch.execute(
        args.input_file,
        args.output_file,
        urls=list(urls),
        concurrency=args.concurrency,
        timeout=args.timeout,
        model=args.model,
        watchdog=watchdog,
    )
    print(summary.format(), file=sys.stderr)
    return EXIT_SOME_FAILED if summary.failed else 0


def report_errors(run: Callable[[], int]) -> int:
    """Errors a user can fix become one line and an exit status, as in the `jsonlbatch` CLI."""
    try:
        return run()
    except jsonlbatch.JsonlbatchError as exc:
        print(f"Error: {redact(str(exc))}", file=sys.stderr)
        return exc.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return report_errors(lambda: process(args, [base_url(args.url)]))


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Drop-in for the Agentless batch workflow's `scripts/process_batch_requests.py`.

    python scripts/process_batch_requests.py --input_file requests.jsonl \
        --output_file responses.jsonl --url http://localhost:30000/v1/chat/completions \
        --concurrency 64

The same flags as that script, run by `jsonlbatch.execute`: the output is OpenAI Batch response
JSONL (`line["response"]["body"]["choices"][0]["message"]["content"]`), and running the same
command again after a crash resumes instead of starting over.

Failed requests go to a separate error file (`--error_file`, by default the output's name with
`.errors.jsonl`), as OpenAI's Batch API splits its output and error files: the workflow's next
step (Agentless `repair.py --process_batch`) reads every output line's
`["response"]["body"]["choices"][0]["message"]["content"]` and catches only KeyError and
IndexError, so one timed-out request (`"response": null`) in the output would stop it. Running
the same command again sends the failed requests again. Exit status: 0 all ok, 3 some requests
failed (the error file says why), 130 interrupted, 1-2 an error.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence

import orjson

import jsonlbatch
from jsonlbatch.batch_format.records import is_failure
from jsonlbatch.file_io.jsonl import rewrite_atomically
from jsonlbatch.file_io.output_guard import OutputLock, check_output
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
        "--error_file",
        help="failed requests' lines (default: the output file's name with .errors.jsonl); "
        "rewritten by every run",
    )
    p.add_argument(
        "--max_retries",
        type=int,
        help="retries of a request that timed out or failed on the server's side (default: "
        "jsonlbatch's, 8)",
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
    """Run the request file, then move the failed lines to the error file; returns the exit
    status. The move happens however the run ends (an interrupt too), so the output never
    holds a line the next step cannot read."""
    check_output(error_file(args), [args.input_file, args.output_file])  # both are read
    retries = {} if args.max_retries is None else {"max_retries": args.max_retries}
    try:
        summary = jsonlbatch.execute(
            args.input_file,
            args.output_file,
            urls=list(urls),
            concurrency=args.concurrency,
            timeout=args.timeout,
            model=args.model,
            watchdog=watchdog,
            **retries,
        )
    except BaseException:
        with contextlib.suppress(jsonlbatch.JsonlbatchError):  # the run's own error is news
            split_failures(args.output_file, error_file(args))
        raise
    moved = split_failures(args.output_file, error_file(args))
    print(summary.format(), file=sys.stderr)
    if moved:
        print(f"{moved} failed requests are in {error_file(args)} (running this command again "
              "sends them again)", file=sys.stderr)  # fmt: skip
    return EXIT_SOME_FAILED if summary.failed else 0


def error_file(args: argparse.Namespace) -> str:
    """`--error_file`, else the output's name with `.errors.jsonl` for `.jsonl`."""
    if args.error_file:
        return str(args.error_file)
    stem = args.output_file[: -len(".jsonl")] if args.output_file.endswith(".jsonl") else None
    return f"{stem or args.output_file}.errors.jsonl"


def split_failures(output: str, errors: str) -> int:
    """Move the failed lines of `output` into `errors` (which then holds exactly them, so a
    stale error file never outlives the failures it listed); returns how many. The error file
    is written first: a crash in between leaves a failure in both files, never in neither."""
    if not os.path.exists(output):
        return 0
    lock = OutputLock(output)
    try:
        lock.acquire()
    except jsonlbatch.JsonlbatchError:
        return 0  # another run writes it (why this one stopped): the split is that run's
    try:
        failed = sum(1 for line in _lines(output) if _failed(line))
        if failed or os.path.exists(errors):
            rewrite_atomically(errors, (line for line in _lines(output) if _failed(line)))
        if failed:
            rewrite_atomically(output, (line for line in _lines(output) if not _failed(line)))
        return failed
    finally:
        lock.release()


def _lines(path: str) -> Iterator[bytes]:
    with open(path, "rb") as f:
        for raw in f:
            if raw.strip():
                yield raw.strip() + b"\n"


def _failed(line: bytes) -> bool:
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return False  # a torn last line: the next run cuts and resends it
    return isinstance(obj, dict) and is_failure(obj)


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

#!/usr/bin/env python3
"""The answer contract under load: share valid after re-asks, requests spent, and what checking costs.

10,000 chat requests, each declaring a nested JSON schema (an enum, a number, an array, an object
through `$ref`), go to the built-in mock (pinned to one core; exec to the other):

1. against a mock that breaks 20% of answers (`--break-json 0.2`: a third of them only wrapped in
   a code fence or prose, which the stripping rules recover; the rest a missing field, a wrong
   type, cut short or trailing text), with `exec --reask 2`: the share of valid lines (goal
   >= 99.5%) and the requests the mock answered per request (goal <= 1.3);
2. against a mock that breaks nothing, exec with the check on and with `--no-schema-check`,
   alternating, `--repeats` times each: requests/s of the whole command (goal: on >= 0.9 x off)
   and exec's CPU time per request (user + system of the process).

    python scripts/bench_contract.py                       # 10,000 requests, 3 repeats
    python scripts/bench_contract.py --requests 2000 --repeats 5 --json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_exec
from bench_exec import exec_command, free_port, median, pin

from jsonlbatch.answer_contract.schema_forms import with_schema
from jsonlbatch.batch_format.records import CHAT_URL, request_line

SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": ["positive", "negative", "neutral"]},
        "score": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "author": {"$ref": "#/$defs/Person"},
    },
    "required": ["label", "score", "tags", "author"],
    "additionalProperties": False,
    "$defs": {
        "Person": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
            "additionalProperties": False,
        }
    },
}


def write_requests(path: Path, n: int) -> None:
    """bench_exec's chat requests, each declaring `SCHEMA` (and no 16-token cap: JSON is longer)."""
    plain = path.with_suffix(".plain.jsonl")
    bench_exec.write_requests(plain, n)
    with plain.open("rb") as src, path.open("wb") as f:
        for raw in src:
            line = orjson.loads(raw)
            body = {k: v for k, v in line["body"].items() if k != "max_tokens"}
            f.write(request_line(line["custom_id"], with_schema(CHAT_URL, body, SCHEMA)))
    plain.unlink()


def start_mock(port: int, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "jsonlbatch.mock", "--port", str(port), *args]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, text=True, preexec_fn=lambda: pin(1), start_new_session=True
    )
    assert proc.stdout is not None
    if "ready" not in proc.stdout.readline():
        proc.kill()
        raise SystemExit("mock server did not start")
    return proc


def mock_requests(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/mock/stats") as resp:
        return json.loads(resp.read())["requests"].get("/v1/chat/completions", 0)


def run_exec(requests: Path, output: Path, url: str, concurrency: int, *extra: str) -> dict:
    """The whole command, pinned to core 0: wall seconds and the child's CPU seconds."""
    output.unlink(missing_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        exec_command(requests, output, url, concurrency, "--quiet", *extra),
        preexec_fn=lambda: pin(0),
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 3):
        raise SystemExit(proc.stderr)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"seconds": seconds, "cpu_s": cpu, "exit": proc.returncode}


def reask_run(requests: Path, work: Path, n: int, concurrency: int) -> dict:
    port = free_port()
    mock = start_mock(port, "--break-json", "0.2")
    try:
        out = work / "reask.jsonl"
        timing = run_exec(requests, out, f"http://127.0.0.1:{port}/v1", concurrency,
                          "--reask", "2")  # fmt: skip
        sent = mock_requests(port)
    finally:
        mock.kill()
        mock.wait()
    valid = asks = first_valid = 0
    for raw in out.read_bytes().splitlines():
        record = orjson.loads(raw)["metrics"]["contract"]
        valid += record["valid"]
        asks += record["asks"]
        first_valid += record["valid"] and record["asks"] == 1
    return {
        "requests": n,
        "valid_share": valid / n,
        "valid_first_ask_share": first_valid / n,
        "requests_sent": sent,
        "asks_recorded": asks,
        "spent_per_request": sent / n,
        "seconds": round(timing["seconds"], 2),
    }


def cost_runs(requests: Path, work: Path, n: int, concurrency: int, repeats: int) -> dict:
    port = free_port()
    mock = start_mock(port)
    url = f"http://127.0.0.1:{port}/v1"
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    try:
        run_exec(
            requests, work / "warm.jsonl", url, concurrency
        )  # caches, the mock's JIT-free warm-up
        modes = [("on", ()), ("off", ("--no-schema-check",))]
        for i in range(repeats):
            for mode, extra in modes if i % 2 == 0 else modes[::-1]:  # neither always first
                runs[mode].append(
                    run_exec(requests, work / f"{mode}.jsonl", url, concurrency, *extra)
                )
    finally:
        mock.kill()
        mock.wait()
    out = {}
    for mode, timings in runs.items():
        out[mode] = {
            "requests_per_s": round(median([n / t["seconds"] for t in timings]), 1),
            "cpu_us_per_request": round(median([t["cpu_s"] / n * 1e6 for t in timings]), 1),
        }
    out["ratio_on_off"] = round(out["on"]["requests_per_s"] / out["off"]["requests_per_s"], 3)
    out["cpu_ratio_off_on"] = round(
        out["off"]["cpu_us_per_request"] / out["on"]["cpu_us_per_request"], 3
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    try:
        import fastjsonschema  # noqa: F401

        fast = True
    except ImportError:
        fast = False
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        requests = work / "requests.jsonl"
        write_requests(requests, args.requests)
        result = {
            "fastjsonschema": fast,
            "load_before": os.getloadavg()[0],
            "reask": reask_run(requests, work, args.requests, args.concurrency),
            "cost": cost_runs(requests, work, args.requests, args.concurrency, args.repeats),
            "load_after": os.getloadavg()[0],
        }
    if args.json:
        print(json.dumps(result))
        return
    r, c = result["reask"], result["cost"]
    print(
        f"{args.requests:,} schema requests, concurrency {args.concurrency}, fastjsonschema: {fast}"
    )
    print(f"  --break-json 0.2, --reask 2: {r['valid_share']:.2%} valid "
          f"({r['valid_first_ask_share']:.2%} at the first ask); {r['requests_sent']:,} requests "
          f"answered = {r['spent_per_request']:.3f} per request")  # fmt: skip
    for mode in ("on", "off"):
        print(f"  check {mode:>3}: {c[mode]['requests_per_s']:,.0f} req/s, "
              f"{c[mode]['cpu_us_per_request']:.0f} us CPU per request (median of {args.repeats})")  # fmt: skip
    print(f"  on/off: {c['ratio_on_off']:.3f} x the requests/s, {c['cpu_ratio_off_on']:.3f} x "
          f"the CPU per request; load average {result['load_before']:.1f} -> "
          f"{result['load_after']:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()

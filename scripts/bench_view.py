"""Benchmark `jsonlbatch view` on a large response file: time to the first table, time to a
full index, memory while browsing, and the latency of filters, sorts and a text search.

    python scripts/bench_view.py --lines 1000000

The viewer runs as a real child process (`python -m jsonlbatch view FILE --port 0`) and is
asked over HTTP like the page asks it; its memory is read from /proc (VmRSS now, VmHWM peak).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import orjson

ANSWER = "The answer is 42, because six times seven is forty-two. " * 3


def make_file(path: Path, lines: int) -> None:
    with path.open("wb") as fh:
        for i in range(lines):
            failed = i % 50 == 0
            line = {
                "id": f"batch_req_{i}",
                "custom_id": f"task-{i:07d}|{i % 4}",
                "response": {
                    "status_code": 500 if failed else 200,
                    "body": {"error": {"message": "boom"}}
                    if failed
                    else {
                        "model": "m",
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "length" if i % 9 == 0 else "stop",
                                "message": {"role": "assistant", "content": f"{ANSWER} #{i}"},
                            }
                        ],
                        "usage": {"prompt_tokens": 100 + i % 50, "completion_tokens": 20 + i % 200},
                    },
                },
                "error": {"code": "http_500", "message": "HTTP 500"} if failed else None,
                "metrics": {
                    "latency_s": (i * 7919 % 10007) / 1000,
                    "ttft_s": 0.05,
                    "endpoint": "http://127.0.0.1:8000/v1",
                },
            }
            fh.write(orjson.dumps(line) + b"\n")


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=600) as response:
        return json.loads(response.read())


def memory(pid: int) -> tuple[float, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def view_url(proc: subprocess.Popen) -> str:
    """The address a `jsonlbatch view` child prints once it listens."""
    assert proc.stderr is not None
    while True:
        select.select([proc.stderr], [], [], 1)
        line = proc.stderr.readline()
        if "jsonlbatch view: " in line:
            return line.split("jsonlbatch view: ")[1].split()[0]


def timed(url: str) -> tuple[float, dict]:
    start = time.perf_counter()
    data = get(url)
    return time.perf_counter() - start, data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--dir", default=None, help="where to write the file (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "responses.jsonl"
        start = time.perf_counter()
        make_file(path, args.lines)
        size = path.stat().st_size
        print(
            f"file: {args.lines:,} lines, {size / 1e6:.0f} MB, written in {time.perf_counter() - start:.1f} s"
        )
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "jsonlbatch", "view", str(path), "--port", "0"],
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            url = view_url(proc)
            listening = time.perf_counter() - started
            while True:
                rows = get(url + "api/rows?size=50")
                if rows["rows"]:
                    break
                time.sleep(0.02)
            first = time.perf_counter() - started
            print(f"listening after {listening:.2f} s; first table (50 rows) after {first:.2f} s "
                  f"(indexed then: {rows['file']['lines']:,} lines)")  # fmt: skip
            while not get(url + "api/files")["files"][0]["done"]:
                time.sleep(0.2)
            full = time.perf_counter() - started
            rss, peak = memory(proc.pid)
            print(f"whole file indexed after {full:.1f} s ({args.lines / full:,.0f} lines/s); "
                  f"memory {rss:.0f} MB (peak {peak:.0f} MB)")  # fmt: skip
            for name, query in [
                ("first page", "size=50"),
                ("failed only", "status=failed&size=50"),
                ("failed, page 2 (cached match)", "status=failed&page=1&size=50"),
                ("truncated", "status=truncated&size=50"),
                ("by error code", "error=http_500&size=50"),
                ("sorted by latency, descending", "sort=latency&desc=1&size=50"),
                ("text search", "q=%23424242&size=50"),
                ("text search, page 2 (cached)", "q=%23424242&page=1&size=50"),
            ]:
                seconds, data = timed(url + "api/rows?" + query)
                print(f"  {name:32s} {seconds * 1000:8.0f} ms  ({data['total']:,} rows match)")
            seconds, _ = timed(
                url + "api/line?row=777777" if args.lines > 777777 else url + "api/line?row=1"
            )
            print(f"  {'one request':32s} {seconds * 1000:8.0f} ms")
            seconds, _ = timed(url + "api/compare?id=task-0000777|1")
            print(
                f"  {'compare by custom_id':32s} {seconds * 1000:8.0f} ms (first: sorts the id index)"
            )
            seconds, _ = timed(url + "api/compare?id=task-0000778|2")
            print(f"  {'compare again':32s} {seconds * 1000:8.0f} ms")
            rss, peak = memory(proc.pid)
            print(f"memory after browsing: {rss:.0f} MB (peak {peak:.0f} MB)")
        finally:
            proc.terminate()
            proc.wait()
        print(f"load average: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

"""Benchmark `jsonlbatch view` on an image run: the first page, the first picture and a text
search when the request file is mostly base64.

    python scripts/bench_view_images.py --requests 20000      # the issue's 500 MB run
    python scripts/bench_view_images.py --requests 5000       # ~125 MB: about a minute here

Writes a request file of chat requests each carrying a ~25 KB PNG as a `data:` URL (64
different pictures of random noise, so they compress as little as photos do), and a response
file of one answer each; runs `jsonlbatch view RESPONSES --requests REQUESTS` as a child
process and asks it over HTTP as the page does: the first table, the first detail (the
prompt with its picture's link), that picture's bytes, and a search for a word that the
base64 holds thousands of times and the text in one request of ten.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import orjson
from bench_view import memory, view_url  # run as a script: scripts/ is on the path
from PIL import Image


def pictures(count: int, side: int = 90) -> list[str]:
    """`count` data: URLs of noise PNGs of about 25 KB each (24 KB raw, 32 KB as base64)."""
    out = []
    for seed in range(count):
        noise = random.Random(seed).randbytes(side * side * 3)
        buf = io.BytesIO()
        Image.frombytes("RGB", (side, side), noise).save(buf, "PNG")
        out.append("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode())
    return out


def make_files(folder: Path, n: int) -> tuple[Path, Path]:
    urls = pictures(64)
    requests, responses = folder / "requests.jsonl", folder / "responses.jsonl"
    with requests.open("wb") as req, responses.open("wb") as out:
        for i in range(n):
            cid = f"img-{i:07d}"
            animal = "dog" if i % 10 == 0 else "cat"
            content = [{"type": "text", "text": f"Is this a {animal}? Answer in one word."},
                       {"type": "image_url", "image_url": {"url": urls[i % 64]}}]  # fmt: skip
            req.write(orjson.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                                    "body": {"model": "m", "max_tokens": 8,
                                             "messages": [{"role": "user", "content": content}]}}) + b"\n")  # fmt: skip
            body = {"model": "m", "choices": [{"index": 0, "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "No."}}],
                    "usage": {"prompt_tokens": 100, "completion_tokens": 2}}  # fmt: skip
            out.write(orjson.dumps({"id": f"batch_req_{i}", "custom_id": cid,
                                    "response": {"status_code": 200, "body": body}, "error": None,
                                    "metrics": {"latency_s": 0.5}}) + b"\n")  # fmt: skip
    return requests, responses


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=600) as response:
        return response.read()


def timed(url: str) -> tuple[float, bytes]:
    start = time.perf_counter()
    data = get(url)
    return time.perf_counter() - start, data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument(
        "--dir", default=None, help="where to write the files (default: a temp dir)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        start = time.perf_counter()
        requests, responses = make_files(Path(tmp), args.requests)
        print(f"files: {args.requests:,} image requests, {requests.stat().st_size / 1e6:.0f} MB of "
              f"requests, written in {time.perf_counter() - start:.1f} s")  # fmt: skip
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "jsonlbatch", "view", str(responses), "--requests", str(requests),
             "--port", "0"], stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            url = view_url(proc)
            listening = time.perf_counter() - started
            while not json.loads(get(url + "api/rows?size=50"))["rows"]:
                time.sleep(0.02)
            first = time.perf_counter() - started
            print(f"listening after {listening:.2f} s; first table (50 rows) after {first:.2f} s")
            seconds, raw = timed(url + "api/line?row=0")
            detail = json.loads(raw)
            media = [m for t in detail.get("prompt", []) for m in t.get("media", [])]
            print(f"  first detail {seconds * 1000:6.0f} ms, {len(raw):,} bytes "
                  f"({'prompt with its picture link' if media and 'src' in media[0] else 'no prompt yet'})")  # fmt: skip
            if media and "src" in media[0]:
                seconds, data = timed(url + media[0]["src"].lstrip("/"))
                print(f"  first picture {seconds * 1000:5.0f} ms, {len(data):,} bytes")
            first_page = time.perf_counter() - started
            print(f"first page with its picture after {first_page:.2f} s (target: under 2 s)")
            while not all(f["done"] for f in [json.loads(get(url + "api/files"))["files"][0]]):
                time.sleep(0.2)
            deadline = time.perf_counter() + 600
            while time.perf_counter() < deadline:  # the request index too: a search reads it
                seconds, raw = timed(url + "api/line?row=" + str(args.requests - 1))
                if json.loads(raw).get("prompt"):
                    break
                time.sleep(0.2)
            full = time.perf_counter() - started
            now, peak = memory(proc.pid)
            print(
                f"both files indexed after {full:.1f} s; memory {now:.0f} MB (peak {peak:.0f} MB)"
            )
            for name, query in [("first page", "size=50"), ("search 'dog' (skips base64)", "q=dog&size=50"),
                                ("search, page 2 (cached)", "q=dog&page=1&size=50")]:  # fmt: skip
                seconds, raw = timed(url + "api/rows?" + query)
                print(
                    f"  {name:30s} {seconds * 1000:7.0f} ms ({json.loads(raw)['total']:,} rows match)"
                )
            now, peak = memory(proc.pid)
            print(f"memory after browsing: {now:.0f} MB (peak {peak:.0f} MB)")
        finally:
            proc.terminate()
            proc.wait()
        print(f"load average: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

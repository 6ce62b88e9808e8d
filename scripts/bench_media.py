#!/usr/bin/env python3
"""Pictures in requests, end to end: gen from a folder, exec's throughput and memory on the mock.

1. Writes N different PNG files of about 18 KB (25 KB request lines) into a folder and a data file naming them, then
   times `jsonlbatch gen --messages` embedding each as a data URL (target: 5,000 under 10 s).
2. Runs `jsonlbatch exec` on the mock (instant, pinned to one core; exec pinned to the other)
   over those image requests and over text-only requests of equal count, alternating, and
   reports requests/s of each and their ratio (target: images within 0.8x of text), and the
   ratio of exec's CPU seconds, which a shared machine's load does not inflate.
3. Reports the image run's peak RSS (target: under 200 MB at 20,000 requests, a 500 MB file).

    python scripts/bench_media.py                          # 5,000 pictures, 20,000 requests
    python scripts/bench_media.py --images 2000 --requests 5000 --rounds 1   # ~1 minute

The exec files are written apart from gen's (a picture of its own on every line, as gen writes
from a folder of --requests pictures), so --requests can exceed --images.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import orjson
from bench_exec import compile_package, exec_command, free_port, median, pin, start_server

from jsonlbatch.batch_format.records import request_line

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = """[{"role": "user", "content": [
  {"type": "text", "text": "Describe the picture in one sentence."},
  {{ path | image_part(detail="low") | tojson }}]}]"""


def png(side: int) -> bytes:
    """A grey PNG of noise (it does not compress): about side * side bytes."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    pixels = b"".join(b"\x00" + os.urandom(side) for _ in range(side))
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(pixels, 1))
        + chunk(b"IEND", b"")
    )


def make_folder(folder: Path, images: int) -> Path:
    (folder / "pics").mkdir(parents=True)
    with (folder / "rows.jsonl").open("wb") as rows:
        for i in range(images):
            name = f"pics/{i:06d}.png"
            (folder / name).write_bytes(png(136))  # 18.5 KB: a 25 KB request line
            rows.write(orjson.dumps({"path": name}) + b"\n")
    (folder / "messages.j2").write_text(TEMPLATE)
    return folder / "rows.jsonl"


def timed_gen(folder: Path, out: Path) -> float:
    cmd = [sys.executable, "-m", "jsonlbatch", "gen", "--data", str(folder / "rows.jsonl"),
           "--messages", str(folder / "messages.j2"), "--model", "mock", "--max-tokens", "16",
           "-o", str(out), "--force"]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=lambda: pin(0))
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    return time.perf_counter() - start


def spread(gen_file: Path, out: Path, requests: int, *, images: bool) -> None:
    """`requests` lines shaped as the gen file's, each with a picture of its own (as gen would
    write from a folder of `requests` pictures); without images: the text part only."""
    body = orjson.loads(gen_file.read_bytes().split(b"\n", 1)[0])["body"]
    text = body["messages"][0]["content"][0]["text"]
    with out.open("wb") as f:
        for i in range(requests):
            if images:
                url = "data:image/png;base64," + base64.b64encode(png(136)).decode()
                part = {"type": "image_url", "image_url": {"url": url, "detail": "low"}}
                content: Any = [{"type": "text", "text": text}, part]
            else:
                content = text
            f.write(
                request_line(f"r{i}", {**body, "messages": [{"role": "user", "content": content}]})
            )


def timed_exec(
    requests: Path, output: Path, url: str, concurrency: int
) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, peak RSS in MB) of one `jsonlbatch exec`, pinned to core 0.
    CPU seconds are what a shared machine's load does not inflate."""
    output.unlink(missing_ok=True)
    cmd = exec_command(requests, output, url, concurrency, "--quiet")
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, preexec_fn=lambda: pin(0), stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(proc.stderr.read().decode() if proc.stderr else "exec failed")
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--images", type=int, default=5000, help="pictures in the folder gen reads")
    ap.add_argument("--requests", type=int, default=20000, help="requests of each exec run")
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3, help="exec runs of each kind (median)")
    ap.add_argument("--json", action="store_true", help="print one JSON object of the figures")
    args = ap.parse_args()
    compile_package(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        make_folder(folder, args.images)
        gen_out = folder / "gen.jsonl"
        gen_s = timed_gen(folder, gen_out)
        image_file, text_file = folder / "images.jsonl", folder / "text.jsonl"
        spread(gen_out, image_file, args.requests, images=True)
        spread(gen_out, text_file, args.requests, images=False)
        port = free_port()
        server = start_server(port)
        url = f"http://127.0.0.1:{port}/v1"
        runs: dict[str, list[tuple[float, float, float]]] = {"text": [], "images": []}
        try:
            for _ in range(args.rounds):
                runs["text"].append(
                    timed_exec(text_file, folder / "out-text.jsonl", url, args.concurrency)
                )
                runs["images"].append(
                    timed_exec(image_file, folder / "out-img.jsonl", url, args.concurrency)
                )
        finally:
            server.terminate()
            server.wait(timeout=10)
        text_s = median([s for s, _, _ in runs["text"]])
        image_s = median([s for s, _, _ in runs["images"]])
        text_cpu = median([c for _, c, _ in runs["text"]])
        image_cpu = median([c for _, c, _ in runs["images"]])
        figures = {
            "gen_images": args.images,
            "gen_s": round(gen_s, 2),
            "gen_images_per_s": round(args.images / gen_s),
            "requests": args.requests,
            "image_file_mb": round(image_file.stat().st_size / 2**20),
            "text_req_per_s": round(args.requests / text_s),
            "image_req_per_s": round(args.requests / image_s),
            "image_over_text": round(text_s / image_s, 2),
            "text_cpu_s": round(text_cpu, 2),
            "image_cpu_s": round(image_cpu, 2),
            "image_over_text_cpu": round(text_cpu / image_cpu, 2),
            "image_peak_rss_mb": round(max(m for _, _, m in runs["images"])),
            "text_peak_rss_mb": round(max(m for _, _, m in runs["text"])),
        }
    if args.json:
        print(json.dumps(figures))
        return
    f = figures
    print(f"gen: {f['gen_images']:,} pictures in {f['gen_s']} s ({f['gen_images_per_s']:,}/s)")
    print(
        f"exec, {f['requests']:,} requests at -c {args.concurrency}: text {f['text_req_per_s']:,} "
        f"req/s, images ({f['image_file_mb']} MB file) {f['image_req_per_s']:,} req/s: "
        f"{f['image_over_text']}x; CPU seconds text {f['text_cpu_s']}, images "
        f"{f['image_cpu_s']}: {f['image_over_text_cpu']}x; peak RSS images {f['image_peak_rss_mb']} MB, "
        f"text {f['text_peak_rss_mb']} MB"
    )


if __name__ == "__main__":
    main()

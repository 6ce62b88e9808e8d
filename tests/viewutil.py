"""Response files for the viewer's tests, and `jsonlbatch view` as a real child process."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

ANSWERS = (
    "The answer is **42**.\n\n```python\nprint(6 * 7)\n```\n\n- one\n- two",
    "<script>document.title='pwned'</script> and <b>bold</b> as typed",
    '{"label": "positive", "score": 0.9}',
    "<think>First I add, then I check.</think>Paris is the capital.",
)


def request_line(i: int) -> dict:
    return {
        "custom_id": f"task-{i:05d}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "m",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": f"Question {i}: what is the needle-{i}?"},
            ],
        },
    }


def response_line(i: int, *, shift: int = 0, fail_every: int = 17) -> dict:
    cid = f"task-{i:05d}"
    if (i + shift) % fail_every == 0:
        return {
            "id": f"batch_req_{i}",
            "custom_id": cid,
            "response": {"status_code": 500, "body": {"error": {"message": "boom"}}},
            "error": {"code": "http_500", "message": "HTTP 500"},
            "metrics": {"attempts": 3, "latency_s": 1.5},
        }
    return {
        "id": f"batch_req_{i}",
        "custom_id": cid,
        "response": {
            "status_code": 200,
            "body": {
                "model": "m" if i % 2 else "n",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": ANSWERS[(i + shift) % 4]},
                        "finish_reason": "length" if i % 23 == 0 else "stop",
                    }
                ],
                "usage": {"prompt_tokens": 20 + i % 7, "completion_tokens": 10 + i % 50},
            },
        },
        "error": None,
        "metrics": {
            "latency_s": round(0.1 + (i * 37 % 100) / 10, 3),
            "ttft_s": 0.05,
            "endpoint": f"http://127.0.0.1:800{i % 2}/v1",
        },
    }


def write_run(path: Path, n: int, **kwargs: int) -> Path:
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps(response_line(i, **kwargs)) + "\n")
    return path


def write_requests(path: Path, n: int) -> Path:
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps(request_line(i)) + "\n")
    return path


class ViewProcess:
    """`python -m jsonlbatch view ... --port 0`, its URL read from the line it prints."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jsonlbatch", "view", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.url = self._wait_url()

    def _wait_url(self, timeout: float = 30.0) -> str:
        assert self.proc.stderr is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"view exited {self.proc.returncode}: {self.proc.stderr.read()}"
                )
            ready, _, _ = select.select([self.proc.stderr], [], [], 0.1)
            if ready:
                line = self.proc.stderr.readline()
                if "jsonlbatch view: " in line:
                    return line.split("jsonlbatch view: ")[1].split()[0]
        raise AssertionError("view printed no URL")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()

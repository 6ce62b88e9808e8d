"""Helpers for the Batch API tests: a `serve --batch-api` process and waiting on batches."""

from __future__ import annotations

import select
import subprocess
import time
from pathlib import Path
from typing import Any

from batchutil import start_cli
from openai import OpenAI

TERMINAL = {"completed", "failed", "expired", "cancelled"}


class BatchServer:
    """`jsonlbatch serve --batch-api --upstream URL` on a state directory; `kill` is SIGKILL and
    `start` again resumes from the same directory."""

    def __init__(self, directory: Path, upstream: str, *args: str) -> None:
        self.directory = directory
        self.upstream = upstream
        self.args = args
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self, port: int = 0) -> BatchServer:
        if port == 0 and self.url:
            port = int(self.url.rsplit(":", 1)[1].split("/")[0])  # same URL after a restart
        self.proc = start_cli(
            "serve",
            "--batch-api",
            "--upstream",
            self.upstream,
            "--batch-dir",
            str(self.directory),
            "--batch-port",
            str(port),
            *self.args,
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited: {self.proc.stderr.read()}")  # type: ignore[union-attr]
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
            if ready:
                self.url = self.proc.stdout.readline().strip()
                assert self.url.startswith("http://127.0.0.1:"), self.url
                return self
        raise AssertionError("serve --batch-api printed no URL within 30 s")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def client(self, api_key: str = "unused") -> OpenAI:
        return OpenAI(base_url=self.url, api_key=api_key, max_retries=0)


def wait_batch(client: OpenAI, batch_id: str, timeout: float = 60, until: Any = None) -> Any:
    """Poll until the batch ends (or `until(batch)` is true); return the last object."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if until(batch) if until else batch.status in TERMINAL:
            return batch
        time.sleep(0.1)
    raise AssertionError(f"batch {batch_id} still {batch.status} after {timeout} s")


def jsonl_lines(text: str) -> list[dict]:
    import orjson

    return [orjson.loads(line) for line in text.splitlines() if line.strip()]

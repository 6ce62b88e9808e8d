"""Request files and tool files the rollout tests share."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

TOOLS = [
    {"type": "function", "function": {
        "name": "lookup", "parameters": {"type": "object", "properties": {
            "q": {"type": "string"}}, "required": ["q"]}}},
    {"type": "function", "function": {
        "name": "expert", "parameters": {"type": "object", "properties": {
            "topic": {"type": "string"}}}}},
]  # fmt: skip

TOOLS_PY = """
import os
import jsonlbatch

LOG = os.environ["ROLLOUT_TEST_LOG"]


def lookup(q):
    conv = jsonlbatch.current_conversation()
    with open(LOG, "a") as f:
        f.write(f"{conv.id} {conv.turn} lookup {q}\\n")
    return {"found": q, "turn": conv.turn}


async def expert(topic="none"):
    conv = jsonlbatch.current_conversation()
    with open(LOG, "a") as f:
        f.write(f"{conv.id} {conv.turn} expert {topic}\\n")
    answer = await conv.ask({"model": "mock", "max_tokens": 4,
                             "messages": [{"role": "user", "content": topic}]})
    return answer.text
"""


def write_requests(
    path: Path, n: int, *, tools: list[dict[str, Any]] | None = None, **body: Any
) -> Path:
    with path.open("w") as f:
        for i in range(n):
            line = {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": "mock", "max_tokens": 6, "tools": tools or TOOLS,
                             "messages": [{"role": "user", "content": f"task {i}"}], **body}}  # fmt: skip
            f.write(json.dumps(line) + "\n")
    return path


def write_tools(tmp_path: Path, text: str = TOOLS_PY, name: str = "tools.py") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def by_id(path: Path) -> dict[str, dict[str, Any]]:
    return {line["custom_id"]: line for line in lines(path)}


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120):
    return subprocess.run([sys.executable, "-m", "jsonlbatch", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)  # fmt: skip

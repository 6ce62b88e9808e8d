"""The Python API: write requests from your own loop instead of calling a model.

python examples/gen/pipeline.py out/gen-example/pipeline-requests.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonlbatch

here = Path(__file__).parent
out = sys.argv[1] if len(sys.argv) > 1 else "pipeline-requests.jsonl"
tasks = [json.loads(line) for line in (here / "problems.jsonl").read_text().splitlines()]

# Every request gets these body fields; `n=3` asks for three answers in one call.
with jsonlbatch.RequestWriter(out, model="mock", temperature=0.6, max_tokens=256, force=True) as w:
    for task in tasks:
        prompt = f"Answer with a number only.\n\n{task['question']}"
        w.add(task["id"], [{"role": "user", "content": prompt}], n=3)

s = w.summary
print(f"wrote {s.requests} request(s) to {s.path} (about {s.prompt_tokens_estimate:,} prompt tokens)")

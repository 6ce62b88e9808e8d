#!/usr/bin/env python3
"""One request's path through the executor, counted: the functions it passes through and the
module boundaries it crosses, from the worker that takes it to its written line.

    python scripts/trace_request.py                 # this checkout
    python scripts/trace_request.py --tree ../old   # another checkout (a before/after figure)

A profiler hook (`sys.setprofile`) records every call of a `jsonlbatch` function made while a
worker (`Run._work`) or the line writer (`Recorder.flush`) is on the stack, for a run of a
single chat request against the in-process mock (no cache, no schema: the plain path). A
crossing is a call whose caller lives in another `jsonlbatch` module. Setup (the input scan,
the pools, the servers' checks) is not counted: it is paid once per run, not per request.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

_PROBE = r"""
import sys, os, tempfile, json
from collections import Counter
import jsonlbatch
from jsonlbatch.exec import execute  # in every version of the tree
from jsonlbatch.mock import BackgroundMock, MockConfig

ROOTS = {"_work", "flush"}
calls = []

def inside(frame):
    while frame is not None:
        if frame.f_code.co_name in ROOTS and "jsonlbatch" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False

def module_of(code):
    path = code.co_filename
    cut = path.rfind("jsonlbatch" + os.sep)
    return path[cut:] if cut >= 0 else None

def hook(frame, event, arg):
    if event != "call":
        return
    mod = module_of(frame.f_code)
    if mod is None or not inside(frame):
        return
    caller = frame.f_back  # None, or asyncio's, for a coroutine the loop resumes
    calls.append((mod, frame.f_code.co_qualname, module_of(caller.f_code) if caller else None))

with tempfile.TemporaryDirectory() as tmp:
    req = os.path.join(tmp, "in.jsonl")
    with open(req, "w") as f:
        f.write(json.dumps({"custom_id": "one", "method": "POST", "url": "/v1/chat/completions",
                            "body": {"model": "mock", "messages": [{"role": "user", "content": "hi"}]}}) + "\n")
    server = BackgroundMock(MockConfig())
    try:
        sys.setprofile(hook)
        execute(req, os.path.join(tmp, "out.jsonl"), urls=[server.url], quiet=True,
                concurrency=1)
        sys.setprofile(None)
    finally:
        server.close()
functions = sorted({(m, q) for m, q, _ in calls})
crossings = sum(1 for m, _, c in calls if c is not None and c != m)
modules = sorted({m for m, _ in functions})
print(json.dumps({"functions": len(functions), "calls": len(calls), "crossings": crossings,
                  "modules": len(modules), "names": [f"{m}:{q}" for m, q in functions]}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default=os.path.dirname(os.path.dirname(__file__)) or ".")
    parser.add_argument("--names", action="store_true", help="list the functions too")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": os.path.abspath(args.tree)}
    with tempfile.TemporaryDirectory() as cwd:
        out = subprocess.run([sys.executable, "-c", _PROBE], env=env, cwd=cwd, check=True,
                             capture_output=True, text=True).stdout  # fmt: skip
    import json

    found = json.loads(out.strip().splitlines()[-1])
    print(f"{os.path.abspath(args.tree)}: {found['functions']} functions in {found['modules']} "
          f"modules, {found['calls']} calls, {found['crossings']} module crossings")  # fmt: skip
    if args.names:
        print("\n".join(found["names"]))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Start-up cost of the command line: CPU time (user + system) per command, median of N runs.

    python scripts/bench_startup.py                          # this checkout
    python scripts/bench_startup.py --baseline ../old-tree   # and another, in turns

CPU time, not wall time: on a shared machine the wall clock measures the neighbours too. Each
command runs in a fresh interpreter from a neutral directory (so `python -m jsonlbatch` finds the
package of the checkout asked for, through PYTHONPATH).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
COMMANDS = [
    ("python -c pass", ["-c", "pass"]),
    ("import jsonlbatch", ["-c", "import jsonlbatch"]),
    ("jsonlbatch --help", ["-m", "jsonlbatch", "--help"]),
    ("jsonlbatch gen --help", ["-m", "jsonlbatch", "gen", "--help"]),
    ("jsonlbatch exec --help", ["-m", "jsonlbatch", "exec", "--help"]),
]


def cpu_ms(args: list[str], tree: Path, cwd: str) -> float:
    """CPU milliseconds of one `python ARGS` run with `tree` first on the path."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, *args], env=env, cwd=cwd, stdout=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return used * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--baseline", help="another checkout, measured in turns with this one")
    args = ap.parse_args()
    trees = {"this": HERE.parent}
    if args.baseline:
        trees["baseline"] = Path(args.baseline).resolve()
    print("| command | " + " | ".join(f"{name}, ms CPU" for name in trees) + " |")
    print("|---|" + "---|" * len(trees))
    with tempfile.TemporaryDirectory() as cwd:
        for label, command in COMMANDS:
            seen: dict[str, list[float]] = {name: [] for name in trees}
            for _ in range(args.runs):
                for name, tree in trees.items():  # in turns: load changes weigh on both
                    seen[name].append(cpu_ms(command, tree, cwd))
            cells = " | ".join(f"{statistics.median(v):.0f}" for v in seen.values())
            print(f"| `{label}` | {cells} |")


if __name__ == "__main__":
    main()

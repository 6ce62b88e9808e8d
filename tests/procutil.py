"""Processes seen through /proc: which are alive, by what their command line holds."""

from __future__ import annotations

import os
from pathlib import Path


def pids_with(*markers: str) -> list[int]:
    """Live (not zombie) processes whose command line holds every one of `markers` (each a
    whole argument)."""
    wanted = [m.encode() for m in markers]
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if all(m in argv for m in wanted) and state != "Z":
            found.append(int(entry))
    return found

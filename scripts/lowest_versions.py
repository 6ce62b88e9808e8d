#!/usr/bin/env python3
"""Print pip constraints that pin each dependency to the lowest version pyproject.toml allows.

    python3 scripts/lowest_versions.py [EXTRA ...] > lowest.txt
    pip install -c lowest.txt -e '.[test]'

The core dependencies (and those of the extras named) with a `>=` floor become `name==floor`,
so a CI job can check that the declared ranges are true: the package must work on the oldest
versions it claims to accept, not only on today's. Markers are kept (`; sys_platform ...`).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10: pip's own copy of the same parser
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
_FLOOR = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*>=\s*([0-9][^,;\s]*)")


def floors(requirements: list[str]) -> list[str]:
    """`name==floor` for each requirement with a `>=` floor (its marker kept)."""
    out = []
    for requirement in requirements:
        match = _FLOOR.match(requirement)
        if match:
            marker = requirement.split(";", 1)[1].strip() if ";" in requirement else ""
            out.append(f"{match[1]}=={match[2]}" + (f"; {marker}" if marker else ""))
    return out


def main(extras: list[str]) -> int:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        print(f"no such extra: {', '.join(unknown)}", file=sys.stderr)
        return 2
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += [r for r in optional[extra] if not r.startswith(project["name"])]
    print("\n".join(floors(requirements)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The requirements of agentrun extras, one per line, for an image's dependency layer.

    python3 devtools/requirements_of.py operator [store-api ...] < pyproject.toml

Reads pyproject.toml alone (so the layer is rebuilt only when it changes), expands the
extras that name agentrun's own (`agentrun[store]`), and prints the base dependencies and
those of every extra named. The standard library only: it runs before anything is
installed.
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Iterator

_OURS = re.compile(r"agentrun\[([^\]]+)\]")


def requirements(project: dict, extra: str, seen: set[str]) -> Iterator[str]:
    extras = project.get("optional-dependencies", {})
    if extra not in extras:
        raise SystemExit(f"pyproject.toml has no extra {extra!r} (it has: "
                         f"{', '.join(sorted(extras))})")
    if extra in seen:
        return
    seen.add(extra)
    for requirement in extras[extra]:
        ours = _OURS.fullmatch(requirement.strip())
        if ours:
            for inner in ours.group(1).split(","):
                yield from requirements(project, inner.strip(), seen)
        else:
            yield requirement


def main(argv: list[str]) -> int:
    if not argv:
        raise SystemExit(__doc__)
    project = tomllib.loads(sys.stdin.read())["project"]
    seen: set[str] = set()
    lines = list(project.get("dependencies", []))
    for extra in argv:
        lines.extend(requirements(project, extra, seen))
    print(*dict.fromkeys(lines), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

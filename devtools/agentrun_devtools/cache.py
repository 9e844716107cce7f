"""Where the development tools keep what they build and measure, outside the checkout:
`${AGENTRUN_CACHE:-${XDG_CACHE_HOME:-~/.cache}/agentrun}`, the same root the build
scripts (devtools/*/build.sh) and .ci/run use."""

from __future__ import annotations

import os
from pathlib import Path


def root() -> Path:
    given = os.environ.get("AGENTRUN_CACHE")
    if given:
        return Path(given)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agentrun"

"""Figures the benchmarks report, and where they are kept."""

from __future__ import annotations

import datetime
from pathlib import Path

from agentrun_devtools import cache


def pct(values: list[float], q: float) -> float:
    """The `q` quantile (0 to 1) of `values`: the nearest rank, no interpolation."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def results_dir() -> Path:
    """`${AGENTRUN_CACHE:-${XDG_CACHE_HOME:-~/.cache}/agentrun}/bench`: outside the tree, so
    a run's figures are never committed by accident (the docs quote the ones they cite)."""
    return cache.root() / "bench"


def results_file(name: str, given: str | None) -> Path | None:
    """A benchmark's `--out`: `-` for stdout only (None), a path as given, or by default
    `<results_dir>/<name>-<UTC date and time>.txt` (one file per run, none overwritten)."""
    if given == "-":
        return None
    if given:
        return Path(given)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H%M%SZ")
    return results_dir() / f"{name}-{stamp}.txt"


def write_results(text: str, out: Path | None) -> None:
    """Write a benchmark's figures (already printed to stdout) to `out`, if any."""
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text if text.endswith("\n") else text + "\n")
    print(f"\nwritten to {out}", flush=True)

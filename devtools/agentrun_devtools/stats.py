"""Figures the benchmarks report."""

from __future__ import annotations


def pct(values: list[float], q: float) -> float:
    """The `q` quantile (0 to 1) of `values`: the nearest rank, no interpolation."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]

"""The summary figures the benchmarks report: percentiles and a median with its spread."""

from __future__ import annotations

import statistics
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float:
    """The value at quantile `q` (0 to 1) of `values`, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def spread(values: Iterable[float], digits: int = 2) -> dict[str, float]:
    """Median, 10th and 90th percentiles of `values`, rounded."""
    values = list(values)
    return {
        "median": round(statistics.median(values), digits),
        "p10": round(percentile(values, 0.1), digits),
        "p90": round(percentile(values, 0.9), digits),
    }


def shown(figures: dict[str, float], unit: str = "") -> str:
    """A `spread` as the docs show it: median (p10 to p90)."""
    return f"{figures['median']}{unit} ({figures['p10']} to {figures['p90']})"

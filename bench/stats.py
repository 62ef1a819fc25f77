"""Pure numbers: percentiles, summaries, ratios and a least-squares slope."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between ranks (numpy's default).

    NaN for an empty sequence.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0-100")
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    fraction = rank - low
    return ordered[low] + (ordered[high] - ordered[low]) * fraction


def summarize(values: Sequence[float]) -> dict[str, float]:
    """count, mean, p50, p90, p99 and max of a sample (NaN where empty)."""
    count = len(values)
    return {
        "count": count,
        "mean": sum(values) / count if count else math.nan,
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values) if count else math.nan,
    }


def ratio(ours: float | None, theirs: float | None) -> float | None:
    """ours / theirs, or None when either is missing, NaN or theirs is 0."""
    if ours is None or theirs is None:
        return None
    if math.isnan(ours) or math.isnan(theirs) or theirs == 0:
        return None
    return ours / theirs


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope dy/dx; 0 with fewer than two distinct x values."""
    n = len(xs)
    if n != len(ys):
        raise ValueError("xs and ys differ in length")
    if n < 2:
        return 0.0
    mean_x = sum(xs) / n
    mean_y = sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    if sxx == 0:
        return 0.0
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    return sxy / sxx


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan

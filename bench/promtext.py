"""Just enough of the Prometheus text format (0.0.4) to count families and read counters."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

# Sample-name suffixes that belong to a declared family of each type.
_SUFFIXES = {
    "counter": ("", "_total", "_created"),
    "gauge": ("",),
    "untyped": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("", "_info"),
}

# Quantities the comparison asks about, matched against family names that have samples.
QUANTITIES: Mapping[str, str] = {
    "utilization": r"^gpu_utilization",
    "sm_activity": r"sm_active|sm_occupancy",
    "tensor": r"tensor",
    "dram": r"dram",
    "power": r"^gpu_power_(watts|usage)",
    "energy": r"energy",
    "clocks": r"^gpu_clock_(hertz|max|sm|memory|graphics|video)",
    "throttle_reasons": r"clock_event|throttle",
    "pcie": r"pcie",
    "nvlink": r"nvlink",
    "ecc": r"ecc|remap|retired",
    "xid": r"xid",
    "memory_used": r"^gpu_memory_used",
    "temperature": r"temperature",
}


def declared_families(text: str) -> dict[str, str]:
    """Family name -> type, from the `# TYPE` lines."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4:
                found[parts[2]] = parts[3]
    return found


def sample_name(line: str) -> str:
    """`name{labels} value` -> name."""
    end = len(line)
    for stop in ("{", " "):
        at = line.find(stop)
        if at != -1:
            end = min(end, at)
    return line[:end]


def samples(text: str) -> dict[str, float]:
    """`name{labels}` -> value for every sample line (labels kept verbatim)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            try:
                out[series] = float(value)
            except ValueError:
                continue
    return out


def families_with_samples(text: str) -> set[str]:
    """Declared families with at least one sample whose value is a number (not NaN)."""
    declared = declared_families(text)
    names = {
        sample_name(series) for series, value in samples(text).items() if not math.isnan(value)
    }
    found: set[str] = set()
    for family, kind in declared.items():
        base = family.removesuffix("_total") if kind == "counter" else family
        for suffix in _SUFFIXES.get(kind, ("",)):
            if f"{base}{suffix}" in names or f"{family}{suffix}" in names:
                found.add(family)
                break
    return found


def sum_and_count(text: str, family: str) -> tuple[float, float] | None:
    """`<family>_sum` and `<family>_count` of an unlabelled histogram or summary."""
    values = samples(text)
    total, count = values.get(f"{family}_sum"), values.get(f"{family}_count")
    if total is None or count is None:
        return None
    return total, count


def coverage(families: Iterable[str]) -> dict[str, list[str]]:
    """Quantity -> the families (sorted) that carry it; empty list where none does."""
    names = sorted(families)
    return {
        quantity: [name for name in names if re.search(pattern, name)]
        for quantity, pattern in QUANTITIES.items()
    }

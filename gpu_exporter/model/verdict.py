"""The bottleneck classifier's verdict on one GPU or MIG instance: its class, a one-line
reason, and the window statistics it decided on (`gpu_exporter/collect/classify.py`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WindowStats:
    """What the checks look at: means and rates over the window (None = no data)."""

    samples: int
    utilization: float | None
    sm_active: float | None
    tensor_active: float | None
    dram_active: float | None
    sm_stuck: bool
    throttle_fraction: float | None
    throttle_reasons: tuple[str, ...]  # reasons active in any sample of the window
    pcie_bytes_per_second: float | None  # the busier direction
    nvlink_bytes_per_second: float | None
    pcie_utilization: float | None  # of capacity, the busier direction
    nvlink_utilization: float | None
    link_utilization: float | None  # the busier link; None when a link cannot be judged
    pcie_capacity: float | None = None  # bytes/s per direction, in the link's current state
    nvlink_capacity: float | None = None  # over all active links


@dataclass(frozen=True, slots=True)
class Verdict:
    """One GPU's class with the numbers it came from and a one-line reason."""

    cls: str
    why: str
    stats: WindowStats

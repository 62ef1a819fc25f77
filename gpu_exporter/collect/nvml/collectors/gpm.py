"""gpm: SM, Tensor (any, and per tensor pipe), DRAM and pipe activity from NVML GPM (Hopper
and newer; `nvml.gpm`).

The first tick checks support and takes the baseline sample, reporting the activity as
awaited (`gpu_activity_awaited`); every later tick reads the activity since the previous one
(`collect/nvml/gpm.py`). Pre-Hopper boards are learned unsupported once: their activity is
absent, never zero.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pynvml as N

from gpu_exporter.collect.nvml import gpm
from gpu_exporter.collect.nvml.collectors.base import Collector, Device
from gpu_exporter.collect.nvml.values import return_code_name
from gpu_exporter.model.activity import ACTIVITY, AWAITED_FAMILY, Activity
from gpu_exporter.model.snapshot import Reading

# Percent metrics exported as 0..1 ratios, as DCGM does for its profiling fields: every
# activity quantity (model/activity.py), in the table's order.
METRICS: tuple[Activity, ...] = ACTIVITY
# What a device whose window has no activity yet reports: "not sampled yet", not "unsupported".
AWAITED = Reading(AWAITED_FAMILY, 1.0)
FAMILIES = (*dict.fromkeys(metric.family for metric in METRICS), AWAITED_FAMILY)


_FAILURE_NAMES = {gpm.NOT_A_NUMBER: "NaN", gpm.ABOVE_100: "AboveOne"}


def activity_readings(nvml: Device, result: gpm.GpmResult) -> list[Reading]:
    """A GPM window's readings; its per-metric failures counted as source="gpm"."""
    for metric_id, code in result.failures.items():
        if code != N.NVML_ERROR_NOT_SUPPORTED:
            name = _FAILURE_NAMES.get(code) or return_code_name(code)
            nvml.count_error("gpm", f"metric_{metric_id}", name)
    return [
        Reading(metric.family, result.values[metric.gpm_metric], metric.labels)
        for metric in METRICS
        if metric.gpm_metric in result.values
    ]


def open_window(nvml: Device, key: str, gpu_instance: int | None = None) -> gpm.GpmWindow | None:
    """A window over METRICS for the GPU (or one of its GPU instances), baseline taken."""
    ids = [metric.gpm_metric for metric in METRICS]
    return nvml.call(key, gpm.GpmWindow, nvml.handle, nvml.clock, ids, nvml.errors, gpu_instance)


def window_readings(nvml: Device, key: str, window: gpm.GpmWindow) -> list[Reading]:
    """The activity since the window's last read, as readings; awaited while the window is
    shorter than GPM's 100 ms (a failed read is no reading: counted, not awaited)."""
    if not window.ready():
        return [AWAITED]
    result = nvml.call(key, window.read)
    return [] if result is None else activity_readings(nvml, result)


class Gpm(Collector):
    name = "gpm"
    families = FAMILIES
    calls = (
        "nvmlGpmQueryDeviceSupport",
        "nvmlGpmSampleAlloc",
        "nvmlGpmSampleGet",
        "nvmlGpmMetricsGet",
        "nvmlGpmSampleFree",
    )
    setting = "gpm"
    mig_dependent = ("gpm", "gpm_support", "gpm_sample", "gpm_metrics")

    def __init__(self) -> None:
        super().__init__()
        self.window: gpm.GpmWindow | None = None
        self.abandoned = gpm.AbandonedWindows()

    def read(self, nvml: Device) -> list[Reading]:
        if nvml.mig_enabled:  # activity is per GPU instance then (the mig collector's)
            self.close()
            return []
        if nvml.is_unsupported("gpm"):
            return []
        if self.window is None:
            supported = nvml.call("gpm_support", gpm.is_supported, nvml.handle)
            if supported is False:
                nvml.learn_unsupported("gpm")  # pre-Hopper: no activity metrics, never zeros
                return []
            if supported:
                self.window = open_window(nvml, "gpm_sample")
            # The first window needs a second sample: activity comes next tick.
            return [AWAITED] if self.window is not None else []
        return window_readings(nvml, "gpm_metrics", self.window)

    def abandon(self, stuck_tick: Future[Any]) -> None:
        if self.window is not None:
            self.abandoned.add((self.window,), stuck_tick)
            self.window = None

    def free_orphans(self) -> None:
        self.abandoned.free_finished()

    def close(self) -> None:
        if self.window is not None:
            self.window.close()
            self.window = None
        self.free_orphans()

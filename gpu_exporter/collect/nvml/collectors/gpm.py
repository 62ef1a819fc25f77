"""gpm: SM, Tensor (any, and per tensor pipe), DRAM and pipe activity from NVML GPM (Hopper
and newer; `nvml.gpm`).

The first tick checks support and takes the baseline sample; every later tick reads the
activity since the previous one (`collect/nvml/gpm.py`). Pre-Hopper boards are learned unsupported
once: their activity is absent, never zero.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pynvml as N

from gpu_exporter.collect.nvml import gpm
from gpu_exporter.collect.nvml.collectors.base import Collector, Device
from gpu_exporter.collect.nvml.values import return_code_name
from gpu_exporter.model.snapshot import Labels, Reading


@dataclass(frozen=True, slots=True)
class GpmMetric:
    metric_id: int
    family: str
    labels: Labels = ()


# Percent metrics exported as 0..1 ratios, as DCGM does for fields 1001-1016.
METRICS: tuple[GpmMetric, ...] = (
    GpmMetric(N.NVML_GPM_METRIC_GRAPHICS_UTIL, "gpu_graphics_engine_active_ratio"),
    GpmMetric(N.NVML_GPM_METRIC_SM_UTIL, "gpu_sm_active_ratio"),
    GpmMetric(N.NVML_GPM_METRIC_SM_OCCUPANCY, "gpu_sm_occupancy_ratio"),
    GpmMetric(N.NVML_GPM_METRIC_ANY_TENSOR_UTIL, "gpu_tensor_active_ratio"),
    GpmMetric(N.NVML_GPM_METRIC_DRAM_BW_UTIL, "gpu_dram_active_ratio"),
    GpmMetric(N.NVML_GPM_METRIC_FP64_UTIL, "gpu_pipe_active_ratio", (("pipe", "fp64"),)),
    GpmMetric(N.NVML_GPM_METRIC_FP32_UTIL, "gpu_pipe_active_ratio", (("pipe", "fp32"),)),
    GpmMetric(N.NVML_GPM_METRIC_FP16_UTIL, "gpu_pipe_active_ratio", (("pipe", "fp16"),)),
    GpmMetric(N.NVML_GPM_METRIC_INTEGER_UTIL, "gpu_pipe_active_ratio", (("pipe", "int"),)),
    *(
        GpmMetric(metric_id, "gpu_tensor_pipe_active_ratio", (("pipe", pipe),))
        for pipe, metric_id in (
            ("hmma", N.NVML_GPM_METRIC_HMMA_TENSOR_UTIL),
            ("imma", N.NVML_GPM_METRIC_IMMA_TENSOR_UTIL),
            ("dfma", N.NVML_GPM_METRIC_DFMA_TENSOR_UTIL),
        )
    ),
)


_FAILURE_NAMES = {gpm.NOT_A_NUMBER: "NaN", gpm.ABOVE_100: "AboveOne"}


def activity_readings(nvml: Device, result: gpm.GpmResult) -> list[Reading]:
    """A GPM window's readings; its per-metric failures counted as source="gpm"."""
    for metric_id, code in result.failures.items():
        if code != N.NVML_ERROR_NOT_SUPPORTED:
            name = _FAILURE_NAMES.get(code) or return_code_name(code)
            nvml.count_error("gpm", f"metric_{metric_id}", name)
    return [
        Reading(metric.family, result.values[metric.metric_id], metric.labels)
        for metric in METRICS
        if metric.metric_id in result.values
    ]


def open_window(nvml: Device, key: str, gpu_instance: int | None = None) -> gpm.GpmWindow | None:
    """A window over METRICS for the GPU (or one of its GPU instances), baseline taken."""
    ids = [metric.metric_id for metric in METRICS]
    return nvml.call(key, gpm.GpmWindow, nvml.handle, nvml.clock, ids, nvml.errors, gpu_instance)


def window_readings(nvml: Device, key: str, window: gpm.GpmWindow) -> list[Reading]:
    """The activity since the window's last read, as readings."""
    result = nvml.call(key, window.read)
    return [] if result is None else activity_readings(nvml, result)


class Gpm(Collector):
    name = "gpm"
    families = tuple(dict.fromkeys(metric.family for metric in METRICS))
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
            return []  # the first window needs a second sample
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

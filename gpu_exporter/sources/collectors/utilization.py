"""utilization: the share of time any kernel ran and device memory was read or written."""

from __future__ import annotations

import pynvml as N

from gpu_exporter.snapshot import Reading
from gpu_exporter.sources.collectors.base import Collector, Device


class Utilization(Collector):
    name = "utilization"
    families = ("gpu_utilization_ratio", "gpu_memory_utilization_ratio")
    calls = ("nvmlDeviceGetUtilizationRates",)
    mig_dependent = ("utilization",)  # not supported with MIG on

    def read(self, nvml: Device) -> list[Reading]:
        util = nvml.call("utilization", N.nvmlDeviceGetUtilizationRates, nvml.handle)
        if util is None:
            return []
        return [
            Reading("gpu_utilization_ratio", util.gpu / 100.0),
            Reading("gpu_memory_utilization_ratio", util.memory / 100.0),
        ]

"""memory: device memory total, used, free and (memory info v2) reserved by the driver."""

from __future__ import annotations

from typing import Any

import pynvml as N

from gpu_exporter.collect.nvml.collectors.base import Collector, Device
from gpu_exporter.model.snapshot import Reading

MEMORY_FAMILIES = (
    "gpu_memory_total_bytes",
    "gpu_memory_used_bytes",
    "gpu_memory_free_bytes",
    "gpu_memory_reserved_bytes",
)


def memory_readings(mem: Any) -> list[Reading]:
    """A memory info struct (v1 or v2; a GPU's or a MIG device's) as readings."""
    out = [
        Reading("gpu_memory_total_bytes", mem.total),
        Reading("gpu_memory_used_bytes", mem.used),
        Reading("gpu_memory_free_bytes", mem.free),
    ]
    if hasattr(mem, "reserved"):  # v2 only; v1's `used` includes the reserved part
        out.append(Reading("gpu_memory_reserved_bytes", mem.reserved))
    return out


class Memory(Collector):
    name = "memory"
    families = MEMORY_FAMILIES
    calls = ("nvmlDeviceGetMemoryInfo",)  # v2 struct first, then v1 on older drivers
    mig_dependent = ("memory_info_v2", "memory_info")  # MIG on: needs the monitor capability

    def read(self, nvml: Device) -> list[Reading]:
        mem = nvml.first(
            ("memory_info_v2", N.nvmlDeviceGetMemoryInfo, nvml.handle, N.nvmlMemory_v2),
            ("memory_info", N.nvmlDeviceGetMemoryInfo, nvml.handle),
        )
        return [] if mem is None else memory_readings(mem)

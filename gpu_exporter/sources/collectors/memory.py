"""memory: device memory total, used, free and (memory info v2) reserved by the driver."""

from __future__ import annotations

import pynvml as N

from gpu_exporter.snapshot import Reading
from gpu_exporter.sources.collectors.base import Collector, Device


class Memory(Collector):
    name = "memory"
    families = (
        "gpu_memory_total_bytes",
        "gpu_memory_used_bytes",
        "gpu_memory_free_bytes",
        "gpu_memory_reserved_bytes",
    )
    calls = ("nvmlDeviceGetMemoryInfo",)  # v2 struct first, then v1 on older drivers

    def read(self, nvml: Device) -> list[Reading]:
        mem = nvml.first(
            ("memory_info_v2", N.nvmlDeviceGetMemoryInfo, nvml.handle, N.nvmlMemory_v2),
            ("memory_info", N.nvmlDeviceGetMemoryInfo, nvml.handle),
        )
        if mem is None:
            return []
        out = [
            Reading("gpu_memory_total_bytes", mem.total),
            Reading("gpu_memory_used_bytes", mem.used),
            Reading("gpu_memory_free_bytes", mem.free),
        ]
        if hasattr(mem, "reserved"):  # v2 only; v1's `used` includes the reserved part
            out.append(Reading("gpu_memory_reserved_bytes", mem.reserved))
        return out

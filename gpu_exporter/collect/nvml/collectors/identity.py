"""identity: who the GPU is (gpu_info's labels and its UUID), read once per handle."""

from __future__ import annotations

import pynvml as N

from gpu_exporter.collect.nvml.collectors.base import NEVER, Collector, Device
from gpu_exporter.collect.nvml.values import normalise_bus_id
from gpu_exporter.model.nvml_facts import ARCHITECTURE_NAMES
from gpu_exporter.model.snapshot import MINOR_NUMBER, Reading


class Identity(Collector):
    name = "identity"
    families = ("gpu_info",)  # built from the labels this sets (DeviceSample.info)
    calls = (
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetArchitecture",
        "nvmlDeviceGetCudaComputeCapability",
        "nvmlDeviceGetName",
        "nvmlDeviceGetMinorNumber",
    )
    refreshes = True

    def refresh_due(self, now: float, every: float) -> bool:
        return self.static_at == NEVER  # once, and again after a re-bind

    def refresh(self, nvml: Device) -> list[Reading]:
        h = nvml.handle
        uuid = nvml.call("uuid", N.nvmlDeviceGetUUID, h)
        pci = nvml.call("pci_info", N.nvmlDeviceGetPciInfo, h)
        arch = nvml.call("architecture", N.nvmlDeviceGetArchitecture, h)
        cc = nvml.call("compute_capability", N.nvmlDeviceGetCudaComputeCapability, h)
        info = {
            "model": nvml.call("name", N.nvmlDeviceGetName, h) or "unknown",
            "pci_bus_id": normalise_bus_id(pci.busId) if pci is not None else "",
            "architecture": ARCHITECTURE_NAMES.get(arch, "unknown")
            if arch is not None
            else "unknown",
            "compute_capability": f"{cc[0]}.{cc[1]}" if cc else "",
            "driver_version": nvml.driver_version,
        }
        minor = nvml.call("minor_number", N.nvmlDeviceGetMinorNumber, h)
        if minor is not None:  # /dev/nvidia<minor>: how some device plugins name the GPU
            info[MINOR_NUMBER] = str(minor)
        nvml.identify(uuid, info)
        return []

"""pcie: link generation and width (current and maximum), the GPU's own maximum generation,
bytes moved, replays.

Bytes come from the GPU's byte-counter fields; where the driver lacks them, from the 20 ms
`nvmlDeviceGetPcieThroughput` sample (`pcie_throughput_fallback`), which costs 20 ms per call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml as N

from gpu_exporter.collect.nvml.collectors.base import Collector, Device, FieldSpec
from gpu_exporter.model.snapshot import Reading

TX_BYTES = FieldSpec(197, "gpu_pcie_bytes_total", (("direction", "tx"),))
RX_BYTES = FieldSpec(198, "gpu_pcie_bytes_total", (("direction", "rx"),))
REPLAYS = FieldSpec(94, "gpu_pcie_replay_total")


class Pcie(Collector):
    name = "pcie"
    families = (
        "gpu_pcie_bytes_total",
        "gpu_pcie_throughput_bytes_per_second",
        "gpu_pcie_link_generation",
        "gpu_pcie_gpu_max_generation",
        "gpu_pcie_link_width",
        "gpu_pcie_replay_total",
    )
    calls = (
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetGpuMaxPcieLinkGeneration",
        "nvmlDeviceGetCurrPcieLinkGeneration",
        "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlDeviceGetPcieReplayCounter",  # without the replay field
        "nvmlDeviceGetPcieThroughput",  # without the byte-counter fields
    )
    fields = (TX_BYTES, RX_BYTES, REPLAYS)
    options = ("pcie_throughput_fallback",)
    refreshes = True

    def refresh(self, nvml: Device) -> list[Reading]:
        out = _link_state(
            nvml,
            "max",
            ("pcie_max_generation", N.nvmlDeviceGetMaxPcieLinkGeneration),
            ("pcie_max_width", N.nvmlDeviceGetMaxPcieLinkWidth),
        )
        # What the board could train to in a faster slot (the link's max is the lower of both).
        gpu_max = nvml.call(
            "pcie_gpu_max_generation", N.nvmlDeviceGetGpuMaxPcieLinkGeneration, nvml.handle
        )
        if gpu_max is not None:
            out.append(Reading("gpu_pcie_gpu_max_generation", gpu_max))
        return out

    def read(self, nvml: Device) -> list[Reading]:
        h = nvml.handle
        out = _link_state(
            nvml,
            "current",
            ("pcie_generation", N.nvmlDeviceGetCurrPcieLinkGeneration),
            ("pcie_width", N.nvmlDeviceGetCurrPcieLinkWidth),
        )
        out += nvml.field_readings(self.fields)
        if nvml.fields_gone(REPLAYS.field_id):
            replay = nvml.call("pcie_replay", N.nvmlDeviceGetPcieReplayCounter, h)
            if replay is not None:
                out.append(Reading("gpu_pcie_replay_total", replay))
        bytes_gone = nvml.fields_gone(TX_BYTES.field_id, RX_BYTES.field_id)
        if bytes_gone and nvml.settings.pcie_throughput_fallback:
            for direction, counter in (
                ("tx", N.NVML_PCIE_UTIL_TX_BYTES),
                ("rx", N.NVML_PCIE_UTIL_RX_BYTES),
            ):
                kbps = nvml.call(
                    f"pcie_throughput_{direction}", N.nvmlDeviceGetPcieThroughput, h, counter
                )
                if kbps is not None:  # "KB/s" over a 20 ms window; read as KiB/s (unverified)
                    labels = (("direction", direction),)
                    out.append(
                        Reading("gpu_pcie_throughput_bytes_per_second", kbps * 1024.0, labels)
                    )
        return out


def _link_state(
    nvml: Device,
    state: str,
    generation: tuple[str, Callable[..., Any]],
    width: tuple[str, Callable[..., Any]],
) -> list[Reading]:
    """Link generation and width for one `state` label (current, or the maximum)."""
    out = []
    for family, (key, function) in (
        ("gpu_pcie_link_generation", generation),
        ("gpu_pcie_link_width", width),
    ):
        value = nvml.call(key, function, nvml.handle)
        if value is not None:
            out.append(Reading(family, value, (("state", state),)))
    return out

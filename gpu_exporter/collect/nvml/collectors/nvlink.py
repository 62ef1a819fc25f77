"""nvlink: links in the active state, and data bytes and errors over all links.

The link count comes from the NVLINK_LINK_COUNT field at each slow refresh; a board without
links asks for no NVLink fields at all, so it has no NVLink series (never zeros made up).
"""

from __future__ import annotations

from collections.abc import Sequence

import pynvml as N

from gpu_exporter.collect.nvml.collectors.base import Collector, Device, FieldSpec
from gpu_exporter.collect.nvml.values import field_value
from gpu_exporter.model.snapshot import Reading

AGGREGATE_SCOPE = 0xFFFFFFFF  # "returns aggregate value summed up across all links"
_KIB = 1024.0


class NvLink(Collector):
    name = "nvlink"
    families = ("gpu_nvlink_bytes_total", "gpu_nvlink_links_active", "gpu_nvlink_errors_total")
    calls = ("nvmlDeviceGetFieldValues", "nvmlDeviceGetNvLinkState")  # the link count field
    fields = (
        FieldSpec(138, "gpu_nvlink_bytes_total", (("direction", "tx"),), _KIB, AGGREGATE_SCOPE),
        FieldSpec(139, "gpu_nvlink_bytes_total", (("direction", "rx"),), _KIB, AGGREGATE_SCOPE),
        # NVML_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL: the driver's sums over all links and lanes.
        FieldSpec(38, "gpu_nvlink_errors_total", (("error", "crc_flit"),)),
        FieldSpec(45, "gpu_nvlink_errors_total", (("error", "crc_data"),)),
        FieldSpec(52, "gpu_nvlink_errors_total", (("error", "replay"),)),
        FieldSpec(59, "gpu_nvlink_errors_total", (("error", "recovery"),)),
    )
    refreshes = True

    def __init__(self) -> None:
        super().__init__()
        self.links = 0

    def wanted_fields(self) -> Sequence[FieldSpec]:
        return self.fields if self.links else ()

    def refresh(self, nvml: Device) -> list[Reading]:
        counts = nvml.call(
            "nvlink_link_count",
            N.nvmlDeviceGetFieldValues,
            nvml.handle,
            [N.NVML_FI_DEV_NVLINK_LINK_COUNT],
        )
        self.links = 0
        if counts is not None and counts[0].nvmlReturn == N.NVML_SUCCESS:
            self.links = int(field_value(counts[0]))
        if not self.links:
            return []
        active = 0
        for link in range(self.links):
            state = nvml.call("nvlink_state", N.nvmlDeviceGetNvLinkState, nvml.handle, link)
            if state is None:
                return []  # unsupported or failing: absent rather than a wrong count
            active += int(state == N.NVML_FEATURE_ENABLED)
        return [Reading("gpu_nvlink_links_active", active)]

    def read(self, nvml: Device) -> list[Reading]:
        return nvml.field_readings(self.wanted_fields())

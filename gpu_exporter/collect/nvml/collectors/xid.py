"""xid: XID errors per XID number, counted by the event thread (`collect/nvml/xid.py`).

On with `nvml.xid_events`. Its NVML calls are made by that thread, not per tick; reading the
counts needs none, so they are reported even while the GPU is down.
"""

from __future__ import annotations

from gpu_exporter.collect.nvml.collectors.base import Collector, Device
from gpu_exporter.model.snapshot import Reading


class Xid(Collector):
    name = "xid"
    families = ("gpu_xid_errors_total", "gpu_xid_last_timestamp_seconds")
    calls = (  # on the event thread
        "nvmlEventSetCreate",
        "nvmlDeviceGetSupportedEventTypes",
        "nvmlDeviceRegisterEvents",
        "nvmlEventSetWait",
        "nvmlEventSetFree",
    )
    setting = "xid_events"
    works_offline = True

    def read(self, nvml: Device) -> list[Reading]:
        out = []
        for xid, (count, last) in sorted(nvml.xid_counts.for_gpu(nvml.uuid).items()):
            labels = (("xid", str(xid)),)
            out.append(Reading("gpu_xid_errors_total", count, labels))
            out.append(Reading("gpu_xid_last_timestamp_seconds", last, labels))
        return out

"""xid: XID errors per XID number, counted by the event thread (`collect/nvml/xid.py`).

On with `nvml.xid_events`. Its NVML calls are made by that thread, not per tick; reading the
counts needs none, so they are reported even while the GPU is down.

The XIDs the rule pack alerts on (`gpu_exporter/model/xids.py`: CRITICAL and WARNING) are
reported at 0 from the first tick after the GPU is registered for XID events: a counter whose
series is born at 1 has no earlier sample, so Prometheus' increase() misses its first XID. Only
those XIDs (9 series per GPU, not one per possible XID), and only on GPUs registered for XIDs
(where none can be seen, 0 would be a claim nobody checked). gpu_xid_last_timestamp_seconds
stays absent until an XID of that number occurs.
"""

from __future__ import annotations

from gpu_exporter.collect.nvml.collectors.base import Collector, Device
from gpu_exporter.model.snapshot import Reading
from gpu_exporter.model.xids import ALWAYS_EXPORTED


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
        seen = nvml.xid_counts.for_gpu(nvml.uuid)
        shown = set(seen)
        if nvml.xid_counts.watched(nvml.uuid):
            shown.update(ALWAYS_EXPORTED)
        out = []
        for xid in sorted(shown):
            labels = (("xid", str(xid)),)
            if xid not in seen:
                out.append(Reading("gpu_xid_errors_total", 0, labels))
                continue
            count, last = seen[xid]
            out.append(Reading("gpu_xid_errors_total", count, labels))
            out.append(Reading("gpu_xid_last_timestamp_seconds", last, labels))
        return out

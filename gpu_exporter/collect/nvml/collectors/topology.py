"""topology: how the GPU reaches its peers (NVLink or PCIe level, P2P), CPU and NUMA affinity.

Each pair quantity is exported as the GPU's usual value plus the peers that differ from it (see
`gpu_exporter/collect/nvml/topology.py`), so the series grow with the GPU count, not its square.

Read by `gpu_exporter/collect/nvml/topology.py` at start and after each full NVML re-init, never per
tick (a pair query can take hundreds of milliseconds); each tick repeats what was read. On when the
source has a topology reader. While the latest read failed (the reader raised), the source reports
this collector failed on every tick (`NvmlSource._read_topology`).
"""

from __future__ import annotations

from gpu_exporter.collect.nvml.collectors.base import Collector, Device
from gpu_exporter.collect.settings import NvmlConfig
from gpu_exporter.model.snapshot import Reading


class Topology(Collector):
    name = "topology"
    families = (
        "gpu_topology_usual_link_info",
        "gpu_topology_link_info",
        "gpu_topology_usual_nvlink_links",
        "gpu_topology_nvlink_links",
        "gpu_p2p_usual_supported",
        "gpu_p2p_supported",
        "gpu_cpu_affinity_info",
        "gpu_numa_node",
    )
    calls = (  # at start and re-init
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetFieldValues",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetNvLinkRemoteDeviceType",
        "nvmlDeviceGetNvLinkRemotePciInfo",
        "nvmlDeviceGetNumaNodeId",
        "nvmlDeviceGetCpuAffinity",
        "nvmlDeviceGetMemoryAffinity",
        "nvmlDeviceGetTopologyCommonAncestor",
        "nvmlDeviceGetP2PStatus",
    )

    @classmethod
    def enabled(cls, settings: NvmlConfig, *, topology: bool) -> bool:
        return topology

    def read(self, nvml: Device) -> list[Reading]:
        if nvml.topology is None:
            return []
        return nvml.topology.readings_for(nvml.uuid)

"""The per-GPU collectors, registered in the order a tick runs them (node_exporter's layout).

One module per area; each collector declares its name, families, NVML calls, fields and
setting next to its code (see `base.py`). Adding a metric family touches only its collector,
the catalog (`gpu_exporter/model/catalog.py`) and the fake NVML (`gpu_exporter/sim/`).
"""

from __future__ import annotations

from gpu_exporter.collect.nvml.collectors.base import Collector, Device, FieldSpec
from gpu_exporter.collect.nvml.collectors.clocks import Clocks
from gpu_exporter.collect.nvml.collectors.ecc import Ecc
from gpu_exporter.collect.nvml.collectors.fabric import Fabric
from gpu_exporter.collect.nvml.collectors.gpm import Gpm
from gpu_exporter.collect.nvml.collectors.identity import Identity
from gpu_exporter.collect.nvml.collectors.memory import Memory
from gpu_exporter.collect.nvml.collectors.mig import Mig
from gpu_exporter.collect.nvml.collectors.nvlink import NvLink
from gpu_exporter.collect.nvml.collectors.pcie import Pcie
from gpu_exporter.collect.nvml.collectors.power import Power
from gpu_exporter.collect.nvml.collectors.processes import Processes
from gpu_exporter.collect.nvml.collectors.recovery import Recovery
from gpu_exporter.collect.nvml.collectors.temperature import Temperature
from gpu_exporter.collect.nvml.collectors.topology import Topology
from gpu_exporter.collect.nvml.collectors.utilization import Utilization
from gpu_exporter.collect.nvml.collectors.xid import Xid
from gpu_exporter.collect.settings import NvmlConfig

__all__ = [
    "COLLECTORS",
    "SOURCE_FAMILIES",
    "SOURCE_INSTANCE_FAMILIES",
    "Collector",
    "Device",
    "FieldSpec",
    "build",
    "enabled",
]

# Identity first (the other collectors' slow refreshes follow it), then MIG (utilization, memory
# and gpm read differently with it on), then the per-tick reads.
COLLECTORS: tuple[type[Collector], ...] = (
    Identity,
    Mig,
    Utilization,
    Processes,
    Memory,
    Power,
    Temperature,
    Clocks,
    Pcie,
    NvLink,
    Fabric,
    Ecc,
    Recovery,
    Gpm,
    Xid,
    Topology,
)

# Per-GPU families the NVML source itself emits, not any collector: whether the GPU answered.
SOURCE_FAMILIES: tuple[str, ...] = ("gpu_up",)
# Likewise per MIG instance: whether it was read in this tick or is the one last known.
SOURCE_INSTANCE_FAMILIES: tuple[str, ...] = ("gpu_mig_instance_up",)


def enabled(settings: NvmlConfig, *, topology: bool) -> tuple[type[Collector], ...]:
    """The collectors these settings turn on; `topology`: a topology reader is configured."""
    return tuple(c for c in COLLECTORS if c.enabled(settings, topology=topology))


def build(settings: NvmlConfig, *, topology: bool) -> list[Collector]:
    """One GPU's collector instances (each holds that GPU's state for its area)."""
    return [collector() for collector in enabled(settings, topology=topology)]

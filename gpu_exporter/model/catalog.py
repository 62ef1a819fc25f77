"""Every metric family the exporter can emit, named once.

Sources produce `Reading`s that refer to these names; the exposition, the metric reference in
the README (`python -m gpu_exporter.model.catalog`) and the tests all read this table, so a
family is added or renamed in exactly one place.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from gpu_exporter.model.default_profile import DEFAULT
from gpu_exporter.model.xids import ALWAYS_EXPORTED


class Kind(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"
    INFO = "info"  # exposed as a gauge with value 1 and identifying labels
    HISTOGRAM = "histogram"


class Scope(StrEnum):
    """Which series of a per-GPU family exist: the whole GPU's, MIG instances', or both."""

    GPU = "gpu"
    GPU_AND_INSTANCE = "gpu, instance"
    INSTANCE = "instance"


# The labels that name a pod's container: on gpu_pod_info and the per-pod families as their own.
POD_LABELS = ("namespace", "pod", "container")
# A DRA claim's: the pod's, then the ResourceClaim and the device as the kubelet reports them.
DRA_CLAIM_LABELS = (
    *POD_LABELS,
    "claim_namespace",
    "resourceclaim_name",
    "driver",
    "pool",
    "device",
)

# Labels of a MIG instance's series, after the parent GPU's gpu and uuid (series.py says when
# each is present).
INSTANCE_LABELS = ("gpu_instance", "compute_instance", "mig_uuid", "mig_profile")


@dataclass(frozen=True, slots=True)
class Family:
    name: str  # as exposed; counters include the `_total` suffix
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()  # labels beyond gpu/uuid
    unit: str = ""  # OpenMetrics unit; must be the name's suffix
    source: str = "nvml"
    per_device: bool = True
    # Per-GPU families only: whether MIG instances have series of it too (memory, activity,
    # classes, pods) or only whole GPUs do (power, clocks, links: the parent's quantities).
    scope: Scope = Scope.GPU

    @property
    def on_gpus(self) -> bool:
        return self.per_device and self.scope is not Scope.INSTANCE

    @property
    def on_instances(self) -> bool:
        return self.per_device and self.scope is not Scope.GPU

    @property
    def base_name(self) -> str:
        """Name without `_total`, as prometheus_client's CounterMetricFamily wants it."""
        if self.kind is Kind.COUNTER and self.name.endswith("_total"):
            return self.name[: -len("_total")]
        return self.name


G, C = Kind.GAUGE, Kind.COUNTER

# Activity ratio -> (its counter of active seconds, what is active), for the activity families
# without labels of their own.
_ACTIVITY_SECONDS: dict[str, tuple[str, str]] = {
    "gpu_sm_active_ratio": ("gpu_sm_active_seconds_total", "SMs"),
    "gpu_tensor_active_ratio": ("gpu_tensor_active_seconds_total", "Tensor Cores"),
    "gpu_dram_active_ratio": ("gpu_dram_active_seconds_total", "DRAM interface"),
    "gpu_graphics_engine_active_ratio": (
        "gpu_graphics_engine_active_seconds_total",
        "graphics/compute engine",
    ),
}
ACTIVITY_SECONDS: Mapping[str, str] = MappingProxyType(
    {ratio: counter for ratio, (counter, _) in _ACTIVITY_SECONDS.items()}
)
BOTH = Scope.GPU_AND_INSTANCE

FAMILIES: tuple[Family, ...] = (
    Family(
        "gpu_info",
        Kind.INFO,
        "GPU identity; value is always 1.",
        ("model", "pci_bus_id", "architecture", "compute_capability", "driver_version"),
    ),
    Family(
        "gpu_up",
        G,
        "1 when the GPU answered NVML in this tick, 0 when it did not: lost, hung, or not read "
        "in time.",
    ),
    Family(
        "gpu_mig_mode",
        G,
        "1 when MIG is enabled, now (current) and after the next GPU reset (pending); only on "
        "GPUs with MIG.",
        ("state",),
    ),
    Family(
        "gpu_mig_instance_info",
        Kind.INFO,
        "A MIG instance's size: GPU and compute slices, SMs and memory (NVML device "
        "attributes); value is always 1.",
        ("gpu_slices", "compute_slices", "multiprocessors", "memory_bytes"),
        scope=Scope.INSTANCE,
    ),
    Family(
        "gpu_mig_instance_slices",
        G,
        "GPU slices of the MIG instance's GPU instance (of 7 on A100, H100 and H200): the "
        "weight of an instance in averages over a GPU or a fleet.",
        scope=Scope.INSTANCE,
    ),
    Family(
        "gpu_mig_instance_up",
        G,
        "1 when the MIG instance was read in this tick, 0 while it is unknown: its GPU is lost "
        "or hung, or its GPU's MIG layout could not be read (an NVML call failed or hung). "
        "Then it is the instance last enumerated, with the pods holding it, until it is read "
        "again; its quantities are absent meanwhile.",
        scope=Scope.INSTANCE,
    ),
    Family(
        "gpu_utilization_ratio",
        G,
        "Fraction of the last sample period in which at least one kernel ran (NVML).",
        unit="ratio",
    ),
    Family(
        "gpu_memory_utilization_ratio",
        G,
        "Fraction of the last sample period in which device memory was read or written.",
        unit="ratio",
    ),
    Family(
        "gpu_encoder_utilization_ratio",
        G,
        "Fraction of the last sample period the video encoder (NVENC) was busy (NVML); not on "
        "MIG-enabled GPUs.",
        unit="ratio",
    ),
    Family(
        "gpu_decoder_utilization_ratio",
        G,
        "Fraction of the last sample period the video decoder (NVDEC) was busy (NVML); not on "
        "MIG-enabled GPUs.",
        unit="ratio",
    ),
    Family(
        "gpu_sm_active_ratio",
        G,
        "Fraction of cycles an SM had at least one warp, averaged over SMs (GPM SM_UTIL, or "
        "DCGM field 1002 before Hopper).",
        unit="ratio",
        source="gpm",
        scope=BOTH,
    ),
    Family(
        "gpu_sm_occupancy_ratio",
        G,
        "Resident warps as a fraction of the theoretical maximum (GPM SM_OCCUPANCY, or DCGM 1003).",
        unit="ratio",
        source="gpm",
        scope=BOTH,
    ),
    Family(
        "gpu_tensor_active_ratio",
        G,
        "Fraction of cycles any tensor pipe was active (GPM ANY_TENSOR_UTIL, or DCGM 1004).",
        unit="ratio",
        source="gpm",
        scope=BOTH,
    ),
    Family(
        "gpu_dram_active_ratio",
        G,
        "Device memory bandwidth used as a fraction of the maximum (GPM DRAM_BW_UTIL, or DCGM "
        "1005).",
        unit="ratio",
        source="gpm",
        scope=BOTH,
    ),
    Family(
        "gpu_graphics_engine_active_ratio",
        G,
        "Fraction of time the graphics/compute engine was busy (GPM GRAPHICS_UTIL, or DCGM 1001).",
        unit="ratio",
        source="gpm",
        scope=BOTH,
    ),
    Family(
        "gpu_pipe_active_ratio",
        G,
        "Fraction of cycles the non-tensor fp64/fp32/fp16/integer pipe was active (GPM, or "
        "DCGM 1006-1008 and 1016).",
        ("pipe",),
        unit="ratio",
        source="gpm",
        scope=BOTH,
    ),
    Family(
        "gpu_tensor_pipe_active_ratio",
        G,
        "Fraction of cycles a tensor pipe was active, by pipe: hmma (half precision, FP16/BF16),"
        " imma (integer), dfma (FP64) (GPM HMMA/IMMA/DFMA_TENSOR_UTIL, or DCGM 1013-1015).",
        ("pipe",),
        unit="ratio",
        source="gpm",
        scope=BOTH,
    ),
    Family(
        "gpu_activity_source_info",
        Kind.INFO,
        "Which source measured the GPU's SM/Tensor/DRAM activity: gpm (NVML, Hopper and newer)"
        " or dcgm (DCGM's profiling fields); only while DCGM is configured; value is always 1.",
        ("source",),
        source="dcgm",
    ),
    Family(
        "gpu_activity_awaited",
        G,
        "1 while the device's SM/Tensor/DRAM activity is measured but has no value yet (NVML GPM"
        " diffs two samples, so the tick that takes the first one, at start, after a driver"
        " re-init or a MIG change, has none; DCGM has none before its first update cycle);"
        " absent otherwise. Activity missing while this is present is not sampled yet, not"
        " unavailable.",
        scope=BOTH,
    ),
    Family("gpu_memory_total_bytes", G, scope=BOTH, help="Total device memory.", unit="bytes"),
    Family(
        "gpu_memory_used_bytes",
        G,
        scope=BOTH,
        help="Device memory allocated by processes.",
        unit="bytes",
    ),
    Family(
        "gpu_memory_reserved_bytes",
        G,
        "Device memory reserved by the driver and firmware (memory info v2).",
        unit="bytes",
        scope=BOTH,
    ),
    Family("gpu_memory_free_bytes", G, scope=BOTH, help="Device memory free.", unit="bytes"),
    Family("gpu_power_watts", G, "Power draw (1 s average on Ampere and newer).", unit="watts"),
    Family(
        "gpu_power_limit_watts",
        G,
        "Enforced power limit, after every limiter.",
        unit="watts",
    ),
    Family(
        "gpu_power_management_limit_watts",
        G,
        "Power management limit set by the administrator (or the default), before the other "
        "limiters; gpu_power_limit_watts is the one enforced.",
        unit="watts",
    ),
    Family(
        "gpu_power_management_limit_min_watts",
        G,
        "Lowest power management limit the board accepts.",
        unit="watts",
    ),
    Family(
        "gpu_power_management_limit_max_watts",
        G,
        "Highest power management limit the board accepts.",
        unit="watts",
    ),
    Family(
        "gpu_power_management_limit_default_watts",
        G,
        "The power management limit the board boots with (its default).",
        unit="watts",
    ),
    Family(
        "gpu_energy_joules_total",
        C,
        "Energy consumed since the driver was loaded.",
        unit="joules",
    ),
    Family(
        "gpu_temperature_celsius",
        G,
        "Temperature by sensor (gpu die, memory).",
        ("sensor",),
        unit="celsius",
    ),
    Family("gpu_clock_hertz", G, "Current clock frequency.", ("clock",), unit="hertz"),
    Family("gpu_clock_max_hertz", G, "Maximum clock frequency.", ("clock",), unit="hertz"),
    Family(
        "gpu_clock_event_active",
        G,
        "1 while this clock-event (throttle) reason holds the clocks down, per supported reason.",
        ("reason",),
    ),
    Family(
        "gpu_clock_event_seconds_total",
        C,
        "Cumulative time the clocks were held down by this reason.",
        ("reason",),
        unit="seconds",
    ),
    Family(
        "gpu_violation_seconds_total",
        C,
        "Cumulative time a performance policy held the clocks down (NVML violation counters: "
        "board_limit, low_utilization, reliability); power, thermal and sync-boost time are in "
        "gpu_clock_event_seconds_total.",
        ("policy",),
        unit="seconds",
    ),
    Family("gpu_performance_state", G, "Performance state (0 = P0, fastest; 15 = slowest)."),
    Family(
        "gpu_pcie_bytes_total",
        C,
        "PCIe bytes transferred, from the GPU's byte counters.",
        ("direction",),
        unit="bytes",
    ),
    Family(
        "gpu_pcie_throughput_bytes_per_second",
        G,
        "PCIe throughput over a 20 ms window; only where byte counters are unavailable.",
        ("direction",),
    ),
    Family(
        "gpu_pcie_link_generation",
        G,
        "PCIe link generation, current and maximum for this device and system.",
        ("state",),
    ),
    Family(
        "gpu_pcie_gpu_max_generation",
        G,
        "Highest PCIe generation the GPU itself supports; above the link's maximum "
        '(gpu_pcie_link_generation{state="max"}), the slot or a riser holds the link back.',
    ),
    Family("gpu_pcie_link_width", G, "PCIe link width in lanes, current and maximum.", ("state",)),
    Family("gpu_pcie_replay_total", C, "PCIe replay events (link-level retransmissions)."),
    Family(
        "gpu_nvlink_bytes_total",
        C,
        "NVLink data bytes over all links.",
        ("direction",),
        unit="bytes",
    ),
    Family("gpu_nvlink_links_active", G, "NVLink links in the active state."),
    Family(
        "gpu_nvlink_errors_total",
        C,
        "NVLink errors summed over all links, by kind (crc_flit, crc_data, replay, recovery); "
        "only on GPUs with NVLink.",
        ("error",),
    ),
    Family("gpu_ecc_enabled", G, "1 when ECC is enabled."),
    Family(
        "gpu_ecc_errors_total",
        C,
        "ECC errors since the driver was loaded (volatile counters).",
        ("error",),
    ),
    Family(
        "gpu_ecc_aggregate_errors_total",
        C,
        "ECC errors over the GPU's lifetime (aggregate counters, kept in the InfoROM across "
        "driver reloads and resets).",
        ("error",),
    ),
    Family(
        "gpu_retired_pages_total",
        C,
        "Memory pages retired, by cause (pre-Ampere page retirement).",
        ("cause",),
    ),
    Family("gpu_retired_pages_pending", G, "1 when a page retirement waits for a reboot."),
    Family(
        "gpu_remapped_rows_total",
        C,
        "Memory rows remapped, by the severity of the error that caused it (Ampere+).",
        ("severity",),
    ),
    Family("gpu_row_remap_pending", G, "1 when a row remap waits for a GPU reset."),
    Family("gpu_row_remap_failure", G, "1 when a row remap failed; the GPU needs service."),
    Family(
        "gpu_xid_errors_total",
        C,
        "XID errors seen since the exporter started, by XID number. The XIDs the rule pack "
        f"alerts on ({', '.join(map(str, ALWAYS_EXPORTED))}) are exported at 0 from a GPU's first "
        "tick once it is registered for XID events, so that increase() counts the first one; "
        "any other XID appears when it first occurs.",
        ("xid",),
    ),
    Family(
        "gpu_xid_last_timestamp_seconds",
        G,
        "Unix time of the last XID error of this number; absent until the first.",
        ("xid",),
        unit="seconds",
    ),
    Family(
        "gpu_recovery_action",
        G,
        "The action the driver says the GPU needs to recover (NVML field "
        "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION), as a state set: 1 for the current action (none, "
        "gpu_reset, node_reboot, drain_p2p, drain_and_reset, recover_imex_domain, bus_reset, "
        "system_reboot; unknown for a value newer than these), 0 for the others; absent where "
        "the driver does not support the field.",
        ("action",),
    ),
    Family(
        "gpu_fabric_state",
        G,
        "The GPU's registration with the NVLink fabric (nvmlDeviceGetGpuFabricInfoV) as a "
        "state set: 1 for the current state (not_supported, not_started, in_progress, "
        "completed), 0 for the others; only where the driver answers the call (Hopper and "
        "newer on an NVSwitch fabric).",
        ("state",),
    ),
    Family(
        "gpu_fabric_health_summary",
        G,
        "The driver's summary of the GPU's NVLink fabric health as a state set (healthy, "
        "unhealthy, limited_capacity); only where the driver gives one (fabric info v3).",
        ("summary",),
    ),
    Family(
        "gpu_fabric_health_issue",
        G,
        "1 while the NVLink fabric reports this health issue (degraded_bandwidth, "
        "route_recovery, route_unhealthy, access_timeout_recovery, incorrect_configuration), "
        "0 while it reports none; only the issues the driver reports on.",
        ("issue",),
    ),
    Family("gpu_numa_node", G, "Host NUMA node nearest the GPU.", source="topology"),
    Family(
        "gpu_cpu_affinity_info",
        Kind.INFO,
        "CPUs nearest the GPU (NVML CPU affinity); value is always 1.",
        ("cpus",),
        source="topology",
    ),
    Family(
        "gpu_topology_usual_link_info",
        Kind.INFO,
        "How this GPU reaches most of its peer GPUs (nvlink, single/multiple PCIe switch, "
        "hostbridge, node, system), as nvidia-smi topo -m; peers reached otherwise are in "
        "gpu_topology_link_info; value is always 1.",
        ("link",),
        source="topology",
    ),
    Family(
        "gpu_topology_link_info",
        Kind.INFO,
        "How this GPU reaches a peer GPU (unknown: not reported), for the peers reached "
        "otherwise than by gpu_topology_usual_link_info; value is always 1.",
        ("peer_gpu", "peer_uuid", "link"),
        source="topology",
    ),
    Family(
        "gpu_topology_usual_nvlink_links",
        G,
        "NVLink links connecting this GPU to most of its peer GPUs (0: none); peers with "
        "another count are in gpu_topology_nvlink_links.",
        source="topology",
    ),
    Family(
        "gpu_topology_nvlink_links",
        G,
        "NVLink links connecting this GPU to a peer GPU (NaN: unknown), for the peers whose "
        "count differs from gpu_topology_usual_nvlink_links.",
        ("peer_gpu", "peer_uuid"),
        source="topology",
    ),
    Family(
        "gpu_p2p_usual_supported",
        G,
        "1 when peer-to-peer access to most of this GPU's peers is possible, by capability; "
        "peers that differ are in gpu_p2p_supported.",
        ("capability",),
        source="topology",
    ),
    Family(
        "gpu_p2p_supported",
        G,
        "1 when peer-to-peer access to the peer GPU is possible, by capability (NaN: unknown), "
        "for the peers that differ from gpu_p2p_usual_supported.",
        ("peer_gpu", "peer_uuid", "capability"),
        source="topology",
    ),
    Family(
        "gpu_bottleneck",
        G,
        "Bottleneck class of the GPU over the last seconds, as a state set: 1 for the current "
        "class (idle, throttled, launch_bound, link_bound, memory_bound, tensor_bound, "
        "compute_bound, unknown), 0 for the others.",
        ("class",),
        source="classifier",
        scope=BOTH,
    ),
    Family(
        "gpu_bottleneck_seconds_total",
        C,
        "Time the GPU spent in each bottleneck class.",
        ("class",),
        unit="seconds",
        source="classifier",
        scope=BOTH,
    ),
    # The health verdict (gpu_exporter/model/health_verdict.py, collect/health_latch.py).
    Family(
        "gpu_health_verdict",
        G,
        "Health verdict of the GPU as a state set (pass, info, warning, critical: NVIDIA Health "
        "Validation's): 1 for the worst of its inputs (XIDs, uncorrected ECC, row remapping, "
        "page retirement, the driver's recovery action, NVLink fabric, a GPU lost or hung: "
        "NVML says so, or its reads are late tick after tick, not once), 0 for the others. "
        "Latched: an input holds until the evidence that it was fixed (its reading "
        "healthy again; for a critical XID a GPU reset, seen as a volatile ECC counter going "
        "down, a pending remap or retirement done, or the recovery action back to none); an "
        "absent reading clears nothing; an exporter restart keeps only what the driver still "
        "shows (XIDs before it are forgotten).",
        ("verdict",),
        source="health",
    ),
    Family(
        "gpu_health_action_info",
        Kind.INFO,
        "Next step for the GPU (action: none, restart_app, reset_gpu, drain_and_reset, "
        "reboot_node, service, ...) and why (reason: the input deciding gpu_health_verdict, "
        "e.g. xid_79, uncorrected_ecc, gpu_lost; healthy when none), latched and cleared with "
        "gpu_health_verdict (docs/runbook.md, Health verdicts); value is always 1.",
        ("action", "reason"),
        source="health",
    ),
    Family(
        "gpu_health_xid_info",
        Kind.INFO,
        "The XID whose latch decides gpu_health_verdict (gpu_health_action_info's reason is "
        "xid_<xid>), for joins with gpu_xid_*{xid}; absent when no XID decides it. Value is "
        "always 1.",
        ("xid",),
        source="health",
    ),
    Family(
        "gpu_pod_info",
        Kind.INFO,
        "Pod and container the GPU or MIG instance is allocated to (kubelet PodResources); "
        "value is always 1.",
        POD_LABELS,
        source="kubernetes",
        scope=BOTH,
    ),
    Family(
        "gpu_pod_resourceclaim_info",
        Kind.INFO,
        "Pod and container holding the GPU or MIG instance through a DRA ResourceClaim "
        "(kubelet PodResources dynamic_resources, resolved to the device through the node's "
        "ResourceSlices), with the claim and the device as DRA names it; resourceclaim_name is "
        "the ResourceClaim object's name, as kube-state-metrics' kube_pod_resourceclaim_info "
        "labels it. Value is always 1.",
        DRA_CLAIM_LABELS,
        source="kubernetes",
        scope=BOTH,
    ),
    # Activity as counters: the ratio of each tick times the tick's interval, summed.
    *(
        Family(
            counter,
            C,
            f"Active time of the {what}: {ratio} integrated over each tick (ratio times the "
            "time since the previous tick), so rate() gives the exact average over any window.",
            unit="seconds",
            source="activity",
            scope=BOTH,
        )
        for ratio, (counter, what) in _ACTIVITY_SECONDS.items()
    ),
    # Per-process use, by the pod and container each process runs in (kubernetes.processes).
    Family(
        "gpu_pod_processes",
        G,
        "Processes of the container running on the GPU or MIG instance (NVML's running-process "
        "lists); 0 for a container the kubelet allocated it to that runs none.",
        POD_LABELS,
        source="processes",
        scope=BOTH,
    ),
    Family(
        "gpu_pod_memory_used_bytes",
        G,
        "GPU memory used by the container's processes, summed from NVML's per-process figures "
        "(measured).",
        POD_LABELS,
        unit="bytes",
        source="processes",
        scope=BOTH,
    ),
    Family(
        "gpu_pod_utilization_ratio",
        G,
        "Share of time the container's kernels ran on the GPU in the driver's newest per-process "
        "sample periods, summed over its processes (measured; with the other containers' at most "
        "the GPU's utilization over the same periods). "
        "NVML has none under MIG.",
        POD_LABELS,
        unit="ratio",
        source="processes",
    ),
    Family(
        "gpu_pod_encoder_utilization_ratio",
        G,
        "Share of time the GPU's video encoders worked for the container in the driver's newest "
        "per-process sample periods (measured).",
        POD_LABELS,
        unit="ratio",
        source="processes",
    ),
    Family(
        "gpu_pod_decoder_utilization_ratio",
        G,
        "Share of time the GPU's video decoders worked for the container in the driver's newest "
        "per-process sample periods (measured).",
        POD_LABELS,
        unit="ratio",
        source="processes",
    ),
    Family(
        "gpu_pod_energy_joules_total",
        C,
        "GPU energy charged to the container: all of it while the container alone runs on the GPU "
        "(attribution=\"exclusive\", measured), else each tick's energy times the container's "
        'share of the SM time its processes used (attribution="apportioned": an estimate, NVML '
        "measures no per-process energy). Never more than gpu_energy_joules_total over all "
        "containers.",
        (*POD_LABELS, "attribution"),
        unit="joules",
        source="processes",
    ),
    Family(
        "gpu_unattributed_processes",
        G,
        'Processes on the GPU or MIG instance that no container is known for: reason="host" (it '
        'runs outside Kubernetes), "unknown" (its container could not be found: see '
        "gpu_exporter_process_attribution_up).",
        ("reason",),
        source="processes",
        scope=BOTH,
    ),
    Family(
        "gpu_unattributed_memory_used_bytes",
        G,
        "GPU memory used by the processes of gpu_unattributed_processes, by reason (measured).",
        ("reason",),
        unit="bytes",
        source="processes",
        scope=BOTH,
    ),
    Family(
        "gpu_unattributed_utilization_ratio",
        G,
        "Share of time the kernels of the processes of gpu_unattributed_processes ran in the "
        "driver's newest per-process sample periods, by reason (measured).",
        ("reason",),
        unit="ratio",
        source="processes",
    ),
    # Self-telemetry.
    Family(
        "gpu_exporter_build_info",
        Kind.INFO,
        "Exporter build; value is always 1.",
        ("version", "python_version", "nvml_binding_version"),
        source="exporter",
        per_device=False,
    ),
    Family(
        "gpu_exporter_tick_duration_seconds",
        Kind.HISTOGRAM,
        "Time the NVML reads (all GPUs, concurrently) and the enrichment of one tick took; rule "
        "evaluation and rendering come after and are not included.",
        unit="seconds",
        source="exporter",
        per_device=False,
    ),
    Family(
        "gpu_exporter_full_tick_duration_seconds",
        Kind.HISTOGRAM,
        "Time whole ticks took: NVML reads, enrichment, series and rule evaluation (waited for "
        "at most a quarter of the interval; the exposition is written on a tick's first "
        "scrape, outside it). A tick is counted from the next tick's series on, since they are "
        "built before it ends.",
        unit="seconds",
        source="exporter",
        per_device=False,
    ),
    Family(
        "gpu_exporter_last_tick_timestamp_seconds",
        G,
        "Unix time the last sampler tick finished.",
        unit="seconds",
        source="exporter",
        per_device=False,
    ),
    Family(
        "gpu_exporter_ticks_total",
        C,
        "Sampler ticks completed.",
        source="exporter",
        per_device=False,
    ),
    Family(
        "gpu_exporter_collector_success",
        G,
        "1 when the collector produced its series in the last tick, 0 when it failed (its "
        "series are then missing for that tick only).",
        ("collector",),
        source="exporter",
        per_device=False,
    ),
    Family(
        "gpu_exporter_collector_duration_seconds",
        G,
        "Time the collector took in the last tick (summed over GPUs for per-GPU collectors).",
        ("collector",),
        unit="seconds",
        source="exporter",
        per_device=False,
    ),
    Family(
        "gpu_exporter_errors_total",
        C,
        "Failed reads by source, field and NVML error name.",
        ("source", "field", "error"),
        source="exporter",
        per_device=False,
    ),
    Family(
        "gpu_exporter_alerts",
        G,
        "Alerts of each in-daemon alerting rule, by state (pending, firing).",
        ("alertname", "state"),
        source="rules",
        per_device=False,
    ),
    Family(
        "gpu_exporter_rule_evaluations_total",
        C,
        "Rule group evaluations.",
        source="rules",
        per_device=False,
    ),
    Family(
        "gpu_exporter_rule_evaluations_skipped_total",
        C,
        "Ticks that found the previous rule evaluation still running and skipped theirs (their "
        "series still feed the rules' history); the sampling goes on at its interval.",
        source="rules",
        per_device=False,
    ),
    Family(
        "gpu_exporter_rule_evaluation_failures_total",
        C,
        "Rule evaluations that failed (the rule's last good state is kept).",
        source="rules",
        per_device=False,
    ),
    Family(
        "gpu_exporter_rule_group_duration_seconds",
        G,
        "How long the last evaluation of each rule group took.",
        ("group",),
        unit="seconds",
        source="rules",
        per_device=False,
    ),
    Family(
        "gpu_exporter_rule_group_skipped_rules",
        G,
        "Rules of each rule group loaded but not evaluated in the daemon (valid PromQL it does "
        "not implement, e.g. native-histogram functions; Prometheus evaluates them).",
        ("group",),
        source="rules",
        per_device=False,
    ),
    Family(
        "gpu_exporter_rule_reload_success",
        G,
        "1 when the last rule (re)load succeeded; 0 while the previous rules stay active.",
        source="rules",
        per_device=False,
    ),
    Family(
        "gpu_exporter_rule_reload_failures_total",
        C,
        "Rule reloads refused because a file was broken.",
        source="rules",
        per_device=False,
    ),
    Family(
        "gpu_exporter_rule_group_budget_exceeded_total",
        C,
        "Evaluations of each rule group stopped at its time budget (its rules kept their "
        "state; annotations it stopped are marked).",
        ("group",),
        source="rules",
        per_device=False,
    ),
    Family(
        "gpu_exporter_rule_history_bytes",
        G,
        "Memory the rule history holds (samples' arrays and series), at the last ingest.",
        unit="bytes",
        source="rules",
        per_device=False,
    ),
    Family(
        "gpu_exporter_rule_history_max_bytes",
        G,
        "The rule history's memory cap (rules.history_max_bytes).",
        unit="bytes",
        source="rules",
        per_device=False,
    ),
    Family(
        "gpu_exporter_rule_history_dropped_samples_total",
        C,
        "Samples the rule history dropped before the rules were done with them, to stay "
        "within its memory cap.",
        source="rules",
        per_device=False,
    ),
    Family(
        "gpu_exporter_notifications_sent_total",
        C,
        "Alerts delivered to each Alertmanager.",
        ("alertmanager",),
        source="notifier",
        per_device=False,
    ),
    Family(
        "gpu_exporter_notifications_errors_total",
        C,
        "Alerts in POSTs to each Alertmanager that failed, by reason (unreachable, credentials,"
        " unauthorized, unavailable, invalid, too_large, unexpected_status); kept and sent"
        " again (invalid and too_large: in halves).",
        ("alertmanager", "reason"),
        source="notifier",
        per_device=False,
    ),
    Family(
        "gpu_exporter_notifications_rejected_total",
        C,
        "Alerts dropped as undeliverable, by reason: invalid (400/422 for the alert alone),"
        " too_large (413 for the alert alone), invalid_local (refused before sending).",
        ("alertmanager", "reason"),
        source="notifier",
        per_device=False,
    ),
    Family(
        "gpu_exporter_notifications_dropped_total",
        C,
        "Alerts dropped, oldest first, because an Alertmanager's queue was full.",
        ("alertmanager",),
        source="notifier",
        per_device=False,
    ),
    Family(
        "gpu_exporter_notifications_queue_length",
        G,
        "Alerts waiting to be delivered to each Alertmanager.",
        ("alertmanager",),
        source="notifier",
        per_device=False,
    ),
    Family(
        "gpu_exporter_attribution_up",
        G,
        "1 when the last kubelet PodResources refresh succeeded; while 0 the last known pod"
        " labels are kept until a grace period after the last success, then removed.",
        source="kubernetes",
        per_device=False,
    ),
    Family(
        "gpu_exporter_process_attribution_up",
        G,
        "1 when the last mapping of GPU processes to containers could read the processes' "
        "cgroups and the container runtime answered; while 0 their use is counted unattributed "
        '(reason="unknown").',
        source="processes",
        per_device=False,
    ),
    Family(
        "gpu_exporter_process_attribution_errors_total",
        C,
        "Failures mapping GPU processes to containers, by what failed (proc: a process's cgroup "
        "or stat could not be read; runtime: the container runtime's CRI API failed).",
        ("reason",),
        source="processes",
        per_device=False,
    ),
    Family(
        "gpu_exporter_attribution_refreshes_total",
        C,
        "kubelet PodResources refreshes, by result (success, error).",
        ("result",),
        source="kubernetes",
        per_device=False,
    ),
    Family(
        "gpu_exporter_attribution_last_success_timestamp_seconds",
        G,
        "Unix time of the last successful kubelet PodResources refresh.",
        unit="seconds",
        source="kubernetes",
        per_device=False,
    ),
    Family(
        "gpu_exporter_dra_up",
        G,
        "1 while this node's ResourceSlices are listed and watched; while 0 the last known DRA "
        "devices are kept until a grace period after the last success, then removed.",
        source="dra",
        per_device=False,
    ),
    Family(
        "gpu_exporter_dra_lists_total",
        C,
        "Complete lists of this node's ResourceSlices (the first, and each after a 410 Gone or "
        "a failure past the grace).",
        source="dra",
        per_device=False,
    ),
    Family(
        "gpu_exporter_dra_errors_total",
        C,
        "Failures reading ResourceSlices, by reason (config, connection, tls, timeout, "
        "unauthorized, forbidden, not_found, http, invalid, other).",
        ("reason",),
        source="dra",
        per_device=False,
    ),
    Family(
        "gpu_exporter_dra_last_success_timestamp_seconds",
        G,
        "Unix time of the last successful ResourceSlice list or watch event.",
        unit="seconds",
        source="dra",
        per_device=False,
    ),
    Family(
        "gpu_exporter_dra_devices",
        G,
        "DRA devices of the configured drivers known from this node's ResourceSlices.",
        source="dra",
        per_device=False,
    ),
    Family(
        "gpu_exporter_dra_unresolved_devices",
        G,
        "Devices the kubelet reports allocated through DRA claims that no ResourceSlice of this "
        "node publishes with a uuid: their pods are not attributed (counted, never guessed).",
        source="dra",
        per_device=False,
    ),
    Family(
        "gpu_exporter_dcgm_up",
        G,
        "1 while the DCGM host engine answers and watches the profiling fields, by dcgm.mode;"
        " only while DCGM is configured and libdcgm is installed.",
        ("mode",),
        source="dcgm",
        per_device=False,
    ),
    Family(
        "gpu_exporter_dcgm_blank_values",
        G,
        "DCGM profiling values read blank in the last tick (DCGM writes blanks while profiling "
        "is paused for Nsight or CUPTI); absent from the activity families, not errors.",
        source="dcgm",
        per_device=False,
    ),
    Family(
        "gpu_exporter_devices",
        G,
        "GPUs known to the exporter (answering or not).",
        source="exporter",
        per_device=False,
    ),
    Family(
        "gpu_exporter_series",
        G,
        "Series of each family in this tick's /metrics, after metrics.profile, metrics.include "
        "and metrics.exclude (this family's own included): what the node costs a time-series "
        "database, family by family.",
        ("family",),
        source="exporter",
        per_device=False,
    ),
)

BY_NAME: dict[str, Family] = {family.name: family for family in FAMILIES}


def family(name: str) -> Family:
    """The catalog entry for `name`; a KeyError here is a programming error in a source."""
    return BY_NAME[name]


_SCOPE_NAMES = {
    Scope.GPU: "GPUs",
    Scope.GPU_AND_INSTANCE: "GPUs, MIG instances",
    Scope.INSTANCE: "MIG instances",
}


def markdown_table() -> str:
    """The metric reference embedded in the README (checked for drift by a test), with what
    the default metrics profile exports of each family."""
    rows = [
        "| metric | type | series of | labels | default profile | description |",
        "|---|---|---|---|---|---|",
    ]
    for fam in FAMILIES:
        base = ["gpu", "uuid"] if fam.per_device else []
        labels = ", ".join(f"`{label}`" for label in (*base, *fam.labels)) or "—"
        of = _SCOPE_NAMES[fam.scope] if fam.per_device else "the exporter"
        part = DEFAULT.get(fam.name)
        profile = "full only" if part is None else part.note or "yes"
        rows.append(
            f"| `{fam.name}` | {fam.kind.value} | {of} | {labels} | {profile} | {fam.help} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover - used to regenerate the README section
    sys.stdout.write(markdown_table() + "\n")

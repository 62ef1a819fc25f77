"""What the default metrics profile exports of each family (gpu_exporter/model/profile.py applies
it): the families the shipped rule pack, recording rules and dashboards read, plus each
subsystem's `up` and the few self-metrics that say whether the exporter works, some of them in
part. A family not listed here is exported by the `full` profile only: a new family costs a
fleet nothing until someone decides it should. tests/test_metrics_profile.py checks that what is
listed carries every selector of those readers, within dcgm-exporter's series count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gpu_exporter.model.nvml_facts import CLOCK_EVENT_REASONS, COMBINED_THERMAL_REASON, Effect

SERIES_FAMILY = "gpu_exporter_series"


@dataclass(frozen=True, slots=True)
class Part:
    """The part of a family the default profile exports: all of its series unless a field
    below says otherwise (the conditions add up)."""

    # With `values`: only the series whose label `label` has one of these values; with
    # `omitted`: only those whose label `label` has none of these.
    label: str = ""
    values: frozenset[str] = frozenset()
    omitted: frozenset[str] = frozenset()
    # Series at this value are left out until they first leave it (then kept while they
    # exist, so a counter or gauge does not come and go): placeholders that say nothing
    # until something happens.
    quiet: float | None = None
    # Left out where this family has a series with the same labels: the same quantity, measured
    # better there.
    unless: str = ""
    # What the README says of the part left to `full` (empty when the family is whole).
    note: str = ""

    @property
    def whole(self) -> bool:
        return not self.label and self.quiet is None and not self.unless


WHOLE = Part()

# The clock-event reasons that hold a busy GPU's clocks down (not the informational ones: idle,
# application or display clocks, sync boost), which the rule pack and the dashboards read, and
# the label of the pre-R535 counter of both thermal reasons together.
_THROTTLE_REASONS = frozenset(
    reason.name for reason in CLOCK_EVENT_REASONS if reason.effect is not Effect.INFORMATIONAL
)
_THROTTLE_COUNTERS = _THROTTLE_REASONS | {COMBINED_THERMAL_REASON}

DEFAULT: Mapping[str, Part] = MappingProxyType(
    {
        # Identity and liveness.
        "gpu_info": WHOLE,
        "gpu_up": WHOLE,
        "gpu_mig_instance_up": WHOLE,
        "gpu_mig_instance_slices": WHOLE,
        # Activity (the rule pack's efficiency group, the efficiency dashboard).
        "gpu_utilization_ratio": WHOLE,
        "gpu_sm_active_ratio": WHOLE,
        "gpu_sm_occupancy_ratio": WHOLE,
        "gpu_tensor_active_ratio": WHOLE,
        "gpu_dram_active_ratio": WHOLE,
        "gpu_graphics_engine_active_ratio": WHOLE,
        "gpu_activity_source_info": WHOLE,
        "gpu_activity_awaited": WHOLE,
        # Memory, power, temperature, clocks.
        "gpu_memory_total_bytes": WHOLE,
        "gpu_memory_used_bytes": WHOLE,
        "gpu_memory_reserved_bytes": WHOLE,
        "gpu_power_watts": WHOLE,
        "gpu_power_limit_watts": WHOLE,
        "gpu_energy_joules_total": WHOLE,
        "gpu_temperature_celsius": WHOLE,
        "gpu_clock_hertz": Part(label="clock", values=frozenset({"sm"}), note="the SM clock only"),
        "gpu_clock_max_hertz": Part(
            label="clock", values=frozenset({"sm"}), note="the SM clock only"
        ),
        "gpu_clock_event_active": Part(
            label="reason",
            values=_THROTTLE_REASONS,
            unless="gpu_clock_event_seconds_total",
            note="the throttling reasons, and only where the driver has no "
            "gpu_clock_event_seconds_total of the reason (that counter measures it exactly)",
        ),
        "gpu_clock_event_seconds_total": Part(
            label="reason", values=_THROTTLE_COUNTERS, note="the throttling reasons"
        ),
        # Links.
        "gpu_pcie_bytes_total": WHOLE,
        "gpu_pcie_throughput_bytes_per_second": WHOLE,
        "gpu_pcie_link_generation": WHOLE,
        "gpu_pcie_link_width": WHOLE,
        "gpu_pcie_replay_total": WHOLE,
        "gpu_nvlink_bytes_total": WHOLE,
        "gpu_nvlink_links_active": WHOLE,
        # Memory errors and XIDs (the health group, the health dashboard).
        "gpu_ecc_enabled": WHOLE,
        "gpu_ecc_errors_total": WHOLE,
        "gpu_retired_pages_pending": WHOLE,
        "gpu_row_remap_pending": WHOLE,
        "gpu_row_remap_failure": WHOLE,
        "gpu_remapped_rows_total": Part(
            quiet=0.0, note="from a GPU's first remapped row on (0 until then)"
        ),
        "gpu_retired_pages_total": Part(
            quiet=0.0, note="from a GPU's first retired page on (0 until then)"
        ),
        "gpu_xid_errors_total": Part(
            quiet=0.0, note="the XIDs seen (full also has the alerted ones at 0 before the first)"
        ),
        "gpu_xid_last_timestamp_seconds": WHOLE,
        # Topology (the health dashboard's link tables).
        "gpu_numa_node": WHOLE,
        "gpu_topology_usual_link_info": WHOLE,
        "gpu_topology_link_info": WHOLE,
        # The classifier and the health verdict.
        "gpu_bottleneck": WHOLE,
        "gpu_health_verdict": Part(
            label="verdict",
            values=frozenset({"critical"}),
            quiet=0.0,
            note='verdict="critical", from the first time a GPU is critical on',
        ),
        "gpu_health_action_info": Part(
            label="reason",
            omitted=frozenset({"healthy"}),
            note="GPUs with something to report (not healthy)",
        ),
        "gpu_health_xid_info": WHOLE,
        # Pods.
        "gpu_pod_info": WHOLE,
        "gpu_pod_processes": WHOLE,
        "gpu_pod_memory_used_bytes": WHOLE,
        "gpu_pod_utilization_ratio": WHOLE,
        "gpu_pod_energy_joules_total": WHOLE,
        # The use of no known container: with the gpu_pod_* families, the whole GPU's (only
        # with kubernetes.processes on, as they).
        "gpu_unattributed_processes": WHOLE,
        "gpu_unattributed_memory_used_bytes": WHOLE,
        "gpu_unattributed_utilization_ratio": WHOLE,
        # The exporter itself.
        "gpu_exporter_build_info": WHOLE,
        "gpu_exporter_tick_duration_seconds": WHOLE,
        "gpu_exporter_last_tick_timestamp_seconds": WHOLE,
        "gpu_exporter_ticks_total": WHOLE,
        "gpu_exporter_collector_success": Part(
            quiet=1.0, note="the collectors that failed since the exporter started"
        ),
        "gpu_exporter_errors_total": WHOLE,
        "gpu_exporter_alerts": Part(
            label="state",
            values=frozenset({"firing"}),
            quiet=0.0,
            note='state="firing", for the alerts that fired since the exporter started',
        ),
        "gpu_exporter_rule_evaluation_failures_total": WHOLE,
        "gpu_exporter_rule_reload_success": WHOLE,
        "gpu_exporter_notifications_sent_total": WHOLE,
        "gpu_exporter_notifications_errors_total": WHOLE,
        "gpu_exporter_notifications_rejected_total": WHOLE,
        "gpu_exporter_notifications_dropped_total": WHOLE,
        "gpu_exporter_attribution_up": WHOLE,
        "gpu_exporter_process_attribution_up": WHOLE,
        "gpu_exporter_dra_up": WHOLE,
        "gpu_exporter_dcgm_up": WHOLE,
        "gpu_exporter_devices": WHOLE,
        SERIES_FAMILY: WHOLE,
    }
)

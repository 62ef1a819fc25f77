"""clocks: frequencies and their maxima, clock events (throttle reasons) and their time, P-state,
and the time the other performance policies held the clocks down.

Clock-event bits are decoded by the documented reasons (`nvml_facts.CLOCK_EVENT_REASONS`) that
this board supports; bits nobody documented are masked off rather than guessed at. Time held
down per reason comes from the per-reason counter fields, or on older drivers from
`nvmlDeviceGetViolationStatus` (power, and thermal as one combined counter). The board-limit,
low-utilization and reliability policies' time is counted apart (`nvml_facts.VIOLATION_POLICIES`):
from their NVML_FI_DEV_PERF_POLICY_* fields, or without them from the same status call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml as N

from gpu_exporter.collect.nvml.collectors.base import Collector, Device, FieldSpec
from gpu_exporter.collect.nvml.values import binding
from gpu_exporter.model.nvml_facts import (
    CLOCK_EVENT_REASONS,
    COMBINED_THERMAL_REASON,
    HW_THERMAL_SLOWDOWN,
    KNOWN_REASON_BITS,
    SW_POWER_CAP,
    SW_THERMAL_SLOWDOWN,
    VIOLATION_POLICIES,
)
from gpu_exporter.model.snapshot import Labels, Reading

CLOCKS = (
    ("sm", N.NVML_CLOCK_SM),
    ("memory", N.NVML_CLOCK_MEM),
    ("graphics", N.NVML_CLOCK_GRAPHICS),
)
_NS = 1e-9


def _reason(name: str) -> Labels:
    return (("reason", name),)


# Cumulative time held down per reason, ns (NVML_FI_DEV_CLOCKS_EVENT_REASON_*), by reason name.
COUNTERS: dict[str, FieldSpec] = {
    r.name: FieldSpec(field_id, "gpu_clock_event_seconds_total", _reason(r.name), _NS)
    for r in CLOCK_EVENT_REASONS
    if (field_id := r.counter_field) is not None
}
# Cumulative time each other policy held the clocks down, ns (NVML_FI_DEV_PERF_POLICY_*).
VIOLATIONS: dict[str, FieldSpec] = {
    p.name: FieldSpec(p.counter_field, "gpu_violation_seconds_total", (("policy", p.name),), _NS)
    for p in VIOLATION_POLICIES
}


class Clocks(Collector):
    name = "clocks"
    families = (
        "gpu_clock_hertz",
        "gpu_clock_max_hertz",
        "gpu_clock_event_active",
        "gpu_clock_event_seconds_total",
        "gpu_performance_state",
        "gpu_violation_seconds_total",
    )
    calls = (
        "nvmlDeviceGetMaxClockInfo",
        "nvmlDeviceGetSupportedClocksEventReasons",
        "nvmlDeviceGetSupportedClocksThrottleReasons",  # its name before R535
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",  # its name before R535
        "nvmlDeviceGetPerformanceState",
        "nvmlDeviceGetViolationStatus",  # without the per-reason counter fields
    )
    fields = (*COUNTERS.values(), *VIOLATIONS.values())
    refreshes = True

    def __init__(self) -> None:
        super().__init__()
        self.supported_reasons = KNOWN_REASON_BITS

    def refresh(self, nvml: Device) -> list[Reading]:
        h = nvml.handle
        out = _clocks(nvml, "gpu_clock_max_hertz", "max_clock", N.nvmlDeviceGetMaxClockInfo)
        mask = nvml.first(
            ("supported_clock_events", binding("nvmlDeviceGetSupportedClocksEventReasons"), h),
            ("supported_clock_throttle", N.nvmlDeviceGetSupportedClocksThrottleReasons, h),
        )
        self.supported_reasons = KNOWN_REASON_BITS if mask is None else mask & KNOWN_REASON_BITS
        return out

    def read(self, nvml: Device) -> list[Reading]:
        h = nvml.handle
        out = _clocks(nvml, "gpu_clock_hertz", "clock", N.nvmlDeviceGetClockInfo)
        bits = nvml.first(
            ("clock_event_reasons", binding("nvmlDeviceGetCurrentClocksEventReasons"), h),
            ("clock_throttle_reasons", N.nvmlDeviceGetCurrentClocksThrottleReasons, h),
        )
        if bits is not None:
            out += [
                Reading("gpu_clock_event_active", float(bool(bits & r.bit)), _reason(r.name))
                for r in CLOCK_EVENT_REASONS
                if self.supported_reasons & r.bit
            ]
        pstate = nvml.call("performance_state", N.nvmlDeviceGetPerformanceState, h)
        if pstate is not None and pstate != N.NVML_PSTATE_UNKNOWN:
            out.append(Reading("gpu_performance_state", pstate))
        out += nvml.field_readings(self.fields)
        if nvml.fields_gone(COUNTERS[SW_POWER_CAP.name].field_id):
            out += _violation(nvml, "violation_power", N.NVML_PERF_POLICY_POWER, SW_POWER_CAP.name)
        thermal = (COUNTERS[r.name].field_id for r in (SW_THERMAL_SLOWDOWN, HW_THERMAL_SLOWDOWN))
        if nvml.fields_gone(*thermal):
            # Before the per-reason fields, thermal throttling had one combined counter.
            out += _violation(
                nvml, "violation_thermal", N.NVML_PERF_POLICY_THERMAL, COMBINED_THERMAL_REASON
            )
        for policy in VIOLATION_POLICIES:
            if nvml.fields_gone(policy.counter_field):
                ns = _violation_ns(nvml, f"violation_{policy.name}", policy.policy)
                if ns is not None:
                    labels = VIOLATIONS[policy.name].labels
                    out.append(Reading("gpu_violation_seconds_total", ns * _NS, labels))
        return out


def _violation(nvml: Device, key: str, policy: int, reason: str) -> list[Reading]:
    ns = _violation_ns(nvml, key, policy)
    if ns is None:
        return []
    return [Reading("gpu_clock_event_seconds_total", ns * _NS, _reason(reason))]


def _violation_ns(nvml: Device, key: str, policy: int) -> int | None:
    """The policy's cumulative violation time (nvmlViolationTime_t.violationTime, ns)."""
    status = nvml.call(key, N.nvmlDeviceGetViolationStatus, nvml.handle, policy)
    return None if status is None else int(status.violationTime)


def _clocks(nvml: Device, family: str, key: str, function: Callable[..., Any]) -> list[Reading]:
    """One reading per clock domain (NVML reports MHz; the family is in hertz)."""
    out = []
    for label, clock_type in CLOCKS:
        mhz = nvml.call(f"{key}_{label}", function, nvml.handle, clock_type)
        if mhz is not None:
            out.append(Reading(family, mhz * 1e6, (("clock", label),)))
    return out

"""NVML facts that the exporter, the simulator, the classifier and the dashboards share.

Each is written here once. Standard library only: the dashboard generator imports this module,
and importing it must not load pynvml. The numbers are NVIDIA's (nvml.h, as mirrored by pynvml);
tests/test_nvml_facts.py checks them against the installed nvidia-ml-py and the fake NVML.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType


class Effect(StrEnum):
    """What a clock-event reason means for a busy GPU."""

    INFORMATIONAL = "informational"  # idle, application/display clocks, sync boost: no limit
    POWER_CAP = "power_cap"  # at the power limit: normal operation under load
    PROTECTIVE = "protective"  # the hardware or driver slows the GPU to protect it


@dataclass(frozen=True, slots=True)
class ClockEventReason:
    """One bit of `nvmlDeviceGetCurrentClocksEventReasons` (formerly "throttle reasons")."""

    name: str  # the `reason` label value of gpu_clock_event_*
    bit: int
    binding: str  # pynvml's constant is nvmlClocksThrottleReason<binding>
    effect: Effect
    counter_field: int | None = None  # NVML_FI_DEV_CLOCKS_EVENT_REASON_*: cumulative ns


GPU_IDLE = ClockEventReason("gpu_idle", 0x001, "GpuIdle", Effect.INFORMATIONAL)
APPLICATIONS_CLOCKS_SETTING = ClockEventReason(
    "applications_clocks_setting", 0x002, "ApplicationsClocksSetting", Effect.INFORMATIONAL
)
SW_POWER_CAP = ClockEventReason("sw_power_cap", 0x004, "SwPowerCap", Effect.POWER_CAP, 74)
HW_SLOWDOWN = ClockEventReason("hw_slowdown", 0x008, "HwSlowdown", Effect.PROTECTIVE)
SYNC_BOOST = ClockEventReason("sync_boost", 0x010, "SyncBoost", Effect.INFORMATIONAL, 76)
SW_THERMAL_SLOWDOWN = ClockEventReason(
    "sw_thermal_slowdown", 0x020, "SwThermalSlowdown", Effect.PROTECTIVE, 269
)
HW_THERMAL_SLOWDOWN = ClockEventReason(
    "hw_thermal_slowdown", 0x040, "HwThermalSlowdown", Effect.PROTECTIVE, 270
)
HW_POWER_BRAKE_SLOWDOWN = ClockEventReason(
    "hw_power_brake_slowdown", 0x080, "HwPowerBrakeSlowdown", Effect.PROTECTIVE, 271
)
DISPLAY_CLOCK_SETTING = ClockEventReason(
    "display_clock_setting", 0x100, "DisplayClockSetting", Effect.INFORMATIONAL
)
# Defined by pynvml only, absent from nvml.h and undocumented: the simulator can set them, the
# exporter masks them off rather than guess what they mean.
BOARD_LIMIT = ClockEventReason("board_limit", 0x200, "BoardLimit", Effect.PROTECTIVE)
RELIABILITY = ClockEventReason("reliability", 0x400, "Reliability", Effect.PROTECTIVE)

# The documented reasons, in bit order: what the exporter reports (C `...All = 0x1FF`).
CLOCK_EVENT_REASONS: tuple[ClockEventReason, ...] = (
    GPU_IDLE,
    APPLICATIONS_CLOCKS_SETTING,
    SW_POWER_CAP,
    HW_SLOWDOWN,
    SYNC_BOOST,
    SW_THERMAL_SLOWDOWN,
    HW_THERMAL_SLOWDOWN,
    HW_POWER_BRAKE_SLOWDOWN,
    DISPLAY_CLOCK_SETTING,
)
BINDING_ONLY_REASONS: tuple[ClockEventReason, ...] = (BOARD_LIMIT, RELIABILITY)
ALL_CLOCK_EVENT_REASONS: tuple[ClockEventReason, ...] = (
    *CLOCK_EVENT_REASONS,
    *BINDING_ONLY_REASONS,
)
# Newer drivers may set bits nobody documented yet; they are masked off with this.
KNOWN_REASON_BITS = sum(reason.bit for reason in CLOCK_EVENT_REASONS)

# The `reason` label of the pre-R535 fallback counter (nvmlDeviceGetViolationStatus THERMAL),
# which counts SW and HW thermal slowdown together.
COMBINED_THERMAL_REASON = "thermal"


@dataclass(frozen=True, slots=True)
class ViolationPolicy:
    """An NVML performance policy whose violation time is not a clock-event reason's counter
    (power, thermal and sync boost are: gpu_clock_event_seconds_total)."""

    name: str  # the `policy` label value of gpu_violation_seconds_total
    policy: int  # NVML_PERF_POLICY_*: nvmlDeviceGetViolationStatus's policy argument
    counter_field: int  # NVML_FI_DEV_PERF_POLICY_*: the same cumulative time (ns) as a field


VIOLATION_POLICIES: tuple[ViolationPolicy, ...] = (
    ViolationPolicy("board_limit", 3, 77),
    ViolationPolicy("low_utilization", 4, 78),
    ViolationPolicy("reliability", 5, 79),
)

# NVML_DEVICE_ARCH_* by the `architecture` label value (gpu_info), in release order.
ARCHITECTURES: Mapping[str, int] = MappingProxyType(
    {
        "kepler": 2,
        "maxwell": 3,
        "pascal": 4,
        "volta": 5,
        "turing": 6,
        "ampere": 7,
        "ada": 8,
        "hopper": 9,
        "blackwell": 10,
    }
)
ARCHITECTURE_NAMES: Mapping[int, str] = MappingProxyType(
    {code: name for name, code in ARCHITECTURES.items()}
)

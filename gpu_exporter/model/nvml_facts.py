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

# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvml.h: "GPU Recovery action - None/Reset/Reboot/Drain
# P2P/Drain and Reset"): the field whose value is an nvmlDeviceGpuRecoveryAction_t.
RECOVERY_ACTION_FIELD = 230

# The `action` label values of gpu_recovery_action: index = the nvmlDeviceGpuRecoveryAction_t
# value (NVML_GPU_RECOVERY_ACTION_*; nvml.h has 0-5, nvidia-ml-py 13.615 adds BUS_RESET = 6 and
# SYSTEM_REBOOT = 7), then "unknown" for any value past them (never read as "none").
RECOVERY_ACTIONS: tuple[str, ...] = (
    "none",
    "gpu_reset",
    "node_reboot",
    "drain_p2p",
    "drain_and_reset",
    "recover_imex_domain",
    "bus_reset",
    "system_reboot",
    "unknown",
)
UNKNOWN_RECOVERY_ACTION = RECOVERY_ACTIONS[-1]


def recovery_action(value: float) -> str:
    """The `action` label of a field-230 value: its enum name, else "unknown"."""
    known = len(RECOVERY_ACTIONS) - 1
    if value != value or value < 0 or value >= known or value != int(value):  # NaN, odd values
        return UNKNOWN_RECOVERY_ACTION
    return RECOVERY_ACTIONS[int(value)]


# nvmlGpuFabricState_t (NVML_GPU_FABRIC_STATE_*), by value: the GPU's registration with the
# NVLink fabric (nvmlDeviceGetGpuFabricInfoV); the `state` label values of gpu_fabric_state.
FABRIC_STATES: tuple[str, ...] = ("not_supported", "not_started", "in_progress", "completed")
FABRIC_STATE_COMPLETED = 3  # nvml.h: `status` "must be checked only if" the state is this

# NVML_GPU_FABRIC_HEALTH_SUMMARY_* (fabric info v3's healthSummary), by value; 0 is "not
# supported" (no series), the others are gpu_fabric_health_summary's `summary` label values.
FABRIC_HEALTH_SUMMARIES: tuple[str, ...] = (
    "not_supported",
    "healthy",
    "unhealthy",
    "limited_capacity",
)


@dataclass(frozen=True, slots=True)
class FabricHealthIssue:
    """One sub-field of the fabric info's healthMask (NVML_GPU_FABRIC_HEALTH_MASK_*): its value
    is `(mask >> shift) & width`; 0 means the driver does not report it."""

    name: str  # the `issue` label value of gpu_fabric_health_issue
    shift: int
    width: int
    binding: str  # pynvml's NVML_GPU_FABRIC_HEALTH_MASK_{SHIFT,WIDTH}_<binding>

    def value(self, mask: int) -> int:
        return (mask >> self.shift) & self.width

    def present(self, value: int) -> bool:
        """Whether a supported sub-field value reports the issue: TRUE (1) for the yes/no
        ones; for incorrect configuration, NONE is 1 and every value from 2 names a problem."""
        if self.name == "incorrect_configuration":
            return value >= FABRIC_INCORRECT_CONFIGURATION_NONE + 1
        return value == FABRIC_HEALTH_TRUE


FABRIC_HEALTH_TRUE = 1  # ..._TRUE of the yes/no sub-fields (FALSE is 2)
FABRIC_HEALTH_FALSE = 2
FABRIC_INCORRECT_CONFIGURATION_NONE = 1
FABRIC_HEALTH_ISSUES: tuple[FabricHealthIssue, ...] = (
    FabricHealthIssue("degraded_bandwidth", 0, 0x3, "DEGRADED_BW"),
    FabricHealthIssue("route_recovery", 2, 0x3, "ROUTE_RECOVERY"),
    FabricHealthIssue("route_unhealthy", 4, 0x3, "ROUTE_UNHEALTHY"),
    FabricHealthIssue("access_timeout_recovery", 6, 0x3, "ACCESS_TIMEOUT_RECOVERY"),
    FabricHealthIssue("incorrect_configuration", 8, 0xF, "INCORRECT_CONFIGURATION"),
)
# NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_*, by value (1 = none; 0 not supported).
FABRIC_INCORRECT_CONFIGURATIONS: tuple[str, ...] = (
    "not_supported",
    "none",
    "incorrect_sysguid",
    "incorrect_chassis_sn",
    "no_partition",
    "insufficient_nvlinks",
    "incompatible_gpu_fw",
    "invalid_location",
    "gpu_state_invalid",
)

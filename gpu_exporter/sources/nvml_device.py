"""Reading one GPU through pynvml: the choke point every per-device NVML call goes through.

`DeviceReader.call` is where NVML's error semantics become exporter behaviour:
NOT_SUPPORTED / FUNCTION_NOT_FOUND / NO_PERMISSION are learned once and never asked again (the
quantity is then absent, never 0), GPU_IS_LOST aborts the device's tick, anything else is
counted and skipped for this tick only. A device's tick runs on that device's own worker
thread; the source abandons a tick that misses its deadline (see `sources/nvml.py`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pynvml as N

from gpu_exporter.snapshot import Reading
from gpu_exporter.sources import gpm
from gpu_exporter.sources.base import ErrorLog
from gpu_exporter.sources.xid import XidCounts

SOURCE = "nvml"
NVLINK_AGGREGATE_SCOPE = 0xFFFFFFFF  # "returns aggregate value summed up across all links"

# Errors that will not change while the driver stays loaded: learn them, stop asking.
# A struct-version mismatch means this driver wants an older struct: same as a missing call.
PERMANENT = (
    N.NVMLError_NotSupported,
    N.NVMLError_FunctionNotFound,
    N.NVMLError_NoPermission,
    N.NVMLError_ArgumentVersionMismatch,
)
# Errors that mean the driver itself is gone or was replaced under us (nvml.md §10.1/§10.2):
# no device can answer until NVML is shut down and initialised again.
DRIVER_GONE = (
    N.NVMLError_LibRmVersionMismatch,
    N.NVMLError_Uninitialized,
    N.NVMLError_DriverNotLoaded,
)

ARCHITECTURES = {
    N.NVML_DEVICE_ARCH_KEPLER: "kepler",
    N.NVML_DEVICE_ARCH_MAXWELL: "maxwell",
    N.NVML_DEVICE_ARCH_PASCAL: "pascal",
    N.NVML_DEVICE_ARCH_VOLTA: "volta",
    N.NVML_DEVICE_ARCH_TURING: "turing",
    N.NVML_DEVICE_ARCH_AMPERE: "ampere",
    N.NVML_DEVICE_ARCH_ADA: "ada",
    N.NVML_DEVICE_ARCH_HOPPER: "hopper",
    getattr(N, "NVML_DEVICE_ARCH_BLACKWELL", 10): "blackwell",
}

# Documented clock-event reason bits (nvml.h `nvmlClocksEventReason*`, C `...All = 0x1FF`).
# Newer drivers may set bits we do not know; they are masked off rather than guessed at.
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
KNOWN_REASON_BITS = 0x1FF

CLOCKS = (
    ("sm", N.NVML_CLOCK_SM),
    ("memory", N.NVML_CLOCK_MEM),
    ("graphics", N.NVML_CLOCK_GRAPHICS),
)


class DeviceLostError(Exception):
    """NVML answered GPU_IS_LOST: the GPU fell off the bus or the driver lost it."""

    def __init__(self, call: str) -> None:
        super().__init__(f"GPU lost (NVML GPU_IS_LOST from {call})")
        self.call = call


class DeviceUnresponsiveError(Exception):
    """Every call of a tick failed: the GPU is not really answering."""


class DriverGoneError(DeviceLostError):
    """The driver was unloaded or upgraded under the process: re-initialise NVML."""

    def __init__(self, call: str, error: str) -> None:
        Exception.__init__(self, f"NVML driver unavailable ({error} from {call})")
        self.call = call


class TickAbandonedError(Exception):
    """This tick missed its deadline and a newer tick owns the device now."""


def _binding(name: str) -> Callable[..., Any] | None:
    """A pynvml wrapper that older nvidia-ml-py releases lack, or None."""
    return getattr(N, name, None)


def error_name(exc: BaseException) -> str:
    """`NVMLError_NotSupported` -> `NotSupported`; an unnamed code -> `code_N`."""
    name = type(exc).__name__
    if name == "NVMLError":
        return f"code_{getattr(exc, 'value', 'unknown')}"
    return name.removeprefix("NVMLError_")


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One entry of the per-tick `nvmlDeviceGetFieldValues` batch."""

    field_id: int
    family: str
    labels: tuple[tuple[str, str], ...] = ()
    scale: float = 1.0
    scope: int = 0
    needs_nvlink: bool = False

    @property
    def key(self) -> str:
        return f"field_{self.field_id}"


def _reason(name: str) -> tuple[tuple[str, str], ...]:
    return (("reason", name),)


_NS = 1e-9
FIELDS: tuple[FieldSpec, ...] = (
    # Cumulative throttle time per reason, ns (nvml.h NVML_FI_DEV_CLOCKS_EVENT_REASON_*).
    FieldSpec(74, "gpu_clock_event_seconds_total", _reason("sw_power_cap"), _NS),
    FieldSpec(76, "gpu_clock_event_seconds_total", _reason("sync_boost"), _NS),
    FieldSpec(269, "gpu_clock_event_seconds_total", _reason("sw_thermal_slowdown"), _NS),
    FieldSpec(270, "gpu_clock_event_seconds_total", _reason("hw_thermal_slowdown"), _NS),
    FieldSpec(271, "gpu_clock_event_seconds_total", _reason("hw_power_brake_slowdown"), _NS),
    FieldSpec(82, "gpu_temperature_celsius", (("sensor", "memory"),)),
    FieldSpec(83, "gpu_energy_joules_total", scale=1e-3),  # mJ since driver load
    FieldSpec(197, "gpu_pcie_bytes_total", (("direction", "tx"),)),
    FieldSpec(198, "gpu_pcie_bytes_total", (("direction", "rx"),)),
    FieldSpec(94, "gpu_pcie_replay_total"),
    FieldSpec(
        138,
        "gpu_nvlink_bytes_total",
        (("direction", "tx"),),
        1024.0,  # KiB
        NVLINK_AGGREGATE_SCOPE,
        needs_nvlink=True,
    ),
    FieldSpec(
        139,
        "gpu_nvlink_bytes_total",
        (("direction", "rx"),),
        1024.0,
        NVLINK_AGGREGATE_SCOPE,
        needs_nvlink=True,
    ),
    FieldSpec(3, "gpu_ecc_errors_total", (("error", "corrected"),)),  # ECC_SBE_VOL_TOTAL
    FieldSpec(4, "gpu_ecc_errors_total", (("error", "uncorrected"),)),  # ECC_DBE_VOL_TOTAL
    FieldSpec(142, "gpu_remapped_rows_total", (("severity", "correctable"),)),
    FieldSpec(143, "gpu_remapped_rows_total", (("severity", "uncorrectable"),)),
    FieldSpec(144, "gpu_row_remap_pending"),
    FieldSpec(145, "gpu_row_remap_failure"),
)

_VALUE_MEMBERS = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}
_FIELD_GONE = (N.NVML_ERROR_NOT_SUPPORTED, N.NVML_ERROR_INVALID_ARGUMENT)


@dataclass
class ReaderSettings:
    slow_refresh_seconds: float = 30.0
    hang_quarantine_seconds: float = 60.0
    gpm: bool = True
    pcie_throughput_fallback: bool = True


@dataclass
class DeviceReader:
    """Per-device state that outlives ticks: handle, identity, what is unsupported."""

    index: int
    handle: Any
    errors: ErrorLog
    xid_counts: XidCounts
    settings: ReaderSettings
    clock: Callable[[], float] = time.monotonic
    timings: dict[str, list[float]] | None = None
    uuid: str = ""
    info: dict[str, str] = field(default_factory=dict)
    unsupported: set[str] = field(default_factory=set)
    quarantine: dict[str, float] = field(default_factory=dict)
    current_call: str = ""
    active_tick: int = 0
    needs_identity: bool = True
    calls_succeeded: int = 0
    calls_failed: int = 0
    nvlink_links: int = 0
    _supported_reasons: int = KNOWN_REASON_BITS
    _static: list[Reading] = field(default_factory=list)
    _static_at: float = float("-inf")
    _gpm: gpm.GpmWindow | None = None
    _orphaned_gpm: list[tuple[gpm.GpmWindow, Any]] = field(default_factory=list)
    _local: threading.local = field(default_factory=threading.local)

    # -- the choke point -------------------------------------------------------------------

    def call(self, key: str, fn: Callable[..., Any] | None, *args: Any) -> Any:
        """Run one NVML call; None when unsupported, quarantined or failed this tick.

        `fn` is None when the installed nvidia-ml-py predates the call: same as an old driver.
        """
        if key in self.unsupported:
            return None
        if fn is None:
            self.unsupported.add(key)
            return None
        until = self.quarantine.get(key)
        if until is not None:
            if self.clock() < until:
                return None
            del self.quarantine[key]
        self._check_owner()
        self.current_call = key
        started = time.perf_counter()
        try:
            result = fn(*args)
            self.calls_succeeded += 1
            return result
        except N.NVMLError_GpuIsLost as exc:
            raise DeviceLostError(key) from exc
        except DRIVER_GONE as exc:
            raise DriverGoneError(key, error_name(exc)) from exc
        except PERMANENT as exc:
            self.unsupported.add(key)
            if not isinstance(exc, N.NVMLError_NotSupported):
                self.errors.add(SOURCE, key, error_name(exc))
            return None
        except N.NVMLError as exc:
            self.calls_failed += 1
            self.errors.add(SOURCE, key, error_name(exc))
            return None
        finally:
            self.current_call = ""  # between calls nothing is hung
            if self.timings is not None:
                self.timings.setdefault(key, []).append(time.perf_counter() - started)
            self._check_owner()

    def first(self, *attempts: tuple[Any, ...]) -> Any:
        """Try (key, fn, *args) alternatives in order, moving on only past unsupported ones.

        This is how newer calls fall back to older names on older drivers.
        """
        for key, fn, *args in attempts:
            result = self.call(key, fn, *args)
            if result is not None or key not in self.unsupported:
                return result
        return None

    def _check_owner(self) -> None:
        tick = getattr(self._local, "tick", None)
        if tick is not None and tick != self.active_tick:
            raise TickAbandonedError

    def abandon_tick(self, now: float, stuck_tick: Any) -> str:
        """Called by the source when a tick missed its deadline; returns the hung call.

        Only the call that was running at the deadline is quarantined ("" when the tick was
        merely slow between calls). The GPM window may still be in use by the stuck thread, so
        it is set aside and freed once that tick's future completes.
        """
        hung = self.current_call
        if hung:
            self.quarantine[hung] = now + self.settings.hang_quarantine_seconds
        self.active_tick += 1  # the stuck thread raises TickAbandonedError when it wakes
        if self._gpm is not None:
            self._orphaned_gpm.append((self._gpm, stuck_tick))
            self._gpm = None
        return hung

    def free_orphans(self) -> None:
        """Free GPM buffers whose abandoned tick has finished (sampler thread)."""
        keep = []
        for window, tick in self._orphaned_gpm:
            if tick.done():
                window.close()
            else:
                keep.append((window, tick))
        self._orphaned_gpm = keep

    def rebind(self, index: int, handle: Any) -> None:
        """After recovery: a new handle, identity to re-read, GPM from a fresh baseline."""
        self.close()
        self.index, self.handle = index, handle
        self.needs_identity = True
        self._static_at = float("-inf")

    # -- identity and slow-changing data -----------------------------------------------------

    def read_identity(self, driver_version: str) -> None:
        h = self.handle
        self.uuid = self.call("uuid", N.nvmlDeviceGetUUID, h) or self.uuid
        pci = self.call("pci_info", N.nvmlDeviceGetPciInfo, h)
        arch = self.call("architecture", N.nvmlDeviceGetArchitecture, h)
        cc = self.call("compute_capability", N.nvmlDeviceGetCudaComputeCapability, h)
        self.info = {
            "model": self.call("name", N.nvmlDeviceGetName, h) or "unknown",
            "pci_bus_id": normalise_bus_id(pci.busId) if pci is not None else "",
            "architecture": ARCHITECTURES.get(arch, "unknown") if arch is not None else "unknown",
            "compute_capability": f"{cc[0]}.{cc[1]}" if cc else "",
            "driver_version": driver_version,
        }
        self._static_at = float("-inf")
        self.needs_identity = False

    def _read_static(self) -> list[Reading]:
        h, out = self.handle, []
        for label, clock_type in CLOCKS:
            mhz = self.call(f"max_clock_{label}", N.nvmlDeviceGetMaxClockInfo, h, clock_type)
            if mhz is not None:
                out.append(Reading("gpu_clock_max_hertz", mhz * 1e6, (("clock", label),)))
        gen = self.call("pcie_max_generation", N.nvmlDeviceGetMaxPcieLinkGeneration, h)
        if gen is not None:
            out.append(Reading("gpu_pcie_link_generation", gen, (("state", "max"),)))
        width = self.call("pcie_max_width", N.nvmlDeviceGetMaxPcieLinkWidth, h)
        if width is not None:
            out.append(Reading("gpu_pcie_link_width", width, (("state", "max"),)))
        mask = self.first(
            ("supported_clock_events", _binding("nvmlDeviceGetSupportedClocksEventReasons"), h),
            ("supported_clock_throttle", N.nvmlDeviceGetSupportedClocksThrottleReasons, h),
        )
        self._supported_reasons = KNOWN_REASON_BITS if mask is None else mask & KNOWN_REASON_BITS
        ecc = self.call("ecc_mode", N.nvmlDeviceGetEccMode, h)
        if ecc is not None:
            out.append(Reading("gpu_ecc_enabled", float(ecc[0] == N.NVML_FEATURE_ENABLED)))
        out += self._read_retired_pages()
        out += self._read_nvlink_state()
        return out

    def _read_retired_pages(self) -> list[Reading]:
        out = []
        for cause, code in (
            ("single_bit_ecc", N.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
            ("double_bit_ecc", N.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
        ):
            pages = self.call(
                f"retired_pages_{cause}", N.nvmlDeviceGetRetiredPages, self.handle, code
            )
            if pages is not None:
                out.append(Reading("gpu_retired_pages_total", len(pages), (("cause", cause),)))
        pending = self.call(
            "retired_pages_pending", N.nvmlDeviceGetRetiredPagesPendingStatus, self.handle
        )
        if pending is not None:
            out.append(Reading("gpu_retired_pages_pending", float(bool(pending))))
        return out

    def _read_nvlink_state(self) -> list[Reading]:
        counts = self.call(
            "nvlink_link_count",
            N.nvmlDeviceGetFieldValues,
            self.handle,
            [N.NVML_FI_DEV_NVLINK_LINK_COUNT],
        )
        self.nvlink_links = 0
        if counts is not None and counts[0].nvmlReturn == N.NVML_SUCCESS:
            self.nvlink_links = int(field_value(counts[0]))
        if not self.nvlink_links:
            return []
        active = 0
        for link in range(self.nvlink_links):
            state = self.call("nvlink_state", N.nvmlDeviceGetNvLinkState, self.handle, link)
            if state is None:
                return []  # unsupported or failing: absent rather than a wrong count
            active += int(state == N.NVML_FEATURE_ENABLED)
        return [Reading("gpu_nvlink_links_active", active)]

    # -- one tick ------------------------------------------------------------------------------

    def read_tick(self, tick: int, now: float, driver_version: str = "") -> list[Reading]:
        """Everything that changes tick to tick. Runs on this device's worker thread."""
        self._local.tick = tick
        self.calls_succeeded = self.calls_failed = 0
        if self.needs_identity:
            self.read_identity(driver_version)
        if now - self._static_at >= self.settings.slow_refresh_seconds:
            static = self._read_static()
            self._check_owner()  # an abandoned tick must not overwrite the live tick's state
            self._static, self._static_at = static, now
        out = list(self._static)
        h = self.handle
        util = self.call("utilization", N.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            out.append(Reading("gpu_utilization_ratio", util.gpu / 100.0))
            out.append(Reading("gpu_memory_utilization_ratio", util.memory / 100.0))
        out += self._read_memory()
        power = self.call("power_usage", N.nvmlDeviceGetPowerUsage, h)
        if power is not None:
            out.append(Reading("gpu_power_watts", power / 1000.0))
        limit = self.call("power_limit", N.nvmlDeviceGetEnforcedPowerLimit, h)
        if limit is not None:
            out.append(Reading("gpu_power_limit_watts", limit / 1000.0))
        temp = self.first(
            ("temperature_v", _binding("nvmlDeviceGetTemperatureV"), h, N.NVML_TEMPERATURE_GPU),
            ("temperature", N.nvmlDeviceGetTemperature, h, N.NVML_TEMPERATURE_GPU),
        )
        if temp is not None:
            out.append(Reading("gpu_temperature_celsius", temp, (("sensor", "gpu"),)))
        for label, clock_type in CLOCKS:
            mhz = self.call(f"clock_{label}", N.nvmlDeviceGetClockInfo, h, clock_type)
            if mhz is not None:
                out.append(Reading("gpu_clock_hertz", mhz * 1e6, (("clock", label),)))
        out += self._read_clock_events()
        pstate = self.call("performance_state", N.nvmlDeviceGetPerformanceState, h)
        if pstate is not None and pstate != N.NVML_PSTATE_UNKNOWN:
            out.append(Reading("gpu_performance_state", pstate))
        gen = self.call("pcie_generation", N.nvmlDeviceGetCurrPcieLinkGeneration, h)
        if gen is not None:
            out.append(Reading("gpu_pcie_link_generation", gen, (("state", "current"),)))
        width = self.call("pcie_width", N.nvmlDeviceGetCurrPcieLinkWidth, h)
        if width is not None:
            out.append(Reading("gpu_pcie_link_width", width, (("state", "current"),)))
        out += self._read_fields()
        out += self._read_gpm()
        out += self.xid_readings()
        if self.calls_failed and not self.calls_succeeded:
            raise DeviceUnresponsiveError(f"every NVML call failed ({self.calls_failed})")
        return out

    def _read_memory(self) -> list[Reading]:
        mem = self.first(
            ("memory_info_v2", N.nvmlDeviceGetMemoryInfo, self.handle, N.nvmlMemory_v2),
            ("memory_info", N.nvmlDeviceGetMemoryInfo, self.handle),
        )
        if mem is None:
            return []
        out = [
            Reading("gpu_memory_total_bytes", mem.total),
            Reading("gpu_memory_used_bytes", mem.used),
            Reading("gpu_memory_free_bytes", mem.free),
        ]
        if hasattr(mem, "reserved"):  # v2 only; v1's `used` includes the reserved part
            out.append(Reading("gpu_memory_reserved_bytes", mem.reserved))
        return out

    def _read_clock_events(self) -> list[Reading]:
        bits = self.first(
            (
                "clock_event_reasons",
                _binding("nvmlDeviceGetCurrentClocksEventReasons"),
                self.handle,
            ),
            ("clock_throttle_reasons", N.nvmlDeviceGetCurrentClocksThrottleReasons, self.handle),
        )
        if bits is None:
            return []
        return [
            Reading("gpu_clock_event_active", float(bool(bits & bit)), _reason(name))
            for bit, name in CLOCK_EVENT_REASONS
            if self._supported_reasons & bit
        ]

    def _read_fields(self) -> list[Reading]:
        wanted = [
            spec
            for spec in FIELDS
            if spec.key not in self.unsupported and (self.nvlink_links or not spec.needs_nvlink)
        ]
        values = None
        if wanted and "field_values" not in self.unsupported:
            request = [(spec.field_id, spec.scope) for spec in wanted]
            values = self.call("field_values", N.nvmlDeviceGetFieldValues, self.handle, request)
        out: list[Reading] = []
        if values is not None:
            for spec, value in zip(wanted, values, strict=True):
                if value.nvmlReturn == N.NVML_SUCCESS:
                    out.append(Reading(spec.family, field_value(value) * spec.scale, spec.labels))
                elif value.nvmlReturn in _FIELD_GONE:
                    self.unsupported.add(spec.key)  # this driver or board lacks it
                else:
                    self.errors.add(SOURCE, spec.key, error_name(N.NVMLError(value.nvmlReturn)))
        out += self._field_fallbacks()
        return out

    def _field_fallbacks(self) -> list[Reading]:
        """Older calls for what the field batch could not give (older drivers, no fields)."""

        def gone(*field_ids: int) -> bool:
            return "field_values" in self.unsupported or all(
                f"field_{fid}" in self.unsupported for fid in field_ids
            )

        h, out = self.handle, []
        if gone(83):
            mj = self.call("total_energy", N.nvmlDeviceGetTotalEnergyConsumption, h)
            if mj is not None:
                out.append(Reading("gpu_energy_joules_total", mj / 1000.0))
        if gone(74):
            out += self._violation("violation_power", N.NVML_PERF_POLICY_POWER, "sw_power_cap")
        if gone(269, 270):
            # Before the per-reason fields, thermal throttling had one combined counter.
            out += self._violation("violation_thermal", N.NVML_PERF_POLICY_THERMAL, "thermal")
        if gone(94):
            replay = self.call("pcie_replay", N.nvmlDeviceGetPcieReplayCounter, h)
            if replay is not None:
                out.append(Reading("gpu_pcie_replay_total", replay))
        if gone(197, 198) and self.settings.pcie_throughput_fallback:
            for direction, counter in (
                ("tx", N.NVML_PCIE_UTIL_TX_BYTES),
                ("rx", N.NVML_PCIE_UTIL_RX_BYTES),
            ):
                kbps = self.call(
                    f"pcie_throughput_{direction}", N.nvmlDeviceGetPcieThroughput, h, counter
                )
                if kbps is not None:  # "KB/s" over a 20 ms window; read as KiB/s (unverified)
                    labels = (("direction", direction),)
                    out.append(
                        Reading("gpu_pcie_throughput_bytes_per_second", kbps * 1024.0, labels)
                    )
        if gone(142, 143, 144, 145):
            rows = self.call("remapped_rows", N.nvmlDeviceGetRemappedRows, h)
            if rows is not None:
                corr, unc, pending, failure = rows
                out += [
                    Reading("gpu_remapped_rows_total", corr, (("severity", "correctable"),)),
                    Reading("gpu_remapped_rows_total", unc, (("severity", "uncorrectable"),)),
                    Reading("gpu_row_remap_pending", float(bool(pending))),
                    Reading("gpu_row_remap_failure", float(bool(failure))),
                ]
        return out

    def _violation(self, key: str, policy: int, reason: str) -> list[Reading]:
        status = self.call(key, N.nvmlDeviceGetViolationStatus, self.handle, policy)
        if status is None:
            return []
        return [
            Reading("gpu_clock_event_seconds_total", status.violationTime * _NS, _reason(reason))
        ]

    def _read_gpm(self) -> list[Reading]:
        if not self.settings.gpm or "gpm" in self.unsupported:
            return []
        if self._gpm is None:
            supported = self.call("gpm_support", gpm.is_supported, self.handle)
            if supported is False:
                self.unsupported.add("gpm")  # pre-Hopper: no activity metrics, never zeros
                return []
            if supported:
                self._gpm = self.call("gpm_sample", gpm.GpmWindow, self.handle, self.clock)
            return []  # the first window needs a second sample
        result = self.call("gpm_metrics", self._gpm.read)
        if result is None:
            return []
        for metric_id, code in result.failures.items():
            if code != N.NVML_ERROR_NOT_SUPPORTED:
                name = "NaN" if code < 0 else error_name(N.NVMLError(code))
                self.errors.add("gpm", f"metric_{metric_id}", name)
        return [
            Reading(metric.family, result.values[metric.metric_id], metric.labels)
            for metric in gpm.METRICS
            if metric.metric_id in result.values
        ]

    def xid_readings(self) -> Iterable[Reading]:
        """XID counts need no NVML call, so they are reported even while the GPU is down."""
        for xid, (count, last) in sorted(self.xid_counts.for_gpu(self.uuid).items()):
            labels = (("xid", str(xid)),)
            yield Reading("gpu_xid_errors_total", count, labels)
            yield Reading("gpu_xid_last_timestamp_seconds", last, labels)

    def close(self) -> None:
        if self._gpm is not None:
            self._gpm.close()
            self._gpm = None
        self.free_orphans()


def field_value(value: Any) -> float:
    """The union member `valueType` says is valid (c_nvmlFieldValue_t)."""
    member = _VALUE_MEMBERS.get(value.valueType, "ullVal")
    return float(getattr(value.value, member))


def normalise_bus_id(bus_id: str) -> str:
    """NVML's `00000000:18:00.0` -> sysfs/kubelet form `0000:18:00.0` (lower case)."""
    domain, _, rest = bus_id.partition(":")
    return f"{domain[-4:]}:{rest}".lower()

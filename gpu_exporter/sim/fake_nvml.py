"""A fake libnvidia-ml (the C library) for pynvml, driven by a scenario.

`FakeNvmlLib` is assigned to `pynvml.nvmlLib`; pynvml then looks up its C symbols by name and
calls them with the same ctypes arguments it would pass to the real driver. Every fake symbol
is a plain function stored on the instance (pynvml sets `fn.restype` on some of them, which a
bound method would reject) and returns an `int` NVML return code (nvmlErrorString alone returns
its `const char *` as bytes); out-parameters are written through the ctypes objects pynvml
passes. So pynvml's own wrappers, struct versions, two-call protocols and error mapping all run
unchanged. A symbol the scenario's driver lacks is simply not set, and pynvml raises
`NVMLError_FunctionNotFound` as with an old driver.

Concurrency: NVML is thread-safe and ctypes releases the GIL, so callers run in parallel. The
fake holds its locks only for bookkeeping, never while sleeping (latency, hangs, event waits).
"""

from __future__ import annotations

import ctypes
import itertools
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeVar

import pynvml

from gpu_exporter.model.activity import ACTIVITY
from gpu_exporter.model.nvml_facts import RECOVERY_ACTION_FIELD
from gpu_exporter.sim import activity as sim_activity
from gpu_exporter.sim.mig import MigInstanceSpec, mig_device_name
from gpu_exporter.sim.processes import ProcessSpec, by_gpu
from gpu_exporter.sim.spec import COMPUTE_MODES, DeviceSpec, Scenario, normalize_bus_id
from gpu_exporter.sim.values import ValueSpec

__all__ = [
    "FABRIC_INFO_VERSIONS",
    "PROCESSES_UTILIZATION_INFO_V1",
    "THROTTLE_FIELDS",
    "FakeNvmlLib",
    "implemented_functions",
]

# NVML return codes used here (nvml.h / pynvml).
SUCCESS = pynvml.NVML_SUCCESS
UNINITIALIZED = pynvml.NVML_ERROR_UNINITIALIZED
INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION
NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
INSUFFICIENT_SIZE = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
ARGUMENT_VERSION_MISMATCH = pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH

_ERROR_STRINGS: dict[int, bytes] = {
    getattr(pynvml, name): name.removeprefix("NVML_ERROR_").replace("_", " ").title().encode()
    for name in dir(pynvml)
    if name.startswith("NVML_ERROR_")
} | {SUCCESS: b"Success"}

_STEP_S = 0.05  # integration sub-step (scenario seconds)
_ALL_ONES_32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF
_KIB = 1024
_MIB = 1024 * 1024
_MIG_RESERVED = 64 * 1024 * 1024  # memory a GPU instance reserves for the driver (assumed)
_RAW_OVERHEAD = 1.0625  # NVLink raw bytes = data bytes + protocol overhead (assumed ratio)
_CODEC_SAMPLING_US = 1_000_000  # encoder/decoder utilization's sampling period (assumed)
# Per-process utilization: the driver's sample period and how many periods its buffer keeps.
# nvml.h documents neither ("one utilization sample structure is returned per process running,
# that had some non-zero utilization during the last sample period"; lastSeenTimeStamp 0 reads
# "all the samples maintained by the driver's internal sample buffer"): both are assumed.
_PROCESS_SAMPLE_US = 1_000_000
_PROCESS_SAMPLES_KEPT = 20
# nvmlDeviceGetSamples' sampling types the fake keeps: the device quantity each samples, and
# the per-process engine (its index in the per-process percents) that keeps the device busy.
_SAMPLED = {
    pynvml.NVML_GPU_UTILIZATION_SAMPLES: ("utilization", 0),  # SM
    pynvml.NVML_ENC_UTILIZATION_SAMPLES: ("encoder_utilization", 2),
    pynvml.NVML_DEC_UTILIZATION_SAMPLES: ("decoder_utilization", 3),
}
# nvml.h: nvmlGpuFabricInfo_v2 and _v3 = NVML_STRUCT_VERSION(GpuFabricInfo, n), the struct's size
# | n << 24 (36 and 40 bytes), by version word: the fake's own copy (tests check pynvml's).
FABRIC_INFO_VERSIONS = {0x02000024: 2, 0x03000028: 3}
# nvml.h: nvmlProcessesUtilizationInfo_v1 = NVML_STRUCT_VERSION(ProcessesUtilizationInfo, 1),
# the struct's size (24) | 1 << 24; the fake's own copy (tests check pynvml's).
PROCESSES_UTILIZATION_INFO_V1 = 0x01000018
# What each running-process list shows: nvml.h's compute list has the compute contexts, its MPS
# list the processes "utilizing MPS" (the clients). That the MPS server is on the compute list,
# as nvidia-smi shows it beside its clients, is assumed.
_COMPUTE = frozenset({"compute", "mps_server"})
_GRAPHICS = frozenset({"graphics"})
_MPS = frozenset({"mps"})

# Handle tokens stored in the opaque NVML pointers; distinct ranges catch mixed-up handles.
_DEVICE_TOKEN_BASE = 0x6E760000
_MIG_TOKEN_BASE = 0x6D000000  # + parent index * _MIG_TOKENS_PER_PARENT + MIG device slot
_MIG_TOKENS_PER_PARENT = 0x100
_MIG_TOKEN_RANGE = range(0, 0x100 * _MIG_TOKENS_PER_PARENT)
_TOKENS = itertools.count(0x6E770000)

# Clock-event bits, from the vendor's binding (not the exporter's copy, which the fake tests):
# nvml.h's 0x1FF plus pynvml's 0x200 board limit and 0x400 reliability.
_ALL_REASONS = pynvml.nvmlClocksThrottleReasonAll
# "Any limiter": every reason that holds clocks down, not idle/app-clock/display settings.
_ANY_THROTTLE = _ALL_REASONS & ~(
    pynvml.nvmlClocksThrottleReasonGpuIdle
    | pynvml.nvmlClocksThrottleReasonApplicationsClocksSetting
    | pynvml.nvmlClocksThrottleReasonDisplayClockSetting
)
# NVML_PERF_POLICY_* -> reason bits whose time it counts (TOTAL_* are unverified guesses).
_POLICY_MASKS = {
    pynvml.NVML_PERF_POLICY_POWER: pynvml.nvmlClocksThrottleReasonSwPowerCap,
    pynvml.NVML_PERF_POLICY_THERMAL: (
        pynvml.nvmlClocksThrottleReasonSwThermalSlowdown
        | pynvml.nvmlClocksThrottleReasonHwThermalSlowdown
    ),
    pynvml.NVML_PERF_POLICY_SYNC_BOOST: pynvml.nvmlClocksThrottleReasonSyncBoost,
    pynvml.NVML_PERF_POLICY_BOARD_LIMIT: pynvml.nvmlClocksThrottleReasonBoardLimit,
    pynvml.NVML_PERF_POLICY_LOW_UTILIZATION: pynvml.nvmlClocksThrottleReasonGpuIdle,
    pynvml.NVML_PERF_POLICY_RELIABILITY: pynvml.nvmlClocksThrottleReasonReliability,
    pynvml.NVML_PERF_POLICY_TOTAL_APP_CLOCKS: _ANY_THROTTLE,
    pynvml.NVML_PERF_POLICY_TOTAL_BASE_CLOCKS: _ANY_THROTTLE,
}
# Cumulative throttle-time fields -> the reason bits they count. The ids are the fake's own
# copy of nvml.h's NVML_FI_DEV_* numbers (older pynvml lacks some names); tests check them.
THROTTLE_FIELDS: dict[int, int] = {
    74: pynvml.nvmlClocksThrottleReasonSwPowerCap,  # PERF_POLICY_POWER = ..._SW_POWER_CAP
    76: pynvml.nvmlClocksThrottleReasonSyncBoost,  # PERF_POLICY_SYNC_BOOST = ..._SYNC_BOOST
    77: pynvml.nvmlClocksThrottleReasonBoardLimit,  # PERF_POLICY_BOARD_LIMIT
    78: pynvml.nvmlClocksThrottleReasonGpuIdle,  # PERF_POLICY_LOW_UTILIZATION
    79: pynvml.nvmlClocksThrottleReasonReliability,  # PERF_POLICY_RELIABILITY
    81: _ANY_THROTTLE,  # PERF_POLICY_TOTAL_BASE_CLOCKS
    269: pynvml.nvmlClocksThrottleReasonSwThermalSlowdown,  # CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN
    270: pynvml.nvmlClocksThrottleReasonHwThermalSlowdown,  # CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN
    271: pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown,  # ..._HW_POWER_BRAKE_SLOWDOWN
}
_MASKS = tuple(sorted({*_POLICY_MASKS.values(), *THROTTLE_FIELDS.values()}))

# Quantities whose integrals NVML exposes as counters (energy, bytes, GPM activity).
_ACTIVITY = (
    "graphics_active", "sm_active", "sm_occupancy", "tensor_active", "tensor_imma_active",
    "tensor_dfma_active", "dram_active", "fp64_active", "fp32_active", "fp16_active", "int_active",
)  # fmt: skip
_RATES = (
    "power_watts",
    "pcie_tx_bytes_per_second",
    "pcie_rx_bytes_per_second",
    "nvlink_tx_bytes_per_second",
    "nvlink_rx_bytes_per_second",
    *_ACTIVITY,
)


def _mask_key(mask: int) -> str:
    return f"reasons&{mask:#x}"


# ---------------------------------------------------------------------------------------------
# ctypes plumbing


def _target(arg: Any) -> Any:
    """The object an out-parameter refers to: byref(x) -> x, pointer(x) -> x, array -> array."""
    if hasattr(arg, "_obj"):
        return arg._obj
    if isinstance(arg, ctypes._Pointer):
        return arg.contents
    return arg


def _int(arg: Any) -> int:
    """An integer argument as C would see it; anything else fails like a ctypes conversion."""
    if isinstance(arg, int) and not isinstance(arg, bool):
        return arg
    if isinstance(arg, ctypes._SimpleCData) and isinstance(arg.value, int):
        return arg.value
    raise ctypes.ArgumentError(f"expected an integer argument, got {arg!r}")


def _token(pointer: Any) -> int | None:
    """The integer stored in an opaque NVML handle (device, event set, GPM sample)."""
    if pointer is None:
        return None
    if isinstance(pointer, int):
        return pointer
    return ctypes.cast(pointer, ctypes.c_void_p).value


_V = TypeVar("_V")


def _lookup(table: Mapping[int, _V], token: int | None) -> _V | None:
    """The object a handle's token names; None for a NULL handle or one never handed out."""
    return None if token is None else table.get(token)


def _release(table: dict[int, _V], token: int | None) -> _V | None:
    """Remove and return the object a handle's token names (None as for `_lookup`)."""
    return None if token is None else table.pop(token, None)


def _slots(arg: Any) -> Any:
    """An out-parameter array of structs, indexable: an array, a pointer, or byref(array)."""
    return arg._obj if hasattr(arg, "_obj") else arg


def _c_string(arg: Any) -> str:
    """A `const char *` argument as text; NULL (None, or a c_char_p holding None) reads as ""."""
    raw = arg.value if isinstance(arg, ctypes.c_char_p) else arg
    return (raw or b"").decode()


def _store_token(out: Any, token: int) -> None:
    ctypes.c_void_p.from_address(ctypes.addressof(_target(out))).value = token


def _set(out: Any, value: int | float) -> None:
    _target(out).value = value


def _write_str(buf: Any, size: Any, text: str) -> int:
    data = text.encode() + b"\0"
    if len(data) > _int(size):
        return INSUFFICIENT_SIZE
    ctypes.memmove(buf, data, len(data))
    return SUCCESS


# ---------------------------------------------------------------------------------------------
# Function registry: C symbol name -> implementation


# What a fake symbol returns: an NVML return code, except nvmlErrorString's `const char *`
# (pynvml sets its restype to c_char_p; a Python function hands the bytes back directly).
_Result: TypeAlias = int | bytes
_Impl = TypeVar("_Impl", bound=Callable[..., _Result])


@dataclass(frozen=True)
class _Fn:
    impl: Callable[..., _Result]
    device: bool  # first argument is a device handle, resolved and fault-checked first
    feature: str | None  # NOT_SUPPORTED unless the device supports it
    needs_init: bool


_FUNCTIONS: dict[str, _Fn] = {}
# C symbol -> its implementation for a MIG device handle; a device function without one answers
# NOT_SUPPORTED there (nvml.h: utilization, power, clocks, ... are the parent's, not per MIG).
_MIG_IMPLS: dict[str, Callable[..., _Result]] = {}


def _nvml(
    *names: str, device: bool = True, feature: str | None = None, needs_init: bool = True
) -> Callable[[_Impl], _Impl]:
    def register(impl: _Impl) -> _Impl:
        for name in names:
            _FUNCTIONS[name] = _Fn(impl, device, feature, needs_init)
        return impl

    return register


def _on_mig(*names: str) -> Callable[[_Impl], _Impl]:
    """What these (already registered) device functions do given a MIG device handle."""

    def register(impl: _Impl) -> _Impl:
        for name in names:
            _MIG_IMPLS[name] = impl
        return impl

    return register


def implemented_functions() -> frozenset[str]:
    """C symbols the fake provides (before a scenario's `missing_functions`)."""
    return frozenset(_FUNCTIONS)


# ---------------------------------------------------------------------------------------------
# Per-device state


class _Integrals:
    """Integrals of time-varying rates from scenario time 0 (energy, bytes, GPM activity)."""

    def __init__(
        self,
        values: Mapping[str, ValueSpec],
        rates: tuple[str, ...],
        reasons: Callable[[float], int] | None = None,
    ) -> None:
        self._values = values
        self._rates = rates
        self._reasons = reasons  # clock-event reasons at t, integrated per mask; None: none
        self._lock = threading.Lock()
        self._t = 0.0
        masks = map(_mask_key, _MASKS) if reasons is not None else ()
        self._totals: dict[str, float] = dict.fromkeys((*rates, *masks), 0.0)

    def at(self, t: float) -> dict[str, float]:
        """Integrals from scenario time 0 to t (never backwards: a late caller gets the latest)."""
        with self._lock:
            if t > self._t:
                self._advance(self._t, t)
                self._t = t
            return dict(self._totals)

    def _advance(self, t0: float, t1: float) -> None:
        steps = max(1, math.ceil((t1 - t0) / _STEP_S))
        h = (t1 - t0) / steps
        mids = [t0 + (i + 0.5) * h for i in range(steps)]
        for name in self._rates:
            spec = self._values[name]
            if spec.is_constant:
                self._totals[name] += spec.constant * (t1 - t0)
            else:
                self._totals[name] += h * sum(spec.value_at(m) for m in mids)
        if self._reasons is not None:
            reasons = [self._reasons(m) for m in mids]
            for mask in _MASKS:
                self._totals[_mask_key(mask)] += h * sum(1 for r in reasons if r & mask)


# What a GPU reset (a `gpu_reset` fault) does to a quantity, read at t after a reset at r:
# volatile ECC counts restart from 0 (their aggregate twins are other quantities, untouched);
# a pending remap or retirement is applied and the recovery action done, so these read 0
# ("none") while the scenario's value is still the one it had at r, and as written once it
# changes (a new pending remap, another action).
_RESTARTED = frozenset({"ecc_corrected_total", "ecc_uncorrected_total"})
_CLEARED = frozenset({"row_remap_pending", "retired_pages_pending", "recovery_action"})


class _Device:
    """A device: its spec, its handle token, its resets and the integrals of its rates over
    time."""

    def __init__(self, spec: DeviceSpec, resets: tuple[float, ...] = ()) -> None:
        self.spec = spec
        self.index = spec.index
        self.token = _DEVICE_TOKEN_BASE + spec.index
        self.resets = tuple(sorted(resets))  # scenario times of its `gpu_reset` faults
        self._integrals = _Integrals(spec.values, _RATES, self.reasons)
        # GPU instance (by position in the scenario) -> its activity integrals
        self.instance_integrals = {
            inst.position: _Integrals(inst.values, _ACTIVITY)
            for inst in (spec.mig.instances if spec.mig else ())
        }

    def value(self, quantity: str, t: float) -> float:
        spec = self.spec.values[quantity]
        value = spec.value_at(t)
        if not self.resets or (quantity not in _RESTARTED and quantity not in _CLEARED):
            return value
        reset = self.last_reset(t)
        if reset is None:
            return value
        at_reset = spec.value_at(reset)
        if quantity in _RESTARTED:
            return max(0.0, value - at_reset)
        return 0.0 if value == at_reset else value

    def last_reset(self, t: float) -> float | None:
        """The latest `gpu_reset` at or before `t`."""
        return next((r for r in reversed(self.resets) if r <= t), None)

    def reasons(self, t: float) -> int:
        return int(self.value("clock_event_reasons", t)) & _ALL_REASONS

    def totals(self, t: float) -> dict[str, float]:
        return self._integrals.at(t)

    def mig_changes(self) -> tuple[float, ...]:
        """When its MIG layout changes (a configuration-change event each)."""
        return self.spec.mig.changes() if self.spec.mig and self.spec.mig.enabled else ()

    def mig_live(self, t: float) -> tuple[MigInstanceSpec, ...]:
        return self.spec.mig.live(t) if self.spec.mig is not None else ()

    def gpu_instance(self, gpu_instance: int, t: float) -> MigInstanceSpec | None:
        return next((i for i in self.mig_live(t) if i.gpu_instance == gpu_instance), None)

    def mig_device(self, slot: int, t: float) -> _MigDevice | None:
        """The MIG device in this slot now, if any."""
        for inst in self.mig_live(t):
            if slot in inst.slots:
                return _MigDevice(self, inst, inst.slots.index(slot))
        return None


@dataclass(frozen=True)
class _MigDevice:
    """A MIG device (one compute instance of one GPU instance) as a handle resolves it now."""

    parent: _Device
    instance: MigInstanceSpec
    compute_instance: int

    @property
    def token(self) -> int:
        return _mig_token(self.parent.index, self.instance.slots[self.compute_instance])

    @property
    def uuid(self) -> str:
        return self.instance.mig_uuids[self.compute_instance]


def _mig_token(parent: int, slot: int) -> int:
    # A MIG device handle names a slot of a parent: nvml.h warns that after a reconfiguration
    # "handles may be reused and their properties can change", which this makes certain.
    return _MIG_TOKEN_BASE + parent * _MIG_TOKENS_PER_PARENT + slot


@dataclass
class _EventSet:
    registered: dict[int, tuple[int, float]] = field(default_factory=dict)  # dev -> (mask, since)
    delivered: set[int] = field(default_factory=set)  # fault indexes
    mig_delivered: set[tuple[int, float]] = field(default_factory=set)  # (device, change time)


@dataclass
class _GpmSample:
    device: int | None = None
    gpu_instance: int | None = None  # a GPU instance's sample (nvmlGpmMigSampleGet)
    t: float = 0.0
    totals: dict[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# The library


class FakeNvmlLib:
    """Fake `libnvidia-ml.so.1`: attributes are the NVML C functions (see module docstring).

    `clock()` returns scenario seconds; `call_counts` counts calls per C symbol.
    """

    def __init__(self, scenario: Scenario, clock: Callable[[], float] | None = None) -> None:
        self.scenario = scenario
        self.clock: Callable[[], float] = clock or _monotonic_since(time.monotonic())
        self.call_counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        # Notified (under _lock) when a blocked nvmlEventSetWait may have to answer otherwise:
        # a shutdown, a freed set, a new registration.
        self._events_changed = threading.Condition(self._lock)
        self._refcount = 0
        self._generation = 0
        self._recovered: frozenset[int] = frozenset()  # gpu_lost faults cleared by a re-init
        resets: dict[int, list[float]] = {}
        for fault in scenario.faults:
            if fault.kind == "gpu_reset":
                resets.setdefault(fault.device, []).append(fault.at)
        self._devices = [
            _Device(spec, tuple(resets.get(spec.index, ()))) for spec in scenario.devices
        ]
        self._by_token = {dev.token: dev for dev in self._devices}
        self._faults = list(enumerate(scenario.faults))
        self._event_sets: dict[int, _EventSet] = {}
        self._samples: dict[int, _GpmSample] = {}
        self._processes = by_gpu(scenario.processes)
        self._epoch_us = round(time.time() * 1e6)  # process samples' timestamps: this + t
        # Called with the scenario time by each per-process call, before it answers: the fake
        # /proc syncs there, so what the caller maps next is what the call just listed.
        self.process_listeners: list[Callable[[float], None]] = []
        # Where the simulated node's /proc and CRI runtime socket are (sim.install sets them
        # for a scenario with processes; None otherwise).
        self.proc_root: str | None = None
        self.cri_socket_path: str | None = None
        for name, fn in _FUNCTIONS.items():
            if name not in scenario.driver.missing_functions:
                setattr(self, name, self._entry(name, fn))

    @property
    def generation(self) -> int:
        """How many times NVML went from uninitialised to initialised."""
        return self._generation

    def set_processes(self, processes: Iterable[ProcessSpec]) -> None:
        """Replace what the per-process calls list and sample (the scenario's `processes:` at
        start), for processes not known when the scenario was written: bench/gpu_validation.py
        makes its workload child (a real PID) a process on GPU 0 with each workload's use.
        NVML's view only: the simulated node's /proc and CRI runtime keep the scenario's."""
        self._processes = by_gpu(tuple(processes))

    # -- dispatch ---------------------------------------------------------------------------

    def _entry(self, name: str, fn: _Fn) -> Callable[..., _Result]:
        delay = self.scenario.latency.seconds(name)

        def entry(*args: Any) -> _Result:
            return self._dispatch(name, fn, delay, args)

        entry.__name__ = name
        return entry

    def _dispatch(self, name: str, fn: _Fn, delay: float, args: tuple[Any, ...]) -> _Result:
        with self._lock:
            self.call_counts[name] += 1
        if delay:
            time.sleep(delay)
        if fn.needs_init and self._refcount == 0:
            return UNINITIALIZED
        if not fn.device:
            return fn.impl(self, *args)
        token = _token(args[0])
        if token is not None and token - _MIG_TOKEN_BASE in _MIG_TOKEN_RANGE:
            return self._dispatch_mig(name, token - _MIG_TOKEN_BASE, args)
        dev = self._device(args[0])
        if dev is None:
            return INVALID_ARGUMENT
        rc = self._gate(name, dev)
        if rc != SUCCESS:
            return rc
        if fn.feature and not dev.spec.supports(fn.feature):
            return NOT_SUPPORTED
        return fn.impl(self, dev, self.clock(), *args[1:])

    def _dispatch_mig(self, name: str, offset: int, args: tuple[Any, ...]) -> _Result:
        index, slot = divmod(offset, _MIG_TOKENS_PER_PARENT)
        if index >= len(self._devices):
            return INVALID_ARGUMENT
        parent = self._devices[index]
        rc = self._gate(name, parent)  # the parent's faults hold for its MIG devices
        if rc != SUCCESS:
            return rc
        t = self.clock()
        mig = parent.mig_device(slot, t)
        if mig is None:
            # Destroyed by a reconfiguration (or MIG turned off), nothing in its slot since.
            return INVALID_ARGUMENT
        impl = _MIG_IMPLS.get(name)
        if impl is None:
            return NOT_SUPPORTED
        return impl(self, mig, t, *args[1:])

    def _device(self, handle: Any) -> _Device | None:
        return _lookup(self._by_token, _token(handle))

    def _gate(self, name: str, dev: _Device) -> int:
        """Device faults for a call of `name`: lost, hang (sleeps, no lock), no permission."""
        t = self.clock()
        if self._lost(dev.index, t):
            return GPU_IS_LOST
        for _, fault in self._faults:
            if fault.device != dev.index or fault.function != name or not fault.active(t):
                continue
            if fault.kind == "hang":
                time.sleep(fault.duration)
            elif fault.kind == "no_permission":
                return NO_PERMISSION
        return SUCCESS

    def _lost(self, index: int, t: float) -> bool:
        return any(
            f.kind == "gpu_lost" and f.device == index and t >= f.at and i not in self._recovered
            for i, f in self._faults
        )

    def _fault_active(self, kind: str, dev: _Device, t: float, **match: Any) -> bool:
        return any(
            f.kind == kind
            and f.device == dev.index
            and f.active(t)
            and all(getattr(f, k) == v for k, v in match.items())
            for _, f in self._faults
        )

    # -- lifecycle and system ---------------------------------------------------------------

    @_nvml("nvmlInitWithFlags", "nvmlInit_v2", device=False, needs_init=False)
    def _init(self, *flags: Any) -> int:
        for flag in flags:
            _int(flag)
        t = self.clock()
        with self._lock:
            if self._refcount == 0:
                # A fresh init is a driver reload: lost GPUs past `until` come back.
                self._generation += 1
                self._recovered = self._recovered | {
                    i
                    for i, f in self._faults
                    if f.kind == "gpu_lost" and f.until is not None and t >= f.until
                }
            self._refcount += 1
        return SUCCESS

    @_nvml("nvmlShutdown", device=False, needs_init=False)
    def _shutdown(self) -> int:
        with self._lock:
            if self._refcount == 0:
                return UNINITIALIZED
            self._refcount -= 1
            self._events_changed.notify_all()
        return SUCCESS

    @_nvml("nvmlErrorString", device=False, needs_init=False)
    def _error_string(self, result: Any) -> bytes:
        return _ERROR_STRINGS.get(_int(result), b"Unknown Error")

    @_nvml("nvmlSystemGetDriverVersion", device=False)
    def _driver_version(self, buf: Any, size: Any) -> int:
        return _write_str(buf, size, self.scenario.driver.version)

    @_nvml("nvmlSystemGetNVMLVersion", device=False)
    def _nvml_version(self, buf: Any, size: Any) -> int:
        return _write_str(buf, size, self.scenario.driver.nvml_version)

    @_nvml("nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2", device=False)
    def _cuda_version(self, out: Any) -> int:
        _set(out, self.scenario.driver.cuda_version)
        return SUCCESS

    @_nvml("nvmlDeviceGetCount_v2", device=False)
    def _count(self, out: Any) -> int:
        _set(out, len(self._devices))
        return SUCCESS

    # -- handles ----------------------------------------------------------------------------

    def _hand_out(self, name: str, dev: _Device | None, out: Any, missing: int) -> int:
        if dev is None:
            return missing
        rc = self._gate(name, dev)
        if rc == SUCCESS:
            _store_token(out, dev.token)
        return rc

    @_nvml("nvmlDeviceGetHandleByIndex_v2", device=False)
    def _handle_by_index(self, index: Any, out: Any) -> int:
        i = _int(index)
        dev = self._devices[i] if 0 <= i < len(self._devices) else None
        return self._hand_out("nvmlDeviceGetHandleByIndex_v2", dev, out, INVALID_ARGUMENT)

    @_nvml("nvmlDeviceGetHandleByUUID", device=False)
    def _handle_by_uuid(self, uuid: Any, out: Any) -> int:
        text = _c_string(uuid)
        dev = next((d for d in self._devices if d.spec.uuid == text), None)
        return self._hand_out("nvmlDeviceGetHandleByUUID", dev, out, NOT_FOUND)

    @_nvml("nvmlDeviceGetHandleByPciBusId_v2", device=False)
    def _handle_by_bus_id(self, bus_id: Any, out: Any) -> int:
        wanted = normalize_bus_id(_c_string(bus_id))
        if wanted is None:
            return INVALID_ARGUMENT
        dev = next((d for d in self._devices if d.spec.pci_bus_id == wanted), None)
        return self._hand_out("nvmlDeviceGetHandleByPciBusId_v2", dev, out, NOT_FOUND)

    # -- identity ---------------------------------------------------------------------------

    @_nvml("nvmlDeviceGetUUID")
    def _uuid(self, dev: _Device, t: float, buf: Any, size: Any) -> int:
        return _write_str(buf, size, dev.spec.uuid)

    @_nvml("nvmlDeviceGetName")
    def _name(self, dev: _Device, t: float, buf: Any, size: Any) -> int:
        return _write_str(buf, size, dev.spec.model)

    @_nvml("nvmlDeviceGetSerial")
    def _serial(self, dev: _Device, t: float, buf: Any, size: Any) -> int:
        return _write_str(buf, size, dev.spec.serial)

    @_nvml("nvmlDeviceGetVbiosVersion")
    def _vbios(self, dev: _Device, t: float, buf: Any, size: Any) -> int:
        return _write_str(buf, size, dev.spec.vbios_version)

    @_nvml("nvmlDeviceGetIndex", "nvmlDeviceGetMinorNumber")
    def _index(self, dev: _Device, t: float, out: Any) -> int:
        _set(out, dev.index)
        return SUCCESS

    @_nvml("nvmlDeviceGetPciInfo_v3")
    def _pci_info(self, dev: _Device, t: float, out: Any) -> int:
        info = _target(out)
        bus_id = dev.spec.pci_bus_id  # "DDDDDDDD:BB:DD.F"
        domain, bus, rest = bus_id.split(":")
        info.busId = bus_id.encode()
        info.busIdLegacy = bus_id[4:].encode()
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest[:2], 16)
        info.pciDeviceId = dev.spec.pci_device_id
        info.pciSubSystemId = (0x1600 + dev.index) << 16 | 0x10DE
        return SUCCESS

    @_nvml("nvmlDeviceGetArchitecture")
    def _architecture(self, dev: _Device, t: float, out: Any) -> int:
        _set(out, dev.spec.arch_code)
        return SUCCESS

    @_nvml("nvmlDeviceGetCudaComputeCapability")
    def _compute_capability(self, dev: _Device, t: float, major: Any, minor: Any) -> int:
        _set(major, dev.spec.compute_capability[0])
        _set(minor, dev.spec.compute_capability[1])
        return SUCCESS

    @_nvml("nvmlDeviceGetPersistenceMode")
    def _persistence(self, dev: _Device, t: float, out: Any) -> int:
        _set(out, int(dev.spec.persistence_mode))
        return SUCCESS

    @_nvml("nvmlDeviceGetComputeMode")  # nvml.h: "For all products."
    def _compute_mode(self, dev: _Device, t: float, out: Any) -> int:
        _set(out, COMPUTE_MODES[dev.spec.compute_mode])
        return SUCCESS

    @_nvml("nvmlDeviceGetPerformanceState")
    def _pstate(self, dev: _Device, t: float, out: Any) -> int:
        _set(out, dev.spec.performance_state)
        return SUCCESS

    # -- MIG --------------------------------------------------------------------------------

    @_nvml("nvmlDeviceGetMigMode")
    def _mig_mode(self, dev: _Device, t: float, current: Any, pending: Any) -> int:
        if not dev.spec.mig_capable:
            return NOT_SUPPORTED
        mig = dev.spec.mig
        _set(current, int(mig is not None and mig.enabled))
        _set(pending, int(mig is not None and mig.pending))
        return SUCCESS

    @_nvml("nvmlDeviceGetMaxMigDeviceCount")
    def _max_mig_devices(self, dev: _Device, t: float, out: Any) -> int:
        if not dev.spec.mig_capable:
            return NOT_SUPPORTED
        # nvml.h: "Returns zero if MIG is not supported or enabled."
        _set(out, dev.spec.mig.max_devices if dev.spec.mig_enabled and dev.spec.mig else 0)
        return SUCCESS

    @_nvml("nvmlDeviceGetMigDeviceHandleByIndex")
    def _mig_handle_by_index(self, dev: _Device, t: float, index: Any, out: Any) -> int:
        mig = dev.spec.mig
        if not dev.spec.mig_capable:
            return NOT_SUPPORTED
        if mig is None or not mig.enabled or not 0 <= _int(index) < mig.max_devices:
            return INVALID_ARGUMENT
        found = dev.mig_device(_int(index), t)
        if found is None:
            return NOT_FOUND  # nvml.h: "no valid MIG device was found at index"
        _store_token(out, found.token)
        return SUCCESS

    @_nvml("nvmlDeviceIsMigDeviceHandle")
    def _is_mig_handle(self, dev: _Device, t: float, out: Any) -> int:
        _set(out, 0)
        return SUCCESS

    @_on_mig("nvmlDeviceIsMigDeviceHandle")
    def _is_mig_handle_mig(self, mig: _MigDevice, t: float, out: Any) -> int:
        _set(out, 1)
        return SUCCESS

    @_nvml("nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId")
    def _instance_id_parent(self, dev: _Device, t: float, out: Any) -> int:
        return NOT_SUPPORTED  # only MIG device handles have instance ids

    @_on_mig("nvmlDeviceGetGpuInstanceId")
    def _gpu_instance_id(self, mig: _MigDevice, t: float, out: Any) -> int:
        _set(out, mig.instance.gpu_instance)
        return SUCCESS

    @_on_mig("nvmlDeviceGetComputeInstanceId")
    def _compute_instance_id(self, mig: _MigDevice, t: float, out: Any) -> int:
        _set(out, mig.compute_instance)
        return SUCCESS

    @_nvml("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
    def _parent_of_parent(self, dev: _Device, t: float, out: Any) -> int:
        return INVALID_ARGUMENT  # not a MIG device handle

    @_on_mig("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
    def _parent_handle(self, mig: _MigDevice, t: float, out: Any) -> int:
        _store_token(out, mig.parent.token)
        return SUCCESS

    @_nvml("nvmlDeviceGetAttributes_v2")
    def _attributes(self, dev: _Device, t: float, out: Any) -> int:
        return NOT_SUPPORTED  # nvml.h: "currently only supports MIG device handles"

    @_on_mig("nvmlDeviceGetAttributes_v2")
    def _mig_attributes(self, mig: _MigDevice, t: float, out: Any) -> int:
        attrs, inst = _target(out), mig.instance
        attrs.multiprocessorCount = inst.profile.multiprocessors // inst.compute_instances
        attrs.gpuInstanceSliceCount = inst.profile.gpu_slices
        attrs.computeInstanceSliceCount = inst.compute_slices
        attrs.memorySizeMB = inst.profile.memory_bytes // _MIB
        return SUCCESS

    @_on_mig("nvmlDeviceGetUUID")
    def _mig_uuid(self, mig: _MigDevice, t: float, buf: Any, size: Any) -> int:
        return _write_str(buf, size, mig.uuid)

    @_on_mig("nvmlDeviceGetName")
    def _mig_name(self, mig: _MigDevice, t: float, buf: Any, size: Any) -> int:
        return _write_str(buf, size, mig_device_name(mig.parent.spec.model, mig.instance))

    def _mig_memory(self, mig: _MigDevice, t: float) -> tuple[int, int, int]:
        """A GPU instance's memory, the same through each of its compute instances."""
        total = mig.instance.profile.memory_bytes
        used = min(int(mig.instance.values["memory_used_bytes"].value_at(t)), total - _MIG_RESERVED)
        return total, _MIG_RESERVED, used

    @_on_mig("nvmlDeviceGetMemoryInfo")
    def _mig_memory_v1(self, mig: _MigDevice, t: float, out: Any) -> int:
        mem = _target(out)
        total, reserved, allocated = self._mig_memory(mig, t)
        mem.total, mem.used, mem.free = total, allocated + reserved, total - allocated - reserved
        return SUCCESS

    @_on_mig("nvmlDeviceGetMemoryInfo_v2")
    def _mig_memory_v2(self, mig: _MigDevice, t: float, out: Any) -> int:
        mem = _target(out)
        if mem.version != pynvml.nvmlMemory_v2:
            return ARGUMENT_VERSION_MISMATCH
        total, reserved, allocated = self._mig_memory(mig, t)
        mem.total, mem.reserved, mem.used = total, reserved, allocated
        mem.free = total - reserved - allocated
        return SUCCESS

    def _parent_memory(self, dev: _Device, t: float) -> tuple[int, int, int] | int:
        """(total, reserved, allocated), or NO_PERMISSION: with MIG on, the parent's aggregate
        memory needs the MIG monitor capability (nvml.h)."""
        mig = dev.spec.mig
        if mig is None or not mig.enabled:
            return self._memory(dev, t)
        if not mig.monitor_capability:
            return NO_PERMISSION
        used = sum(
            min(int(i.values["memory_used_bytes"].value_at(t)), i.profile.memory_bytes)
            for i in mig.live(t)
            if i.compute_instances
        )
        total, reserved = dev.spec.memory_total_bytes, dev.spec.memory_reserved_bytes
        return total, reserved, min(used, total - reserved)

    # -- utilization, memory, power, temperature --------------------------------------------

    @_nvml("nvmlDeviceGetUtilizationRates", feature="utilization")
    def _utilization(self, dev: _Device, t: float, out: Any) -> int:
        if dev.spec.mig_enabled:
            return NOT_SUPPORTED  # nvml.h: not supported on MIG-enabled GPUs
        util = _target(out)
        util.gpu = _percent(dev.value("utilization", t))
        util.memory = _percent(dev.value("memory_utilization", t))
        return SUCCESS

    def _codec(self, dev: _Device, t: float, quantity: str, util: Any, period: Any) -> int:
        if dev.spec.mig_enabled:
            return NOT_SUPPORTED  # as utilization rates: not on MIG-enabled GPUs
        _set(util, _percent(dev.value(quantity, t)))
        _set(period, _CODEC_SAMPLING_US)
        return SUCCESS

    @_nvml("nvmlDeviceGetEncoderUtilization", feature="encoder")
    def _encoder(self, dev: _Device, t: float, util: Any, period: Any) -> int:
        return self._codec(dev, t, "encoder_utilization", util, period)

    @_nvml("nvmlDeviceGetDecoderUtilization", feature="decoder")
    def _decoder(self, dev: _Device, t: float, util: Any, period: Any) -> int:
        return self._codec(dev, t, "decoder_utilization", util, period)

    def _memory(self, dev: _Device, t: float) -> tuple[int, int, int]:
        total, reserved = dev.spec.memory_total_bytes, dev.spec.memory_reserved_bytes
        allocated = min(int(dev.value("memory_used_bytes", t)), total - reserved)
        return total, reserved, allocated

    @_nvml("nvmlDeviceGetMemoryInfo")
    def _memory_v1(self, dev: _Device, t: float, out: Any) -> int:
        read = self._parent_memory(dev, t)
        if isinstance(read, int):
            return read
        mem = _target(out)
        total, reserved, allocated = read
        mem.total, mem.used = total, allocated + reserved  # v1 `used` includes reserved
        mem.free = total - mem.used
        return SUCCESS

    @_nvml("nvmlDeviceGetMemoryInfo_v2", feature="memory_v2")
    def _memory_v2(self, dev: _Device, t: float, out: Any) -> int:
        mem = _target(out)
        if mem.version != pynvml.nvmlMemory_v2:
            return ARGUMENT_VERSION_MISMATCH
        read = self._parent_memory(dev, t)
        if isinstance(read, int):
            return read
        total, reserved, allocated = read
        mem.total, mem.reserved, mem.used = total, reserved, allocated
        mem.free = total - reserved - allocated
        return SUCCESS

    @_nvml("nvmlDeviceGetPowerUsage", feature="power")
    def _power(self, dev: _Device, t: float, out: Any) -> int:
        _set(out, round(dev.value("power_watts", t) * 1000))
        return SUCCESS

    @_nvml("nvmlDeviceGetEnforcedPowerLimit", feature="power_limit")
    def _power_limit(self, dev: _Device, t: float, out: Any) -> int:
        _set(out, round(dev.spec.power_limit_watts * 1000))
        return SUCCESS

    @_nvml("nvmlDeviceGetPowerManagementLimit", feature="power_limit")
    def _power_management_limit(self, dev: _Device, t: float, out: Any) -> int:
        _set(out, round(dev.spec.power_management_limit_watts * 1000))
        return SUCCESS

    # Settings `gpu-exporter diagnose` checks. As nvml.h documents them (Kepler or newer
    # fully supported devices; NOT_SUPPORTED elsewhere); not compared with a real driver.

    @_nvml("nvmlDeviceGetPowerManagementDefaultLimit", feature="power_limit")
    def _power_default_limit(self, dev: _Device, t: float, out: Any) -> int:
        _set(out, round(dev.spec.power_default_limit_watts * 1000))
        return SUCCESS

    @_nvml("nvmlDeviceGetPowerManagementLimitConstraints", feature="power_limit")
    def _power_limit_constraints(self, dev: _Device, t: float, low: Any, high: Any) -> int:
        minimum, maximum = dev.spec.power_limit_range_watts
        _set(low, round(minimum * 1000))
        _set(high, round(maximum * 1000))
        return SUCCESS

    @_nvml("nvmlDeviceGetTotalEnergyConsumption", feature="energy")
    def _energy(self, dev: _Device, t: float, out: Any) -> int:
        _set(out, _energy_mj(dev, t))
        return SUCCESS

    @_nvml("nvmlDeviceGetTemperature", feature="temperature")
    def _temperature(self, dev: _Device, t: float, sensor: Any, out: Any) -> int:
        if _int(sensor) != pynvml.NVML_TEMPERATURE_GPU:
            return INVALID_ARGUMENT
        _set(out, max(0, round(dev.value("temperature_celsius", t))))
        return SUCCESS

    @_nvml("nvmlDeviceGetTemperatureV", feature="temperature")
    def _temperature_v(self, dev: _Device, t: float, out: Any) -> int:
        temp = _target(out)
        if temp.version != pynvml.nvmlTemperature_v1:
            return ARGUMENT_VERSION_MISMATCH
        if temp.sensorType != pynvml.NVML_TEMPERATURE_GPU:
            return INVALID_ARGUMENT
        temp.temperature = round(dev.value("temperature_celsius", t))
        return SUCCESS

    # -- clocks and clock events ------------------------------------------------------------

    def _clock_mhz(self, dev: _Device, t: float, clock_type: int) -> int | None:
        maxima = dev.spec.max_clocks_mhz
        if clock_type == pynvml.NVML_CLOCK_GRAPHICS:
            return round(dev.value("graphics_clock_mhz", t))
        if clock_type == pynvml.NVML_CLOCK_SM:
            return round(dev.value("sm_clock_mhz", t))
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return round(dev.value("memory_clock_mhz", t))
        if clock_type == pynvml.NVML_CLOCK_VIDEO:  # follows the SM clock, scaled to its max
            return round(dev.value("sm_clock_mhz", t) * maxima["video"] / maxima["sm"])
        return None

    @_nvml("nvmlDeviceGetClockInfo", feature="clocks")
    def _clock_info(self, dev: _Device, t: float, clock_type: Any, out: Any) -> int:
        mhz = self._clock_mhz(dev, t, _int(clock_type))
        if mhz is None:
            return INVALID_ARGUMENT
        _set(out, mhz)
        return SUCCESS

    @_nvml("nvmlDeviceGetMaxClockInfo", feature="clocks")
    def _max_clock_info(self, dev: _Device, t: float, clock_type: Any, out: Any) -> int:
        names = {0: "graphics", 1: "sm", 2: "memory", 3: "video"}
        name = names.get(_int(clock_type))
        if name is None:
            return INVALID_ARGUMENT
        _set(out, dev.spec.max_clocks_mhz[name])
        return SUCCESS

    def _application_clock(self, clocks: Mapping[str, int], clock_type: Any, out: Any) -> int:
        # Graphics and SM share one application clock; NVML has none for the video clock.
        names = {pynvml.NVML_CLOCK_GRAPHICS: "sm", pynvml.NVML_CLOCK_SM: "sm"}
        names[pynvml.NVML_CLOCK_MEM] = "memory"
        kind = _int(clock_type)
        if kind == pynvml.NVML_CLOCK_VIDEO:
            return NOT_SUPPORTED
        if kind not in names:
            return INVALID_ARGUMENT
        _set(out, clocks[names[kind]])
        return SUCCESS

    @_nvml("nvmlDeviceGetApplicationsClock", feature="applications_clocks")
    def _applications_clock(self, dev: _Device, t: float, clock_type: Any, out: Any) -> int:
        return self._application_clock(dev.spec.application_clocks_mhz, clock_type, out)

    @_nvml("nvmlDeviceGetDefaultApplicationsClock", feature="applications_clocks")
    def _default_applications_clock(self, dev: _Device, t: float, clock_type: Any, out: Any) -> int:
        return self._application_clock(dev.spec.default_application_clocks_mhz, clock_type, out)

    @_nvml(
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        feature="clock_event_reasons",
    )
    def _current_reasons(self, dev: _Device, t: float, out: Any) -> int:
        _set(out, dev.reasons(t))
        return SUCCESS

    @_nvml(
        "nvmlDeviceGetSupportedClocksEventReasons",
        "nvmlDeviceGetSupportedClocksThrottleReasons",
        feature="clock_event_reasons",
    )
    def _supported_reasons(self, dev: _Device, t: float, out: Any) -> int:
        _set(out, _ALL_REASONS)
        return SUCCESS

    @_nvml("nvmlDeviceGetViolationStatus", feature="throttle_time")
    def _violation(self, dev: _Device, t: float, policy: Any, out: Any) -> int:
        mask = _POLICY_MASKS.get(_int(policy))
        if mask is None:
            return INVALID_ARGUMENT
        violation = _target(out)
        violation.referenceTime = _wall_us()
        violation.violationTime = _ns(dev.totals(t)[_mask_key(mask)])
        return SUCCESS

    # -- PCIe -------------------------------------------------------------------------------

    @_nvml("nvmlDeviceGetPcieThroughput", feature="pcie_throughput")
    def _pcie_throughput(self, dev: _Device, t: float, counter: Any, out: Any) -> int:
        quantity = {0: "pcie_tx_bytes_per_second", 1: "pcie_rx_bytes_per_second"}.get(_int(counter))
        if quantity is None:
            return INVALID_ARGUMENT
        _set(out, round(dev.value(quantity, t) / _KIB))  # KB/s, read as KiB/s
        return SUCCESS

    @_nvml("nvmlDeviceGetCurrPcieLinkGeneration", feature="pcie_link")
    def _pcie_gen(self, dev: _Device, t: float, out: Any) -> int:
        _set(out, round(dev.value("pcie_generation", t)))
        return SUCCESS

    @_nvml("nvmlDeviceGetCurrPcieLinkWidth", feature="pcie_link")
    def _pcie_width(self, dev: _Device, t: float, out: Any) -> int:
        _set(out, round(dev.value("pcie_width", t)))
        return SUCCESS

    @_nvml("nvmlDeviceGetMaxPcieLinkGeneration", feature="pcie_link")
    def _pcie_max_gen(self, dev: _Device, t: float, out: Any) -> int:
        _set(out, dev.spec.pcie_max_generation)
        return SUCCESS

    @_nvml("nvmlDeviceGetMaxPcieLinkWidth", feature="pcie_link")
    def _pcie_max_width(self, dev: _Device, t: float, out: Any) -> int:
        _set(out, dev.spec.pcie_max_width)
        return SUCCESS

    @_nvml("nvmlDeviceGetGpuMaxPcieLinkGeneration", feature="pcie_link")
    def _pcie_gpu_max_gen(self, dev: _Device, t: float, out: Any) -> int:
        _set(out, dev.spec.pcie_gpu_max_generation)
        return SUCCESS

    @_nvml("nvmlDeviceGetPcieReplayCounter", feature="pcie_replay")
    def _pcie_replay(self, dev: _Device, t: float, out: Any) -> int:
        _set(out, int(dev.value("pcie_replay_total", t)))
        return SUCCESS

    # -- NVLink -----------------------------------------------------------------------------

    def _link_ok(self, dev: _Device, link: Any) -> int:
        return SUCCESS if 0 <= _int(link) < dev.spec.nvlink_links else INVALID_ARGUMENT

    @_nvml("nvmlDeviceGetNvLinkState", feature="nvlink")
    def _nvlink_state(self, dev: _Device, t: float, link: Any, out: Any) -> int:
        rc = self._link_ok(dev, link)
        if rc == SUCCESS:
            _set(out, pynvml.NVML_FEATURE_ENABLED)
        return rc

    @_nvml("nvmlDeviceGetNvLinkVersion", feature="nvlink")
    def _nvlink_version(self, dev: _Device, t: float, link: Any, out: Any) -> int:
        rc = self._link_ok(dev, link)
        if rc == SUCCESS:
            _set(out, dev.spec.nvlink_version)
        return rc

    @_nvml("nvmlDeviceGetNvLinkRemoteDeviceType", feature="nvlink")
    def _nvlink_remote(self, dev: _Device, t: float, link: Any, out: Any) -> int:
        rc = self._link_ok(dev, link)
        if rc == SUCCESS:
            _set(out, pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)  # HGX boards: all links to NVSwitch
        return rc

    # -- ECC, retired pages, remapped rows --------------------------------------------------

    @_nvml("nvmlDeviceGetEccMode", feature="ecc")
    def _ecc_mode(self, dev: _Device, t: float, current: Any, pending: Any) -> int:
        _set(current, int(dev.spec.ecc))
        _set(pending, int(dev.spec.ecc_pending))
        return SUCCESS

    @_nvml("nvmlDeviceGetTotalEccErrors", feature="ecc")
    def _ecc_errors(self, dev: _Device, t: float, err_type: Any, counter: Any, out: Any) -> int:
        if not dev.spec.ecc:
            return NOT_SUPPORTED  # "Requires ECC Mode to be enabled"
        # (error type, counter type): NVML_MEMORY_ERROR_TYPE_*, NVML_VOLATILE/AGGREGATE_ECC
        quantity = {
            (0, 0): "ecc_corrected_total",
            (1, 0): "ecc_uncorrected_total",
            (0, 1): "ecc_corrected_aggregate_total",
            (1, 1): "ecc_uncorrected_aggregate_total",
        }.get((_int(err_type), _int(counter)))
        if quantity is None:
            return INVALID_ARGUMENT
        _set(out, int(dev.value(quantity, t)))
        return SUCCESS

    def _retired(self, dev: _Device, t: float, cause: Any) -> list[int] | None:
        quantity = {0: "retired_pages_sbe", 1: "retired_pages_dbe"}.get(_int(cause))
        if quantity is None:
            return None
        base = 0x7F0000000 + _int(cause) * 0x100000
        return [base + i * 0x1000 for i in range(int(dev.value(quantity, t)))]

    def _two_call(self, pages: list[int], count: Any, buffers: tuple[Any, ...]) -> int:
        """NVML's count/buffer protocol: too small (or NULL) -> INSUFFICIENT_SIZE + count."""
        box = _target(count)
        capacity = box.value
        box.value = len(pages)
        if not pages:
            return SUCCESS
        if capacity < len(pages) or any(b is None for b in buffers):
            return INSUFFICIENT_SIZE
        retired_at = int(time.time()) - 86400  # a day ago, in seconds since 1970
        for i, address in enumerate(pages):
            buffers[0][i] = address
            if len(buffers) > 1:
                buffers[1][i] = retired_at
        return SUCCESS

    @_nvml("nvmlDeviceGetRetiredPages", feature="retired_pages")
    def _retired_pages(self, dev: _Device, t: float, cause: Any, count: Any, addresses: Any) -> int:
        pages = self._retired(dev, t, cause)
        return INVALID_ARGUMENT if pages is None else self._two_call(pages, count, (addresses,))

    @_nvml("nvmlDeviceGetRetiredPages_v2", feature="retired_pages")
    def _retired_pages_v2(
        self, dev: _Device, t: float, cause: Any, count: Any, addresses: Any, times: Any = None
    ) -> int:
        # pynvml's first (count) call passes only four arguments; C would see garbage there.
        pages = self._retired(dev, t, cause)
        if pages is None:
            return INVALID_ARGUMENT
        return self._two_call(pages, count, (addresses, times))

    @_nvml("nvmlDeviceGetRetiredPagesPendingStatus", feature="retired_pages")
    def _retired_pending(self, dev: _Device, t: float, out: Any) -> int:
        _set(out, int(dev.value("retired_pages_pending", t) >= 0.5))
        return SUCCESS

    @_nvml("nvmlDeviceGetRemappedRows", feature="remapped_rows")
    def _remapped_rows(
        self, dev: _Device, t: float, corr: Any, unc: Any, pending: Any, failure: Any
    ) -> int:
        _set(corr, int(dev.value("remapped_rows_correctable", t)))
        _set(unc, int(dev.value("remapped_rows_uncorrectable", t)))
        _set(pending, int(dev.value("row_remap_pending", t) >= 0.5))
        _set(failure, int(dev.value("row_remap_failure", t) >= 0.5))
        return SUCCESS

    # -- NUMA and topology ------------------------------------------------------------------

    @_nvml("nvmlDeviceGetNumaNodeId", feature="numa")
    def _numa_node(self, dev: _Device, t: float, out: Any) -> int:
        _set(out, dev.spec.numa_node)
        return SUCCESS

    @_nvml("nvmlDeviceGetCpuAffinity", feature="numa")
    def _cpu_affinity(self, dev: _Device, t: float, size: Any, out: Any) -> int:
        _fill_bitmask(_target(out), _int(size), dev.spec.cpus)
        return SUCCESS

    @_nvml("nvmlDeviceGetMemoryAffinity", feature="numa")
    def _memory_affinity(self, dev: _Device, t: float, size: Any, out: Any, scope: Any) -> int:
        if _int(scope) not in (pynvml.NVML_AFFINITY_SCOPE_NODE, pynvml.NVML_AFFINITY_SCOPE_SOCKET):
            return INVALID_ARGUMENT
        _fill_bitmask(_target(out), _int(size), (dev.spec.numa_node,))
        return SUCCESS

    def _peer(self, handle: Any) -> tuple[_Device | None, int]:
        peer = self._device(handle)
        if peer is None:
            return None, INVALID_ARGUMENT
        if self._lost(peer.index, self.clock()):
            return None, GPU_IS_LOST
        return peer, SUCCESS

    @_nvml("nvmlDeviceGetTopologyCommonAncestor", feature="topology")
    def _common_ancestor(self, dev: _Device, t: float, other: Any, out: Any) -> int:
        peer, rc = self._peer(other)
        if peer is None:
            return rc
        if not peer.spec.supports("topology"):
            return NOT_SUPPORTED
        _set(out, self.scenario.topology_level(dev.index, peer.index))
        return SUCCESS

    @_nvml("nvmlDeviceGetP2PStatus")
    def _p2p_status(self, dev: _Device, t: float, other: Any, index: Any, out: Any) -> int:
        peer, rc = self._peer(other)
        if peer is None:
            return rc
        nvlinked = dev.spec.nvlink_links > 0 and peer.spec.nvlink_links > 0
        same_node = dev.spec.numa_node == peer.spec.numa_node
        if _int(index) == pynvml.NVML_P2P_CAPS_INDEX_NVLINK:
            status = pynvml.NVML_P2P_STATUS_OK if nvlinked else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
        elif nvlinked or same_node:
            status = pynvml.NVML_P2P_STATUS_OK
        else:
            status = pynvml.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED
        _set(out, status)
        return SUCCESS

    # -- NVLink fabric -----------------------------------------------------------------------

    @_nvml("nvmlDeviceGetGpuFabricInfoV")
    def _fabric_info(self, dev: _Device, t: float, out: Any) -> int:
        """nvmlGpuFabricInfo_v2/v3 (nvml.h). The struct's version is checked first (one the
        scenario's driver does not accept: ARGUMENT_VERSION_MISMATCH), then whether the GPU
        has a fabric (`fabric:`; none: NOT_SUPPORTED); v2 has no healthSummary. Assumed, not
        compared with a real driver: that order, and the clique id and cluster UUID."""
        if out is None:
            return INVALID_ARGUMENT
        info = _target(out)
        version = FABRIC_INFO_VERSIONS.get(info.version)
        if version is None or version not in self.scenario.driver.fabric_info_versions:
            return ARGUMENT_VERSION_MISMATCH
        fabric = dev.spec.fabric
        if fabric is None:
            return NOT_SUPPORTED
        now = fabric.at(t)
        info.clusterUuid[:] = bytes(range(1, 17))  # one fabric for every GPU of the scenario
        info.status, info.cliqueId, info.state = now.status, 1, now.state
        info.healthMask = now.health_mask
        if version >= 3:
            info.healthSummary = now.health_summary
        return SUCCESS

    # -- field values -----------------------------------------------------------------------

    @_nvml("nvmlDeviceGetFieldValues")
    def _field_values(self, dev: _Device, t: float, count: Any, values: Any) -> int:
        entries = _target(values)
        n = _int(count)
        if n < 0 or n > len(entries):
            return INVALID_ARGUMENT
        totals = dev.totals(t)  # one integration step serves the whole batch
        stamp = _wall_us()
        for i in range(n):
            entry = entries[i]
            rc, value_type, value = self._field(dev, t, totals, entry.fieldId, entry.scopeId)
            entry.timestamp = stamp
            entry.latencyUsec = 0
            entry.nvmlReturn = rc
            if rc == SUCCESS:
                entry.valueType = value_type
                setattr(entry.value, _UNION_MEMBER[value_type], value)
        return SUCCESS

    def _field(
        self, dev: _Device, t: float, totals: dict[str, float], field_id: int, scope: int
    ) -> tuple[int, int, int | float]:
        handler = _FIELDS.get(field_id)
        if handler is None or field_id in self.scenario.driver.unsupported_fields:
            return INVALID_ARGUMENT, 0, 0  # this driver does not know the id
        feature, read = handler
        if not dev.spec.supports(feature) or (feature == "ecc" and not dev.spec.ecc):
            return NOT_SUPPORTED, 0, 0
        return read(dev, t, totals, scope)

    # -- events -----------------------------------------------------------------------------

    @_nvml("nvmlEventSetCreate", device=False)
    def _event_set_create(self, out: Any) -> int:
        token = next(_TOKENS)
        with self._lock:
            self._event_sets[token] = _EventSet()
        _store_token(out, token)
        return SUCCESS

    @_nvml("nvmlEventSetFree", device=False)
    def _event_set_free(self, handle: Any) -> int:
        with self._lock:
            found = _release(self._event_sets, _token(handle))
            self._events_changed.notify_all()
        return SUCCESS if found is not None else INVALID_ARGUMENT

    def _supported_events(self, dev: _Device) -> int:
        if not dev.spec.supports("events"):
            return 0
        ecc = dev.spec.ecc and dev.spec.supports("ecc")
        mig = pynvml.nvmlEventMigConfigChange if dev.spec.mig_capable else 0
        return pynvml.nvmlEventTypeXidCriticalError | (0x3 if ecc else 0) | mig

    @_nvml("nvmlDeviceGetSupportedEventTypes")
    def _supported_event_types(self, dev: _Device, t: float, out: Any) -> int:
        _set(out, self._supported_events(dev))
        return SUCCESS

    @_nvml("nvmlDeviceRegisterEvents", feature="events")
    def _register_events(self, dev: _Device, t: float, types: Any, handle: Any) -> int:
        wanted = _int(types)
        with self._lock:
            event_set = _lookup(self._event_sets, _token(handle))
            if event_set is None:
                return INVALID_ARGUMENT
            if wanted & ~self._supported_events(dev):
                return NOT_SUPPORTED  # "some of requested event types" unsupported
            mask, since = event_set.registered.get(dev.index, (0, t))
            event_set.registered[dev.index] = (mask | wanted, since)
            self._events_changed.notify_all()
        return SUCCESS

    @_nvml("nvmlEventSetWait_v2", device=False)
    def _event_wait(self, handle: Any, out: Any, timeout_ms: Any) -> int:
        token = _token(handle)
        deadline = time.monotonic() + _int(timeout_ms) / 1000.0
        while True:
            t = self.clock()
            with self._lock:
                event_set = _lookup(self._event_sets, token)
                if event_set is None or self._refcount == 0:
                    return INVALID_ARGUMENT if event_set is None else UNINITIALIZED
                fault = self._next_event(event_set, t)
                if fault is None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return TIMEOUT
                    # Real NVML blocks in the kernel. With an XID still to come, poll every
                    # 100 ms: the clock may be a manual one, so its due time cannot be turned
                    # into a real-time sleep. With none, nothing but a shutdown, a free or a
                    # registration (which notify) can change the answer: block until the
                    # deadline. The wait releases the lock.
                    if self._xid_to_come(event_set, t):
                        remaining = min(0.1, remaining)
                    self._events_changed.wait(remaining)
                    continue
            device, event_type, data = fault
            _fill_event(_target(out), self._devices[device].token, event_type, data)
            return SUCCESS

    def _next_event(self, event_set: _EventSet, t: float) -> tuple[int, int, int] | None:
        """(device, event type, data) of the earliest due, undelivered event for a registered
        device: an XID fault or a MIG layout change (caller holds the lock)."""
        due: list[tuple[float, int, int, int]] = [
            (f.at, i, f.device, f.xid)
            for i, f in self._faults
            if f.kind == "xid"
            and i not in event_set.delivered
            and f.at <= t
            and not self._reset_since(f.device, f.at, t)
            and self._wants(event_set, f.device, f.at, pynvml.nvmlEventTypeXidCriticalError)
        ]
        changes = [
            (at, -1, dev.index, 0)
            for dev in self._devices
            for at in dev.mig_changes()
            if at <= t
            and (dev.index, at) not in event_set.mig_delivered
            and self._wants(event_set, dev.index, at, pynvml.nvmlEventMigConfigChange)
        ]
        if not due and not changes:
            return None
        at, index, device, xid = min(due + changes)
        if index < 0:
            event_set.mig_delivered.add((device, at))
            return device, pynvml.nvmlEventMigConfigChange, 0
        event_set.delivered.add(index)
        return device, pynvml.nvmlEventTypeXidCriticalError, xid

    def _reset_since(self, device: int, at: float, t: float) -> bool:
        """Whether the GPU was reset after `at` and by `t`: an XID from before a GPU reset is
        not delivered after it (the reset cleared what raised it)."""
        return any(at < r <= t for r in self._devices[device].resets)

    def _xid_to_come(self, event_set: _EventSet, t: float) -> bool:
        """Whether an event for a registered device is undelivered, due or not (lock held)."""
        xid = pynvml.nvmlEventTypeXidCriticalError
        return any(
            f.kind == "xid"
            and i not in event_set.delivered
            and not self._reset_since(f.device, f.at, t)
            and self._wants(event_set, f.device, f.at, xid)
            for i, f in self._faults
        ) or any(
            (dev.index, at) not in event_set.mig_delivered
            and self._wants(event_set, dev.index, at, pynvml.nvmlEventMigConfigChange)
            for dev in self._devices
            for at in dev.mig_changes()
        )

    @staticmethod
    def _wants(event_set: _EventSet, device: int, at: float, event_type: int) -> bool:
        mask, since = event_set.registered.get(device, (0, math.inf))
        # NVML does not record events that happened before registration.
        return bool(mask & event_type) and at >= since

    # -- processes --------------------------------------------------------------------------
    # nvml.h's semantics: the running-process lists' sizing protocol ("call this function with
    # *infoCount = 0 ... NVML_ERROR_INSUFFICIENT_SIZE, or NVML_SUCCESS if none are running"),
    # nvmlProcessInfo_v2_t's instance ids (0xFFFFFFFF "otherwise", i.e. MIG off), MIG ("if
    # device handle is provided, the API returns aggregate information, only if the caller has
    # appropriate privileges": the `monitor_capability`, else NO_PERMISSION; a MIG device
    # handle lists its own), per-process utilization ("one utilization sample structure ...
    # per process running, that had some non-zero utilization during the last sample period",
    # CPU timestamps in microseconds, only samples newer than lastSeenTimeStamp, NOT_FOUND
    # "if sample entries are not found", "not currently supported" on MIG-enabled GPUs).
    # Assumed, not compared with a real driver: the sample period and buffer (above), that MPS
    # clients are sampled under their own PIDs, that the struct version is checked before
    # MIG mode, and that a sizing call answers NOT_FOUND before INSUFFICIENT_SIZE.

    def _processes_read(self, t: float) -> None:
        for listener in self.process_listeners:
            listener(t)

    def _running(
        self,
        dev: _Device,
        t: float,
        mig: _MigDevice | None,
        kinds: frozenset[str],
        count: Any,
        infos: Any,
    ) -> int:
        """One running-process list (nvmlProcessInfo_v2_t entries) of a GPU or MIG device."""
        self._processes_read(t)
        if count is None:
            return INVALID_ARGUMENT
        spec_mig = dev.spec.mig
        parent_of_mig = mig is None and spec_mig is not None and spec_mig.enabled
        if parent_of_mig and spec_mig is not None and not spec_mig.monitor_capability:
            return NO_PERMISSION
        procs = [
            p
            for p in self._processes.get(dev.index, ())
            if p.kind in kinds
            and p.running(t)
            and (
                mig is None
                or (p.gpu_instance, p.compute_instance or 0)
                == (mig.instance.gpu_instance, mig.compute_instance)
            )
        ]
        box = _target(count)
        capacity = box.value
        box.value = len(procs)
        if not procs:
            return SUCCESS
        if capacity < len(procs):
            return INSUFFICIENT_SIZE
        if infos is None:
            return INVALID_ARGUMENT  # "either of infoCount or infos is NULL"
        entries = _slots(infos)
        for i, proc in enumerate(procs):
            entry = entries[i]
            entry.pid = proc.pid
            entry.usedGpuMemory = int(proc.memory_bytes.value_at(t))
            on_mig = proc.gpu_instance is not None
            entry.gpuInstanceId = proc.gpu_instance if on_mig else _ALL_ONES_32
            entry.computeInstanceId = (proc.compute_instance or 0) if on_mig else _ALL_ONES_32
        return SUCCESS

    @_nvml("nvmlDeviceGetComputeRunningProcesses_v3")
    def _compute_processes(self, dev: _Device, t: float, count: Any, infos: Any) -> int:
        return self._running(dev, t, None, _COMPUTE, count, infos)

    @_on_mig("nvmlDeviceGetComputeRunningProcesses_v3")
    def _compute_processes_mig(self, mig: _MigDevice, t: float, count: Any, infos: Any) -> int:
        return self._running(mig.parent, t, mig, _COMPUTE, count, infos)

    @_nvml("nvmlDeviceGetGraphicsRunningProcesses_v3")
    def _graphics_processes(self, dev: _Device, t: float, count: Any, infos: Any) -> int:
        return self._running(dev, t, None, _GRAPHICS, count, infos)

    @_on_mig("nvmlDeviceGetGraphicsRunningProcesses_v3")
    def _graphics_processes_mig(self, mig: _MigDevice, t: float, count: Any, infos: Any) -> int:
        return self._running(mig.parent, t, mig, _GRAPHICS, count, infos)

    @_nvml("nvmlDeviceGetMPSComputeRunningProcesses_v3")
    def _mps_processes(self, dev: _Device, t: float, count: Any, infos: Any) -> int:
        if not dev.spec.at_least("volta"):
            return NOT_SUPPORTED  # nvml.h: "For Volta or newer fully supported devices"
        return self._running(dev, t, None, _MPS, count, infos)

    @_on_mig("nvmlDeviceGetMPSComputeRunningProcesses_v3")
    def _mps_processes_mig(self, mig: _MigDevice, t: float, count: Any, infos: Any) -> int:
        return self._running(mig.parent, t, mig, _MPS, count, infos)

    def _periods(self, t: float, last_seen: int) -> list[tuple[int, float]]:
        """(stamp, middle) of each sample period the buffer keeps that ended by `t` and is
        stamped after `last_seen`, oldest first. Period k covers scenario time
        [(k - 1) P, k P), is judged at its middle and stamped at its end."""
        period_s = _PROCESS_SAMPLE_US / 1e6
        newest = math.floor(t / period_s + 1e-9)
        out = []
        for k in range(max(1, newest - _PROCESS_SAMPLES_KEPT + 1), newest + 1):
            stamp = self._epoch_us + k * _PROCESS_SAMPLE_US
            if stamp > last_seen:
                out.append((stamp, (k - 0.5) * period_s))
        return out

    def _process_samples(
        self, dev: _Device, t: float, last_seen: int
    ) -> list[tuple[int, int, tuple[int, ...]]]:
        """(pid, timestamp, percents) of each process with non-zero utilization in each sample
        period (`_periods`) newer than `last_seen`; oldest first. A PID with two contexts on the
        GPU (two entries) is one process: its percents add up (at most 100)."""
        samples = []
        for stamp, middle in self._periods(t, last_seen):
            by_pid: dict[int, tuple[int, ...]] = {}
            for proc in self._processes.get(dev.index, ()):
                if proc.running(middle):
                    percents = proc.utilization.percents(middle)
                    before = by_pid.get(proc.pid, (0,) * len(percents))
                    by_pid[proc.pid] = tuple(
                        min(100, a + b) for a, b in zip(before, percents, strict=True)
                    )
            samples += [(pid, stamp, pc) for pid, pc in by_pid.items() if any(pc)]
        return samples

    @_nvml("nvmlDeviceGetProcessesUtilizationInfo", feature="process_utilization")
    def _processes_utilization_info(self, dev: _Device, t: float, arg: Any) -> int:
        self._processes_read(t)
        if arg is None:
            return INVALID_ARGUMENT
        info = _target(arg)
        if info.version != PROCESSES_UTILIZATION_INFO_V1:
            return ARGUMENT_VERSION_MISMATCH
        if dev.spec.mig_enabled:
            return NOT_SUPPORTED
        samples = self._process_samples(dev, t, info.lastSeenTimeStamp)
        if not samples:
            return NOT_FOUND
        capacity = info.processSamplesCount
        info.processSamplesCount = len(samples)  # "the recommended minimal buffer size"
        if not info.procUtilArray or capacity < len(samples):
            return INSUFFICIENT_SIZE
        for i, (pid, stamp, percents) in enumerate(samples):
            entry = info.procUtilArray[i]
            entry.timeStamp, entry.pid = stamp, pid
            (entry.smUtil, entry.memUtil, entry.encUtil, entry.decUtil, entry.jpgUtil,
             entry.ofaUtil) = percents  # fmt: skip
        return SUCCESS

    @_nvml("nvmlDeviceGetProcessUtilization", feature="process_utilization")
    def _process_utilization(
        self, dev: _Device, t: float, utilization: Any, count: Any, last_seen: Any
    ) -> int:
        """The older call: nvmlProcessUtilizationSample_t (SM, memory, encoder, decoder)."""
        self._processes_read(t)
        if count is None:
            return INVALID_ARGUMENT
        if dev.spec.mig_enabled:
            return NOT_SUPPORTED
        samples = self._process_samples(dev, t, _int(last_seen))
        if not samples:
            return NOT_FOUND
        box = _target(count)
        capacity = box.value
        box.value = len(samples)
        if utilization is None or capacity < len(samples):
            return INSUFFICIENT_SIZE
        entries = _slots(utilization)
        for i, (pid, stamp, percents) in enumerate(samples):
            entry = entries[i]
            entry.pid, entry.timeStamp = pid, stamp
            entry.smUtil, entry.memUtil, entry.encUtil, entry.decUtil = percents[:4]
        return SUCCESS

    @_nvml("nvmlDeviceGetSamples", feature="utilization")
    def _utilization_samples(
        self,
        dev: _Device,
        t: float,
        sampling: Any,
        last_seen: Any,
        value_type: Any,
        count: Any,
        samples: Any,
    ) -> int:
        """The driver's buffer of utilization samples, one per sample period (the periods of the
        per-process samples: same period, same stamps), newer than lastSeenTimeStamp; percent
        as unsigned int. nvml.h: "samples set to NULL" sizes (samplesCount), NOT_FOUND "if
        sample entries are not found". The fake keeps GPU, encoder and decoder utilization;
        the other sampling types (power, clocks, memory utilization) answer NOT_SUPPORTED.
        A sample is at least the busiest process's percent of the engine in its period (the
        engine ran while any process's kernels did), whatever the scenario's device value."""
        sampled = _SAMPLED.get(_int(sampling))
        if count is None or value_type is None:
            return INVALID_ARGUMENT
        if dev.spec.mig_enabled or sampled is None:
            return NOT_SUPPORTED  # utilization: not on MIG-enabled GPUs, as the rates
        periods = self._periods(t, _int(last_seen))
        if not periods:
            return NOT_FOUND
        _set(value_type, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT)
        box = _target(count)
        capacity = box.value
        if samples is None:
            box.value = len(periods)
            return SUCCESS
        box.value = min(capacity, len(periods))  # as many as fit, oldest first
        entries = _slots(samples)
        quantity, engine = sampled
        for i, (stamp, middle) in enumerate(periods[: box.value]):
            busiest = max(
                (p.utilization.percents(middle)[engine] for p in self._running_at(dev, middle)),
                default=0,
            )
            entries[i].timeStamp = stamp
            entries[i].sampleValue.uiVal = max(_percent(dev.value(quantity, middle)), busiest)
        return SUCCESS

    def _running_at(self, dev: _Device, t: float) -> list[ProcessSpec]:
        return [p for p in self._processes.get(dev.index, ()) if p.running(t)]

    # -- GPM --------------------------------------------------------------------------------

    @_nvml("nvmlGpmQueryDeviceSupport")
    def _gpm_support(self, dev: _Device, t: float, out: Any) -> int:
        support = _target(out)
        if support.version != pynvml.NVML_GPM_SUPPORT_VERSION:
            return ARGUMENT_VERSION_MISMATCH
        support.isSupportedDevice = int(dev.spec.supports("gpm"))
        return SUCCESS

    @_nvml("nvmlGpmSampleAlloc", device=False)
    def _gpm_alloc(self, out: Any) -> int:
        token = next(_TOKENS)
        with self._lock:
            self._samples[token] = _GpmSample()
        _store_token(out, token)
        return SUCCESS

    @_nvml("nvmlGpmSampleFree", device=False)
    def _gpm_free(self, handle: Any) -> int:
        with self._lock:
            found = _release(self._samples, _token(handle))
        return SUCCESS if found is not None else INVALID_ARGUMENT

    @_nvml("nvmlGpmSampleGet", feature="gpm")
    def _gpm_sample_get(self, dev: _Device, t: float, handle: Any) -> int:
        return self._store_sample(handle, dev.index, None, dev.totals(t), t)

    @_on_mig("nvmlGpmSampleGet")
    def _gpm_sample_get_mig(self, mig: _MigDevice, t: float, handle: Any) -> int:
        if not mig.parent.spec.supports("gpm"):
            return NOT_SUPPORTED
        return self._gpm_instance_sample(mig.parent, mig.instance.gpu_instance, handle, t)

    @_nvml("nvmlGpmMigSampleGet", feature="gpm")
    def _gpm_mig_sample_get(self, dev: _Device, t: float, gpu_instance: Any, handle: Any) -> int:
        return self._gpm_instance_sample(dev, _int(gpu_instance), handle, t)

    def _gpm_instance_sample(self, dev: _Device, gpu_instance: int, handle: Any, t: float) -> int:
        # Samples name the GPU instance by id alone: a sample taken before a reconfiguration
        # that reused the id diffs against the new instance's counters, as NVML's would.
        inst = dev.gpu_instance(gpu_instance, t)
        if inst is None:
            return INVALID_ARGUMENT
        totals = dev.instance_integrals[inst.position].at(t)
        return self._store_sample(handle, dev.index, gpu_instance, totals, t)

    def _store_sample(
        self, handle: Any, device: int, gpu_instance: int | None, totals: dict[str, float], t: float
    ) -> int:
        sample = _lookup(self._samples, _token(handle))
        if sample is None:
            return INVALID_ARGUMENT
        with self._lock:
            sample.device, sample.gpu_instance, sample.t = device, gpu_instance, t
            sample.totals = totals
        return SUCCESS

    @_on_mig("nvmlGpmQueryDeviceSupport")
    def _gpm_support_mig(self, mig: _MigDevice, t: float, out: Any) -> int:
        return self._gpm_support(mig.parent, t, out)

    @_nvml("nvmlGpmMetricsGet", device=False)
    def _gpm_metrics_get(self, arg: Any) -> int:
        request = _target(arg)
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            return ARGUMENT_VERSION_MISMATCH
        with self._lock:
            first = _lookup(self._samples, _token(request.sample1))
            second = _lookup(self._samples, _token(request.sample2))
        if (
            first is None
            or second is None
            or first.device is None
            or (first.device, first.gpu_instance) != (second.device, second.gpu_instance)
        ):
            return INVALID_ARGUMENT
        if request.numMetrics > len(request.metrics):
            return INVALID_ARGUMENT
        dev = self._devices[first.device]
        t = self.clock()
        if self._lost(dev.index, t):
            return GPU_IS_LOST
        for slot in request.metrics[: request.numMetrics]:
            if first.gpu_instance is not None and slot.metricId not in _GPM_INSTANCE_METRICS:
                rc, value = NOT_SUPPORTED, 0.0  # links and engines are the parent's
            else:
                rc, value = self._gpm_metric(dev, t, slot.metricId, first, second)
            slot.nvmlReturn, slot.value = rc, value
            short, unit = _GPM_INFO.get(slot.metricId, (None, None))
            slot.metricInfo.shortName = slot.metricInfo.longName = short
            slot.metricInfo.unit = unit
        return SUCCESS

    def _gpm_metric(
        self, dev: _Device, t: float, metric: int, first: _GpmSample, second: _GpmSample
    ) -> tuple[int, float]:
        dt = second.t - first.t
        if dt < 0.1:
            return INVALID_ARGUMENT, 0.0  # NVML needs >= 100 ms between samples (unverified code)
        read = _GPM_METRICS.get(metric)
        if read is None:
            return INVALID_ARGUMENT, 0.0
        rc, value = read(dev, first.totals, second.totals, dt)
        if rc == SUCCESS and self._fault_active("gpm_nan", dev, t, metric=metric):
            return SUCCESS, math.nan
        return rc, value


# ---------------------------------------------------------------------------------------------
# Helpers for values, fields and GPM


def _monotonic_since(start: float) -> Callable[[], float]:
    def clock() -> float:
        return time.monotonic() - start

    return clock


def _percent(ratio: float) -> int:
    return max(0, min(100, round(ratio * 100)))


def _ns(seconds: float) -> int:
    return int(seconds * 1e9) & _U64


def _wall_us() -> int:
    return int(time.time() * 1e6)


def _energy_mj(dev: _Device, t: float, totals: dict[str, float] | None = None) -> int:
    joules = (dev.totals(t) if totals is None else totals)["power_watts"]
    return int(joules * 1000) & _U64


def _fill_bitmask(words: Any, size: int, bits: tuple[int, ...]) -> None:
    for i in range(min(size, len(words))):
        words[i] = 0
    for bit in bits:
        if bit // 64 < min(size, len(words)):
            words[bit // 64] |= 1 << (bit % 64)


def _fill_event(event: Any, device_token: int, event_type: int, data: int) -> None:
    event.device = ctypes.cast(ctypes.c_void_p(device_token), pynvml.c_nvmlDevice_t)
    event.eventType = event_type
    event.eventData = data
    event.gpuInstanceId = _ALL_ONES_32
    event.computeInstanceId = _ALL_ONES_32


_UI = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
_ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
_UNION_MEMBER = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    _UI: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    _ULL: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}

_FieldResult = tuple[int, int, int | float]
_FieldReader = Callable[[_Device, float, dict[str, float], int], _FieldResult]


def _throttle_field(mask: int) -> _FieldReader:
    return lambda dev, t, totals, scope: (SUCCESS, _ULL, _ns(totals[_mask_key(mask)]))


def _gauge_field(quantity: str, value_type: int = _UI, scale: float = 1.0) -> _FieldReader:
    return lambda dev, t, totals, scope: (
        SUCCESS,
        value_type,
        round(dev.value(quantity, t) * scale),
    )


def _flag_field(quantity: str) -> _FieldReader:
    return lambda dev, t, totals, scope: (SUCCESS, _UI, int(dev.value(quantity, t) >= 0.5))


def _nvlink_field(quantity: str, raw: bool) -> _FieldReader:
    """Cumulative KiB, per link (scopeId) or summed over links (scopeId 0xFFFFFFFF)."""

    def read(dev: _Device, t: float, totals: dict[str, float], scope: int) -> _FieldResult:
        links = dev.spec.nvlink_links
        if scope != _ALL_ONES_32 and scope >= links:
            return INVALID_ARGUMENT, 0, 0
        kib = totals[quantity] / _KIB * (_RAW_OVERHEAD if raw else 1.0)
        share = kib if scope == _ALL_ONES_32 else kib / links
        return SUCCESS, _ULL, int(share) & _U64

    return read


def _bytes_field(quantity: str) -> _FieldReader:
    return lambda dev, t, totals, scope: (SUCCESS, _ULL, int(totals[quantity]) & _U64)


def _energy_field(dev: _Device, t: float, totals: dict[str, float], scope: int) -> _FieldResult:
    return SUCCESS, _ULL, _energy_mj(dev, t, totals)


def _link_count_field(dev: _Device, t: float, totals: dict[str, float], scope: int) -> _FieldResult:
    return SUCCESS, _UI, dev.spec.nvlink_links


def _recovery_action_field(
    dev: _Device, t: float, totals: dict[str, float], scope: int
) -> _FieldResult:
    """nvmlDeviceGpuRecoveryAction_t as an unsigned int (its valueType assumed, not verified)."""
    return SUCCESS, _UI, int(dev.value("recovery_action", t)) & _ALL_ONES_32


# field id -> (feature, reader); ids are pynvml's NVML_FI_DEV_* values.
_FIELDS: dict[int, tuple[str, _FieldReader]] = {
    3: ("ecc", _gauge_field("ecc_corrected_total", _ULL)),  # ECC_SBE_VOL_TOTAL
    4: ("ecc", _gauge_field("ecc_uncorrected_total", _ULL)),  # ECC_DBE_VOL_TOTAL
    5: ("ecc", _gauge_field("ecc_corrected_aggregate_total", _ULL)),  # ECC_SBE_AGG_TOTAL
    6: ("ecc", _gauge_field("ecc_uncorrected_aggregate_total", _ULL)),  # ECC_DBE_AGG_TOTAL
    # NVLINK_*_ERROR_COUNT_TOTAL: summed over all links by the driver (no per-link scope).
    38: ("nvlink", _gauge_field("nvlink_crc_flit_errors_total", _ULL)),
    45: ("nvlink", _gauge_field("nvlink_crc_data_errors_total", _ULL)),
    52: ("nvlink", _gauge_field("nvlink_replay_errors_total", _ULL)),
    59: ("nvlink", _gauge_field("nvlink_recovery_errors_total", _ULL)),
    82: ("memory_temperature", _gauge_field("memory_temperature_celsius")),
    83: ("energy", _energy_field),  # TOTAL_ENERGY_CONSUMPTION (mJ)
    91: ("nvlink", _link_count_field),
    94: ("pcie_replay", _gauge_field("pcie_replay_total")),
    138: ("nvlink", _nvlink_field("nvlink_tx_bytes_per_second", raw=False)),
    139: ("nvlink", _nvlink_field("nvlink_rx_bytes_per_second", raw=False)),
    140: ("nvlink", _nvlink_field("nvlink_tx_bytes_per_second", raw=True)),
    141: ("nvlink", _nvlink_field("nvlink_rx_bytes_per_second", raw=True)),
    142: ("remapped_rows", _gauge_field("remapped_rows_correctable")),
    143: ("remapped_rows", _gauge_field("remapped_rows_uncorrectable")),
    144: ("remapped_rows", _flag_field("row_remap_pending")),
    145: ("remapped_rows", _flag_field("row_remap_failure")),
    185: ("power", _gauge_field("power_watts", _UI, 1000)),  # POWER_AVERAGE (mW)
    186: ("power", _gauge_field("power_watts", _UI, 1000)),  # POWER_INSTANT (mW)
    191: ("energy", _energy_field),  # NVML_FI_DEV_ENERGY (mJ)
    197: ("pcie_counters", _bytes_field("pcie_tx_bytes_per_second")),
    198: ("pcie_counters", _bytes_field("pcie_rx_bytes_per_second")),
    RECOVERY_ACTION_FIELD: ("recovery_action", _recovery_action_field),  # 230
} | {
    field_id: ("throttle_time", _throttle_field(mask)) for field_id, mask in THROTTLE_FIELDS.items()
}

_GpmReader = Callable[[_Device, dict[str, float], dict[str, float], float], tuple[int, float]]


def _gpm_percent(quantity: str | None) -> _GpmReader:
    def read(
        dev: _Device, a: dict[str, float], b: dict[str, float], dt: float
    ) -> tuple[int, float]:
        if quantity is None:
            return SUCCESS, 0.0
        return SUCCESS, max(0.0, min(100.0, 100.0 * (b[quantity] - a[quantity]) / dt))

    return read


def _gpm_rate(quantity: str, nvlink: bool, link: int | None = None) -> _GpmReader:
    """MiB/s over the window; NVLink per link = an even share of the whole GPU's traffic."""

    def read(
        dev: _Device, a: dict[str, float], b: dict[str, float], dt: float
    ) -> tuple[int, float]:
        links = dev.spec.nvlink_links
        if nvlink and (not dev.spec.supports("nvlink") or (link is not None and link >= links)):
            return NOT_SUPPORTED, 0.0
        rate = max(0.0, (b[quantity] - a[quantity]) / dt / _MIB)
        return SUCCESS, rate / links if link is not None else rate

    return read


def _gpm_hmma(
    dev: _Device, a: dict[str, float], b: dict[str, float], dt: float
) -> tuple[int, float]:
    """HMMA: the tensor activity the IMMA and DFMA pipes do not account for (sim/activity.py)."""

    def delta(quantity: str) -> float:
        return b[quantity] - a[quantity]

    return SUCCESS, min(100.0, 100.0 * sim_activity.hmma_share(delta) / dt)


_DMMA_TENSOR_UTIL = pynvml.NVML_GPM_METRIC_DMMA_TENSOR_UTIL  # no activity quantity: always 0
# The activity metrics serve what the fake libdcgm serves for the same quantity.
_GPM_METRICS: dict[int, _GpmReader] = {
    **{
        activity.gpm_metric: _gpm_percent(quantity)
        for activity, quantity in sim_activity.QUANTITIES.items()
    },
    sim_activity.HMMA.gpm_metric: _gpm_hmma,
    _DMMA_TENSOR_UTIL: _gpm_percent(None),
    20: _gpm_rate("pcie_tx_bytes_per_second", nvlink=False),
    21: _gpm_rate("pcie_rx_bytes_per_second", nvlink=False),
    60: _gpm_rate("nvlink_rx_bytes_per_second", nvlink=True),
    61: _gpm_rate("nvlink_tx_bytes_per_second", nvlink=True),
}
for _link in range(18):  # NVML_GPM_METRIC_NVLINK_L{n}_RX/TX_PER_SEC = 62 + 2n / 63 + 2n
    _GPM_METRICS[62 + 2 * _link] = _gpm_rate("nvlink_rx_bytes_per_second", True, _link)
    _GPM_METRICS[63 + 2 * _link] = _gpm_rate("nvlink_tx_bytes_per_second", True, _link)

# Per GPU instance: the SM, tensor, DRAM and pipe activity.
_GPM_INSTANCE_METRICS = frozenset({*(a.gpm_metric for a in ACTIVITY), _DMMA_TENSOR_UTIL})

# metricInfo strings (kept alive here: the struct holds bare char pointers).
_GPM_INFO: dict[int, tuple[bytes, bytes]] = {
    getattr(pynvml, name): (
        name.removeprefix("NVML_GPM_METRIC_").encode(),
        b"MiB/s" if name.endswith("_PER_SEC") else b"%",
    )
    for name in dir(pynvml)
    if name.startswith("NVML_GPM_METRIC_") and getattr(pynvml, name) in _GPM_METRICS
}

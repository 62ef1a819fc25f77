"""A fake libdcgm (DCGM's C library, libdcgm.so.4) for the simulator, driven by a scenario.

`FakeDcgmLib` stands where `ctypes.CDLL("libdcgm.so.4")` would: its attributes are C function
pointers made with `ctypes.CFUNCTYPE(...)(impl)`, so a binding sets `argtypes`/`restype` on
them and calls them with ctypes objects, and real ctypes marshalling runs in between. Every
pointer parameter is declared `c_void_p` and read through the production binding's structure
definitions (gpu_exporter/collect/dcgm_api.py), whose return codes, versions, field types,
blank values and sizes it uses too; tests/test_fake_dcgm.py drives the fake through its own
copies of DCGM's headers, so a layout or version mistake in the binding shows there. A symbol
the scenario's `dcgm.missing_functions` names is not set: looking it up raises AttributeError,
as with CDLL.

One fake is one simulated node: this process's libdcgm, the node's nv-hostengine (standalone
connections) and at most one embedded host engine. It follows DCGM's documented semantics
(DCGM 4.6.0 dcgm_structs.h, dcgm_agent.h, dcgm_fields.h): return codes, struct versions
(`MAKE_DCGM_VERSION`), blank sentinels, groups and field groups, and, from DCGM 4.6.0's own
dcgmlib/src/DcgmApi.cpp, the process-wide `dcgmInit` flag, a `dcgmShutdown` that frees every
connection and the embedded host engine, and a second `dcgmStartEmbedded` that answers OK
without writing a handle; "the first update of the field will not occur until the next field
update cycle" and "DCGM will save BLANK values while profiling is paused".

Assumptions, not verified against a real DCGM:
- a watched field read before its first update cycle has status DCGM_ST_NO_DATA; a field no
  connection to that host engine watches has DCGM_ST_NOT_WATCHED (both with a blank value);
- samples fall exactly on the grid watch time + k * updateFreq (no jitter); only the latest is
  kept (maxKeepAge and maxKeepSamples are checked, not modelled);
- DCGM_FV_FLAG_LIVE_DATA reads the device fields (54, 57) live; profiling fields always come
  from the watches;
- a connection's groups, field groups and watches go with it (persistAfterDisconnect is not
  modelled); watches are the host engine's, so every connection to it reads them;
- `embedded: requires_root` refuses watches of profiling fields only (DCGM_ST_REQUIRES_ROOT);
- dcgmDisconnect of a dead connection answers DCGM_ST_CONNECTION_NOT_VALID and frees it;
  DCGM_OPERATION_MODE_MANUAL samples as AUTO (there is no dcgmUpdateAllFields here);
- profiling is paused node-wide (a `dcgm_paused` fault, or dcgmProfPause through any handle);
- group types other than DEFAULT / DEFAULT_EVERYTHING make empty groups (no NVSwitches, no MIG
  entities); entities other than whole GPUs and GPU instances are refused
  (DCGM_ST_NOT_SUPPORTED);
- MIG (see "MIG" below): DCGM enumerates a GPU's GPU instances by profile, smallest first,
  then by GPU-instance id; the profiling module gives a GPU instance's own activity (the
  scenario instance's `values`); a GPU instance without a compute instance reads
  DCGM_ST_NO_DATA; a GPU's profiling fields read on a MIG-enabled GPU are its `values`, as
  without MIG.

MIG. dcgmGetGpuInstanceHierarchy lists the GPU instances of the MIG-enabled GPUs live now
(none with `dcgm.mig: requires_root`: DCGM reads MIG only as root), each followed by its
compute instances, numbered as DCGM 4.6.0 dcgmlib/src/DcgmCacheManager.cpp numbers them: a GPU
instance is entity `gpuId * maxGpcs + n` (n counting the GPU's instances in enumeration order,
maxGpcs = nvmlDeviceGetMaxMigDeviceCount), a compute instance `gpuId * maxGpcs + c` (c counting
the GPU's compute instances). The numbering is made again at every layout change, as DCGM does
on nvmlEventMigConfigChange, so after a reconfiguration an entity id may name another GPU
instance. Watches are by entity id (DcgmCacheManager's watch key), so a watch keeps sampling
whatever instance its entity id names; an entity id no instance has any longer keeps its last
sample (GetLatestSample returns what a watch has cached), and its timestamp stops. Fields that
exist only per GPU (PCIe, NVLink, the UUID) read on a GPU instance are its GPU's, as DCGM
remaps them to the parent GPU.

Every implementation catches every exception and answers DCGM_ST_GENERIC_ERROR (an exception
in a ctypes callback would otherwise be printed and answer 0, DCGM_ST_OK); `internal_errors`
keeps what was caught, so tests can assert there was none, and the log has its traceback, each
once until the function answers again (`failures` counts every one). The fake holds its lock
only for bookkeeping, never while a `dcgm_hang` fault sleeps.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpu_exporter.collect import dcgm_api as api
from gpu_exporter.model.dcgm_fields import FIELD_IDS
from gpu_exporter.sim import activity as sim_activity
from gpu_exporter.sim.mig import MigInstanceSpec
from gpu_exporter.sim.spec import (
    DcgmSpec,
    DeviceSpec,
    FaultSpec,
    Scenario,
    normalize_dcgm_address,
)

__all__ = ["FakeDcgmLib", "implemented_functions", "served_fields"]

log = logging.getLogger(__name__)

# dcgmReturn_t codes (dcgm_structs.h) the binding has no use for, and errorString's text for
# each code (the header's description of it).
ST_NOT_CONFIGURED = -5
ST_INSUFFICIENT_SIZE = -31
ST_GROUP_IS_EMPTY = -35
_MESSAGES: dict[int, bytes] = {
    api.ST_OK: b"Success",
    api.ST_BADPARAM: b"A bad parameter was passed to a function",
    api.ST_GENERIC_ERROR: b"A generic, unspecified error",
    ST_NOT_CONFIGURED: b"Setting not configured",
    api.ST_NOT_SUPPORTED: b"Feature not supported",
    api.ST_INIT_ERROR: b"DCGM Init error",
    api.ST_UNINITIALIZED: b"Object is in undefined state",
    api.ST_TIMEOUT: b"Requested operation timed out",
    api.ST_VER_MISMATCH: b"Version mismatch between received and understood API",
    api.ST_UNKNOWN_FIELD: b"Unknown field id",
    api.ST_NO_DATA: b"No data is available",
    api.ST_STALE_DATA: b"Data is considered stale",
    api.ST_NOT_WATCHED: b"The given field id is not being updated by the cache manager",
    api.ST_NO_PERMISSION: b"Do not have permission to perform the desired action",
    api.ST_CONNECTION_NOT_VALID: b"The connection to the host engine is not valid any longer",
    api.ST_REQUIRES_ROOT: b"This operation cannot be performed when the host engine is running "
    b"as non-root",
    ST_INSUFFICIENT_SIZE: b"An input argument is not large enough",
    api.ST_MODULE_NOT_LOADED: b"This request is serviced by a module of DCGM that is not "
    b"currently loaded",
    ST_GROUP_IS_EMPTY: b"This group is empty and the requested operation is not valid on an "
    b"empty group",
    api.ST_PROFILING_NOT_SUPPORTED: b"Profiling is not supported for this group of GPUs or GPU",
    api.ST_PROFILING_MULTI_PASS: b"The requested profiling metrics cannot be collected in a "
    b"single pass",
    api.ST_PAUSED: b"The hostengine and all modules are paused",
}

# dcgm_structs.h constants the binding has no use for
_OPERATION_MODE_MANUAL = 2
_OPERATION_MODES = frozenset({api.OPERATION_MODE_AUTO, _OPERATION_MODE_MANUAL})
_GROUP_DEFAULT, _GROUP_DEFAULT_EVERYTHING = 0, 5  # dcgmGroupType_t: all GPUs
_GROUP_TYPES = range(6)  # DEFAULT .. DEFAULT_EVERYTHING
GROUP_ALL_GPUS = 0x7FFFFFFF

# String blank values (dcgm_structs.h DCGM_BLANK_VALUES), and the offsets of a blank from its
# base (the binding's BLANK_NAMES, in order): + 1 not found, + 2 not supported, + 3 not
# permissioned.
_STR_BLANKS = (b"<<<NULL>>>", b"<<<NOT_FOUND>>>", b"<<<NOT_SUPPORTED>>>", b"<<<NOT_PERM>>>")
BLANK, NOT_FOUND_BLANK, NOT_SUPPORTED_BLANK = 0, 1, 2

# Profiling fields (DCGM_FI_PROF_*, the first activity field to the last per-link NVLink one):
# the profiling module's, paused together.
PROFILING_FIELDS = range(
    FIELD_IDS["DCGM_FI_PROF_GR_ENGINE_ACTIVE"], FIELD_IDS["DCGM_FI_PROF_NVLINK_L17_RX_BYTES"] + 1
)
# Served fields: id -> the scenario quantity (ratios 0..1, bytes/s). The activity fields serve
# what the fake NVML's GPM serves for the same quantity (sim/activity.py); HMMA is computed.
_RATIO_FIELDS: dict[int, str] = {
    activity.dcgm_field: quantity for activity, quantity in sim_activity.QUANTITIES.items()
}
_HMMA_FIELD = sim_activity.HMMA.dcgm_field
_BYTES_FIELDS: dict[int, str] = {
    FIELD_IDS["DCGM_FI_PROF_PCIE_TX_BYTES"]: "pcie_tx_bytes_per_second",
    FIELD_IDS["DCGM_FI_PROF_PCIE_RX_BYTES"]: "pcie_rx_bytes_per_second",
    FIELD_IDS["DCGM_FI_PROF_NVLINK_TX_BYTES"]: "nvlink_tx_bytes_per_second",
    FIELD_IDS["DCGM_FI_PROF_NVLINK_RX_BYTES"]: "nvlink_rx_bytes_per_second",
}
_NVLINK_FIELDS = frozenset(f for f, quantity in _BYTES_FIELDS.items() if "nvlink" in quantity)
_STRING_FIELDS: dict[int, Callable[[DeviceSpec], str]] = {
    FIELD_IDS["DCGM_FI_DEV_UUID"]: lambda dev: dev.uuid,
    FIELD_IDS["DCGM_FI_DEV_PCI_BUSID"]: lambda dev: dev.pci_bus_id,
}
_FIELD_TYPES: dict[int, int] = (
    dict.fromkeys(_RATIO_FIELDS, api.FT_DOUBLE)
    | {_HMMA_FIELD: api.FT_DOUBLE}
    | dict.fromkeys(_BYTES_FIELDS, api.FT_INT64)
    | dict.fromkeys(_STRING_FIELDS, api.FT_STRING)
)

# Tokens handed out; distinct ranges catch a group passed as a handle and the like.
_HANDLE_BASE, _GROUP_BASE, _FIELD_GROUP_BASE = 0x44430000, 0x47520000, 0x46470000

# dcgmConnectV2Params by version number: its layout and its whole version (MAKE_DCGM_VERSION).
_CONNECT_PARAMS: dict[int, tuple[type[ctypes.Structure], int]] = {
    1: (api.ConnectV2ParamsV1, api.CONNECT_V2_PARAMS_VERSION1),
    2: (api.ConnectV2ParamsV2, api.CONNECT_V2_PARAMS_VERSION2),
}

# The C prototypes as the fake declares them (dcgm_agent.h): (restype, argtypes). Handles are
# uintptr_t; enums are 4-byte ints; every pointer is c_void_p, read through the binding's
# structs (collect/dcgm_api.py).
_H = ctypes.c_size_t
_I, _U, _P = ctypes.c_int, ctypes.c_uint, ctypes.c_void_p
_PROTOTYPES: dict[str, tuple[Any, tuple[Any, ...]]] = {
    "dcgmInit": (_I, ()),
    "dcgmShutdown": (_I, ()),
    "dcgmStartEmbedded": (_I, (_I, _P)),
    "dcgmStopEmbedded": (_I, (_H,)),
    "dcgmConnect_v2": (_I, (_P, _P, _P)),
    "dcgmDisconnect": (_I, (_H,)),
    "dcgmGetAllSupportedDevices": (_I, (_H, _P, _P)),
    "dcgmGetGpuInstanceHierarchy": (_I, (_H, _P)),
    "dcgmGroupCreate": (_I, (_H, _I, _P, _P)),
    "dcgmGroupAddEntity": (_I, (_H, _H, _U, _U)),
    "dcgmGroupDestroy": (_I, (_H, _H)),
    "dcgmFieldGroupCreate": (_I, (_H, _I, _P, _P, _P)),
    "dcgmFieldGroupDestroy": (_I, (_H, _H)),
    "dcgmWatchFields": (_I, (_H, _H, _H, ctypes.c_longlong, ctypes.c_double, _I)),
    "dcgmUnwatchFields": (_I, (_H, _H, _H)),
    "dcgmEntitiesGetLatestValues": (_I, (_H, _P, _U, _P, _U, _U, _P)),
    "dcgmProfPause": (_I, (_H,)),
    "dcgmProfResume": (_I, (_H,)),
    "errorString": (_P, (_I,)),  # const char *: the address of a buffer the fake keeps
}


def implemented_functions() -> frozenset[str]:
    """C symbols the fake provides (before a scenario's `dcgm.missing_functions`)."""
    return frozenset(_PROTOTYPES)


def served_fields() -> frozenset[int]:
    """Field ids the fake serves values for; others read DCGM_ST_UNKNOWN_FIELD."""
    return frozenset(_FIELD_TYPES)


# ---------------------------------------------------------------------------------------------
# Host-engine state


@dataclass
class _FieldGroup:
    name: str
    fields: tuple[int, ...]


@dataclass
class _Watch:
    since_us: int  # scenario time of dcgmWatchFields
    every_us: int  # updateFreq

    def latest_us(self, now_us: int) -> int | None:
        """The most recent update time since + k * every <= now (k >= 1); None before it."""
        k = (now_us - self.since_us) // self.every_us
        return self.since_us + k * self.every_us if k >= 1 else None


_Entity = tuple[int, int]  # (entity group, entity id)
_Key = tuple[int, int, int]  # (entity group, entity id, field id)


@dataclass
class _Connection:
    """A handle's state: standalone (`life` = the host engine's life it was made in) or the
    embedded engine."""

    embedded: bool
    life: int = 0
    groups: dict[int, list[_Entity]] = field(default_factory=dict)  # group -> its entities
    field_groups: dict[int, _FieldGroup] = field(default_factory=dict)
    # (group, field group) -> its watches
    watches: dict[tuple[int, int], dict[_Key, _Watch]] = field(default_factory=dict)


@dataclass(frozen=True)
class _MigRow:
    """One row of the MIG hierarchy: a GPU instance (compute_instance None) or one of its
    compute instances."""

    entity: _Entity
    parent: _Entity
    device: DeviceSpec
    instance: MigInstanceSpec
    compute_instance: int | None = None


_NO_ID = 0xFFFFFFFF  # dcgmMigEntityInfo_t's -1 in an unsigned int: "GPU Instance entities"


@dataclass(frozen=True)
class _Reading:
    status: int
    field_type: int
    value: float | int | bytes  # by field_type
    ts_us: int | None = None  # scenario microseconds of the sample; None: no sample


_Impl = TypeVar("_Impl", bound=Callable[..., Any])
_IMPLS: dict[str, Callable[..., Any]] = {}


def _c(name: str) -> Callable[[_Impl], _Impl]:
    """Register the implementation of C symbol `name`."""

    def register(impl: _Impl) -> _Impl:
        _IMPLS[name] = impl
        return impl

    return register


def _text(address: int | None) -> str | None:
    return None if not address else ctypes.string_at(address).decode(errors="replace")


def _store(address: int, ctype: Any, value: int) -> None:
    ctype.from_address(address).value = value


def _blank(field_type: int, offset: int) -> float | int | bytes:
    if field_type == api.FT_DOUBLE:
        return api.FP64_BLANK + offset
    if field_type == api.FT_STRING:
        return _STR_BLANKS[offset]
    return api.INT64_BLANK + offset


# ---------------------------------------------------------------------------------------------
# The library


class FakeDcgmLib:
    """Fake `libdcgm.so.4` for one simulated node (see the module docstring).

    `clock()` returns scenario seconds (pass the fake NVML's, so both agree; by default
    monotonic seconds since construction); `call_counts` counts calls per C symbol;
    `pause()`/`resume()` pause profiling as another tool would (dcgmProfPause).
    """

    def __init__(self, scenario: Scenario, clock: Callable[[], float] | None = None) -> None:
        if scenario.dcgm is None:
            raise ValueError(f"scenario {scenario.name!r} has no `dcgm:` section")
        self.scenario = scenario
        self.spec: DcgmSpec = scenario.dcgm
        start = time.monotonic()
        self.clock: Callable[[], float] = clock or (lambda: time.monotonic() - start)
        self.call_counts: Counter[str] = Counter()
        # What was caught, once per change (a function that starts failing, or fails
        # otherwise): `failures` counts every time.
        self.internal_errors: list[str] = []
        self.failures: Counter[str] = Counter()
        self._failing: dict[str, str] = {}  # function -> what it last failed with
        self._epoch_us = round(time.time() * 1e6)  # ts = this + scenario time
        self._lock = threading.Lock()
        self._initialised = False
        self._connections: dict[int, _Connection] = {}
        self._tokens = itertools.count(1)
        self._pauses: list[list[int | None]] = []  # [from_us, until_us or None], node-wide
        self._devices = {dev.index: dev for dev in scenario.devices}
        faults = [f for f in scenario.faults if f.kind.startswith("dcgm_")]
        self._down = [f for f in faults if f.kind == "dcgm_down"]
        self._blanks = [f for f in faults if f.kind == "dcgm_blank"]
        self._paused_faults = [f for f in faults if f.kind == "dcgm_paused"]
        self._hangs = [f for f in faults if f.kind == "dcgm_hang"]
        self._messages = {code: ctypes.create_string_buffer(msg) for code, msg in _MESSAGES.items()}
        self._callbacks: dict[str, Any] = {}  # kept: ctypes frees a thunk with its object
        for name, (restype, argtypes) in _PROTOTYPES.items():
            if name in self.spec.missing_functions:
                continue
            pointer = ctypes.CFUNCTYPE(restype, *argtypes)(self._entry(name))
            self._callbacks[name] = pointer
            setattr(self, name, pointer)

    # -- Python-side controls ------------------------------------------------------------------

    def pause(self) -> None:
        """Pause profiling node-wide, as dcgmProfPause (or nsight, through it) would."""
        with self._lock:
            self._pause(self._now_us())

    def resume(self) -> None:
        with self._lock:
            self._resume(self._now_us())

    @property
    def paused(self) -> bool:
        with self._lock:
            return self._profiling_paused(self._now_us())

    # -- dispatch ------------------------------------------------------------------------------

    def _entry(self, name: str) -> Callable[..., Any]:
        impl = _IMPLS[name]
        failed: int | None = None if name == "errorString" else api.ST_GENERIC_ERROR

        def entry(*args: Any) -> Any:
            try:
                with self._lock:
                    self.call_counts[name] += 1
                self._hang(name)
                answer = impl(self, *args)
            except BaseException as exc:  # a callback must answer, never raise (docstring)
                self._failed(name, exc)
                return failed
            if name in self._failing:
                with self._lock:
                    self._failing.pop(name, None)  # answers again: a new failure is news
            return answer

        entry.__name__ = name
        return entry

    def _failed(self, name: str, exc: BaseException) -> None:
        """Logged with its traceback when the function starts failing or fails otherwise, not
        at every call: the daemon calls each function every tick, and a fault that persists
        (a value the scenario should not allow) would fill the log."""
        what = f"{name}: {exc!r}"
        with self._lock:
            self.failures[name] += 1
            news = self._failing.get(name) != what
            self._failing[name] = what
            if news:
                self.internal_errors.append(what)
        if news:
            log.error("fake libdcgm: %s failed (logged once until it answers)", name, exc_info=exc)

    def _hang(self, name: str) -> None:
        """dcgm_hang: sleep `duration` real seconds, no lock held, then answer normally."""
        t = self.clock()
        for fault in self._hangs:
            if fault.function == name and fault.active(t):
                time.sleep(fault.duration)

    def _now_us(self) -> int:
        return round(self.clock() * 1e6)

    def _new_token(self, base: int) -> int:
        return base + next(self._tokens)

    # -- host engine life ----------------------------------------------------------------------

    def _host_engine_up(self, t: float) -> bool:
        return self.spec.host_engine_running and not any(f.active(t) for f in self._down)

    def _life(self, t: float) -> int:
        """Which life of nv-hostengine this is: each `dcgm_down` begun restarts it."""
        return sum(1 for f in self._down if t >= f.at)

    def _alive(self, conn: _Connection, t: float) -> bool:
        return conn.embedded or (self._host_engine_up(t) and conn.life == self._life(t))

    def _connection(self, handle: int, t: float) -> tuple[int, _Connection | None]:
        """(OK, its state) or the return code for a call on `handle` (caller holds the lock)."""
        if not self._initialised:
            return api.ST_UNINITIALIZED, None
        conn = self._connections.get(handle)
        if conn is None:
            return api.ST_BADPARAM, None
        if not self._alive(conn, t):
            return api.ST_CONNECTION_NOT_VALID, None
        return api.ST_OK, conn

    def _peers(self, conn: _Connection, t: float) -> list[_Connection]:
        """The live connections to the same host engine as `conn` (its watches are shared)."""
        return [
            other
            for other in self._connections.values()
            if other.embedded == conn.embedded and self._alive(other, t)
        ]

    # -- profiling pause -----------------------------------------------------------------------

    def _pause(self, now_us: int) -> None:
        if not self._pauses or self._pauses[-1][1] is not None:
            self._pauses.append([now_us, None])

    def _resume(self, now_us: int) -> None:
        if self._pauses and self._pauses[-1][1] is None:
            self._pauses[-1][1] = now_us

    def _profiling_paused(self, t_us: int) -> bool:
        t = t_us / 1e6
        if any(f.active(t) for f in self._paused_faults):
            return True
        return any(
            start is not None and start <= t_us and (end is None or t_us < end)
            for start, end in self._pauses
        )

    # -- lifecycle -----------------------------------------------------------------------------

    # DCGM 4.6.0 dcgmlib/src/DcgmApi.cpp: dcgmInit only sets a process-wide flag (a second call
    # is a no-op, not counted), and dcgmShutdown, called uninitialised, answers OK; otherwise it
    # frees every remote connection and cleans up the embedded host engine.
    @_c("dcgmInit")
    def _init(self) -> int:
        with self._lock:
            self._initialised = True
        return api.ST_OK

    @_c("dcgmShutdown")
    def _shutdown(self) -> int:
        with self._lock:
            if self._initialised:
                self._initialised = False
                self._connections.clear()
        return api.ST_OK

    @_c("errorString")
    def _error_string(self, code: int) -> int | None:
        buffer = self._messages.get(code)
        return None if buffer is None else ctypes.addressof(buffer)

    @_c("dcgmStartEmbedded")
    def _start_embedded(self, mode: int, out: int | None) -> int:
        if out is None or mode not in _OPERATION_MODES:
            return api.ST_BADPARAM
        with self._lock:
            if not self._initialised:
                return api.ST_UNINITIALIZED
            if any(conn.embedded for conn in self._connections.values()):
                # DcgmApi.cpp: "host engine was already running": OK, and no handle written.
                return api.ST_OK
            handle = self._new_token(_HANDLE_BASE)
            self._connections[handle] = _Connection(embedded=True)
        _store(out, _H, handle)
        return api.ST_OK

    @_c("dcgmStopEmbedded")
    def _stop_embedded(self, handle: int) -> int:
        with self._lock:
            if not self._initialised:
                return api.ST_UNINITIALIZED
            conn = self._connections.get(handle)
            if conn is None or not conn.embedded:
                return api.ST_BADPARAM
            del self._connections[handle]
        return api.ST_OK

    @_c("dcgmConnect_v2")
    def _connect(self, address_p: int | None, params_p: int | None, out: int | None) -> int:
        if address_p is None or params_p is None or out is None:
            return api.ST_BADPARAM
        rc, unix = self._connect_params(params_p)
        if rc != api.ST_OK:
            return rc
        address = normalize_dcgm_address(_text(address_p) or "", unix)
        if address is None:
            return api.ST_BADPARAM
        t = self.clock()
        with self._lock:
            if not self._initialised:
                return api.ST_UNINITIALIZED
            wanted = self.spec.address
            if not self._host_engine_up(t) or (wanted is not None and address != wanted):
                return api.ST_CONNECTION_NOT_VALID
            handle = self._new_token(_HANDLE_BASE)
            self._connections[handle] = _Connection(embedded=False, life=self._life(t))
        _store(out, _H, handle)
        return api.ST_OK

    def _connect_params(self, params_p: int) -> tuple[int, bool]:
        """(OK, address is a unix socket) or (VER_MISMATCH, _) for a version not accepted."""
        version = ctypes.c_uint.from_address(params_p).value
        number = version >> 24
        known = _CONNECT_PARAMS.get(number)
        if known is None or number not in self.spec.connect_params_versions:
            return api.ST_VER_MISMATCH, False
        struct, expected = known
        if version != expected:
            return api.ST_VER_MISMATCH, False
        params = struct.from_address(params_p)
        return api.ST_OK, bool(getattr(params, "addressIsUnixSocket", 0))

    @_c("dcgmDisconnect")
    def _disconnect(self, handle: int) -> int:
        t = self.clock()
        with self._lock:
            conn = self._connections.get(handle)
            if conn is not None and conn.embedded:
                return api.ST_BADPARAM
            rc, _ = self._connection(handle, t)
            if conn is not None and rc in (api.ST_OK, api.ST_CONNECTION_NOT_VALID):
                del self._connections[handle]  # freed client-side, even when dead
        return rc

    # -- discovery and groups ------------------------------------------------------------------

    @_c("dcgmGetAllSupportedDevices")
    def _supported_devices(self, handle: int, ids_p: int | None, count_p: int | None) -> int:
        with self._lock:
            rc, _ = self._connection(handle, self.clock())
        if rc != api.ST_OK:
            return rc
        if ids_p is None or count_p is None:
            return api.ST_BADPARAM
        ids = sorted(self._devices)[: api.MAX_NUM_DEVICES]
        out = (ctypes.c_uint * api.MAX_NUM_DEVICES).from_address(ids_p)
        for i, gpu in enumerate(ids):
            out[i] = gpu
        _store(count_p, ctypes.c_int, len(ids))
        return api.ST_OK

    @_c("dcgmGetGpuInstanceHierarchy")
    def _hierarchy(self, handle: int, out: int | None) -> int:
        t = self.clock()
        with self._lock:
            rc, _ = self._connection(handle, t)
        if rc != api.ST_OK:
            return rc
        if out is None:
            return api.ST_BADPARAM
        hierarchy = api.MigHierarchyV2.from_address(out)
        if hierarchy.version != api.MIG_HIERARCHY_VERSION2:
            return api.ST_VER_MISMATCH
        rows = self._mig_rows(t)
        if len(rows) > api.MAX_HIERARCHY_INFO:
            return ST_INSUFFICIENT_SIZE
        ctypes.memset(
            ctypes.addressof(hierarchy.entityList), 0, ctypes.sizeof(hierarchy.entityList)
        )
        hierarchy.count = len(rows)
        for out_row, row in zip(hierarchy.entityList, rows, strict=False):
            out_row.entity = api.GroupEntityPair(*row.entity)
            out_row.parent = api.GroupEntityPair(*row.parent)
            info = out_row.info
            info.gpuUuid = row.device.uuid.encode()[: api.GPU_UUID_LENGTH - 1]
            info.nvmlGpuIndex = row.device.index
            info.nvmlInstanceId = row.instance.gpu_instance
            ci = row.compute_instance
            info.nvmlComputeInstanceId = _NO_ID if ci is None else ci
            info.nvmlMigProfileId = 0  # NVML's profile id: not modelled
            slices = row.instance.profile.gpu_slices if ci is None else row.instance.compute_slices
            info.nvmlProfileSlices = slices
        return api.ST_OK

    def _mig_rows(self, t: float) -> list[_MigRow]:
        """The MIG hierarchy at scenario time `t` (module docstring, "MIG")."""
        if not self.spec.mig_visible:
            return []
        rows = []
        for index in sorted(self._devices):
            dev = self._devices[index]
            if dev.mig is None:
                continue
            base = index * dev.mig.max_devices
            gpu: _Entity = (api.FE_GPU, index)
            ci_count = 0
            order = sorted(dev.mig.live(t), key=lambda i: (i.profile.gpu_slices, i.gpu_instance))
            for n, instance in enumerate(order):
                gi: _Entity = (api.FE_GPU_I, base + n)
                rows.append(_MigRow(gi, gpu, dev, instance))
                for ci in range(instance.compute_instances):
                    entity = (api.FE_GPU_CI, base + ci_count)
                    rows.append(_MigRow(entity, gi, dev, instance, ci))
                    ci_count += 1
        return rows

    def _gpu_instance(self, entity: int, t: float) -> tuple[DeviceSpec, MigInstanceSpec] | None:
        """The GPU instance with this entity id at scenario time `t`, with its GPU."""
        for row in self._mig_rows(t):
            if row.entity == (api.FE_GPU_I, entity):
                return row.device, row.instance
        return None

    @_c("dcgmGroupCreate")
    def _group_create(self, handle: int, kind: int, name_p: int | None, out: int | None) -> int:
        if not _text(name_p) or out is None or kind not in _GROUP_TYPES:
            return api.ST_BADPARAM
        everything = kind in (_GROUP_DEFAULT, _GROUP_DEFAULT_EVERYTHING)
        with self._lock:
            rc, conn = self._connection(handle, self.clock())
            if conn is None:
                return rc
            group = self._new_token(_GROUP_BASE)
            gpus = [(api.FE_GPU, gpu) for gpu in sorted(self._devices)]
            conn.groups[group] = gpus if everything else []
        _store(out, _H, group)
        return api.ST_OK

    @_c("dcgmGroupAddEntity")
    def _group_add(self, handle: int, group: int, entity_group: int, entity: int) -> int:
        t = self.clock()
        with self._lock:
            rc, conn = self._connection(handle, t)
            if conn is None:
                return rc
            members = conn.groups.get(group)
            if members is None:
                return ST_NOT_CONFIGURED
            if entity_group == api.FE_GPU:
                exists = entity in self._devices
            elif entity_group == api.FE_GPU_I:
                exists = self._gpu_instance(entity, t) is not None
            else:
                return api.ST_NOT_SUPPORTED  # no compute instance, vGPU or NVSwitch entities
            # DcgmGroupManager.inl AddEntityToGroup: an entity that is not there, or is in the
            # group already, is a bad parameter.
            if not exists or (entity_group, entity) in members:
                return api.ST_BADPARAM
            members.append((entity_group, entity))
        return api.ST_OK

    @_c("dcgmGroupDestroy")
    def _group_destroy(self, handle: int, group: int) -> int:
        with self._lock:
            rc, conn = self._connection(handle, self.clock())
            if conn is None:
                return rc
            # dcgm_agent.h: what was applied to the group stays (its watches too).
            return api.ST_OK if conn.groups.pop(group, None) is not None else ST_NOT_CONFIGURED

    @_c("dcgmFieldGroupCreate")
    def _field_group_create(
        self, handle: int, count: int, ids_p: int | None, name_p: int | None, out: int | None
    ) -> int:
        name = _text(name_p)
        if not 1 <= count <= api.MAX_FIELD_IDS_PER_FIELD_GROUP or ids_p is None:
            return api.ST_BADPARAM
        if not name or out is None:
            return api.ST_BADPARAM
        fields = tuple((ctypes.c_ushort * count).from_address(ids_p))
        t = self.clock()
        with self._lock:
            rc, conn = self._connection(handle, t)
            if conn is None:
                return rc
            taken = {g.name for peer in self._peers(conn, t) for g in peer.field_groups.values()}
            if name in taken:
                return api.ST_BADPARAM  # dcgm_agent.h: unique per host engine
            token = self._new_token(_FIELD_GROUP_BASE)
            conn.field_groups[token] = _FieldGroup(name, fields)
        _store(out, _H, token)
        return api.ST_OK

    @_c("dcgmFieldGroupDestroy")
    def _field_group_destroy(self, handle: int, field_group: int) -> int:
        with self._lock:
            rc, conn = self._connection(handle, self.clock())
            if conn is None:
                return rc
            return (
                api.ST_OK
                if conn.field_groups.pop(field_group, None) is not None
                else api.ST_BADPARAM
            )

    # -- watches -------------------------------------------------------------------------------

    @_c("dcgmWatchFields")
    def _watch(
        self,
        handle: int,
        group: int,
        field_group: int,
        every_us: int,
        keep_age: float,
        keep_samples: int,
    ) -> int:
        now_us = self._now_us()
        with self._lock:
            rc, conn = self._connection(handle, now_us / 1e6)
            if conn is None:
                return rc
            if group == GROUP_ALL_GPUS:
                entities: list[_Entity] | None = [(api.FE_GPU, g) for g in sorted(self._devices)]
            else:
                entities = conn.groups.get(group)
            fields = conn.field_groups.get(field_group)
            if entities is None or fields is None or every_us <= 0:
                return api.ST_BADPARAM
            if keep_age < 0 or keep_samples < 0:
                return api.ST_BADPARAM
            rc = self._refusal(conn, fields.fields)
            if rc != api.ST_OK:
                return rc
            if not entities:
                return ST_GROUP_IS_EMPTY
            old = conn.watches.get((group, field_group), {})
            # Watching again keeps the samples' schedule: DCGM keeps a watched field's cache.
            keys = [(group_id, entity, f) for group_id, entity in entities for f in fields.fields]
            conn.watches[(group, field_group)] = {
                key: _Watch(old[key].since_us if key in old else now_us, every_us) for key in keys
            }
        return api.ST_OK

    def _refusal(self, conn: _Connection, fields: tuple[int, ...]) -> int:
        """Why the host engine refuses to watch these fields, or OK."""
        if not any(f in PROFILING_FIELDS for f in fields):
            return api.ST_OK
        if not self.spec.profiling_module_loaded:
            return api.ST_MODULE_NOT_LOADED
        if conn.embedded and self.spec.embedded_requires_root:
            return api.ST_REQUIRES_ROOT
        return api.ST_OK

    @_c("dcgmUnwatchFields")
    def _unwatch(self, handle: int, group: int, field_group: int) -> int:
        with self._lock:
            rc, conn = self._connection(handle, self.clock())
            if conn is None:
                return rc
            known_group = group == GROUP_ALL_GPUS or group in conn.groups
            if not known_group or field_group not in conn.field_groups:
                return api.ST_BADPARAM
            conn.watches.pop((group, field_group), None)
        return api.ST_OK

    @_c("dcgmProfPause")
    def _prof_pause(self, handle: int) -> int:
        return self._pause_call(handle, self._pause)

    @_c("dcgmProfResume")
    def _prof_resume(self, handle: int) -> int:
        return self._pause_call(handle, self._resume)

    def _pause_call(self, handle: int, change: Callable[[int], None]) -> int:
        now_us = self._now_us()
        with self._lock:
            rc, _ = self._connection(handle, now_us / 1e6)
            if rc == api.ST_OK:
                change(now_us)
        return rc

    # -- values --------------------------------------------------------------------------------

    @_c("dcgmEntitiesGetLatestValues")
    def _latest_values(
        self,
        handle: int,
        entities_p: int | None,
        entity_count: int,
        fields_p: int | None,
        field_count: int,
        flags: int,
        values_p: int | None,
    ) -> int:
        if not entities_p or not fields_p or not values_p or not entity_count or not field_count:
            return api.ST_BADPARAM
        entities = (api.GroupEntityPair * entity_count).from_address(entities_p)
        fields = tuple((ctypes.c_ushort * field_count).from_address(fields_p))
        records = (api.FieldValueV2 * (entity_count * field_count)).from_address(values_p)
        now_us = self._now_us()
        with self._lock:
            rc, conn = self._connection(handle, now_us / 1e6)
            if conn is None:
                return rc
            watches = self._watch_index(self._peers(conn, now_us / 1e6))
        live = bool(flags & api.FV_FLAG_LIVE_DATA)
        for i, entity in enumerate(entities):
            for j, field_id in enumerate(fields):
                key = (entity.entityGroupId, entity.entityId, field_id)
                reading = self._reading(key, watches, live, now_us)
                self._write(records[i * field_count + j], entity, field_id, reading)
        return api.ST_OK

    @staticmethod
    def _watch_index(peers: list[_Connection]) -> dict[_Key, list[_Watch]]:
        index: dict[_Key, list[_Watch]] = {}
        for conn in peers:
            for watched in conn.watches.values():
                for key, watch in watched.items():
                    index.setdefault(key, []).append(watch)
        return index

    def _reading(
        self, key: _Key, watches: dict[_Key, list[_Watch]], live: bool, now_us: int
    ) -> _Reading:
        entity_group, entity, field_id = key
        field_type = _FIELD_TYPES.get(field_id)
        if field_type is None:
            return _Reading(api.ST_UNKNOWN_FIELD, api.FT_INT64, api.INT64_BLANK)
        blank = _blank(field_type, BLANK)
        if entity_group not in (api.FE_GPU, api.FE_GPU_I):
            return _Reading(api.ST_NOT_SUPPORTED, field_type, blank)  # GPUs and GPU instances
        if entity_group == api.FE_GPU:
            dev = self._devices.get(entity)
            if dev is None:
                return _Reading(api.ST_BADPARAM, field_type, blank)
            if live and field_id in _STRING_FIELDS:
                sample = self._sample(dev, field_id, now_us)
                return _Reading(api.ST_OK, field_type, sample, now_us)
        if key not in watches:
            return _Reading(api.ST_NOT_WATCHED, field_type, blank)
        updates = [u for w in watches[key] if (u := w.latest_us(now_us)) is not None]
        if not updates:
            return _Reading(api.ST_NO_DATA, field_type, blank)  # before the first update cycle
        at = max(updates)
        if entity_group == api.FE_GPU:
            return _Reading(
                api.ST_OK, field_type, self._sample(self._devices[entity], field_id, at), at
            )
        return self._instance_reading(entity, field_id, watches[key], at)

    def _instance_reading(
        self, entity: int, field_id: int, watches: list[_Watch], at: int
    ) -> _Reading:
        """A GPU instance's watched value: sampled at `at` from the instance that has this
        entity id then, or, if none has, the last sample taken while one had (module
        docstring, "MIG")."""
        field_type = _FIELD_TYPES[field_id]
        found = self._gpu_instance(entity, at / 1e6)
        if found is None:
            earlier = self._last_alive(entity, watches, at)
            if earlier is None:
                return _Reading(api.ST_NO_DATA, field_type, _blank(field_type, BLANK))
            at, found = earlier
        dev, instance = found
        if not instance.compute_instances:  # DcgmGpmManager.cpp: "No data available"
            return _Reading(api.ST_NO_DATA, field_type, _blank(field_type, BLANK))
        return _Reading(api.ST_OK, field_type, self._sample(dev, field_id, at, instance), at)

    def _last_alive(
        self, entity: int, watches: list[_Watch], at: int
    ) -> tuple[int, tuple[DeviceSpec, MigInstanceSpec]] | None:
        """The latest update time before `at` at which an instance had this entity id, with
        that instance; None if none had it since the watch began."""
        changes = sorted(
            {round(c * 1e6) for dev in self._devices.values() for c in _mig_changes(dev)}
        )
        for change in reversed([c for c in changes if c <= at]):
            times = [u for w in watches if (u := w.latest_us(change - 1)) is not None]
            if not times:
                return None
            before = max(times)
            found = self._gpu_instance(entity, before / 1e6)
            if found is not None:
                return before, found
        return None

    def _sample(
        self, dev: DeviceSpec, field_id: int, t_us: int, instance: MigInstanceSpec | None = None
    ) -> float | int | bytes:
        """The value the host engine sampled for this field of this GPU (or of this GPU
        instance of it) at scenario time `t_us`."""
        t = t_us / 1e6
        field_type = _FIELD_TYPES[field_id]
        profiling = field_id in PROFILING_FIELDS
        gpu_instance = None if instance is None else instance.gpu_instance
        if profiling and not dev.at_least("volta"):
            return _blank(field_type, NOT_SUPPORTED_BLANK)  # no profiling before Volta
        if any(self._blanked(f, dev, gpu_instance, field_id, t) for f in self._blanks):
            return _blank(field_type, BLANK)
        if profiling:
            with self._lock:
                if self._profiling_paused(t_us):
                    return _blank(field_type, BLANK)  # "DCGM will save BLANK values"
        if field_id in _STRING_FIELDS:
            return _STRING_FIELDS[field_id](dev).encode()
        if field_id in _NVLINK_FIELDS and not dev.supports("nvlink"):
            return _blank(field_type, NOT_SUPPORTED_BLANK)  # as GPM: no links, no metric
        if field_id in _BYTES_FIELDS:  # the GPU's own, on a GPU instance too
            return round(dev.value(_BYTES_FIELDS[field_id], t))

        def value(quantity: str) -> float:
            if instance is None:
                return dev.value(quantity, t)
            return instance.values[quantity].value_at(t)

        if field_id == _HMMA_FIELD:
            return min(1.0, sim_activity.hmma_share(value))
        return value(_RATIO_FIELDS[field_id])

    @staticmethod
    def _blanked(
        fault: FaultSpec, dev: DeviceSpec, gpu_instance: int | None, field_id: int, t: float
    ) -> bool:
        return (
            fault.device == dev.index
            and fault.gpu_instance == gpu_instance
            and fault.field == field_id
            and fault.active(t)
        )

    def _write(self, record: Any, entity: Any, field_id: int, reading: _Reading) -> None:
        ctypes.memset(ctypes.addressof(record), 0, ctypes.sizeof(record))
        record.version = api.FIELD_VALUE_VERSION2  # the library fills each value's version
        record.entityGroupId = entity.entityGroupId
        record.entityId = entity.entityId
        record.fieldId = field_id
        record.fieldType = reading.field_type
        record.status = reading.status
        record.ts = 0 if reading.ts_us is None else self._epoch_us + reading.ts_us
        value = reading.value
        if isinstance(value, bytes):
            record.value.str = value[: api.MAX_STR_LENGTH - 1]
        elif reading.field_type == api.FT_DOUBLE:
            record.value.dbl = float(value)
        else:
            record.value.i64 = int(value)


def _mig_changes(dev: DeviceSpec) -> tuple[float, ...]:
    """When `dev`'s MIG layout changes (DCGM numbers its GPU instances again each time)."""
    return dev.mig.changes() if dev.mig is not None and dev.mig.enabled else ()

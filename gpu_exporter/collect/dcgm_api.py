"""A small ctypes binding of libdcgm (DCGM's C API), written from NVIDIA's public headers.

Only what the DCGM source needs: start or connect, the MIG hierarchy, one group of GPUs and GPU
instances, one field group, a watch, and the latest values. Struct layouts, versions, return
codes and blank sentinels are those of `dcgmlib/dcgm_structs.h`, `dcgm_agent.h` and
`dcgm_fields.h` in github.com/NVIDIA/DCGM (DCGM 4.6.0); each definition below names its
header. NVIDIA ships its own Python bindings only inside the DCGM OS package (not on PyPI), so
the exporter binds the dozen calls itself and loads the library lazily: without libdcgm.so.4
nothing here is touched.

The simulator's fake libdcgm reads and writes these same structures and codes; the fake's
tests (tests/test_fake_dcgm.py) keep their own copies of the headers, so a layout or version
mistake here shows there. Verified against the headers and the simulator's fake libdcgm only;
no real DCGM has been run against this binding yet (no machine with DCGM is at hand in CI).
"""

from __future__ import annotations

import ctypes
import math
import platform
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_exporter.model.dcgm_fields import FIELD_IDS

# --- dcgm_structs.h: dcgmReturn_t ----------------------------------------------------------
ST_OK = 0
ST_BADPARAM = -1
ST_GENERIC_ERROR = -3
ST_NOT_SUPPORTED = -6
ST_INIT_ERROR = -7
ST_UNINITIALIZED = -10
ST_TIMEOUT = -11
ST_VER_MISMATCH = -12
ST_UNKNOWN_FIELD = -13
ST_NO_DATA = -14
ST_STALE_DATA = -15
ST_NOT_WATCHED = -16
ST_NO_PERMISSION = -17
ST_CONNECTION_NOT_VALID = -21
ST_REQUIRES_ROOT = -29
ST_MODULE_NOT_LOADED = -33
ST_PROFILING_NOT_SUPPORTED = -36
ST_PROFILING_MULTI_PASS = -38
ST_INSTANCE_NOT_FOUND = -45
ST_PAUSED = -54

# Short names for gpu_exporter_errors_total{error}, as NVML's are ("Timeout", "NotSupported").
STATUS_NAMES: dict[int, str] = {
    ST_OK: "Success",
    ST_BADPARAM: "BadParam",
    ST_GENERIC_ERROR: "GenericError",
    ST_NOT_SUPPORTED: "NotSupported",
    ST_INIT_ERROR: "InitError",
    ST_UNINITIALIZED: "Uninitialized",
    ST_TIMEOUT: "Timeout",
    ST_VER_MISMATCH: "VersionMismatch",
    ST_UNKNOWN_FIELD: "UnknownField",
    ST_NO_DATA: "NoData",
    ST_STALE_DATA: "StaleData",
    ST_NOT_WATCHED: "NotWatched",
    ST_NO_PERMISSION: "NoPermission",
    ST_CONNECTION_NOT_VALID: "ConnectionNotValid",
    ST_REQUIRES_ROOT: "RequiresRoot",
    ST_MODULE_NOT_LOADED: "ModuleNotLoaded",
    ST_PROFILING_NOT_SUPPORTED: "ProfilingNotSupported",
    ST_PROFILING_MULTI_PASS: "ProfilingMultiPass",
    ST_INSTANCE_NOT_FOUND: "InstanceNotFound",
    ST_PAUSED: "Paused",
}

# --- dcgm_structs.h: constants ---------------------------------------------------------------
OPERATION_MODE_AUTO = 1  # dcgmOperationMode_t: DCGM samples the watches itself
GROUP_EMPTY = 1  # dcgmGroupType_t
MAX_NUM_DEVICES = 32  # DCGM 2.0 and newer
MAX_FIELD_IDS_PER_FIELD_GROUP = 128
MAX_STR_LENGTH = 256
MAX_BLOB_LENGTH = 4096
# dcgmMigHierarchy_v2's capacity: DCGM_MAX_NUM_DEVICES * DCGM_MAX_TOTAL_INSTANCES_PER_GPU (14:
# at most 7 GPU instances and 7 compute instances per GPU).
MAX_HIERARCHY_INFO = MAX_NUM_DEVICES * 14
GPU_UUID_LENGTH = 128  # dcgmMigEntityInfo_t.gpuUuid
FV_FLAG_LIVE_DATA = 0x1  # dcgmEntitiesGetLatestValues: read the driver, not the cache
HOST_ENGINE_PORT = 5555  # DCGM_HE_PORT_NUMBER

# --- dcgm_fields.h ---------------------------------------------------------------------------
# dcgm_field_entity_group_t: NONE 0, GPU 1, VGPU 2, SWITCH 3, GPU_I 4, GPU_CI 5, LINK 6, ...
FE_GPU = 1
FE_GPU_I = 4  # a MIG GPU instance
FE_GPU_CI = 5  # a MIG compute instance
FT_DOUBLE = ord("d")
FT_INT64 = ord("i")
FT_STRING = ord("s")
FI_DEV_GPU_UUID = FIELD_IDS["DCGM_FI_DEV_UUID"]  # the GPU's UUID, a string (model/dcgm_fields.py)

# Blank values (dcgm_structs.h DCGM_BLANK_VALUES): a value at or above the base is no value;
# base + 1 "not found", + 2 "not supported", + 3 "not permissioned".
FP64_BLANK = 140737488355328.0  # 2**47
INT64_BLANK = 0x7FFFFFFFFFFFFFF0
BLANK_NAMES = ("Blank", "NotFound", "NotSupported", "NotPermissioned")


def make_version(struct: type[ctypes.Structure], version: int) -> int:
    """MAKE_DCGM_VERSION: the struct's size in the low 24 bits, the version above them."""
    return ctypes.sizeof(struct) | (version << 24)


class ConnectV2ParamsV1(ctypes.Structure):  # dcgmConnectV2Params_v1 (deprecated)
    _fields_ = [("version", ctypes.c_uint), ("persistAfterDisconnect", ctypes.c_uint)]


class ConnectV2ParamsV2(ctypes.Structure):  # dcgmConnectV2Params_v2
    _fields_ = [
        ("version", ctypes.c_uint),
        ("persistAfterDisconnect", ctypes.c_uint),
        ("timeoutMs", ctypes.c_uint),
        ("addressIsUnixSocket", ctypes.c_uint),
    ]


class GroupEntityPair(ctypes.Structure):  # dcgmGroupEntityPair_t
    _fields_ = [("entityGroupId", ctypes.c_uint), ("entityId", ctypes.c_uint)]


class MigEntityInfo(ctypes.Structure):  # dcgmMigEntityInfo_t
    _fields_ = [
        ("gpuUuid", ctypes.c_char * GPU_UUID_LENGTH),
        ("nvmlGpuIndex", ctypes.c_uint),
        ("nvmlInstanceId", ctypes.c_uint),  # NVML's GPU-instance id
        ("nvmlComputeInstanceId", ctypes.c_uint),  # NVML's compute-instance id; -1 on a GI
        ("nvmlMigProfileId", ctypes.c_uint),
        ("nvmlProfileSlices", ctypes.c_uint),
    ]


class MigHierarchyInfoV2(ctypes.Structure):  # dcgmMigHierarchyInfo_v2
    _fields_ = [
        ("entity", GroupEntityPair),
        ("parent", GroupEntityPair),
        ("info", MigEntityInfo),
    ]


class MigHierarchyV2(ctypes.Structure):  # dcgmMigHierarchy_v2
    _fields_ = [
        ("version", ctypes.c_uint),
        ("count", ctypes.c_uint),
        ("entityList", MigHierarchyInfoV2 * MAX_HIERARCHY_INFO),
    ]


class _FieldValueUnion(ctypes.Union):
    _fields_ = [
        ("i64", ctypes.c_int64),
        ("dbl", ctypes.c_double),
        ("str", ctypes.c_char * MAX_STR_LENGTH),
        ("blob", ctypes.c_char * MAX_BLOB_LENGTH),
    ]


class FieldValueV2(ctypes.Structure):  # dcgmFieldValue_v2
    _fields_ = [
        ("version", ctypes.c_uint),
        ("entityGroupId", ctypes.c_uint),
        ("entityId", ctypes.c_uint),
        ("fieldId", ctypes.c_ushort),
        ("fieldType", ctypes.c_ushort),
        ("status", ctypes.c_int),
        ("unused", ctypes.c_uint),  # aligns ts to 8 bytes
        ("ts", ctypes.c_int64),  # microseconds since 1970
        ("value", _FieldValueUnion),
    ]


CONNECT_V2_PARAMS_VERSION1 = make_version(ConnectV2ParamsV1, 1)
CONNECT_V2_PARAMS_VERSION2 = make_version(ConnectV2ParamsV2, 2)
FIELD_VALUE_VERSION2 = make_version(FieldValueV2, 2)
MIG_HIERARCHY_VERSION2 = make_version(MigHierarchyV2, 2)

_Handle = ctypes.c_size_t  # dcgmHandle_t, dcgmGpuGrp_t, dcgmFieldGrp_t: uintptr_t
_P = ctypes.POINTER

# Every C function used: name -> (argtypes, restype). dcgm_agent.h.
_SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "dcgmInit": ([], ctypes.c_int),
    "dcgmShutdown": ([], ctypes.c_int),
    "dcgmStartEmbedded": ([ctypes.c_int, _P(_Handle)], ctypes.c_int),
    "dcgmStopEmbedded": ([_Handle], ctypes.c_int),
    "dcgmConnect_v2": ([ctypes.c_char_p, ctypes.c_void_p, _P(_Handle)], ctypes.c_int),
    "dcgmDisconnect": ([_Handle], ctypes.c_int),
    "dcgmGetAllSupportedDevices": (
        [_Handle, _P(ctypes.c_uint), _P(ctypes.c_int)],
        ctypes.c_int,
    ),
    "dcgmGetGpuInstanceHierarchy": ([_Handle, _P(MigHierarchyV2)], ctypes.c_int),
    "dcgmGroupCreate": ([_Handle, ctypes.c_int, ctypes.c_char_p, _P(_Handle)], ctypes.c_int),
    "dcgmGroupAddEntity": ([_Handle, _Handle, ctypes.c_uint, ctypes.c_uint], ctypes.c_int),
    "dcgmGroupDestroy": ([_Handle, _Handle], ctypes.c_int),
    "dcgmFieldGroupCreate": (
        [_Handle, ctypes.c_int, _P(ctypes.c_ushort), ctypes.c_char_p, _P(_Handle)],
        ctypes.c_int,
    ),
    "dcgmFieldGroupDestroy": ([_Handle, _Handle], ctypes.c_int),
    "dcgmWatchFields": (
        [_Handle, _Handle, _Handle, ctypes.c_longlong, ctypes.c_double, ctypes.c_int],
        ctypes.c_int,
    ),
    "dcgmUnwatchFields": ([_Handle, _Handle, _Handle], ctypes.c_int),
    "dcgmEntitiesGetLatestValues": (
        [
            _Handle,
            _P(GroupEntityPair),
            ctypes.c_uint,
            _P(ctypes.c_ushort),
            ctypes.c_uint,
            ctypes.c_uint,
            _P(FieldValueV2),
        ],
        ctypes.c_int,
    ),
    "errorString": ([ctypes.c_int], ctypes.c_char_p),
}


class DcgmLibraryMissingError(RuntimeError):
    """libdcgm.so.4 could not be loaded (DCGM is not installed in this image or host)."""


class DcgmError(RuntimeError):
    """A DCGM call returned an error code."""

    def __init__(self, function: str, code: int, message: str) -> None:
        super().__init__(f"{function}: {message} ({STATUS_NAMES.get(code, code)})")
        self.function = function
        self.code = code

    @property
    def name(self) -> str:
        return STATUS_NAMES.get(self.code, f"Code{-self.code}")


@dataclass(frozen=True, slots=True)
class FieldValue:
    """One value from dcgmEntitiesGetLatestValues, of entity (`entity_group`, `entity_id`): a
    GPU (FE_GPU, its DCGM GPU id) or a GPU instance (FE_GPU_I, its DCGM entity id). `value` is
    None when DCGM has none: `problem` then names why (a status name, or a blank kind:
    "Blank", "NotSupported", ...)."""

    entity_id: int
    field_id: int
    value: float | str | None
    problem: str = ""
    timestamp_us: int = 0
    entity_group: int = FE_GPU


# An entity as dcgmGroupAddEntity and dcgmEntitiesGetLatestValues take it: (group, id).
Entity = tuple[int, int]


@dataclass(frozen=True, slots=True)
class MigEntity:
    """One row of dcgmGetGpuInstanceHierarchy: a GPU instance (FE_GPU_I, parent a GPU) or a
    compute instance (FE_GPU_CI, parent a GPU instance), with NVML's ids for it.

    DCGM numbers these entities itself: a GPU instance's entity id is `gpuId * maxGpcs + n`,
    n counting the GPU's instances in the order DCGM enumerated them (DCGM 4.6.0
    dcgmlib/src/DcgmCacheManager.cpp, InitializeGpuInstances), and it enumerates again after
    every MIG reconfiguration. So the entity id is no NVML id and may name another instance
    after a reconfiguration; `gpu_instance` (dcgmMigEntityInfo_t.nvmlInstanceId, "GPU instance
    index within GPU") is NVML's GPU-instance id, and `gpu_uuid` the parent GPU's UUID.
    """

    entity_group: int
    entity_id: int
    parent_group: int
    parent_id: int
    gpu_uuid: str
    gpu_instance: int
    compute_instance: int
    slices: int


def _library_paths() -> list[str]:
    """Where NVIDIA's own bindings look for it (dcgm_structs.py: _LoadDcgmLibrary): the loader's
    search path (LD_LIBRARY_PATH included), then the multiarch and lib64 directories."""
    machine = platform.machine()
    return [
        "libdcgm.so.4",
        f"/usr/lib/{machine}-linux-gnu/libdcgm.so.4",
        "/usr/lib64/libdcgm.so.4",
    ]


# Replaces the real library (the simulator's fake libdcgm), or NO_LIBRARY: behave as if
# libdcgm.so.4 were not installed. None: load the real one on first use.
NO_LIBRARY: Any = object()
_override: Any = None
_lock = threading.Lock()


def use_library(lib: Any) -> None:
    """Use `lib` (an object with the C symbols as attributes) instead of libdcgm.so.4;
    NO_LIBRARY: as if it were missing; None: the real library again."""
    global _override
    with _lock:
        _override = lib


def load() -> Library:
    """The library, loaded now; DcgmLibraryMissingError when there is none."""
    with _lock:
        override = _override
    if override is NO_LIBRARY:
        raise DcgmLibraryMissingError("libdcgm.so.4 is not installed (simulated node)")
    if override is not None:
        return Library(override)
    failures = []
    for path in _library_paths():
        try:
            return Library(ctypes.CDLL(path))
        except OSError as exc:
            failures.append(str(exc))
    raise DcgmLibraryMissingError(
        "libdcgm.so.4 not found (DCGM is not installed here): " + "; ".join(failures[:1])
    )


class Library:
    """The C functions, typed once, as Python calls that raise DcgmError on failure."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self._functions: dict[str, Callable[..., Any]] = {}
        self._fn_lock = threading.Lock()

    def _fn(self, name: str) -> Callable[..., Any]:
        with self._fn_lock:
            fn = self._functions.get(name)
            if fn is None:
                try:
                    fn = getattr(self._lib, name)
                except AttributeError:
                    raise DcgmError(
                        name, ST_GENERIC_ERROR, "not in this libdcgm (too old)"
                    ) from None
                fn.argtypes, fn.restype = _SIGNATURES[name]
                self._functions[name] = fn
            return fn

    def _check(self, name: str, *args: Any) -> None:
        code = self._fn(name)(*args)
        if code != ST_OK:
            raise DcgmError(name, code, self.error_string(code))

    def error_string(self, code: int) -> str:
        """DCGM's own description of `code` (errorString), or the code's name."""
        try:
            text = self._fn("errorString")(code)
        except DcgmError:
            text = None
        return text.decode(errors="replace") if text else STATUS_NAMES.get(code, str(code))

    def init(self) -> None:
        self._check("dcgmInit")

    def shutdown(self) -> None:
        self._check("dcgmShutdown")

    def start_embedded(self) -> int:
        handle = _Handle()
        self._check("dcgmStartEmbedded", OPERATION_MODE_AUTO, ctypes.byref(handle))
        return handle.value

    def stop_embedded(self, handle: int) -> None:
        self._check("dcgmStopEmbedded", handle)

    def connect(self, address: str, unix_socket: bool, timeout_ms: int) -> int:
        """dcgmConnect_v2 with the current parameters (v2: timeout, unix socket), falling back
        to v1 (TCP, the library's own timeout) for a library that predates v2."""
        handle = _Handle()
        params = ConnectV2ParamsV2(CONNECT_V2_PARAMS_VERSION2, 0, timeout_ms, int(unix_socket))
        code = self._fn("dcgmConnect_v2")(
            address.encode(), ctypes.byref(params), ctypes.byref(handle)
        )
        if code == ST_VER_MISMATCH and not unix_socket:
            old = ConnectV2ParamsV1(CONNECT_V2_PARAMS_VERSION1, 0)
            code = self._fn("dcgmConnect_v2")(
                address.encode(), ctypes.byref(old), ctypes.byref(handle)
            )
        if code != ST_OK:
            raise DcgmError("dcgmConnect_v2", code, self.error_string(code))
        return handle.value

    def disconnect(self, handle: int) -> None:
        self._check("dcgmDisconnect", handle)

    def supported_gpus(self, handle: int) -> list[int]:
        ids = (ctypes.c_uint * MAX_NUM_DEVICES)()
        count = ctypes.c_int()
        self._check("dcgmGetAllSupportedDevices", handle, ids, ctypes.byref(count))
        return list(ids[: max(0, min(count.value, MAX_NUM_DEVICES))])

    def gpu_instance_hierarchy(self, handle: int) -> list[MigEntity]:
        """The GPU instances and compute instances DCGM knows (dcgmGetGpuInstanceHierarchy):
        none for a GPU without MIG, and none for any GPU when the host engine cannot read MIG
        (DCGM reads it only as root: DcgmCacheManager.cpp, "DCGM must be run as root if MIG
        mode is enabled")."""
        hierarchy = MigHierarchyV2()
        hierarchy.version = MIG_HIERARCHY_VERSION2
        self._check("dcgmGetGpuInstanceHierarchy", handle, ctypes.byref(hierarchy))
        count = max(0, min(hierarchy.count, MAX_HIERARCHY_INFO))
        return [_mig_entity(row) for row in hierarchy.entityList[:count]]

    def group_create(self, handle: int, name: str, entities: Sequence[Entity]) -> int:
        """An empty group with these entities (GPUs, GPU instances) added."""
        group = _Handle()
        self._check("dcgmGroupCreate", handle, GROUP_EMPTY, name.encode(), ctypes.byref(group))
        try:
            for entity_group, entity_id in entities:
                self._check("dcgmGroupAddEntity", handle, group.value, entity_group, entity_id)
        except DcgmError:
            self.group_destroy(handle, group.value)
            raise
        return group.value

    def group_destroy(self, handle: int, group: int) -> None:
        self._check("dcgmGroupDestroy", handle, group)

    def field_group_create(self, handle: int, name: str, field_ids: Sequence[int]) -> int:
        if not 1 <= len(field_ids) <= MAX_FIELD_IDS_PER_FIELD_GROUP:
            raise ValueError(f"{len(field_ids)} field ids (1 to 128 allowed)")
        ids = (ctypes.c_ushort * len(field_ids))(*field_ids)
        group = _Handle()
        self._check(
            "dcgmFieldGroupCreate", handle, len(field_ids), ids, name.encode(), ctypes.byref(group)
        )
        return group.value

    def field_group_destroy(self, handle: int, field_group: int) -> None:
        self._check("dcgmFieldGroupDestroy", handle, field_group)

    def watch(
        self, handle: int, group: int, field_group: int, every_seconds: float, keep_seconds: float
    ) -> None:
        """Watch the fields at `every_seconds`, keeping `keep_seconds` of samples (at most 2)."""
        every_us = max(1, round(every_seconds * 1_000_000))
        self._check("dcgmWatchFields", handle, group, field_group, every_us, keep_seconds, 2)

    def unwatch(self, handle: int, group: int, field_group: int) -> None:
        self._check("dcgmUnwatchFields", handle, group, field_group)

    def latest_values(
        self,
        handle: int,
        entities: Sequence[Entity],
        field_ids: Sequence[int],
        live: bool = False,
    ) -> list[FieldValue]:
        """The latest value of each field of each entity (the host engine's cache, or the
        driver itself when `live`), decoded; a value DCGM has none for is None with its
        reason."""
        pairs = (GroupEntityPair * len(entities))(*(GroupEntityPair(*e) for e in entities))
        ids = (ctypes.c_ushort * len(field_ids))(*field_ids)
        values = (FieldValueV2 * (len(entities) * len(field_ids)))()
        flags = FV_FLAG_LIVE_DATA if live else 0
        self._check(
            "dcgmEntitiesGetLatestValues",
            handle,
            pairs,
            len(entities),
            ids,
            len(field_ids),
            flags,
            values,
        )
        return [decode(value) for value in values]


def decode(raw: FieldValueV2) -> FieldValue:
    """One dcgmFieldValue_v2 as a FieldValue: blanks and failed statuses become no value."""
    entity, field_id, group = raw.entityId, raw.fieldId, raw.entityGroupId

    def value(number: float | str | None, problem: str = "", ts: int = 0) -> FieldValue:
        return FieldValue(entity, field_id, number, problem, ts, group)

    if raw.version != FIELD_VALUE_VERSION2:
        # A library writing another layout: its bytes cannot be trusted, at any offset.
        return FieldValue(entity, field_id, None, "VersionMismatch")
    if raw.status != ST_OK:
        return value(None, STATUS_NAMES.get(raw.status, f"Code{-raw.status}"))
    if raw.fieldType == FT_DOUBLE:
        number = raw.value.dbl
        if number >= FP64_BLANK:  # DCGM_FP64_IS_BLANK
            return value(None, _blank_name(number - FP64_BLANK), raw.ts)
        return value(number, "", raw.ts)
    if raw.fieldType == FT_INT64:
        integer = raw.value.i64
        if integer >= INT64_BLANK:  # DCGM_INT64_IS_BLANK
            return value(None, _blank_name(integer - INT64_BLANK), raw.ts)
        return value(float(integer), "", raw.ts)
    if raw.fieldType == FT_STRING:
        text = raw.value.str.decode(errors="replace")
        if text.startswith("<<<") and ">>>" in text:  # DCGM_STR_IS_BLANK
            return value(None, "Blank", raw.ts)
        return value(text, "", raw.ts)
    return value(None, f"FieldType{raw.fieldType}")


def _mig_entity(row: MigHierarchyInfoV2) -> MigEntity:
    info = row.info
    return MigEntity(
        row.entity.entityGroupId,
        row.entity.entityId,
        row.parent.entityGroupId,
        row.parent.entityId,
        info.gpuUuid.decode(errors="replace"),
        info.nvmlInstanceId,
        info.nvmlComputeInstanceId,
        info.nvmlProfileSlices,
    )


def _blank_name(offset: float) -> str:
    if not math.isfinite(offset):  # +inf is at or above the base: blank, of no named kind
        return "Blank"
    index = int(offset)
    return BLANK_NAMES[index] if 0 <= index < len(BLANK_NAMES) else "Blank"

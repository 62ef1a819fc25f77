"""The fake libdcgm (gpu_exporter/sim/fake_dcgm.py), driven through raw ctypes only.

The prototypes and structures below are this test's own copies of DCGM's headers (DCGM 4.6.0
dcgm_structs.h, dcgm_agent.h), typed as a binding would type them, so real ctypes marshalling
runs between them and the fake; the production binding is not used. Scenario time is a manual
clock; only `dcgm_hang` uses (short) real time.
"""

from __future__ import annotations

import ctypes
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_exporter import sim
from gpu_exporter.collect import dcgm_api
from gpu_exporter.collect.classify import decide, nvlink_capacity, pcie_capacity
from gpu_exporter.collect.settings import ClassifierConfig
from gpu_exporter.model.verdict import WindowStats
from gpu_exporter.sim.clock import ManualClock
from gpu_exporter.sim.fake_dcgm import FakeDcgmLib, implemented_functions
from gpu_exporter.sim.scenario import load_scenario
from tests.test_scenario import assert_names_line

# -- dcgm_structs.h / dcgm_fields.h, this test's copies ---------------------------------------

OK, BADPARAM, GENERIC_ERROR, NOT_CONFIGURED, NOT_SUPPORTED = 0, -1, -3, -5, -6
INIT_ERROR, UNINITIALIZED, VER_MISMATCH, UNKNOWN_FIELD, NO_DATA = -7, -10, -12, -13, -14
NOT_WATCHED, CONNECTION_NOT_VALID, REQUIRES_ROOT, MODULE_NOT_LOADED = -16, -21, -29, -33
FE_GPU, FE_GPU_I, FE_GPU_CI = 1, 4, 5
INSUFFICIENT_SIZE = -31
GROUP_EMPTY, GROUP_ALL_GPUS = 1, 0x7FFFFFFF
FV_FLAG_LIVE_DATA = 1
FT_DOUBLE, FT_INT64, FT_STRING = ord("d"), ord("i"), ord("s")
FP64_BLANK = 140737488355328.0
FP64_NOT_SUPPORTED = FP64_BLANK + 2
INT64_BLANK = 0x7FFFFFFFFFFFFFF0
INT64_NOT_SUPPORTED = INT64_BLANK + 2


class ConnectV1(ctypes.Structure):  # dcgmConnectV2Params_v1
    _fields_ = [("version", ctypes.c_uint), ("persistAfterDisconnect", ctypes.c_uint)]


class ConnectV2(ctypes.Structure):  # dcgmConnectV2Params_v2
    _fields_ = [
        ("version", ctypes.c_uint),
        ("persistAfterDisconnect", ctypes.c_uint),
        ("timeoutMs", ctypes.c_uint),
        ("addressIsUnixSocket", ctypes.c_uint),
    ]


class EntityPair(ctypes.Structure):  # dcgmGroupEntityPair_t
    _fields_ = [("entityGroupId", ctypes.c_int), ("entityId", ctypes.c_uint)]


class ValueUnion(ctypes.Union):
    _fields_ = [
        ("i64", ctypes.c_longlong),
        ("dbl", ctypes.c_double),
        ("str", ctypes.c_char * 256),
        ("blob", ctypes.c_char * 4096),
    ]


class FieldValueV2(ctypes.Structure):  # dcgmFieldValue_v2
    _fields_ = [
        ("version", ctypes.c_uint),
        ("entityGroupId", ctypes.c_int),
        ("entityId", ctypes.c_uint),
        ("fieldId", ctypes.c_ushort),
        ("fieldType", ctypes.c_ushort),
        ("status", ctypes.c_int),
        ("unused", ctypes.c_uint),
        ("ts", ctypes.c_longlong),
        ("value", ValueUnion),
    ]


class MigEntityInfo(ctypes.Structure):  # dcgmMigEntityInfo_t
    _fields_ = [
        ("gpuUuid", ctypes.c_char * 128),
        ("nvmlGpuIndex", ctypes.c_uint),
        ("nvmlInstanceId", ctypes.c_uint),
        ("nvmlComputeInstanceId", ctypes.c_uint),
        ("nvmlMigProfileId", ctypes.c_uint),
        ("nvmlProfileSlices", ctypes.c_uint),
    ]


class MigHierarchyInfo(ctypes.Structure):  # dcgmMigHierarchyInfo_v2
    _fields_ = [("entity", EntityPair), ("parent", EntityPair), ("info", MigEntityInfo)]


class MigHierarchy(ctypes.Structure):  # dcgmMigHierarchy_v2: DCGM_MAX_HIERARCHY_INFO = 32 * 14
    _fields_ = [
        ("version", ctypes.c_uint),
        ("count", ctypes.c_uint),
        ("entityList", MigHierarchyInfo * (32 * 14)),
    ]


def make_version(struct: type[ctypes.Structure], version: int) -> int:
    return ctypes.sizeof(struct) | version << 24


H = ctypes.c_size_t  # dcgmHandle_t, dcgmGpuGrp_t, dcgmFieldGrp_t: uintptr_t
HP = ctypes.POINTER(H)
ARGTYPES: dict[str, tuple[list[Any], Any]] = {
    "dcgmInit": ([], ctypes.c_int),
    "dcgmShutdown": ([], ctypes.c_int),
    "dcgmStartEmbedded": ([ctypes.c_int, HP], ctypes.c_int),
    "dcgmStopEmbedded": ([H], ctypes.c_int),
    "dcgmConnect_v2": ([ctypes.c_char_p, ctypes.c_void_p, HP], ctypes.c_int),
    "dcgmDisconnect": ([H], ctypes.c_int),
    "dcgmGetAllSupportedDevices": (
        [H, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_int)],
        ctypes.c_int,
    ),
    "dcgmGetGpuInstanceHierarchy": ([H, ctypes.POINTER(MigHierarchy)], ctypes.c_int),
    "dcgmGroupCreate": ([H, ctypes.c_int, ctypes.c_char_p, HP], ctypes.c_int),
    "dcgmGroupAddEntity": ([H, H, ctypes.c_int, ctypes.c_uint], ctypes.c_int),
    "dcgmGroupDestroy": ([H, H], ctypes.c_int),
    "dcgmFieldGroupCreate": (
        [H, ctypes.c_int, ctypes.POINTER(ctypes.c_ushort), ctypes.c_char_p, HP],
        ctypes.c_int,
    ),
    "dcgmFieldGroupDestroy": ([H, H], ctypes.c_int),
    "dcgmWatchFields": (
        [H, H, H, ctypes.c_longlong, ctypes.c_double, ctypes.c_int],
        ctypes.c_int,
    ),
    "dcgmUnwatchFields": ([H, H, H], ctypes.c_int),
    "dcgmEntitiesGetLatestValues": (
        [
            H,
            ctypes.POINTER(EntityPair),
            ctypes.c_uint,
            ctypes.POINTER(ctypes.c_ushort),
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.POINTER(FieldValueV2),
        ],
        ctypes.c_int,
    ),
    "dcgmProfPause": ([H], ctypes.c_int),
    "dcgmProfResume": ([H], ctypes.c_int),
    "errorString": ([ctypes.c_int], ctypes.c_char_p),
}


class Api:
    """The fake's C functions typed by this test, plus the few call sequences tests repeat."""

    def __init__(self, lib: FakeDcgmLib) -> None:
        self.lib = lib

    def __call__(self, name: str, *args: Any) -> Any:
        fn = getattr(self.lib, name)
        fn.argtypes, fn.restype = ARGTYPES[name]
        return fn(*args)

    def connect(
        self, address: str = "localhost", params: ctypes.Structure | None = None, unix: int = 0
    ) -> tuple[int, int]:
        if params is None:
            params = ConnectV2(make_version(ConnectV2, 2), 0, 1000, unix)
        handle = H()
        rc = self("dcgmConnect_v2", address.encode(), ctypes.byref(params), ctypes.byref(handle))
        return rc, handle.value

    def embedded(self) -> int:
        handle = H()
        assert self("dcgmStartEmbedded", 1, ctypes.byref(handle)) == OK
        return handle.value

    def watch(
        self,
        handle: int,
        gpus: list[int],
        fields: list[int],
        every_s: float = 1.0,
        entity_group: int = FE_GPU,
    ) -> tuple[int, int, int]:
        """(rc of dcgmWatchFields, group, field group) for a new group and field group."""
        group, field_group = H(), H()
        assert self("dcgmGroupCreate", handle, GROUP_EMPTY, b"g", ctypes.byref(group)) == OK
        for gpu in gpus:
            assert self("dcgmGroupAddEntity", handle, group.value, entity_group, gpu) == OK
        ids = (ctypes.c_ushort * len(fields))(*fields)
        name = f"fields-{group.value}".encode()
        rc = self("dcgmFieldGroupCreate", handle, len(fields), ids, name, ctypes.byref(field_group))
        assert rc == OK
        every_us = round(every_s * 1e6)
        rc = self("dcgmWatchFields", handle, group.value, field_group.value, every_us, 10.0, 2)
        return rc, group.value, field_group.value

    def read(
        self,
        handle: int,
        gpus: list[int],
        fields: list[int],
        flags: int = 0,
        entity_group: int = FE_GPU,
    ) -> tuple[int, list[FieldValueV2]]:
        entities = (EntityPair * len(gpus))(*(EntityPair(entity_group, gpu) for gpu in gpus))
        ids = (ctypes.c_ushort * len(fields))(*fields)
        values = (FieldValueV2 * (len(gpus) * len(fields)))()
        rc = self(
            "dcgmEntitiesGetLatestValues",
            handle,
            entities,
            len(gpus),
            ids,
            len(fields),
            flags,
            values,
        )
        return rc, list(values)

    def values(
        self,
        handle: int,
        gpus: list[int],
        fields: list[int],
        flags: int = 0,
        entity_group: int = FE_GPU,
    ) -> list:
        """(status, value) per record, the value by its field type."""
        rc, records = self.read(handle, gpus, fields, flags, entity_group)
        assert rc == OK
        return [(r.status, _value(r)) for r in records]


def _value(record: FieldValueV2) -> Any:
    if record.fieldType == FT_DOUBLE:
        return record.value.dbl
    if record.fieldType == FT_STRING:
        return record.value.str.decode()
    return record.value.i64


SM, TENSOR, IMMA, DFMA = 0.9, 0.4, 0.1, 0.05


def scenario(dcgm: dict | None = None, faults: list | None = None, **top: Any) -> dict:
    """Two A100s: a training one (with a step in SM activity at 3.2 s) and a launch-bound one."""
    training = {
        "label": "training",
        "values": {
            "utilization": 0.97,
            "sm_active": {"steps": [[0, 0.2], [3.2, SM]]},
            "tensor_active": TENSOR,
            "tensor_imma_active": IMMA,
            "tensor_dfma_active": DFMA,
            "dram_active": 0.3,
            "pcie_tx_bytes_per_second": 1.5e9,
            "nvlink_tx_bytes_per_second": 8.0e10,
        },
    }
    launch = {"label": "launch", "values": {"utilization": 0.97, "sm_active": 0.12}}
    spec: dict[str, Any] = {
        "name": "dcgm-fake",
        "defaults": {"model": "NVIDIA A100-SXM4-80GB"},
        "devices": [training, launch],
        "dcgm": dcgm if dcgm is not None else {"host_engine": "running"},
        "faults": faults or [],
        **top,
    }
    return spec


Make = Callable[..., tuple[Api, FakeDcgmLib]]


@pytest.fixture
def make(clock: ManualClock) -> Iterator[Make]:
    """make(spec, init=True) -> (Api, fake) on `clock`; no fake may have failed inside."""
    made: list[FakeDcgmLib] = []

    def _make(spec: dict, init: bool = True) -> tuple[Api, FakeDcgmLib]:
        fake = FakeDcgmLib(load_scenario(spec), clock)
        made.append(fake)
        api = Api(fake)
        if init:
            assert api("dcgmInit") == OK
        return api, fake

    yield _make
    for fake in made:
        assert fake.internal_errors == []


# -- structures and versions ----------------------------------------------------------------


def test_struct_sizes_are_the_headers() -> None:
    # dcgmFieldValue_v2: version, entityGroupId, entityId (3 x 4), fieldId + fieldType (4),
    # status, unused (2 x 4) = 6 four-byte words; int64 ts; a union as large as its 4096-byte
    # blob: 24 + 8 + 4096.
    assert ctypes.sizeof(FieldValueV2) == 4 * 6 + 8 + 4096 == 4128
    assert FieldValueV2.ts.offset == 24 and FieldValueV2.value.offset == 32
    assert ctypes.sizeof(ConnectV1) == 8 and ctypes.sizeof(ConnectV2) == 16
    assert ctypes.sizeof(EntityPair) == 8
    assert make_version(FieldValueV2, 2) == 4128 | 2 << 24


def test_every_value_carries_the_v2_version_and_its_entity(make: Make, clock: ManualClock) -> None:
    api, _ = make(scenario())
    rc, handle = api.connect()
    assert rc == OK
    rc, records = api.read(handle, [0, 1], [54, 1002, 9999], flags=FV_FLAG_LIVE_DATA)
    assert rc == OK
    assert [r.version for r in records] == [make_version(FieldValueV2, 2)] * 6
    assert [(r.entityGroupId, r.entityId, r.fieldId) for r in records] == [
        (FE_GPU, gpu, f) for gpu in (0, 1) for f in (54, 1002, 9999)
    ]


@pytest.mark.parametrize(
    ("accepted", "params", "expected"),
    [
        (None, ConnectV2(make_version(ConnectV2, 2)), OK),
        (None, ConnectV1(make_version(ConnectV1, 1)), OK),
        ([2], ConnectV1(make_version(ConnectV1, 1)), VER_MISMATCH),
        ([1], ConnectV2(make_version(ConnectV2, 2)), VER_MISMATCH),
        (None, ConnectV2(make_version(ConnectV1, 2)), VER_MISMATCH),  # v2's number, v1's size
        (None, ConnectV2(0), VER_MISMATCH),
    ],
)
def test_connect_params_versions(
    make: Make, accepted: list[int] | None, params: ctypes.Structure, expected: int
) -> None:
    section: dict[str, Any] = {"host_engine": "running"}
    if accepted is not None:
        section["connect_params_versions"] = accepted
    api, _ = make(scenario(section))
    assert api.connect(params=params)[0] == expected


# -- init, connect, group, watch, read ------------------------------------------------------


def test_watched_fields_read_the_scenario_after_the_first_update_cycle(
    make: Make, clock: ManualClock
) -> None:
    api, fake = make(scenario())
    clock.now = 1.0
    rc, handle = api.connect()
    assert rc == OK
    ids = (ctypes.c_uint * 32)()
    count = ctypes.c_int()
    assert api("dcgmGetAllSupportedDevices", handle, ids, ctypes.byref(count)) == OK
    assert list(ids[: count.value]) == [0, 1]
    assert api.watch(handle, [0, 1], [1002, 1004])[0] == OK
    clock.now = 1.5  # "the first update of the field will not occur until the next cycle"
    rc, records = api.read(handle, [0, 1], [1002, 1004])
    assert [r.status for r in records] == [NO_DATA] * 4
    assert all(r.value.dbl == FP64_BLANK for r in records)
    clock.now = 3.5  # updates at 2 and 3; sm_active steps to 0.9 only at 3.2
    rc, records = api.read(handle, [0, 1], [1002, 1004])
    assert [(r.status, r.fieldType) for r in records] == [(OK, FT_DOUBLE)] * 4
    assert [r.value.dbl for r in records] == pytest.approx([0.2, TENSOR, 0.12, 0.0])
    assert {r.ts for r in records} == {fake._epoch_us + 3_000_000}  # the update's time
    clock.now = 4.0
    assert api.values(handle, [0], [1002]) == [(OK, pytest.approx(SM))]
    assert api("dcgmDisconnect", handle) == OK
    assert api("dcgmShutdown") == OK


def test_fields_served_and_refused(make: Make, clock: ManualClock) -> None:
    api, fake = make(scenario())
    _, handle = api.connect()
    every = [1001, 1005, 1006, 1009, 1011, 1013, 1014, 1015, 1016]
    assert api.watch(handle, [0], every)[0] == OK
    clock.now = 1.0
    graphics, dram, fp64, pcie, nvlink, imma, hmma, dfma, integer = api.values(handle, [0], every)
    assert graphics == (OK, pytest.approx(0.97))  # graphics_active falls back to utilization
    assert dram == (OK, pytest.approx(0.3))
    assert fp64 == (OK, 0.0)  # unset: 0, as GPM gives
    assert pcie == (OK, 1_500_000_000) and nvlink == (OK, 80_000_000_000)  # INT64 bytes/s
    assert imma == (OK, pytest.approx(IMMA)) and dfma == (OK, pytest.approx(DFMA))
    assert hmma == (OK, pytest.approx(TENSOR - IMMA - DFMA))  # the rest of tensor_active
    assert integer == (OK, 0.0)
    not_watched, unknown = api.values(handle, [0], [1003, 9999])
    assert not_watched == (NOT_WATCHED, FP64_BLANK)
    assert unknown[0] == UNKNOWN_FIELD
    assert api.values(handle, [0], [54, 57]) == [(NOT_WATCHED, "<<<NULL>>>")] * 2
    uuid, bus = api.values(handle, [1], [54, 57], flags=FV_FLAG_LIVE_DATA)
    device = fake.scenario.devices[1]
    assert uuid == (OK, device.uuid) and bus == (OK, device.pci_bus_id)
    rc, records = api.read(handle, [0], [1002], entity_group=FE_GPU_I)  # no MIG: no such entity
    assert (rc, records[0].status) == (OK, NOT_WATCHED)
    rc, records = api.read(handle, [0], [1002], entity_group=FE_GPU_CI)  # not modelled
    assert (rc, records[0].status) == (OK, NOT_SUPPORTED)


def test_no_links_and_pre_volta_read_not_supported_with_status_ok(
    make: Make, clock: ManualClock
) -> None:
    spec = scenario()
    spec["devices"][1]["nvlink_links"] = 0
    spec["devices"].append({"model": "Tesla P100", "architecture": "pascal"})
    api, _ = make(spec)
    _, handle = api.connect()
    assert api.watch(handle, [0, 1, 2], [1002, 1011])[0] == OK
    clock.now = 1.0
    values = api.values(handle, [0, 1, 2], [1002, 1011])
    assert values[1] == (OK, 80_000_000_000)
    assert values[3] == (OK, INT64_NOT_SUPPORTED)  # no NVLink: as GPM's NOT_SUPPORTED
    assert values[4:] == [(OK, FP64_NOT_SUPPORTED), (OK, INT64_NOT_SUPPORTED)]  # Pascal


def test_calls_check_init_handles_and_groups(make: Make) -> None:
    api, _ = make(scenario(), init=False)
    assert api.connect()[0] == UNINITIALIZED
    assert api("dcgmShutdown") == OK  # DcgmApi.cpp: uninitialised is not an error
    assert api("dcgmInit") == OK and api("dcgmInit") == OK  # one process-wide flag, not counted
    _, handle = api.connect()
    assert api.watch(handle, [0], [1002])[0] == OK
    assert api("dcgmShutdown") == OK  # one shutdown ends it all: connections go too
    assert api.connect()[0] == UNINITIALIZED
    assert api("dcgmInit") == OK
    assert api("dcgmDisconnect", handle) == BADPARAM
    assert api("dcgmDisconnect", 12345) == BADPARAM
    _, handle = api.connect()
    assert api("dcgmGroupAddEntity", handle, 777, FE_GPU, 0) == NOT_CONFIGURED
    _, group, field_group = api.watch(handle, [0], [1002])
    assert api("dcgmGroupAddEntity", handle, group, FE_GPU, 0) == BADPARAM  # already in it
    assert api("dcgmGroupAddEntity", handle, group, FE_GPU, 9) == BADPARAM  # no such GPU
    assert api("dcgmWatchFields", handle, field_group, group, 1000, 1.0, 0) == BADPARAM  # swapped
    assert api("dcgmWatchFields", handle, group, field_group, 0, 1.0, 0) == BADPARAM
    ids = (ctypes.c_ushort * 1)(1002)
    out = H()
    taken = f"fields-{group}".encode()  # field group names are unique per host engine
    assert api("dcgmFieldGroupCreate", handle, 1, ids, taken, ctypes.byref(out)) == BADPARAM
    assert api("dcgmFieldGroupCreate", handle, 0, ids, b"none", ctypes.byref(out)) == BADPARAM
    assert api("dcgmUnwatchFields", handle, group, field_group) == OK
    assert api("dcgmFieldGroupDestroy", handle, field_group) == OK
    assert api("dcgmFieldGroupDestroy", handle, field_group) == BADPARAM
    assert api("dcgmGroupDestroy", handle, group) == OK
    assert api("dcgmGroupDestroy", handle, group) == NOT_CONFIGURED


def test_error_strings(make: Make) -> None:
    api, _ = make(scenario())
    assert api("errorString", CONNECTION_NOT_VALID) == (
        b"The connection to the host engine is not valid any longer"
    )
    assert api("errorString", MODULE_NOT_LOADED).startswith(b"This request is serviced by a")
    assert api("errorString", -999) is None  # dcgm_agent.h: nullptr for no such code


def test_an_exception_inside_answers_an_error_not_ok(clock: ManualClock) -> None:
    def broken() -> float:
        raise RuntimeError("clock broke")

    fake = FakeDcgmLib(load_scenario(scenario()), broken)
    api = Api(fake)
    assert api("dcgmInit") == GENERIC_ERROR  # ctypes alone would have answered 0 (OK)
    assert fake.internal_errors and "clock broke" in fake.internal_errors[0]


def test_a_call_failing_every_tick_logs_its_traceback_once_until_it_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A value that overflowed in the fake used to log a traceback at every call (every tick).
    broken = [True]

    def clock() -> float:
        if broken[0]:
            raise OverflowError("cannot convert float infinity to integer")
        return 1.0

    fake = FakeDcgmLib(load_scenario(scenario()), clock)
    api = Api(fake)
    with caplog.at_level(logging.ERROR, logger="gpu_exporter.sim.fake_dcgm"):
        for _ in range(5):
            assert api("dcgmInit") == GENERIC_ERROR
        assert [r.exc_info is not None for r in caplog.records] == [True]  # once, traceback
        broken[0] = False
        assert api("dcgmInit") == OK
        broken[0] = True
        assert api("dcgmInit") == GENERIC_ERROR  # failing again after an answer: news
    assert len(caplog.records) == 2
    assert fake.failures["dcgmInit"] == 6
    assert len(fake.internal_errors) == 2


# -- the host engine: address, down, restart, refusals --------------------------------------


def test_address_and_absent_host_engine(make: Make) -> None:
    api, _ = make(scenario({"address": "10.0.0.7"}))
    assert api.connect("10.0.0.7:5555")[0] == OK  # "x.x.x.x": the default port 5555
    assert api.connect("10.0.0.7")[0] == OK
    assert api.connect("10.0.0.8")[0] == CONNECTION_NOT_VALID
    assert api.connect("10.0.0.7:5556")[0] == CONNECTION_NOT_VALID
    unix, _ = make(scenario({"address": "/run/dcgm.sock"}))
    assert unix.connect("/run/dcgm.sock", unix=1)[0] == OK
    assert unix.connect("/run/other.sock", unix=1)[0] == CONNECTION_NOT_VALID
    absent, _ = make(scenario({"host_engine": "absent"}))
    assert absent.connect()[0] == CONNECTION_NOT_VALID
    handle = absent.embedded()  # an embedded engine needs no nv-hostengine
    assert absent.watch(handle, [0], [1002])[0] == OK


def test_host_engine_down_then_restarted(make: Make, clock: ManualClock) -> None:
    api, _ = make(scenario(faults=[{"kind": "dcgm_down", "at": 5, "until": 10}]))
    _, old = api.connect()
    _, group, field_group = api.watch(old, [0], [1002])
    embedded = api.embedded()
    assert api.watch(embedded, [0], [1002])[0] == OK
    clock.now = 4.0
    assert api.values(old, [0], [1002]) == [(OK, pytest.approx(SM))]
    clock.now = 6.0  # down
    assert api.read(old, [0], [1002])[0] == CONNECTION_NOT_VALID
    assert api("dcgmUnwatchFields", old, group, field_group) == CONNECTION_NOT_VALID
    assert api.connect()[0] == CONNECTION_NOT_VALID
    assert api.values(embedded, [0], [1002]) == [(OK, pytest.approx(SM))]  # not affected
    clock.now = 10.0  # restarted: what the old connection set up is gone with it
    assert api.read(old, [0], [1002])[0] == CONNECTION_NOT_VALID
    assert api("dcgmGroupDestroy", old, group) == CONNECTION_NOT_VALID
    rc, new = api.connect()
    assert rc == OK
    assert api.values(new, [0], [1002]) == [(NOT_WATCHED, FP64_BLANK)]  # watch again
    assert api.watch(new, [0], [1002])[0] == OK
    clock.now = 11.0
    assert api.values(new, [0], [1002]) == [(OK, pytest.approx(SM))]
    assert api("dcgmDisconnect", old) == CONNECTION_NOT_VALID  # freed all the same
    assert api("dcgmDisconnect", old) == BADPARAM


def test_profiling_module_missing(make: Make) -> None:
    api, _ = make(scenario({"profiling_module": "missing"}))
    _, handle = api.connect()
    assert api.watch(handle, [0], [54, 1002])[0] == MODULE_NOT_LOADED
    assert api.watch(handle, [0], [54, 57])[0] == OK  # the device fields need no module


def test_embedded_requires_root(make: Make) -> None:
    api, _ = make(scenario({"embedded": "requires_root"}))
    embedded = api.embedded()
    assert api.watch(embedded, [0], [1002])[0] == REQUIRES_ROOT
    _, handle = api.connect()
    assert api.watch(handle, [0], [1002])[0] == OK  # nv-hostengine runs as root
    second = H(0)
    assert api("dcgmStartEmbedded", 1, ctypes.byref(second)) == OK  # "already running" ...
    assert second.value == 0  # ... and no handle written (DcgmApi.cpp)
    assert api("dcgmStopEmbedded", handle) == BADPARAM
    assert api("dcgmStopEmbedded", embedded) == OK


def test_a_missing_symbol_raises_attribute_error(make: Make) -> None:
    missing = ["dcgmProfPause", "dcgmConnect_v2"]
    api, fake = make(scenario({"missing_functions": missing}))
    for name in missing:
        with pytest.raises(AttributeError):
            getattr(fake, name)  # the lookup a binding does, as on a CDLL
    assert api.embedded()  # the rest is there


# -- blank, paused, hang --------------------------------------------------------------------


def test_a_blank_field(make: Make, clock: ManualClock) -> None:
    fault = {"kind": "dcgm_blank", "device": 1, "field": 1002, "at": 2, "until": 4}
    api, _ = make(scenario(faults=[fault]))
    _, handle = api.connect()
    assert api.watch(handle, [0, 1], [1002, 1004])[0] == OK
    clock.now = 3.0
    values = api.values(handle, [0, 1], [1002, 1004])
    assert values == [(OK, 0.2), (OK, TENSOR), (OK, FP64_BLANK), (OK, 0.0)]
    clock.now = 4.0
    assert api.values(handle, [1], [1002]) == [(OK, 0.12)]


def test_profiling_paused_by_a_fault_and_through_the_api(make: Make, clock: ManualClock) -> None:
    api, fake = make(scenario(faults=[{"kind": "dcgm_paused", "at": 2, "until": 3}]))
    _, handle = api.connect()
    assert api.watch(handle, [0], [1002, 1009, 57])[0] == OK
    clock.now = 2.0
    bus = fake.scenario.devices[0].pci_bus_id
    assert api.values(handle, [0], [1002, 1009, 57]) == [
        (OK, FP64_BLANK),
        (OK, INT64_BLANK),
        (OK, bus),  # profiling fields only
    ]
    clock.now = 3.0
    assert api.values(handle, [0], [1002]) == [(OK, 0.2)]
    assert api("dcgmProfPause", handle) == OK
    clock.now = 4.0
    assert api.values(handle, [0], [1002]) == [(OK, FP64_BLANK)]
    assert fake.paused
    clock.now = 4.5
    assert api("dcgmProfResume", handle) == OK
    assert api.values(handle, [0], [1002]) == [(OK, FP64_BLANK)]  # the sample taken at 4
    clock.now = 5.0
    assert api.values(handle, [0], [1002]) == [(OK, SM)]
    fake.pause()  # another tool on the node
    clock.now = 6.0
    assert api.values(handle, [0], [1002]) == [(OK, FP64_BLANK)]
    fake.resume()
    clock.now = 7.0
    assert api.values(handle, [0], [1002]) == [(OK, SM)]


def test_a_hang_blocks_that_function_without_holding_the_lock(make: Make) -> None:
    hang = {"kind": "dcgm_hang", "function": "dcgmEntitiesGetLatestValues", "at": 0, "duration": 1}
    api, _ = make(scenario(faults=[hang]))
    _, handle = api.connect()
    done: list[float] = []

    def read() -> None:
        started = time.monotonic()
        api.read(handle, [0], [54], FV_FLAG_LIVE_DATA)
        done.append(time.monotonic() - started)

    worker = threading.Thread(target=read)
    worker.start()
    time.sleep(0.05)
    assert api.watch(handle, [0], [1002])[0] == OK  # other calls answer meanwhile
    still_blocked = worker.is_alive()
    worker.join(timeout=10)
    assert still_blocked and done and 1.0 <= done[0] < 10.0


def test_a_short_hang_waits_its_duration(make: Make) -> None:
    hang = {"kind": "dcgm_hang", "function": "dcgmInit", "at": 0, "duration": 0.2}
    api, _ = make(scenario(faults=[hang]), init=False)
    started = time.monotonic()
    assert api("dcgmInit") == OK  # answers normally afterwards
    assert 0.2 <= time.monotonic() - started < 5.0


# -- scenario files -------------------------------------------------------------------------

BAD_DCGM = {
    "bad host_engine": (
        """
        name: t
        devices: [{}]
        dcgm:
          host_engine: sleeping  # <-
        """,
        "dcgm.host_engine: unknown value 'sleeping' (known: absent, running)",
    ),
    "unknown dcgm key": (
        """
        name: t
        devices: [{}]
        dcgm:
          host_engine: running
          port: 5555  # <-
        """,
        "dcgm.port: unknown key 'port'",
    ),
    "dcgm_hang with an NVML function": (
        """
        name: t
        devices: [{}]
        dcgm: {}
        faults:
          - kind: dcgm_hang
            function: nvmlDeviceGetPowerUsage  # <-
            at: 1
            duration: 2
        """,
        "faults[0].function: unknown value 'nvmlDeviceGetPowerUsage' (known: dcgmConnect_v2",
    ),
    "bad address": (
        """
        name: t
        devices: [{}]
        dcgm:
          address: "host:port"  # <-
        """,
        "dcgm.address: expected host, host:port or a unix socket path",
    ),
    "unknown missing function": (
        """
        name: t
        devices: [{}]
        dcgm:
          missing_functions: [dcgmFoo]  # <-
        """,
        "dcgm.missing_functions[0]: unknown value 'dcgmFoo'",
    ),
    "connect params version": (
        """
        name: t
        devices: [{}]
        dcgm:
          connect_params_versions: [0]  # <-
        """,
        "dcgm.connect_params_versions[0]: must be >= 1, got 0",
    ),
    "blank of a field not served": (
        """
        name: t
        devices: [{}]
        dcgm: {}
        faults:
          - {kind: dcgm_blank, device: 0, at: 0, field: 1017}  # <-
        """,
        "faults[0].field: the fake libdcgm serves no field 1017 (served: 54, 57, 1001,",
    ),
    "blank needs a device": (
        """
        name: t
        devices: [{}]
        dcgm: {}
        faults:
          - {kind: dcgm_blank, at: 0, field: 1002}  # <-
        """,
        "faults[0]: missing required key 'device'",
    ),
    "down has no device": (
        """
        name: t
        devices: [{}]
        dcgm: {}
        faults:
          - {kind: dcgm_down, at: 0, device: 0}  # <-
        """,
        "faults[0].device: unknown key 'device'",
    ),
    "a dcgm fault without dcgm": (
        """
        name: t
        devices: [{}]
        faults:
          - {kind: dcgm_paused, at: 0}  # <-
        """,
        "faults[0].kind: dcgm_paused needs a top-level `dcgm:` section",
    ),
    "a blank of a GPU instance the GPU never has": (
        """
        name: t
        devices:
          - {model: NVIDIA A100-SXM4-80GB, mig: {instances: [{profile: 1g.10gb, gpu_instance: 9}]}}
        dcgm: {}
        faults:
          - {kind: dcgm_blank, device: 0, at: 0, field: 1002, gpu_instance: 7}  # <-
        """,
        "faults[0].gpu_instance: GPU 0 has no GPU instance 7",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_DCGM))
def test_dcgm_errors_name_file_line_and_field(tmp_path: Path, case: str) -> None:
    assert_names_line(tmp_path, *BAD_DCGM[case])


def test_dcgm_section_defaults_and_values() -> None:
    spec = load_scenario(scenario({})).dcgm
    assert spec is not None and spec.host_engine_running and spec.profiling_module_loaded
    assert spec.address is None and spec.connect_params_versions == {1, 2}
    assert not spec.embedded_requires_root and not spec.missing_functions
    assert load_scenario({"name": "t", "devices": [{}]}).dcgm is None
    spec = load_scenario(scenario({"address": "db1", "embedded": "requires_root"})).dcgm
    assert spec is not None and spec.address == "db1:5555" and spec.embedded_requires_root


def test_install_plugs_the_fake_into_the_binding_or_none(
    clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    used: list[Any] = []
    monkeypatch.setattr(dcgm_api, "use_library", used.append)
    try:
        fake = sim.install(scenario(), clock=clock)
        dcgm = sim.installed_dcgm()
        assert dcgm is not None and dcgm.clock is fake.clock  # one scenario time for both
        assert used == [dcgm]
        sim.install({"name": "t", "devices": [{}]}, clock=clock)
        assert sim.installed_dcgm() is None
        assert used[-1] is dcgm_api.NO_LIBRARY  # never a real libdcgm under a simulated node
    finally:
        sim.uninstall()
    assert sim.installed_dcgm() is None and used[-1] is None  # the real one again


# -- MIG: GPU instances ------------------------------------------------------------------------

GI_SM = {1: 0.8, 5: 0.1, 13: 0.5, 14: 0.3}


def mig_scenario(dcgm: dict | None = None, faults: list | None = None) -> dict:
    """GPU 0 whole; GPU 1 in MIG mode: 3g (GI 1) and 2g (GI 5) for good, 1g GI 13 until 5 s,
    1g GI 14 from 5 s, and a 1g GI 9 without a compute instance."""
    spec = scenario(dcgm, faults)

    def gi(gi: int, profile: str, **more: Any) -> dict:
        values = {"sm_active": GI_SM[gi], "tensor_active": 0.2} if gi in GI_SM else {}
        return {"profile": profile, "gpu_instance": gi, "values": values, **more}

    spec["devices"][1] = {
        "label": "mig",
        "mig": {
            "instances": [
                gi(1, "3g.40gb"),
                gi(5, "2g.20gb"),
                gi(13, "1g.10gb", until=5),
                gi(14, "1g.10gb", **{"from": 5}),
                gi(9, "1g.10gb", compute_instances=0),
            ]
        },
    }
    return spec


def hierarchy(api: Api, handle: int) -> list[tuple[Any, ...]]:
    """(entity, parent, NVML GPU-instance id, compute-instance id, slices, parent UUID) rows."""
    out = MigHierarchy()
    out.version = make_version(MigHierarchy, 2)
    assert api("dcgmGetGpuInstanceHierarchy", handle, ctypes.byref(out)) == OK
    return [
        (
            (row.entity.entityGroupId, row.entity.entityId),
            (row.parent.entityGroupId, row.parent.entityId),
            row.info.nvmlInstanceId,
            row.info.nvmlComputeInstanceId,
            row.info.nvmlProfileSlices,
            row.info.gpuUuid.decode(),
        )
        for row in out.entityList[: out.count]
    ]


def test_hierarchy_numbers_gpu_instances_as_dcgm_does(make: Make, clock: ManualClock) -> None:
    api, fake = make(mig_scenario())
    _, handle = api.connect()
    uuid = fake.scenario.devices[1].uuid
    assert ctypes.sizeof(MigHierarchy) == 8 + 32 * 14 * (8 + 8 + 128 + 5 * 4)
    # GPU 1, maxGpcs 7: GPU instances 7 + n by profile (smallest first), then GPU-instance id;
    # compute instances 7 + c; the whole GPU 0 lists nothing. NVML's -1 is 0xFFFFFFFF here.
    no_ci = 0xFFFFFFFF
    assert hierarchy(api, handle) == [
        ((FE_GPU_I, 7), (FE_GPU, 1), 9, no_ci, 1, uuid),  # no compute instance
        ((FE_GPU_I, 8), (FE_GPU, 1), 13, no_ci, 1, uuid),
        ((FE_GPU_CI, 7), (FE_GPU_I, 8), 13, 0, 1, uuid),
        ((FE_GPU_I, 9), (FE_GPU, 1), 5, no_ci, 2, uuid),
        ((FE_GPU_CI, 8), (FE_GPU_I, 9), 5, 0, 2, uuid),
        ((FE_GPU_I, 10), (FE_GPU, 1), 1, no_ci, 3, uuid),
        ((FE_GPU_CI, 9), (FE_GPU_I, 10), 1, 0, 3, uuid),
    ]
    clock.now = 5.0  # GI 13 destroyed, GI 14 made: DCGM numbers them again
    rows = hierarchy(api, handle)
    assert [(entity, gi) for entity, _, gi, ci, _, _ in rows if ci == no_ci] == [
        ((FE_GPU_I, 7), 9),
        ((FE_GPU_I, 8), 14),  # GI 13's entity id, now another instance's
        ((FE_GPU_I, 9), 5),
        ((FE_GPU_I, 10), 1),
    ]
    stale = MigHierarchy()
    stale.version = make_version(MigHierarchy, 1)
    assert api("dcgmGetGpuInstanceHierarchy", handle, ctypes.byref(stale)) == VER_MISMATCH


def test_a_host_engine_without_root_lists_no_gpu_instances(make: Make) -> None:
    api, _ = make(mig_scenario({"host_engine": "running", "mig": "requires_root"}))
    _, handle = api.connect()
    assert hierarchy(api, handle) == []
    assert api("dcgmGroupCreate", handle, GROUP_EMPTY, b"g", ctypes.byref(group := H())) == OK
    assert api("dcgmGroupAddEntity", handle, group.value, FE_GPU_I, 8) == BADPARAM  # not there


def test_gpu_instance_watches_read_each_instances_own_activity(
    make: Make, clock: ManualClock
) -> None:
    fault = {"kind": "dcgm_blank", "device": 1, "gpu_instance": 5, "field": 1004, "at": 0}
    api, _ = make(mig_scenario(faults=[fault]))
    _, handle = api.connect()
    group = H()
    assert api("dcgmGroupCreate", handle, GROUP_EMPTY, b"g", ctypes.byref(group)) == OK
    assert api("dcgmGroupAddEntity", handle, group.value, FE_GPU_I, 40) == BADPARAM  # none
    assert api("dcgmGroupAddEntity", handle, group.value, FE_GPU_CI, 7) == NOT_SUPPORTED
    entities = [7, 8, 9, 10]  # GI 9 (no compute instance), 13, 5, 1
    assert api.watch(handle, entities, [1002, 1004], entity_group=FE_GPU_I)[0] == OK
    clock.now = 2.0
    values = api.values(handle, entities, [1002, 1004], entity_group=FE_GPU_I)
    assert values[0:2] == [(NO_DATA, FP64_BLANK)] * 2  # GI 9: "No data available"
    assert values[2:4] == [(OK, pytest.approx(GI_SM[13])), (OK, pytest.approx(0.2))]
    assert values[4:6] == [(OK, pytest.approx(GI_SM[5])), (OK, FP64_BLANK)]  # the fault
    assert values[6:8] == [(OK, pytest.approx(GI_SM[1])), (OK, pytest.approx(0.2))]
    _, records = api.read(handle, [8], [1002], entity_group=FE_GPU_I)
    assert (records[0].entityGroupId, records[0].entityId) == (FE_GPU_I, 8)


def test_a_watch_follows_its_entity_id_across_a_reconfiguration(
    make: Make, clock: ManualClock
) -> None:
    """Watches are DCGM's by entity id. At 5 s GIs 5 and 13 go and GI 14 comes: DCGM numbers
    the instances again, so entity 8 (GI 13) samples GI 14 and entity 9 (GI 5) samples GI 1,
    which now have those ids; entity 10 (GI 1 before) names no instance any longer and keeps
    its last sample, its timestamp stopped."""
    spec = mig_scenario()
    spec["devices"][1]["mig"]["instances"][1]["until"] = 5  # GI 5
    api, fake = make(spec)
    _, handle = api.connect()
    entities = [8, 9, 10]
    assert api.watch(handle, entities, [1002], entity_group=FE_GPU_I)[0] == OK
    clock.now = 4.5
    assert api.values(handle, entities, [1002], entity_group=FE_GPU_I) == [
        (OK, pytest.approx(GI_SM[13])),
        (OK, pytest.approx(GI_SM[5])),
        (OK, pytest.approx(GI_SM[1])),
    ]
    clock.now = 7.5  # from 5 s: GIs 9, 14 and 1 are entities 7, 8 and 9
    _, records = api.read(handle, entities, [1002], entity_group=FE_GPU_I)
    assert [(r.status, r.value.dbl) for r in records] == [
        (OK, pytest.approx(GI_SM[14])),
        (OK, pytest.approx(GI_SM[1])),
        (OK, pytest.approx(GI_SM[1])),
    ]
    epoch = fake._epoch_us
    assert [r.ts - epoch for r in records] == [7_000_000, 7_000_000, 4_000_000]


def test_the_pre_hopper_dcgm_builtin_classifies_as_mixed_does(
    make: Make, clock: ManualClock
) -> None:
    """Activity from the fake DCGM and the rest from the scenario, through the classifier's
    checks: the classes the Hopper `mixed` scenario shows for the same behaviours."""
    s = load_scenario("pre-hopper-dcgm")
    fake = FakeDcgmLib(s, clock)
    api = Api(fake)
    assert api("dcgmInit") == OK
    _, handle = api.connect()
    whole = [d for d in s.devices if not d.mig_enabled]
    gpus = [d.index for d in whole]
    assert api.watch(handle, gpus, [1002, 1004, 1005])[0] == OK
    clock.now = 10.0
    values = api.values(handle, gpus, [1002, 1004, 1005])
    classes = []
    for dev in whole:
        sm, tensor, dram = (v for _, v in values[3 * dev.index : 3 * dev.index + 3])
        pcie = max(dev.value(f"pcie_{d}_bytes_per_second", 10.0) for d in ("tx", "rx"))
        nvlink = max(dev.value(f"nvlink_{d}_bytes_per_second", 10.0) for d in ("tx", "rx"))
        link = max(
            pcie / (pcie_capacity(4, 16) or 1),
            nvlink / (nvlink_capacity(dev.architecture, dev.nvlink_links) or 1),
        )
        stats = WindowStats(
            samples=1,
            utilization=dev.value("utilization", 10.0),
            sm_active=sm,
            tensor_active=tensor,
            dram_active=dram,
            sm_stuck=False,
            throttle_fraction=0.0,
            throttle_reasons=(),
            pcie_bytes_per_second=pcie,
            nvlink_bytes_per_second=nvlink,
            pcie_utilization=None,
            nvlink_utilization=None,
            link_utilization=link,
        )
        classes.append(decide(stats, ClassifierConfig())[0])
    assert classes == ["compute_bound", "idle", "launch_bound", "memory_bound"]
    assert {d.uuid for d in whole} <= {p.device_id for p in s.pods}  # every whole GPU held
    assert fake.internal_errors == []


def test_doc_lists_exactly_the_fake_dcgm_symbols() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "scenarios.md").read_text()
    block = text[
        text.index("<!-- dcgm-symbols:begin -->") : text.index("<!-- dcgm-symbols:end -->")
    ]
    assert set(re.findall(r"`(\w+)`", block)) == implemented_functions()

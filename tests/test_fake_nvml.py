"""The fake libnvidia-ml, driven only through pynvml's public wrappers (as production code is).

Time is a manual clock, so every counter and fault window is exact; only latency, hangs and
event waits use (short) real time.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any

import pynvml as N
import pytest

from gpu_exporter import sim
from gpu_exporter.sim.clock import ManualClock
from gpu_exporter.sim.fake_nvml import FakeNvmlLib
from tests.support import wait_for

Install = Callable[..., FakeNvmlLib]


@pytest.fixture
def install(clock: ManualClock) -> Iterator[Install]:
    """install(scenario, init=True) -> fake; always uninstalled afterwards."""

    def _install(scenario: Any, *, init: bool = True) -> FakeNvmlLib:
        fake = sim.install(scenario, clock=clock)
        if init:
            N.nvmlInit()
        return fake

    try:
        yield _install
    finally:
        sim.uninstall()
        assert N.nvmlLib is None and N._nvmlLib_refcount == 0


def scenario(devices: list[dict] | None = None, **top: Any) -> dict:
    """A small scenario: two H100s unless `devices` says otherwise."""
    return {"name": "test", "devices": devices or [{}, {}], **top}


def handle(i: int = 0) -> Any:
    return N.nvmlDeviceGetHandleByIndex(i)


def gpm_metrics(h1: Any, h2: Any, ids: list[int], version: int | None = None) -> Any:
    """Run nvmlGpmMetricsGet on two samples; {metric id: (nvmlReturn, value)}."""
    req = N.c_nvmlGpmMetricsGet_t()
    req.version = N.NVML_GPM_METRICS_GET_VERSION if version is None else version
    req.numMetrics = len(ids)
    req.sample1, req.sample2 = h1, h2
    for slot, metric in zip(req.metrics, ids, strict=False):
        slot.metricId = metric
    N.nvmlGpmMetricsGet(req)
    return {slot.metricId: (slot.nvmlReturn, slot.value) for slot in req.metrics[: len(ids)]}


def gpm_window(clock: ManualClock, device: int, start: float, end: float) -> tuple[Any, Any]:
    h = handle(device)
    first, second = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    clock.now = start
    N.nvmlGpmSampleGet(h, first)
    clock.now = end
    N.nvmlGpmSampleGet(h, second)
    return first, second


# -- lifecycle ------------------------------------------------------------------------------


def test_the_binding_keeps_the_private_attributes_the_fake_relies_on() -> None:
    problems = sim.binding_problems()
    assert problems == [], (
        f"nvidia-ml-py {metadata.version('nvidia-ml-py')} changed what the fake NVML relies "
        "on (see gpu_exporter/sim/__init__.py and the bound in pyproject.toml): "
        + "; ".join(problems)
    )


def test_the_binding_still_behaves_as_the_fake_expects(install: Install) -> None:
    fake = install(scenario(), init=False)
    N._LoadNvmlLibrary()
    assert N.nvmlLib is fake, "pynvml._LoadNvmlLibrary replaced the library already in nvmlLib"
    fn = N._nvmlGetFunctionPointer("nvmlInitWithFlags")
    assert fn is fake.nvmlInitWithFlags, (
        "pynvml._nvmlGetFunctionPointer no longer looks symbols up as getattr(nvmlLib, name)"
    )
    assert N._nvmlGetFunctionPointer_cache.get("nvmlInitWithFlags") is fn, (
        "pynvml._nvmlGetFunctionPointer_cache no longer caches looked-up symbols by name"
    )
    with pytest.raises(N.NVMLError_FunctionNotFound):
        N._nvmlGetFunctionPointer("nvmlNoSuchFunction")
    N.nvmlInit()
    assert N._nvmlLib_refcount == 1, "pynvml._nvmlLib_refcount no longer counts nvmlInit"
    N.nvmlShutdown()
    assert N._nvmlLib_refcount == 0, "pynvml._nvmlLib_refcount no longer counts nvmlShutdown"


@pytest.mark.parametrize("attribute", sorted(sim.BINDING_PRIVATES))
def test_install_refuses_a_binding_without_an_attribute_naming_it(
    monkeypatch: pytest.MonkeyPatch, attribute: str
) -> None:
    monkeypatch.delattr(N, attribute)
    with pytest.raises(sim.BindingChangedError, match=f"pynvml.{attribute} is gone"):
        sim.install(scenario())


def test_install_refuses_a_binding_whose_attribute_changed_kind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(N, "_nvmlGetFunctionPointer_cache", [])
    with pytest.raises(
        sim.BindingChangedError, match="_nvmlGetFunctionPointer_cache is now a list"
    ):
        sim.install(scenario())


def test_uninitialized_before_init_and_after_last_shutdown(install: Install) -> None:
    install(scenario(), init=False)
    with pytest.raises(N.NVMLError_Uninitialized):
        N.nvmlDeviceGetCount()
    N.nvmlInit()
    N.nvmlInit()
    N.nvmlShutdown()
    assert N.nvmlDeviceGetCount() == 2  # still one reference
    N.nvmlShutdown()
    with pytest.raises(N.NVMLError_Uninitialized):
        N.nvmlDeviceGetCount()
    with pytest.raises(N.NVMLError_Uninitialized):
        N.nvmlShutdown()


def test_error_string_and_system_versions(install: Install) -> None:
    install(scenario(driver={"version": "550.1", "cuda_version": 12040}))
    assert N.nvmlSystemGetDriverVersion() == "550.1"
    assert N.nvmlSystemGetCudaDriverVersion() == 12040
    assert N.nvmlSystemGetCudaDriverVersion_v2() == 12040
    assert N.nvmlErrorString(N.NVML_ERROR_GPU_IS_LOST) == "Gpu Is Lost"
    assert str(N.NVMLError(29)) == "Invalid State"  # outside pynvml's table: asks the fake


def test_missing_symbol_is_function_not_found(install: Install) -> None:
    install("pre-hopper")
    h = handle()
    with pytest.raises(N.NVMLError_FunctionNotFound):
        N.nvmlDeviceGetCurrentClocksEventReasons(h)
    with pytest.raises(N.NVMLError_FunctionNotFound):
        N.nvmlDeviceGetTemperatureV(h, N.NVML_TEMPERATURE_GPU)
    assert N.nvmlDeviceGetCurrentClocksThrottleReasons(handle(1)) == N.nvmlClocksEventReasonGpuIdle
    assert N.nvmlDeviceGetTemperature(handle(1), N.NVML_TEMPERATURE_GPU) == 31


# -- identity and handles -------------------------------------------------------------------


def test_identity_and_handle_lookups(install: Install) -> None:
    install("mixed")
    h = handle(3)
    uuid = N.nvmlDeviceGetUUID(h)
    assert uuid.startswith("GPU-") and len(uuid) == 40
    pci = N.nvmlDeviceGetPciInfo(h)
    assert pci.busId == "00000000:5D:00.0" and pci.bus == 0x5D
    assert pci.pciDeviceId == 0x233510DE
    assert N.nvmlDeviceGetName(h) == "NVIDIA H200"
    assert N.nvmlDeviceGetArchitecture(h) == N.NVML_DEVICE_ARCH_HOPPER
    assert N.nvmlDeviceGetCudaComputeCapability(h) == (9, 0)
    assert N.nvmlDeviceGetMigMode(h) == [0, 0]
    for other in (
        N.nvmlDeviceGetHandleByUUID(uuid),
        N.nvmlDeviceGetHandleByPciBusId("0000:5d:00.0"),
    ):
        assert N.nvmlDeviceGetIndex(other) == 3
    with pytest.raises(N.NVMLError_NotFound):
        N.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(N.NVMLError_InvalidArgument):
        handle(8)


# -- telemetry through unchanged wrappers ---------------------------------------------------


def test_power_memory_and_utilization_units(install: Install) -> None:
    total, reserved, used = 80 * 2**30, 2**29, 10 * 2**30
    install(
        scenario(
            [
                {
                    "memory_total_bytes": total,
                    "memory_reserved_bytes": reserved,
                    "power_limit_watts": 650,
                    "values": {
                        "power_watts": 512.345,
                        "memory_used_bytes": used,
                        "utilization": 0.42,
                    },
                }
            ]
        )
    )
    h = handle()
    assert N.nvmlDeviceGetPowerUsage(h) == 512345  # milliwatts
    assert N.nvmlDeviceGetEnforcedPowerLimit(h) == 650000
    v2 = N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
    assert (v2.total, v2.reserved, v2.used, v2.free) == (
        total,
        reserved,
        used,
        total - reserved - used,
    )
    v1 = N.nvmlDeviceGetMemoryInfo(h)
    assert (v1.used, v1.free) == (used + reserved, total - used - reserved)  # v1 used = both
    assert N.nvmlDeviceGetUtilizationRates(h).gpu == 42


def test_codec_limits_aggregate_ecc_and_nvlink_errors(install: Install) -> None:
    values = {
        "encoder_utilization": 0.31,
        "decoder_utilization": 0.64,
        "ecc_corrected_total": 2,
        "ecc_corrected_aggregate_total": 9,
        "nvlink_replay_errors_total": 4,
    }
    install(
        scenario(
            [
                {"power_limit_watts": 600, "power_management_limit_watts": 700, "values": values},
                {"nvlink_links": 0, "ecc": False},
            ]
        )
    )
    h = handle()
    assert N.nvmlDeviceGetEncoderUtilization(h)[0] == 31  # percent, sampling period in µs
    assert N.nvmlDeviceGetDecoderUtilization(h)[0] == 64
    assert N.nvmlDeviceGetPowerManagementLimit(h) == 700000  # milliwatts
    assert N.nvmlDeviceGetEnforcedPowerLimit(h) == 600000
    assert N.nvmlDeviceGetTotalEccErrors(h, 0, N.NVML_VOLATILE_ECC) == 2
    assert N.nvmlDeviceGetTotalEccErrors(h, 0, N.NVML_AGGREGATE_ECC) == 9
    assert N.nvmlDeviceGetTotalEccErrors(h, 1, N.NVML_AGGREGATE_ECC) == 0  # unset: = volatile
    fields = N.nvmlDeviceGetFieldValues(h, [3, 5, 52, 59])
    assert [f.value.ullVal for f in fields] == [2, 9, 4, 0]
    bare = N.nvmlDeviceGetFieldValues(handle(1), [5, 52])  # no ECC, no NVLink
    assert [f.nvmlReturn for f in bare] == [N.NVML_ERROR_NOT_SUPPORTED] * 2


def test_codecs_are_not_supported_with_mig_on(install: Install) -> None:
    install(scenario([{"mig": {"instances": [{"profile": "1g.18gb"}]}}, {}]))
    parent = handle()
    mig = N.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    for h in (parent, mig):
        for call in (N.nvmlDeviceGetEncoderUtilization, N.nvmlDeviceGetDecoderUtilization):
            with pytest.raises(N.NVMLError_NotSupported):
                call(h)
    assert N.nvmlDeviceGetEncoderUtilization(handle(1))[0] == 0


def test_memory_v2_version_mismatch(install: Install) -> None:
    install(scenario())
    with pytest.raises(N.NVMLError_ArgumentVersionMismatch):
        N.nvmlDeviceGetMemoryInfo(handle(), version=0x01000028)


def test_unsupported_features_answer_not_supported(install: Install) -> None:
    install(scenario([{"unsupported": ["power", "ecc", "numa"]}, {"architecture": "volta"}]))
    h = handle()
    for call in (
        lambda: N.nvmlDeviceGetPowerUsage(h),
        lambda: N.nvmlDeviceGetTotalEccErrors(h, 0, 0),
        lambda: N.nvmlDeviceGetNumaNodeId(h),
        lambda: N.nvmlDeviceGetRemappedRows(handle(1)),  # before Ampere
        lambda: N.nvmlDeviceGetMigMode(handle(1)),
    ):
        with pytest.raises(N.NVMLError_NotSupported):
            call()
    assert N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU) == 35  # the rest still works


def test_energy_and_throttle_counters_integrate_rates(install: Install, clock: ManualClock) -> None:
    values = {
        "power_watts": {"steps": [[0, 100], [10, 300]]},
        "clock_event_reasons": {"steps": [[0, []], [5, ["sw_power_cap", "hw_thermal_slowdown"]]]},
    }
    install(scenario([{"values": values}]))
    h = handle()
    clock.now = 20.0
    assert N.nvmlDeviceGetTotalEnergyConsumption(h) == pytest.approx(4_000_000, rel=1e-3)  # mJ
    fields = N.nvmlDeviceGetFieldValues(h, [74, 270, 269, 83])
    assert [f.nvmlReturn for f in fields] == [N.NVML_SUCCESS] * 4
    assert fields[0].value.ullVal == pytest.approx(15e9, rel=1e-3)  # ns of sw_power_cap
    assert fields[1].value.ullVal == pytest.approx(15e9, rel=1e-3)  # ns of hw thermal
    assert fields[2].value.ullVal == 0  # sw thermal never set
    assert fields[3].value.ullVal == pytest.approx(4_000_000, rel=1e-3)
    assert (
        N.nvmlDeviceGetViolationStatus(h, N.NVML_PERF_POLICY_POWER).violationTime
        == fields[0].value.ullVal
    )
    assert N.nvmlDeviceGetViolationStatus(
        h, N.NVML_PERF_POLICY_THERMAL
    ).violationTime == pytest.approx(15e9, rel=1e-3)
    clock.now = 19.0  # a late reader never sees a counter go backwards
    assert N.nvmlDeviceGetTotalEnergyConsumption(h) >= 3_999_000


def test_field_values_per_field_return_codes(install: Install, clock: ManualClock) -> None:
    install(
        scenario(
            [{"nvlink_links": 4, "values": {"nvlink_tx_bytes_per_second": 4 * 1024 * 1000}}, {}],
            driver={"unsupported_fields": [270]},
        )
    )
    clock.now = 10.0
    fields = N.nvmlDeviceGetFieldValues(
        handle(),
        [
            (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF),
            (138, 1),
            (138, 4),
            270,
            12345,
            91,
            82,
        ],
    )
    codes = [f.nvmlReturn for f in fields]
    assert codes == [0, 0, N.NVML_ERROR_INVALID_ARGUMENT, N.NVML_ERROR_INVALID_ARGUMENT,
                     N.NVML_ERROR_INVALID_ARGUMENT, 0, 0]  # fmt: skip
    assert fields[0].value.ullVal == pytest.approx(40_000, rel=1e-3)  # KiB over all links
    assert fields[1].value.ullVal == pytest.approx(10_000, rel=1e-3)  # one link's share
    assert fields[5].valueType == N.NVML_VALUE_TYPE_UNSIGNED_INT and fields[5].value.uiVal == 4
    assert fields[0].timestamp > 1_600_000_000_000_000  # wall clock, microseconds
    other = N.nvmlDeviceGetFieldValues(handle(1), [(138, 0), (138, 17)])  # an H100: 18 links
    assert [f.nvmlReturn for f in other] == [N.NVML_SUCCESS] * 2


def test_field_not_supported_per_feature(install: Install) -> None:
    install(scenario([{"unsupported": ["pcie_counters"], "nvlink_links": 0}]))
    fields = N.nvmlDeviceGetFieldValues(handle(), [197, 91, 94])
    assert [f.nvmlReturn for f in fields] == [N.NVML_ERROR_NOT_SUPPORTED] * 2 + [N.NVML_SUCCESS]


def test_pcie_nvlink_and_topology_calls(install: Install) -> None:
    install("mixed")
    h = handle(7)
    assert N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_TX_BYTES) == pytest.approx(
        4e10 / 1024, rel=0.1
    )
    assert N.nvmlDeviceGetCurrPcieLinkGeneration(h) == N.nvmlDeviceGetMaxPcieLinkGeneration(h) == 5
    assert N.nvmlDeviceGetNvLinkState(h, 17) == N.NVML_FEATURE_ENABLED
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlDeviceGetNvLinkState(h, 18)
    assert N.nvmlDeviceGetTopologyCommonAncestor(handle(0), handle(3)) == N.NVML_TOPOLOGY_NODE
    assert N.nvmlDeviceGetTopologyCommonAncestor(handle(0), h) == N.NVML_TOPOLOGY_SYSTEM
    assert (
        N.nvmlDeviceGetP2PStatus(handle(0), h, N.NVML_P2P_CAPS_INDEX_NVLINK) == N.NVML_P2P_STATUS_OK
    )
    assert list(N.nvmlDeviceGetMemoryAffinity(h, 1, N.NVML_AFFINITY_SCOPE_NODE)) == [0b10]
    assert N.nvmlDeviceGetCpuAffinity(h, 2)[1] & 1  # CPU 64 is on NUMA node 1


# -- two-call protocol ----------------------------------------------------------------------


def test_retired_pages_two_call_protocol(install: Install) -> None:
    # 8 pages: pynvml's second call only has room for the count from its first call * 2 + 5,
    # so a wrong first answer would fail here.
    install(scenario([{"values": {"retired_pages_dbe": 8, "retired_pages_pending": 1}}]))
    h = handle()
    pages = N.nvmlDeviceGetRetiredPages(h, N.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    assert len(pages) == 8 and len(set(pages)) == 8
    detailed = N.nvmlDeviceGetRetiredPages_v2(h, N.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    assert [p["address"] for p in detailed] == pages and all(p["timestamp"] > 0 for p in detailed)
    assert (
        N.nvmlDeviceGetRetiredPages(h, N.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        == []
    )
    assert N.nvmlDeviceGetRetiredPagesPendingStatus(h) == 1


# -- GPM ------------------------------------------------------------------------------------

GPM_VALUES = {
    "sm_active": {"steps": [[0, 0.2], [5, 0.6]]},
    "tensor_active": 0.3,
    "dram_active": 0.5,
}


def test_gpm_metrics_from_integrals(install: Install, clock: ManualClock) -> None:
    install(scenario([{"values": {**GPM_VALUES, "pcie_rx_bytes_per_second": 3 * 2**20}}]))
    assert N.nvmlGpmQueryDeviceSupport(handle()).isSupportedDevice == 1
    first, second = gpm_window(clock, 0, 4.0, 6.0)
    got = gpm_metrics(first, second, [N.NVML_GPM_METRIC_SM_UTIL, 5, 10, 21, 60, 9999])
    assert got[2] == (
        N.NVML_SUCCESS,
        pytest.approx(40.0, abs=0.5),
    )  # half the window at 20, half at 60
    assert got[5] == (N.NVML_SUCCESS, pytest.approx(30.0))
    assert got[10] == (N.NVML_SUCCESS, pytest.approx(50.0))
    assert got[21] == (N.NVML_SUCCESS, pytest.approx(3.0))  # MiB/s
    assert got[60][0] == N.NVML_SUCCESS  # an H100 has NVLink
    assert got[9999][0] == N.NVML_ERROR_INVALID_ARGUMENT  # per metric; the call succeeded


def test_gpm_per_metric_not_supported_without_nvlink(install: Install, clock: ManualClock) -> None:
    install(scenario([{"nvlink_links": 0, "values": GPM_VALUES}]))
    got = gpm_metrics(*gpm_window(clock, 0, 1.0, 2.0), [2, 60, 61])
    assert [got[m][0] for m in (2, 60, 61)] == [
        0,
        N.NVML_ERROR_NOT_SUPPORTED,
        N.NVML_ERROR_NOT_SUPPORTED,
    ]


def test_gpm_needs_100ms_between_samples(install: Install, clock: ManualClock) -> None:
    install(scenario([{"values": GPM_VALUES}]))
    got = gpm_metrics(*gpm_window(clock, 0, 1.0, 1.05), [2, 5])
    assert {rc for rc, _ in got.values()} == {N.NVML_ERROR_INVALID_ARGUMENT}


def test_gpm_version_and_sample_checks(install: Install, clock: ManualClock) -> None:
    install(scenario([{"values": GPM_VALUES}, {"values": GPM_VALUES}]))
    first, second = gpm_window(clock, 0, 1.0, 2.0)
    with pytest.raises(N.NVMLError_ArgumentVersionMismatch):
        gpm_metrics(first, second, [2], version=0)
    other = N.nvmlGpmSampleAlloc()
    N.nvmlGpmSampleGet(handle(1), other)
    with pytest.raises(N.NVMLError_InvalidArgument):
        gpm_metrics(first, other, [2])  # samples from two devices
    N.nvmlGpmSampleFree(other)


def test_gpm_nan_fault(install: Install, clock: ManualClock) -> None:
    install("faults")
    inside = gpm_metrics(*gpm_window(clock, 0, 12.0, 13.0), [2, 5])
    assert inside[2][0] == 0 and not math.isnan(inside[2][1])
    assert inside[5][0] == 0 and math.isnan(inside[5][1])
    after = gpm_metrics(*gpm_window(clock, 0, 18.0, 19.0), [5])
    assert after[5][0] == 0 and not math.isnan(after[5][1])


def test_gpm_not_supported_before_hopper(install: Install) -> None:
    install("pre-hopper")
    assert N.nvmlGpmQueryDeviceSupport(handle()).isSupportedDevice == 0
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlGpmSampleGet(handle(), N.nvmlGpmSampleAlloc())


# -- events ---------------------------------------------------------------------------------


def test_xid_delivered_once_then_timeout(install: Install, clock: ManualClock) -> None:
    install("faults")
    events = N.nvmlEventSetCreate()
    h1 = handle(1)
    N.nvmlDeviceRegisterEvents(h1, N.nvmlEventTypeXidCriticalError, events)
    clock.now = 7.9
    with pytest.raises(N.NVMLError_Timeout):
        N.nvmlEventSetWait(events, 0)
    clock.now = 8.0
    event = N.nvmlEventSetWait(events, 0)
    assert (event.eventType, event.eventData) == (N.nvmlEventTypeXidCriticalError, 79)
    assert N.nvmlDeviceGetUUID(event.device) == N.nvmlDeviceGetUUID(h1)
    assert event.gpuInstanceId == event.computeInstanceId == 0xFFFFFFFF
    clock.now = 12.0  # XID 48 is on GPU 2, which this set did not register
    start = time.monotonic()
    with pytest.raises(N.NVMLError_Timeout):
        N.nvmlEventSetWait(events, 80)
    assert 0.07 < time.monotonic() - start < 1.0  # blocked in real time up to the timeout
    N.nvmlEventSetFree(events)


def test_events_before_registration_are_not_recorded(install: Install, clock: ManualClock) -> None:
    install("faults")
    clock.now = 9.0
    events = N.nvmlEventSetCreate()
    N.nvmlDeviceRegisterEvents(handle(1), N.nvmlEventTypeXidCriticalError, events)
    N.nvmlDeviceRegisterEvents(handle(2), N.nvmlEventTypeXidCriticalError, events)
    clock.now = 11.0
    assert N.nvmlEventSetWait(events, 0).eventData == 48  # XID 79 at 8 s came before
    with pytest.raises(N.NVMLError_Timeout):
        N.nvmlEventSetWait(events, 0)


def test_unsupported_event_registration_leaves_set_usable(
    install: Install, clock: ManualClock
) -> None:
    install("faults")
    events = N.nvmlEventSetCreate()
    assert N.nvmlDeviceGetSupportedEventTypes(handle(3)) == 0
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceRegisterEvents(handle(3), N.nvmlEventTypeXidCriticalError, events)
    with pytest.raises(N.NVMLError_NotSupported):  # a type this GPU does not report
        N.nvmlDeviceRegisterEvents(handle(2), N.nvmlEventTypeClock, events)
    N.nvmlDeviceRegisterEvents(handle(2), N.nvmlEventTypeXidCriticalError, events)
    clock.now = 10.0
    assert N.nvmlEventSetWait(events, 0).eventData == 48


class BlockedWait:
    """nvmlEventSetWait(events, 60 s) on a thread, returned once it blocks inside the fake."""

    TIMEOUT_MS = 60_000

    def __init__(self, fake: FakeNvmlLib, events: Any) -> None:
        self.outcome: list[object] = []
        self._thread = threading.Thread(target=self._wait, args=(events,), daemon=True)
        self._thread.start()
        # White box: blocked means waiting on the condition that free, shutdown and
        # registration notify (or the wait already answered).
        wait_for(
            lambda: fake._events_changed._waiters or self.outcome,  # type: ignore[attr-defined]
            timeout=30,
            what="the wait to block",
            interval=0.01,
        )

    def _wait(self, events: Any) -> None:
        try:
            self.outcome.append(N.nvmlEventSetWait(events, self.TIMEOUT_MS))
        except N.NVMLError as exc:
            self.outcome.append(exc)

    def result(self) -> object:
        self._thread.join(timeout=self.TIMEOUT_MS / 2000)  # half the timeout: it did not run out
        assert not self._thread.is_alive(), "the wait went on after the set changed"
        return self.outcome[0]


def registered_set(device: int) -> Any:
    events = N.nvmlEventSetCreate()
    N.nvmlDeviceRegisterEvents(handle(device), N.nvmlEventTypeXidCriticalError, events)
    return events


def test_with_no_xid_to_come_a_wait_blocks_without_polling(install: Install) -> None:
    reads = 0

    def counting_clock() -> float:
        nonlocal reads
        reads += 1
        return 10.0

    sim.install("faults", clock=counting_clock)  # the fixture uninstalls
    N.nvmlInit()
    events = registered_set(2)
    assert N.nvmlEventSetWait(events, 0).eventData == 48  # GPU 2's only XID
    reads = 0
    with pytest.raises(N.NVMLError_Timeout):
        N.nvmlEventSetWait(events, 300)
    assert reads == 2  # one look before one sleep to the deadline, one after (polling: 4)


def test_freeing_a_set_ends_a_blocked_wait_with_invalid_argument(
    install: Install, clock: ManualClock
) -> None:
    fake = install("faults")
    events = registered_set(2)
    clock.now = 10.0
    assert N.nvmlEventSetWait(events, 0).eventData == 48  # nothing more to come
    waiting = BlockedWait(fake, events)
    N.nvmlEventSetFree(events)
    assert isinstance(waiting.result(), N.NVMLError_InvalidArgument)


def test_shutdown_ends_a_blocked_wait_with_uninitialized(install: Install) -> None:
    fake = install(scenario())  # no XIDs at all
    waiting = BlockedWait(fake, registered_set(0))
    N.nvmlShutdown()
    assert isinstance(waiting.result(), N.NVMLError_Uninitialized)


def test_a_registration_during_a_blocked_wait_delivers_its_due_xid(
    install: Install, clock: ManualClock
) -> None:
    fake = install("faults")
    events = N.nvmlEventSetCreate()
    clock.now = 8.0  # GPU 1's XID 79 happens now; nothing is registered yet
    waiting = BlockedWait(fake, events)
    N.nvmlDeviceRegisterEvents(handle(1), N.nvmlEventTypeXidCriticalError, events)
    event = waiting.result()
    assert event.eventData == 79  # type: ignore[attr-defined]


def test_an_xid_still_to_come_arrives_when_the_clock_reaches_it(
    install: Install, clock: ManualClock
) -> None:
    fake = install("faults")
    events = registered_set(1)
    clock.now = 7.0
    waiting = BlockedWait(fake, events)  # polls: XID 79 is due at 8 s
    clock.now = 8.0
    event = waiting.result()
    assert event.eventData == 79  # type: ignore[attr-defined]


# -- faults ---------------------------------------------------------------------------------


def test_gpu_lost_is_sticky_until_reinit_after_until(install: Install, clock: ManualClock) -> None:
    install("faults")
    h1 = handle(1)
    clock.now = 14.9
    assert N.nvmlDeviceGetPowerUsage(h1) > 0
    clock.now = 15.0
    for call in (
        lambda: N.nvmlDeviceGetPowerUsage(h1),
        lambda: handle(1),
        lambda: N.nvmlDeviceGetUUID(h1),
    ):
        with pytest.raises(N.NVMLError_GpuIsLost):
            call()
    assert N.nvmlDeviceGetPowerUsage(handle(0)) > 0  # the others keep answering
    clock.now = 20.0  # a driver reload before `until` does not bring it back
    N.nvmlShutdown()
    N.nvmlInit()
    with pytest.raises(N.NVMLError_GpuIsLost):
        handle(1)
    clock.now = 30.0  # past `until`, but no reload yet
    with pytest.raises(N.NVMLError_GpuIsLost):
        N.nvmlDeviceGetPowerUsage(h1)
    N.nvmlShutdown()
    N.nvmlInit()
    assert N.nvmlDeviceGetPowerUsage(handle(1)) > 0


def _timed(call: Callable[[], Any]) -> float:
    start = time.monotonic()
    call()
    return time.monotonic() - start


def test_hang_blocks_only_that_call(install: Install, clock: ManualClock) -> None:
    fault = {
        "at": 1,
        "device": 0,
        "kind": "hang",
        "function": "nvmlDeviceGetPowerUsage",
        "duration": 0.4,
    }
    install(scenario(faults=[fault]))
    h0, h1 = handle(0), handle(1)
    assert _timed(lambda: N.nvmlDeviceGetPowerUsage(h0)) < 0.1  # before `at`
    clock.now = 1.2
    hung = threading.Thread(target=N.nvmlDeviceGetPowerUsage, args=(h0,))
    start = time.monotonic()
    hung.start()
    time.sleep(0.05)
    assert hung.is_alive()
    assert _timed(lambda: N.nvmlDeviceGetPowerUsage(h1)) < 0.1  # other device
    assert _timed(lambda: N.nvmlDeviceGetTemperature(h0, 0)) < 0.1  # other function
    assert _timed(lambda: N.nvmlDeviceGetFieldValues(h0, [83])) < 0.1
    hung.join()
    assert time.monotonic() - start >= 0.4
    clock.now = 1.5  # after at + duration
    assert _timed(lambda: N.nvmlDeviceGetPowerUsage(h0)) < 0.1


def test_no_permission_window(install: Install, clock: ManualClock) -> None:
    fault = {
        "at": 2,
        "device": 1,
        "kind": "no_permission",
        "function": "nvmlDeviceGetMemoryInfo_v2",
        "until": 4,
    }
    install(scenario(faults=[fault]))
    clock.now = 3
    with pytest.raises(N.NVMLError_NoPermission):
        N.nvmlDeviceGetMemoryInfo(handle(1), version=N.nvmlMemory_v2)
    assert N.nvmlDeviceGetMemoryInfo(handle(0), version=N.nvmlMemory_v2).total > 0
    clock.now = 4
    assert N.nvmlDeviceGetMemoryInfo(handle(1), version=N.nvmlMemory_v2).total > 0


def test_latency_per_function(install: Install) -> None:
    fake = install(scenario(latency={"functions": {"nvmlDeviceGetPowerUsage": 60}}))
    h = handle()
    assert _timed(lambda: N.nvmlDeviceGetPowerUsage(h)) >= 0.06
    assert _timed(lambda: N.nvmlDeviceGetTemperature(h, 0)) < 0.05
    assert fake.call_counts["nvmlDeviceGetPowerUsage"] == 1


def test_concurrent_readers_see_monotonic_counters(install: Install) -> None:
    fake = sim.install("mixed")  # real clock: integrations race; the fixture uninstalls
    N.nvmlInit()
    errors: list[str] = []

    def reader(index: int) -> None:
        h = handle(index)
        last = -1
        for _ in range(200):
            energy = N.nvmlDeviceGetTotalEnergyConsumption(h)
            if energy < last:
                errors.append(f"GPU {index}: energy went from {last} to {energy}")
            last = energy
            N.nvmlDeviceGetFieldValues(h, [74, 83, (138, 0xFFFFFFFF)])

    threads = [threading.Thread(target=reader, args=(i % 8,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert fake.call_counts["nvmlDeviceGetTotalEnergyConsumption"] == 2400

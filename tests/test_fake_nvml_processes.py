"""The fake libnvidia-ml's per-process calls, driven through pynvml's own wrappers (and, for the
sizing protocol and struct versions, through the C symbols with ctypes, as the wrappers call
them): the running-process lists and the per-process utilization samples of a scenario's
`processes:`, with nvml.h's semantics. Time is a manual clock."""

from __future__ import annotations

import ctypes
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import pynvml as N
import pytest

from gpu_exporter import sim
from gpu_exporter.sim.clock import ManualClock
from gpu_exporter.sim.fake_nvml import PROCESSES_UTILIZATION_INFO_V1, FakeNvmlLib

Install = Callable[..., FakeNvmlLib]
NO_INSTANCE = 0xFFFFFFFF
GIB = 1024**3

# GPU 0: a busy and an idle compute process, a graphics one, an MPS server and client that
# start later; GPU 1: nothing; GPU 2: MIG (GI 1 = slot 0, GI 5 = slot 2, both 1 compute
# instance) with a process on each.
PROCESSES = [
    {"pid": 100, "gpu": 0, "memory_bytes": 8 * GIB, "utilization": {"sm": 0.5, "memory": 0.25}},
    {"pid": 101, "gpu": 0, "memory_bytes": 1 * GIB},  # idle: never sampled
    {"pid": 102, "gpu": 0, "kind": "graphics", "memory_bytes": 2**27, "utilization": {"sm": 0.1}},
    {"pid": 200, "gpu": 0, "kind": "mps_server", "from": 10, "memory_bytes": 2**25},
    {
        "pid": 201,
        "gpu": 0,
        "kind": "mps",
        "from": 10,
        "until": 30,
        "memory_bytes": 3 * GIB,
        "utilization": {"sm": 0.3, "encoder": 0.02, "decoder": 0.04, "jpeg": 0.05, "ofa": 0.06},
    },
    {"pid": 300, "gpu": 2, "gpu_instance": 1, "memory_bytes": 5 * GIB, "utilization": {"sm": 1}},
    {"pid": 301, "gpu": 2, "gpu_instance": 5, "memory_bytes": 6 * GIB},
]


def mig_gpu(monitor: bool) -> dict:
    return {
        "mig": {
            "monitor_capability": monitor,
            "instances": [
                {"profile": "3g.71gb", "gpu_instance": 1, "slots": [0]},
                {"profile": "2g.35gb", "gpu_instance": 5, "slots": [2]},
            ],
        }
    }


def scenario(monitor: bool = True, **top: Any) -> dict:
    return {"name": "p", "devices": [{}, {}, mig_gpu(monitor)], "processes": PROCESSES, **top}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def install(clock: ManualClock) -> Iterator[Install]:
    def _install(spec: Any) -> FakeNvmlLib:
        fake = sim.install(spec, clock=clock)
        N.nvmlInit()
        return fake

    try:
        yield _install
    finally:
        sim.uninstall()


def handle(i: int) -> Any:
    return N.nvmlDeviceGetHandleByIndex(i)


def listed(function: Callable[[Any], list[Any]], h: Any) -> list[tuple[int, int, int, int]]:
    return [(p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId) for p in function(h)]


def c_call(name: str, *args: Any) -> int:
    return N._nvmlGetFunctionPointer(name)(*args)


# -- running processes --------------------------------------------------------------------------


def test_each_list_holds_its_kind_with_memory_and_no_instance_ids(install, clock) -> None:
    install(scenario())
    clock.now = 15
    gpu = handle(0)
    assert listed(N.nvmlDeviceGetComputeRunningProcesses, gpu) == [
        (100, 8 * GIB, NO_INSTANCE, NO_INSTANCE),
        (101, 1 * GIB, NO_INSTANCE, NO_INSTANCE),
        (200, 2**25, NO_INSTANCE, NO_INSTANCE),  # the MPS server is a compute process
    ]
    assert listed(N.nvmlDeviceGetGraphicsRunningProcesses, gpu) == [
        (102, 2**27, NO_INSTANCE, NO_INSTANCE)
    ]
    assert listed(N.nvmlDeviceGetMPSComputeRunningProcesses, gpu) == [
        (201, 3 * GIB, NO_INSTANCE, NO_INSTANCE)
    ]
    assert N.nvmlDeviceGetComputeRunningProcesses(handle(1)) == []


def test_a_caller_can_replace_the_processes_the_calls_list_and_sample(install, clock) -> None:
    fake = install(scenario())
    clock.now = 15
    later = sim.load_scenario(
        {"name": "l", "devices": [{}], "processes": [{"pid": 4242, "gpu": 0, "memory_bytes": GIB,
                                                      "utilization": {"sm": 0.8}}]}
    ).processes  # fmt: skip
    fake.set_processes([*fake.scenario.processes, *later])
    pids = [p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(handle(0))]
    assert pids == [100, 101, 200, 4242]
    clock.now = 17
    sampled = {s.pid: s.smUtil for s in N.nvmlDeviceGetProcessesUtilizationInfo(handle(0), 0)}
    assert sampled[4242] == 80 and sampled[100] == 50
    fake.set_processes(later)
    assert [p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(handle(0))] == [4242]
    assert N.nvmlDeviceGetComputeRunningProcesses(handle(2)) == []  # MIG GPU: none now


def test_processes_come_and_go_with_from_and_until(install, clock) -> None:
    install(scenario())
    gpu = handle(0)
    pids = lambda f: [p.pid for p in f(gpu)]  # noqa: E731
    assert pids(N.nvmlDeviceGetComputeRunningProcesses) == [100, 101]
    assert pids(N.nvmlDeviceGetMPSComputeRunningProcesses) == []
    clock.now = 10
    assert pids(N.nvmlDeviceGetComputeRunningProcesses) == [100, 101, 200]
    assert pids(N.nvmlDeviceGetMPSComputeRunningProcesses) == [201]
    clock.now = 30
    assert pids(N.nvmlDeviceGetMPSComputeRunningProcesses) == []


def test_the_sizing_protocol_is_nvml_hs(install, clock) -> None:
    install(scenario())
    gpu = handle(0)
    count = ctypes.c_uint(0)
    name = "nvmlDeviceGetComputeRunningProcesses_v3"
    # "call this function with *infoCount = 0 ... INSUFFICIENT_SIZE, or SUCCESS if none"
    assert c_call(name, gpu, ctypes.byref(count), None) == N.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 2
    count.value = 0
    assert c_call(name, handle(1), ctypes.byref(count), None) == N.NVML_SUCCESS
    assert count.value == 0
    infos = (N.c_nvmlProcessInfo_v3_t * 1)()
    count.value = 1  # too small: the count needed comes back
    assert c_call(name, gpu, ctypes.byref(count), infos) == N.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 2
    assert c_call(name, gpu, ctypes.byref(count), None) == N.NVML_ERROR_INVALID_ARGUMENT
    assert c_call(name, gpu, None, None) == N.NVML_ERROR_INVALID_ARGUMENT
    infos = (N.c_nvmlProcessInfo_v3_t * 8)()
    count.value = 8
    assert c_call(name, gpu, ctypes.byref(count), infos) == N.NVML_SUCCESS
    assert count.value == 2 and [infos[0].pid, infos[1].pid] == [100, 101]


def test_a_mig_device_lists_its_own_and_the_gpu_all_with_instance_ids(install) -> None:
    install(scenario(monitor=True))
    parent = handle(2)
    assert listed(N.nvmlDeviceGetComputeRunningProcesses, parent) == [
        (300, 5 * GIB, 1, 0),
        (301, 6 * GIB, 5, 0),
    ]
    first = N.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    second = N.nvmlDeviceGetMigDeviceHandleByIndex(parent, 2)
    assert listed(N.nvmlDeviceGetComputeRunningProcesses, first) == [(300, 5 * GIB, 1, 0)]
    assert listed(N.nvmlDeviceGetComputeRunningProcesses, second) == [(301, 6 * GIB, 5, 0)]
    assert N.nvmlDeviceGetGraphicsRunningProcesses(first) == []
    assert N.nvmlDeviceGetMPSComputeRunningProcesses(second) == []


def test_the_gpu_of_mig_devices_needs_the_monitor_capability_to_list(install) -> None:
    """nvml.h: on the GPU's handle, "aggregate information, only if the caller has appropriate
    privileges"; a MIG device's handle lists its own in any case."""
    install(scenario(monitor=False))
    with pytest.raises(N.NVMLError_NoPermission):
        N.nvmlDeviceGetComputeRunningProcesses(handle(2))
    mig = N.nvmlDeviceGetMigDeviceHandleByIndex(handle(2), 0)
    assert [p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(mig)] == [300]


def test_memory_follows_its_value_spec(install, clock) -> None:
    spec = {"pid": 5, "gpu": 0, "memory_bytes": {"ramp": [[0, 0], [100, 1.0e10]]}}
    install({"name": "m", "devices": [{}], "processes": [spec]})
    clock.now = 25
    assert N.nvmlDeviceGetComputeRunningProcesses(handle(0))[0].usedGpuMemory == 2_500_000_000


# -- per-process utilization --------------------------------------------------------------------


def sampled(h: Any, last_seen: int = 0) -> list[tuple[int, int, tuple[int, ...]]]:
    return [
        (s.pid, s.timeStamp, (s.smUtil, s.memUtil, s.encUtil, s.decUtil, s.jpgUtil, s.ofaUtil))
        for s in N.nvmlDeviceGetProcessesUtilizationInfo(h, last_seen)
    ]


def test_one_sample_per_busy_process_per_period_stamped_in_microseconds(install, clock) -> None:
    before = time.time() * 1e6
    install(scenario())
    after = time.time() * 1e6
    clock.now = 12.5  # periods 1..12 have ended
    samples = sampled(handle(0))
    stamps = sorted({stamp for _, stamp, _ in samples})
    assert len(stamps) == 12
    assert all(b - a == 1_000_000 for a, b in itertools.pairwise(stamps))
    assert before + 1e6 <= stamps[0] <= after + 1e6  # the end of period 1, wall-clock µs
    # The idle process (101) and the MPS server have no samples; 201 from period 11 (10-11 s).
    assert {pid for pid, _, _ in samples} == {100, 102, 201}
    last = [s for s in samples if s[1] == stamps[-1]]
    assert last == [
        (100, stamps[-1], (50, 25, 0, 0, 0, 0)),
        (102, stamps[-1], (10, 0, 0, 0, 0, 0)),
        (201, stamps[-1], (30, 0, 2, 4, 5, 6)),
    ]
    assert samples == sorted(samples, key=lambda s: s[1])  # oldest first


def test_only_samples_newer_than_last_seen_and_not_found_without_them(install, clock) -> None:
    install(scenario())
    clock.now = 5.2
    newest = max(stamp for _, stamp, _ in sampled(handle(0)))
    with pytest.raises(N.NVMLError_NotFound):
        N.nvmlDeviceGetProcessesUtilizationInfo(handle(0), newest)
    with pytest.raises(N.NVMLError_NotFound):
        N.nvmlDeviceGetProcessUtilization(handle(0), newest)
    clock.now = 7.0  # two more periods
    assert [(pid, stamp - newest) for pid, stamp, _ in sampled(handle(0), newest)] == [
        (100, 1_000_000),
        (102, 1_000_000),
        (100, 2_000_000),
        (102, 2_000_000),
    ]
    with pytest.raises(N.NVMLError_NotFound):  # nothing runs on GPU 1
        N.nvmlDeviceGetProcessesUtilizationInfo(handle(1), 0)


def test_the_buffer_keeps_the_last_twenty_periods(install, clock) -> None:
    install(scenario())
    clock.now = 100.0
    stamps = sorted({stamp for _, stamp, _ in sampled(handle(0))})
    assert len(stamps) == 20


def test_the_older_call_gives_the_same_samples_without_jpeg_and_ofa(install, clock) -> None:
    install(scenario())
    clock.now = 11.5
    old = [
        (s.pid, s.timeStamp, (s.smUtil, s.memUtil, s.encUtil, s.decUtil))
        for s in N.nvmlDeviceGetProcessUtilization(handle(0), 0)
    ]
    assert old == [(pid, stamp, pc[:4]) for pid, stamp, pc in sampled(handle(0))]


def test_a_process_with_two_contexts_is_one_sample(install, clock) -> None:
    both = [
        {"pid": 9, "gpu": 0, "utilization": {"sm": 0.7}},
        {"pid": 9, "gpu": 0, "kind": "graphics", "utilization": {"sm": 0.5, "memory": 0.1}},
    ]
    install({"name": "cg", "devices": [{}], "processes": both})
    clock.now = 1.0
    assert [(pid, pc[:2]) for pid, _, pc in sampled(handle(0))] == [(9, (100, 10))]


def test_the_struct_version_is_checked(install, clock) -> None:
    install(scenario())
    clock.now = 3
    assert N.ProcessesUtilizationInfo_v1 == PROCESSES_UTILIZATION_INFO_V1
    info = N.c_nvmlProcessesUtilizationInfo_v1_t()
    info.version = PROCESSES_UTILIZATION_INFO_V1 + 1
    name = "nvmlDeviceGetProcessesUtilizationInfo"
    assert c_call(name, handle(0), ctypes.byref(info)) == N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    info.version = PROCESSES_UTILIZATION_INFO_V1
    assert c_call(name, handle(0), ctypes.byref(info)) == N.NVML_ERROR_INSUFFICIENT_SIZE
    assert info.processSamplesCount == 6  # 100 and 102 in each of periods 1..3
    assert c_call(name, handle(0), None) == N.NVML_ERROR_INVALID_ARGUMENT


def test_a_buffer_too_small_for_a_new_period_answers_insufficient_size(install, clock) -> None:
    """The sizing call is exact: a period that ends before the second call overflows it, and
    pynvml's wrapper (which does not oversize) raises; the caller retries."""
    install(scenario())
    clock.now = 3.5
    info = N.c_nvmlProcessesUtilizationInfo_v1_t()
    info.version = PROCESSES_UTILIZATION_INFO_V1
    name = "nvmlDeviceGetProcessesUtilizationInfo"
    assert c_call(name, handle(0), ctypes.byref(info)) == N.NVML_ERROR_INSUFFICIENT_SIZE
    samples = (N.c_nvmlProcessUtilizationInfo_v1_t * info.processSamplesCount)()
    info.procUtilArray = samples
    clock.now = 4.0
    assert c_call(name, handle(0), ctypes.byref(info)) == N.NVML_ERROR_INSUFFICIENT_SIZE
    assert info.processSamplesCount == 8
    samples = (N.c_nvmlProcessUtilizationInfo_v1_t * 8)()
    info.procUtilArray = samples
    assert c_call(name, handle(0), ctypes.byref(info)) == N.NVML_SUCCESS
    assert [s.pid for s in samples] == [100, 102] * 4


def test_utilization_is_not_supported_with_mig_or_before_maxwell(install) -> None:
    kepler = {"model": "Tesla K80", "architecture": "kepler"}
    unsupported = {"unsupported": ["process_utilization"]}
    install(scenario(devices=[{}, unsupported, mig_gpu(True), kepler]))
    mig = N.nvmlDeviceGetMigDeviceHandleByIndex(handle(2), 0)
    for h in (handle(2), mig, handle(1), handle(3)):
        for call in (N.nvmlDeviceGetProcessesUtilizationInfo, N.nvmlDeviceGetProcessUtilization):
            with pytest.raises(N.NVMLError_NotSupported):
                call(h, 0)
    # The lists are every architecture's ("Fermi or newer").
    assert N.nvmlDeviceGetComputeRunningProcesses(handle(3)) == []


def test_device_utilization_samples_share_the_periods_and_their_stamps(install, clock) -> None:
    busy_37 = {"values": {"utilization": 0.37}}
    install(scenario(devices=[busy_37, busy_37, mig_gpu(True)]))
    clock.now = 12.5
    value_type, samples = N.nvmlDeviceGetSamples(handle(1), N.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert value_type == N.NVML_VALUE_TYPE_UNSIGNED_INT
    assert [s.sampleValue.uiVal for s in samples] == [37] * 12  # one per period, in percent
    # GPU 0's busiest process (PID 100) runs kernels 50 % of the time: so did the GPU.
    _, samples = N.nvmlDeviceGetSamples(handle(0), N.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert [s.sampleValue.uiVal for s in samples] == [50] * 12
    stamps = [s.timeStamp for s in samples]
    assert stamps == sorted({stamp for _, stamp, _ in sampled(handle(0))})  # the same periods
    with pytest.raises(N.NVMLError_NotFound):  # none newer than the newest
        N.nvmlDeviceGetSamples(handle(0), N.NVML_GPU_UTILIZATION_SAMPLES, stamps[-1])
    clock.now = 14.0
    _, newer = N.nvmlDeviceGetSamples(handle(0), N.NVML_GPU_UTILIZATION_SAMPLES, stamps[-1])
    assert [s.timeStamp - stamps[-1] for s in newer] == [1_000_000, 2_000_000]
    # Quantities the fake does not keep, and GPUs with MIG on, answer NOT_SUPPORTED.
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetSamples(handle(0), N.NVML_TOTAL_POWER_SAMPLES, 0)
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetSamples(handle(2), N.NVML_GPU_UTILIZATION_SAMPLES, 0)


def test_a_device_samples_buffer_too_small_gets_the_oldest_that_fit(install, clock) -> None:
    install(scenario())
    clock.now = 6.0
    count, value_type = ctypes.c_uint(0), ctypes.c_int(0)
    args = (handle(0), N.NVML_GPU_UTILIZATION_SAMPLES, ctypes.c_ulonglong(0))
    sizing = c_call(
        "nvmlDeviceGetSamples", *args, ctypes.byref(value_type), ctypes.byref(count), None
    )
    assert (sizing, count.value) == (N.NVML_SUCCESS, 6)  # NULL samples: the count needed
    count.value = 4
    buffer = (N.c_nvmlSample_t * 4)()
    ret = c_call(
        "nvmlDeviceGetSamples", *args, ctypes.byref(value_type), ctypes.byref(count), buffer
    )
    assert (ret, count.value) == (N.NVML_SUCCESS, 4)
    assert [b.timeStamp - buffer[0].timeStamp for b in buffer] == [
        0,
        1_000_000,
        2_000_000,
        3_000_000,
    ]


# -- faults and older drivers -------------------------------------------------------------------


def test_an_older_driver_lacks_the_new_call_and_the_older_one_serves(install, clock) -> None:
    missing = {"missing_functions": ["nvmlDeviceGetProcessesUtilizationInfo"]}
    install(scenario(driver=missing))
    clock.now = 2.0
    with pytest.raises(N.NVMLError_FunctionNotFound):
        N.nvmlDeviceGetProcessesUtilizationInfo(handle(0), 0)
    assert {s.pid for s in N.nvmlDeviceGetProcessUtilization(handle(0), 0)} == {100, 102}


def test_device_faults_hold_for_the_per_process_calls(install, clock) -> None:
    faults = [
        {"kind": "no_permission", "device": 0, "at": 5, "until": 10,
         "function": "nvmlDeviceGetComputeRunningProcesses_v3"},
        {"kind": "no_permission", "device": 0, "at": 5,
         "function": "nvmlDeviceGetProcessesUtilizationInfo"},
        {"kind": "hang", "device": 1, "at": 5, "duration": 0.3,
         "function": "nvmlDeviceGetGraphicsRunningProcesses_v3"},
        {"kind": "gpu_lost", "device": 2, "at": 20},
    ]  # fmt: skip
    install(scenario(faults=faults))
    clock.now = 5.1  # inside the hang's window: each call blocks 0.3 s of real time
    started = time.monotonic()
    assert N.nvmlDeviceGetGraphicsRunningProcesses(handle(1)) == []
    assert time.monotonic() - started >= 0.3
    clock.now = 6
    with pytest.raises(N.NVMLError_NoPermission):
        N.nvmlDeviceGetComputeRunningProcesses(handle(0))
    with pytest.raises(N.NVMLError_NoPermission):
        N.nvmlDeviceGetProcessesUtilizationInfo(handle(0), 0)
    assert [s.pid for s in N.nvmlDeviceGetProcessUtilization(handle(0), 0)][:2] == [100, 102]
    clock.now = 10
    assert len(N.nvmlDeviceGetComputeRunningProcesses(handle(0))) == 3  # and the MPS server
    parent = handle(2)
    mig = N.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    clock.now = 20
    for h in (parent, mig):
        with pytest.raises(N.NVMLError_GpuIsLost):
            N.nvmlDeviceGetComputeRunningProcesses(h)


def test_every_per_process_call_tells_its_listeners_the_time_first(install, clock) -> None:
    fake = install(scenario())
    heard: list[float] = []
    fake.process_listeners.append(heard.append)
    calls = (
        N.nvmlDeviceGetComputeRunningProcesses,
        N.nvmlDeviceGetGraphicsRunningProcesses,
        N.nvmlDeviceGetMPSComputeRunningProcesses,
        lambda h: N.nvmlDeviceGetProcessesUtilizationInfo(h, 0),
        lambda h: N.nvmlDeviceGetProcessUtilization(h, 0),
    )
    for i, call in enumerate(calls):
        clock.now = 4.0 + i
        heard.clear()
        call(handle(0))
        assert heard and set(heard) == {4.0 + i}  # pynvml's sizing call and the reading one


def test_the_mps_list_is_volta_and_newer(install) -> None:
    pascal = {"model": "Tesla P100", "architecture": "pascal"}
    volta = {"model": "Tesla V100", "architecture": "volta"}
    install(scenario(devices=[pascal, volta, mig_gpu(True)]))
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetMPSComputeRunningProcesses(handle(0))
    assert N.nvmlDeviceGetComputeRunningProcesses(handle(0))  # compute: any architecture
    assert N.nvmlDeviceGetMPSComputeRunningProcesses(handle(1)) == []

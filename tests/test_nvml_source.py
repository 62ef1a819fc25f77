"""The production NVML source, run in-process on the fake NVML with a manual clock.

Every test goes through pynvml's real wrappers, so NVML's error semantics (NotSupported,
FunctionNotFound, per-field return codes, GPU_IS_LOST, GPM per-metric failures, NaN) reach the
source exactly as they would from the driver.
"""

from __future__ import annotations

import concurrent.futures as futures
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpu_exporter.collect import reader_crew
from gpu_exporter.collect.nvml.device import DeviceReader
from gpu_exporter.collect.nvml.source import NvmlConfig, NvmlSource
from gpu_exporter.collect.source import SourceUnavailableError
from gpu_exporter.model.activity import AWAITED_FAMILY
from gpu_exporter.model.snapshot import DownCause
from tests.conftest import ManualClock
from tests.support import wait_for

H200 = {"model": "NVIDIA H200", "architecture": "hopper", "nvlink_links": 18}
BUSY = {"utilization": 0.9, "sm_active": 0.8, "tensor_active": 0.5, "power_watts": 500}


def scenario(devices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"name": "test", "defaults": {**H200, "values": BUSY}, "devices": devices, **extra}


@pytest.fixture
def start(start_source: Callable[..., NvmlSource]) -> Callable[..., NvmlSource]:
    return start_source


def tick(source: NvmlSource, clock: ManualClock, seconds: float = 1.0):
    clock.advance(seconds)
    return {d.index: d for d in source.sample()}


def test_mixed_matches_the_scenario(start, clock: ManualClock) -> None:
    source = start("mixed")
    source.sample()  # first tick only takes the GPM baseline
    devices = tick(source, clock)
    assert len(devices) == 8 and all(d.up for d in devices.values())
    launch_bound = devices[4]
    assert launch_bound.value("gpu_utilization_ratio") >= 0.9
    assert launch_bound.value("gpu_sm_active_ratio") < 0.2
    assert devices[2].value("gpu_tensor_active_ratio") > 0.5
    assert devices[3].value("gpu_dram_active_ratio") > 0.8
    assert devices[5].value("gpu_clock_event_active", reason="hw_thermal_slowdown") == 1.0
    assert devices[6].value("gpu_clock_event_active", reason="hw_power_brake_slowdown") == 1.0
    assert devices[1].value("gpu_clock_event_active", reason="hw_thermal_slowdown") == 0.0
    assert devices[0].value("gpu_clock_event_active", reason="gpu_idle") == 1.0
    assert 690 < devices[6].value("gpu_power_watts") <= 700
    assert devices[6].value("gpu_power_limit_watts") == 700
    assert devices[7].value("gpu_nvlink_bytes_total", direction="tx") > 0
    assert devices[1].info["architecture"] == "hopper"
    assert devices[1].info["pci_bus_id"].startswith("0000:")
    # Counters integrate over time: energy and throttle time grow by about rate x seconds.
    energy = devices[1].value("gpu_energy_joules_total")
    throttle = devices[5].value("gpu_clock_event_seconds_total", reason="hw_thermal_slowdown")
    later = tick(source, clock, 2.0)
    assert later[1].value("gpu_energy_joules_total") - energy == pytest.approx(2 * 520, rel=0.1)
    hw_thermal = later[5].value("gpu_clock_event_seconds_total", reason="hw_thermal_slowdown")
    assert hw_thermal - throttle == pytest.approx(2.0, abs=0.1)
    assert source.errors.snapshot() == ()


def test_activity_is_awaited_on_the_tick_that_takes_the_first_gpm_sample(
    start, clock: ManualClock
) -> None:
    """GPM diffs two samples: the first tick has no activity, and says it is awaited (not
    unavailable); the next has it, and nothing is awaited."""
    source = start("mixed")
    first = {d.index: d for d in source.sample()}
    assert all(d.value("gpu_sm_active_ratio") is None for d in first.values())
    assert [d.value(AWAITED_FAMILY) for d in first.values()] == [1.0] * 8
    second = tick(source, clock)
    assert all(d.value("gpu_sm_active_ratio") is not None for d in second.values())
    assert [d.value(AWAITED_FAMILY) for d in second.values()] == [None] * 8


def test_pre_hopper_activity_is_not_awaited(start, clock: ManualClock) -> None:
    source = start("pre-hopper")
    for samples in (source.sample(), tick(source, clock).values()):
        assert all(d.value(AWAITED_FAMILY) is None for d in samples)


def test_pre_hopper_has_no_activity_and_uses_older_calls(start, clock: ManualClock) -> None:
    source = start("pre-hopper")
    source.sample()
    devices = tick(source, clock)
    for device in devices.values():
        assert device.up
        families = device.families()
        assert not families & {"gpu_sm_active_ratio", "gpu_tensor_active_ratio"}
        assert "gpu_utilization_ratio" in families
        assert "gpu_temperature_celsius" in families  # via nvmlDeviceGetTemperature
        assert "gpu_clock_event_active" in families  # via ...ClocksThrottleReasons
        # Fields 269/270 unknown to this driver: the combined thermal violation counter.
        assert device.value("gpu_clock_event_seconds_total", reason="thermal") is not None
        # PCIe byte counters unknown: the 20 ms throughput call instead.
        assert device.value("gpu_pcie_throughput_bytes_per_second", direction="tx") is not None
        assert device.value("gpu_pcie_bytes_total", direction="tx") is None


def test_unsupported_is_learned_once_and_absent_not_zero(start, clock: ManualClock) -> None:
    spec = scenario([{"label": "consumer", "unsupported": ["power_limit", "ecc", "gpm"]}])
    source = start(spec)
    fake = source.fake
    calls = {"n": 0}
    real = fake.nvmlDeviceGetEnforcedPowerLimit

    def counting(*args: Any) -> int:
        calls["n"] += 1
        return real(*args)

    fake.nvmlDeviceGetEnforcedPowerLimit = counting
    import pynvml

    pynvml._nvmlGetFunctionPointer_cache.pop("nvmlDeviceGetEnforcedPowerLimit", None)
    for _ in range(4):
        device = tick(source, clock)[0]
    assert calls["n"] == 1, "asked again after NOT_SUPPORTED"
    families = device.families()
    assert "gpu_power_limit_watts" not in families
    assert "gpu_ecc_errors_total" not in families
    assert "gpu_sm_active_ratio" not in families
    assert "gpu_power_watts" in families
    assert source.errors.snapshot() == (), "NotSupported is not an error"


def test_older_driver_missing_functions_falls_back(start, clock: ManualClock) -> None:
    missing = [
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetSupportedClocksEventReasons",
    ]
    source = start(scenario([{"label": "old"}], driver={"missing_functions": missing}))
    for _ in range(3):
        device = tick(source, clock)[0]
    assert device.value("gpu_memory_used_bytes") is not None
    assert device.value("gpu_memory_reserved_bytes") is None  # v1 cannot split it out
    assert device.value("gpu_temperature_celsius", sensor="gpu") is not None
    assert device.value("gpu_clock_event_active", reason="gpu_idle") is not None
    function_not_found = {e.field: e.count for e in source.errors.snapshot()}
    assert function_not_found == {
        "memory_info_v2": 1,
        "temperature_v": 1,
        "clock_event_reasons": 1,
        "supported_clock_events": 1,
    }


def test_per_field_failures_are_per_field(start, clock: ManualClock) -> None:
    spec = scenario([{"label": "a"}], driver={"unsupported_fields": [83, 197, 198]})
    source = start(spec)
    device = tick(source, clock)[0]
    assert device.value("gpu_energy_joules_total") is not None  # from the energy call
    assert device.value("gpu_clock_event_seconds_total", reason="hw_thermal_slowdown") is not None
    assert device.value("gpu_pcie_throughput_bytes_per_second", direction="rx") is not None
    assert device.value("gpu_pcie_bytes_total", direction="rx") is None


def test_gpu_lost_is_down_alone_then_recovers_after_reinit(start, clock: ManualClock) -> None:
    spec = scenario(
        [{"label": "a"}, {"label": "b"}, {"label": "c"}],
        faults=[{"at": 2, "device": 1, "kind": "gpu_lost", "until": 5}],
    )
    source = start(spec, recovery_initial_backoff_seconds=0.5, recovery_max_backoff_seconds=1)
    uuid = tick(source, clock)[1].uuid
    lost = tick(source, clock, 1.5)  # t = 2.5
    assert not lost[1].up and "GPU lost" in lost[1].down_reason
    assert lost[1].down_cause is DownCause.FAILED  # NVML's own word: evidence at once
    assert lost[0].up and lost[2].up
    for _ in range(3):  # t = 3.5 .. 5.5: still lost, or back but not yet re-initialised
        devices = tick(source, clock)
        assert devices[0].up and devices[2].up
    recovered = tick(source, clock, 1.0)  # t = 6.5: re-init has happened past `until`
    assert recovered[1].up, recovered[1].down_reason
    assert recovered[1].uuid == uuid
    assert recovered[1].value("gpu_power_watts") is not None
    assert source.errors.count(field=None) >= 1


def test_a_gpu_no_reader_thread_started_on_is_unread_not_failed(
    start, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = start(scenario([{"label": "a"}, {"label": "b"}]))
    assert all(device.up for device in tick(source, clock).values())
    read_on_crew = source._read_on_crew

    def second_never_started(reads: list[Any], timeout: float | None = None) -> list[Any]:
        never: futures.Future[Any] = futures.Future()
        never.cancel()  # what the crew hands back for a read no thread was free to start
        return [*read_on_crew(reads[:1], timeout), never]

    monkeypatch.setattr(source, "_read_on_crew", second_never_started)
    devices = tick(source, clock)
    assert devices[0].up
    assert not devices[1].up and "every reader thread was busy" in devices[1].down_reason
    assert devices[1].down_cause is DownCause.UNREAD  # the daemon's doing, not the GPU's


@pytest.mark.parametrize("hung", [0, 1])  # the GPU read first, or after the other
def test_hung_call_does_not_stall_the_others(start, clock: ManualClock, hung: int) -> None:
    spec = scenario(
        [{"label": "a"}, {"label": "b"}],
        faults=[
            {
                "at": 0,
                "device": hung,
                "kind": "hang",
                "function": "nvmlDeviceGetPowerUsage",
                "duration": 3,
            }
        ],
    )
    source = start(spec, device_deadline_seconds=0.5)
    started = time.monotonic()
    devices = tick(source, clock, 0.5)
    assert time.monotonic() - started < 2.0, "the tick waited for the hung call"
    assert devices[1 - hung].up
    assert not devices[hung].up and "power_usage" in devices[hung].down_reason
    assert devices[hung].down_cause is DownCause.LATE  # a hang only if the next is late too
    # Next tick: a fresh thread, the hung call skipped, everything else read. Its deadline is
    # not what it tests: a loaded machine gets time to read both GPUs (a call not skipped
    # would still answer within it, after the fault's 3 s, and be read).
    source.deadline_seconds = 5.0
    devices = tick(source, clock, 0.5)
    assert devices[hung].up
    assert devices[hung].value("gpu_power_watts") is None
    assert devices[hung].value("gpu_utilization_ratio") is not None
    assert any(e.error == "Timeout" and e.field == "power_usage" for e in source.errors.snapshot())


def test_gpus_that_answer_are_read_in_turn_on_one_thread(
    start, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a thread per GPU: eight threads runnable at once fight for the GIL at every NVML
    call, which costs more CPU than the reads. (A handover and a budget longer than any
    read here, so that a loaded machine does not bring in a second reader.)"""
    monkeypatch.setattr(reader_crew, "HANDOVER_SECONDS", 5.0)
    monkeypatch.setattr(reader_crew, "BUDGET_SHARE", 1.0)
    readers: set[str] = set()
    read_tick = DeviceReader.read_tick

    def noting_the_thread(self: DeviceReader, *args: Any) -> Any:
        readers.add(threading.current_thread().name)
        return read_tick(self, *args)

    monkeypatch.setattr(DeviceReader, "read_tick", noting_the_thread)
    source = start("mixed")
    for _ in range(3):
        assert all(d.up for d in tick(source, clock).values())
    assert len(readers) == 1 and next(iter(readers)).startswith("nvml-reader-")


def test_gpm_nan_leaves_that_metric_out(start, clock: ManualClock) -> None:
    spec = scenario(
        [{"label": "a"}],
        faults=[{"at": 0, "device": 0, "kind": "gpm_nan", "metric": 5, "until": 9}],
    )
    source = start(spec)
    source.sample()
    device = tick(source, clock)[0]
    assert device.value("gpu_tensor_active_ratio") is None
    assert device.value("gpu_sm_active_ratio") == pytest.approx(0.8, abs=0.05)
    assert any(e.source == "gpm" and e.error == "NaN" for e in source.errors.snapshot())
    clock.advance(10)
    source.sample()
    assert tick(source, clock)[0].value("gpu_tensor_active_ratio") == pytest.approx(0.5, abs=0.05)


def test_xid_events_are_counted_once(start, clock: ManualClock) -> None:
    spec = scenario(
        [{"label": "a"}, {"label": "b"}], faults=[{"at": 1, "device": 1, "kind": "xid", "xid": 79}]
    )
    source = start(spec)
    clock.advance(1.5)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        devices = {d.index: d for d in source.sample()}
        if devices[1].value("gpu_xid_errors_total", xid="79"):
            break
        time.sleep(0.1)
    assert devices[1].value("gpu_xid_errors_total", xid="79") == 1
    assert devices[1].value("gpu_xid_last_timestamp_seconds", xid="79") > 1e9
    # An alerted XID's counter exists at 0 before the first one (gpu_exporter/model/xids.py).
    assert devices[0].value("gpu_xid_errors_total", xid="79") == 0
    assert devices[0].value("gpu_xid_last_timestamp_seconds", xid="79") is None
    time.sleep(1.0)
    assert tick(source, clock)[1].value("gpu_xid_errors_total", xid="79") == 1


def test_without_driver_the_error_says_how_to_simulate(fake_nvml) -> None:
    fake_nvml.uninstall()  # the real library: absent on this machine
    with pytest.raises(SourceUnavailableError, match="--simulate"):
        NvmlSource().start()


def test_a_gpu_lost_for_good_barely_disturbs_the_others(start, clock: ManualClock) -> None:
    spec = scenario(
        [{"label": "healthy"}, {"label": "dead"}],
        faults=[{"at": 1, "device": 1, "kind": "gpu_lost"}],  # no `until`: never comes back
    )
    source = start(spec, recovery_initial_backoff_seconds=1, recovery_max_backoff_seconds=4)
    fake = source.fake
    source.sample()
    with_activity = 0
    for _ in range(40):
        devices = tick(source, clock)
        assert devices[0].up, devices[0].down_reason
        with_activity += devices[0].value("gpu_sm_active_ratio") is not None
        assert not devices[1].up
    # Back-off keeps full re-inits (which restart GPM windows) rare: a handful in 40 s.
    assert fake.generation <= 7, fake.generation
    assert with_activity >= 32, with_activity


def test_a_gpu_lost_at_start_joins_after_recovery(start, clock: ManualClock) -> None:
    spec = scenario(
        [{"label": "a"}, {"label": "late"}],
        faults=[{"at": 0, "device": 1, "kind": "gpu_lost", "until": 2}],
    )
    source = start(spec, recovery_initial_backoff_seconds=0.5, recovery_max_backoff_seconds=1)
    first = {d.index: d for d in source.sample()}
    # GPU 1 could not even be read: shown down (no UUID yet) with the reason, not left out.
    assert first[0].up and not first[1].up and first[1].uuid == ""
    assert "GpuIsLost" in first[1].down_reason
    for _ in range(6):
        devices = tick(source, clock)
    assert set(devices) == {0, 1}
    assert all(d.up for d in devices.values()), [d.down_reason for d in devices.values()]
    assert devices[1].info["model"] == "NVIDIA H200"


def test_a_slow_reinit_runs_beside_the_sampler(start, clock: ManualClock) -> None:
    spec = scenario(
        [{"label": "a"}, {"label": "b"}],
        faults=[{"at": 1, "device": 1, "kind": "gpu_lost", "until": 2}],
        latency={"functions": {"nvmlInitWithFlags": 1500}},
    )
    source = start(
        spec,
        recovery_initial_backoff_seconds=0.1,
        recovery_max_backoff_seconds=0.2,
        device_deadline_seconds=0.2,
    )
    tick(source, clock)
    clock.advance(1.5)
    slowest, recovered = 0.0, False
    for _ in range(40):
        started = time.monotonic()
        devices = tick(source, clock, 0.25)
        slowest = max(slowest, time.monotonic() - started)
        if all(d.up for d in devices.values()):
            recovered = True
            break
        time.sleep(0.05)
    assert recovered, [d.down_reason for d in devices.values()]
    assert slowest < 1.0, "a tick waited for the 1.5 s nvmlInit"


def test_driver_replaced_under_the_daemon_triggers_reinit(start, clock: ManualClock) -> None:
    import pynvml

    source = start(scenario([{"label": "a"}]), recovery_initial_backoff_seconds=0.5)
    fake = source.fake
    real_power = fake.nvmlDeviceGetPowerUsage
    upgraded = {"now": True}

    def power(*args: Any) -> int:
        return pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH if upgraded["now"] else real_power(*args)

    fake.nvmlDeviceGetPowerUsage = power
    pynvml._nvmlGetFunctionPointer_cache.pop("nvmlDeviceGetPowerUsage", None)
    generation = fake.generation
    device = tick(source, clock)[0]
    assert not device.up and "driver" in device.down_reason.lower()
    counted = {(e.field, e.error) for e in source.errors.snapshot()}
    assert ("power_usage", "LibRmVersionMismatch") in counted  # counted by the choke point
    upgraded["now"] = False
    for _ in range(3):
        device = tick(source, clock)[0]
    assert device.up, device.down_reason
    assert fake.generation > generation, "NVML was not re-initialised"


def test_xid_is_still_reported_while_the_gpu_is_down(start, clock: ManualClock) -> None:
    spec = scenario(
        [{"label": "a"}],
        faults=[
            {"at": 1, "device": 0, "kind": "xid", "xid": 79},
            {"at": 1.2, "device": 0, "kind": "gpu_lost"},
        ],
    )
    source = start(spec)
    clock.advance(1.1)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not source._xid_counts.for_gpu(source.sample()[0].uuid):
        time.sleep(0.05)
    device = tick(source, clock, 0.5)[0]
    assert not device.up
    assert device.value("gpu_xid_errors_total", xid="79") == 1


def test_xid_registration_failures_are_counted_like_any_nvml_failure(
    start, clock: ManualClock
) -> None:
    spec = scenario(
        [{"label": "a"}, {"label": "b"}],
        faults=[
            {"at": 0, "device": 1, "kind": "no_permission", "function": "nvmlDeviceRegisterEvents"}
        ],
    )
    source = start(spec)
    counted = [(e.source, e.field, e.error, e.count) for e in source.errors.snapshot()]
    assert counted == [("nvml", "xid_events", "NoPermission", 1)]
    assert source._xid is not None and len(source._xid.registered) == 1  # GPU 0 still is


def test_an_init_that_fails_once_serving_is_retried_with_back_off(fake_nvml) -> None:
    fake_nvml.uninstall()  # the real library: absent on this machine
    settings = NvmlConfig(recovery_initial_backoff_seconds=0.2, recovery_max_backoff_seconds=0.4)
    source = NvmlSource(settings=settings)
    assert source.progress.commit(0) is None  # the daemon serves: from now on, failures retry
    source.begin()
    try:
        reason = wait_for(
            lambda: (
                "LibraryNotFound" in (source.progress.reason() or "") and source.progress.reason()
            ),
            10,
            "a failed attempt",
        )
        assert reason.startswith("NVML init not finished after"), reason
        assert "next in" in reason and source.progress.failure is None
        fake_nvml.install(scenario([{"label": "a"}, {"label": "b"}]))  # the driver arrives
        assert source.progress.wait_ready(10), source.progress.reason()
        assert [d.up for d in source.sample()] == [True, True]
    finally:
        source.close()


def test_a_hung_init_is_tried_again_and_the_first_answer_wins(fake_nvml) -> None:
    spec = scenario([{"label": "a"}], latency={"functions": {"nvmlInitWithFlags": 2500}})
    fake = fake_nvml.install(spec)
    settings = NvmlConfig(hang_quarantine_seconds=1)
    source = NvmlSource(settings=settings, max_abandoned_threads_per_device=1)
    try:
        source.start()
        assert fake.call_counts["nvmlInitWithFlags"] == 2  # one left behind, one more tried
        assert source.errors.count("nvml", "init") == 1  # the timeout, counted
        assert [d.up for d in source.sample()] == [True]
    finally:
        source.close()


def test_a_gpu_whose_uuid_read_hangs_is_down_and_costs_no_re_init_while_hung(
    start, clock: ManualClock
) -> None:
    hang = {"at": 0, "device": 1, "kind": "hang", "function": "nvmlDeviceGetUUID"}
    spec = scenario([{"label": "a"}, {"label": "hung"}], faults=[{**hang, "duration": 600}])
    source = start(spec, device_deadline_seconds=1.0, recovery_initial_backoff_seconds=0.1)
    fake = source.fake
    for _ in range(5):
        devices = tick(source, clock)
        assert devices[0].up, devices[0].down_reason
        assert not devices[1].up and devices[1].uuid == ""
        assert "nvmlDeviceGetUUID did not answer in time" in devices[1].down_reason
    # Re-enumerating while the read is stuck would only hang again, every GPU down meanwhile.
    assert fake.generation == 1
    assert source.errors.count("nvml", "device_handle") == 1


def test_closing_during_start_up_is_clean(fake_nvml) -> None:
    # serve closes the source while start-up may still be adding GPUs (a signal, or bad input
    # found meanwhile): nothing may raise on either thread, and every GPU's worker is stopped.
    fake_nvml.install(scenario([{"label": str(i)} for i in range(8)]))
    failures: list[BaseException] = []
    previous = threading.excepthook
    threading.excepthook = lambda args: failures.append(args.exc_value)  # type: ignore[assignment]
    try:
        for _ in range(20):
            source = NvmlSource(settings=NvmlConfig())
            source.begin()
            source.close()
            assert source._startup is not None
            source._startup.join(5)  # a start-up that outlived close() would add GPUs now
            assert not source._devices
    finally:
        threading.excepthook = previous
    assert not failures, failures

"""Activity as counters (collect/activity_time.py): each tick adds ratio x elapsed time, nothing
that was not measured, per GPU and per MIG instance."""

from __future__ import annotations

import pytest

from gpu_exporter.collect.activity_time import MAX_GAP_SECONDS, ActivityTime
from gpu_exporter.model.snapshot import DeviceSample, InstanceSample, Reading


def gpu(sm: float | None, *instances: InstanceSample) -> DeviceSample:
    readings = () if sm is None else (Reading("gpu_sm_active_ratio", sm),)
    return DeviceSample(0, "GPU-a", {}, True, readings, instances=instances)


def counter(device: DeviceSample | InstanceSample, family: str) -> float | None:
    values = [r.value for r in device.readings if r.family == family]
    return values[0] if values else None


def test_each_tick_adds_the_ratio_times_the_time_since_the_previous_tick() -> None:
    clock = ActivityTime()
    (first,) = clock.process([gpu(0.5)], 100.0)
    assert counter(first, "gpu_sm_active_seconds_total") == 0.0  # born at 0: rate() sees it all
    clock.process([gpu(0.5)], 101.0)
    (third,) = clock.process([gpu(0.25)], 103.0)
    assert counter(third, "gpu_sm_active_seconds_total") == pytest.approx(0.5 + 0.25 * 2)
    assert counter(third, "gpu_tensor_active_seconds_total") is None  # never measured: absent


def test_a_tick_without_the_ratio_adds_nothing_and_shows_no_counter() -> None:
    clock = ActivityTime()
    clock.process([gpu(1.0)], 0.0)
    (missing,) = clock.process([gpu(None)], 1.0)
    assert counter(missing, "gpu_sm_active_seconds_total") is None
    (back,) = clock.process([gpu(1.0)], 2.0)
    assert counter(back, "gpu_sm_active_seconds_total") == pytest.approx(1.0)  # the last window


def test_a_gap_longer_than_any_interval_is_not_counted() -> None:
    clock = ActivityTime()
    clock.process([gpu(1.0)], 0.0)
    (after,) = clock.process([gpu(1.0)], MAX_GAP_SECONDS + 1.0)
    assert counter(after, "gpu_sm_active_seconds_total") == 0.0
    (before,) = clock.process([gpu(1.0)], -5.0)  # the wall clock went back
    assert counter(before, "gpu_sm_active_seconds_total") == 0.0


def test_each_mig_instance_has_its_own_counter() -> None:
    def instance(gi: int, ratio: float) -> InstanceSample:
        readings = (Reading("gpu_graphics_engine_active_ratio", ratio),)
        return InstanceSample(gi, 0, f"MIG-{gi}", "1g.18gb", readings=readings)

    clock = ActivityTime()
    clock.process([gpu(None, instance(1, 0.2), instance(2, 0.8))], 0.0)
    (device,) = clock.process([gpu(None, instance(1, 0.2), instance(2, 0.8))], 10.0)
    one, two = device.instances
    assert counter(one, "gpu_graphics_engine_active_seconds_total") == pytest.approx(2.0)
    assert counter(two, "gpu_graphics_engine_active_seconds_total") == pytest.approx(8.0)
    assert counter(device, "gpu_graphics_engine_active_seconds_total") is None

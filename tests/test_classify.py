"""The bottleneck classifier on crafted samples: each class, `unknown`, time accounting."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_exporter.collect.classify import (
    CLASSES,
    Classifier,
    nvlink_capacity,
    pcie_capacity,
)
from gpu_exporter.collect.settings import ClassifierConfig
from gpu_exporter.model.snapshot import DeviceSample, Reading

GEN5_X16 = 32e9 * 128 / 130 / 8 * 16  # 63 GB/s per direction
H200_NVLINK = 18 * 25e9  # 450 GB/s per direction


def sample(
    t: float,
    *,
    util: float | None = 0.98,
    sm: float | None = 0.9,
    tensor: float | None = 0.05,
    dram: float | None = 0.3,
    reasons: tuple[str, ...] = (),
    pcie_rate: float | None = 1e9,
    nvlink_rate: float | None = 5e9,
    throttle_counters: dict[str, float] | None = None,
    pcie_gauge: float | None = None,
    up: bool = True,
    uuid: str = "GPU-a",
    architecture: str = "hopper",
) -> DeviceSample:
    """One tick at time t; counters grow at the given rates since t = 0."""
    r: list[Reading] = []

    def add(family: str, value: float | None, **labels: str) -> None:
        if value is not None:
            r.append(Reading(family, value, tuple(labels.items())))

    add("gpu_utilization_ratio", util)
    add("gpu_sm_active_ratio", sm)
    add("gpu_tensor_active_ratio", tensor)
    add("gpu_dram_active_ratio", dram)
    for reason in ("gpu_idle", "sw_power_cap", "hw_slowdown", "hw_thermal_slowdown"):
        add("gpu_clock_event_active", float(reason in reasons), reason=reason)
    for reason, rate in (throttle_counters or {}).items():
        add("gpu_clock_event_seconds_total", rate * t, reason=reason)
    add("gpu_pcie_link_generation", 5, state="current")
    add("gpu_pcie_link_width", 16, state="current")
    if pcie_rate is not None:
        add("gpu_pcie_bytes_total", pcie_rate * t, direction="tx")
        add("gpu_pcie_bytes_total", pcie_rate * t / 2, direction="rx")
    add("gpu_pcie_throughput_bytes_per_second", pcie_gauge, direction="tx")
    if nvlink_rate is not None:
        add("gpu_nvlink_links_active", 18)
        add("gpu_nvlink_bytes_total", nvlink_rate * t, direction="tx")
        add("gpu_nvlink_bytes_total", nvlink_rate * t, direction="rx")
    info = {"model": "NVIDIA H200", "architecture": architecture}
    return DeviceSample(0, uuid, info, up, tuple(r) if up else (), "" if up else "lost")


def classify(classifier: Classifier | None = None, ticks: int = 4, **values: Any) -> str:
    classifier = classifier or Classifier()
    out: list[DeviceSample] = []
    for t in range(ticks):
        out = classifier.process([sample(float(t), **values)], float(t))
    return current_class(out[0])


def current_class(device: DeviceSample) -> str:
    active = [
        dict(r.labels)["class"]
        for r in device.readings
        if r.family == "gpu_bottleneck" and r.value == 1.0
    ]
    assert len(active) == 1, active
    return active[0]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"util": 0.0, "sm": 0.0, "tensor": 0.0, "dram": 0.0, "reasons": ("gpu_idle",)}, "idle"),
        ({"util": 0.02, "sm": None, "tensor": None, "dram": None}, "idle"),
        ({"reasons": ("hw_slowdown", "hw_thermal_slowdown")}, "throttled"),
        ({"sm": 0.12, "tensor": 0.01, "dram": 0.04}, "launch_bound"),
        ({"util": 0.3, "sm": 0.28, "tensor": 0.0, "dram": 0.1}, "launch_bound"),  # host-starved
        ({"sm": 0.22, "dram": 0.2, "nvlink_rate": 3.5e11}, "link_bound"),
        ({"sm": 0.22, "dram": 0.2, "pcie_rate": 45e9}, "link_bound"),
        ({"sm": 0.55, "tensor": 0.03, "dram": 0.92}, "memory_bound"),
        ({"sm": 0.3, "tensor": 0.03, "dram": 0.85}, "memory_bound"),
        ({"sm": 0.9, "tensor": 0.78, "dram": 0.45}, "tensor_bound"),
        ({"sm": 0.9, "tensor": 0.8, "dram": 0.75}, "tensor_bound"),  # tensor roof is nearer
        ({"sm": 0.92, "tensor": 0.05, "dram": 0.3}, "compute_bound"),
        ({"sm": 0.6, "tensor": 0.3, "dram": 0.3}, "compute_bound"),
    ],
)
def test_each_class(values: dict[str, Any], expected: str) -> None:
    assert classify(**values) == expected


def test_unknown_when_activity_is_absent() -> None:
    # pre-Hopper without DCGM: utilization alone cannot tell launch-bound from compute-bound.
    assert classify(sm=None, tensor=None, dram=None) == "unknown"
    assert classify(dram=None) == "unknown"  # one of the three missing is enough


def test_unknown_when_sm_activity_is_stuck_at_zero_while_busy() -> None:
    # dcgm-exporter #662: SM activity read 0 for weeks while utilization said 99 %.
    assert classify(util=0.99, sm=0.0, tensor=0.0, dram=0.0) == "unknown"
    classifier = Classifier()
    classify(classifier, util=0.99, sm=0.0, tensor=0.0, dram=0.0)
    verdict = classifier.verdict("GPU-a")
    assert verdict is not None and "stuck" in verdict.why
    # An idle GPU legitimately reads 0: that is idle, not stuck.
    assert classify(util=0.0, sm=0.0, tensor=0.0, dram=0.0) == "idle"


def test_unknown_when_low_sm_activity_cannot_be_explained_without_link_data() -> None:
    # Launch-bound or link-bound? Without PCIe data that would be a guess.
    assert classify(sm=0.12, dram=0.04, pcie_rate=None) == "unknown"
    # NVLink traffic on an architecture whose link rate is unknown cannot be judged either.
    assert classify(sm=0.12, dram=0.04, architecture="future") == "unknown"
    # A PCIe-only card (no NVLink readings) needs only PCIe.
    assert classify(sm=0.12, dram=0.04, nvlink_rate=None) == "launch_bound"
    # SMs busy: links do not matter.
    assert classify(sm=0.9, pcie_rate=None) == "compute_bound"


def test_pcie_throughput_gauge_is_used_without_byte_counters() -> None:
    assert classify(sm=0.2, dram=0.1, pcie_rate=None, pcie_gauge=50e9) == "link_bound"
    assert classify(sm=0.2, dram=0.1, pcie_rate=None, pcie_gauge=1e9) == "launch_bound"


def test_throttle_from_counters_and_bits() -> None:
    # The counter sees throttling between ticks even when no sampled bit shows it.
    assert classify(throttle_counters={"hw_thermal_slowdown": 0.5}) == "throttled"
    assert classify(throttle_counters={"thermal": 0.3}) == "throttled"  # pre-R535 fallback
    assert classify(throttle_counters={"hw_power_brake_slowdown": 0.1}) == "compute_bound"
    # Running at the power limit is normal operation, not throttling.
    assert classify(reasons=("sw_power_cap",)) == "compute_bound"
    # Idle comes first: an idle GPU with the brake on is idle (diagnose reports the brake).
    assert classify(util=0.0, sm=0.0, reasons=("hw_slowdown",)) == "idle"


def test_throttle_fraction_over_the_window() -> None:
    classifier = Classifier(window_seconds=5)
    out = []
    for t in range(6):  # hw_slowdown in 1 of the last 6 samples
        reasons = ("hw_slowdown",) if t == 5 else ()
        out = classifier.process([sample(float(t), reasons=reasons)], float(t))
    assert current_class(out[0]) == "compute_bound"  # 1/6 < 0.2
    out = classifier.process([sample(6.0, reasons=("hw_slowdown",))], 6.0)
    assert current_class(out[0]) == "throttled"  # 2/6


def test_thresholds_are_respected() -> None:
    values = {"sm": 0.9, "tensor": 0.1, "dram": 0.65}
    assert classify(**values) == "compute_bound"
    assert classify(Classifier(ClassifierConfig(dram_active_high=0.6)), **values) == "memory_bound"
    assert classify(Classifier(ClassifierConfig(idle_utilization=0.99)), **values) == "idle"
    assert classify(sm=0.45, dram=0.1) == "launch_bound"
    assert classify(Classifier(ClassifierConfig(sm_active_low=0.4)), sm=0.45, dram=0.1) == (
        "compute_bound"
    )
    assert classify(sm=0.9, tensor=0.4) == "compute_bound"
    assert classify(Classifier(ClassifierConfig(tensor_active_high=0.3)), sm=0.9, tensor=0.4) == (
        "tensor_bound"
    )
    link = {"sm": 0.2, "dram": 0.1, "pcie_rate": 30e9}  # 48 % of Gen5 x16
    assert classify(**link) == "launch_bound"
    assert classify(Classifier(ClassifierConfig(link_utilization_high=0.4)), **link) == "link_bound"


def test_invalid_thresholds_are_refused() -> None:
    with pytest.raises(ValueError, match="sm_active_low"):
        ClassifierConfig(sm_active_low=1.5)
    with pytest.raises(ValueError, match="window_seconds"):
        Classifier(window_seconds=0)


def test_state_set_and_seconds_total_readings() -> None:
    classifier = Classifier(window_seconds=5)
    out = classifier.process([sample(0.0)], 0.0)
    device = out[0]
    states = {
        dict(r.labels)["class"]: r.value for r in device.readings if r.family == "gpu_bottleneck"
    }
    assert set(states) == set(CLASSES) and sum(states.values()) == 1.0
    totals = {
        dict(r.labels)["class"]: r.value
        for r in device.readings
        if r.family == "gpu_bottleneck_seconds_total"
    }
    assert set(totals) == set(CLASSES) and sum(totals.values()) == 0.0  # nothing known before
    # The input readings are kept.
    assert device.value("gpu_sm_active_ratio") == 0.9


def test_seconds_total_accumulates_per_device_and_is_capped() -> None:
    classifier = Classifier(window_seconds=5)
    for t in (0.0, 1.0, 2.0, 3.5):
        out = classifier.process([sample(t), sample(t, uuid="GPU-b", util=0.0)], t)
    assert out[0].value("gpu_bottleneck_seconds_total", **{"class": "compute_bound"}) == 3.5
    assert out[1].value("gpu_bottleneck_seconds_total", **{"class": "idle"}) == 3.5
    # A long gap (a stalled sampler) counts at most one window: nothing is known about it.
    out = classifier.process([sample(100.0)], 100.0)
    assert out[0].value("gpu_bottleneck_seconds_total", **{"class": "compute_bound"}) == 8.5
    # Time going backwards (wall clock stepped) attributes nothing.
    out = classifier.process([sample(99.0)], 99.0)
    assert out[0].value("gpu_bottleneck_seconds_total", **{"class": "compute_bound"}) == 8.5
    assert classifier.seconds("GPU-a")["compute_bound"] == 8.5


def test_class_changes_are_attributed_to_the_new_class() -> None:
    classifier = Classifier(window_seconds=1)
    for t in range(3):
        classifier.process([sample(float(t), util=0.0, sm=0.0)], float(t))
    for t in range(3, 6):
        out = classifier.process([sample(float(t))], float(t))
    seconds = classifier.seconds("GPU-a")
    assert seconds["idle"] == 2.0
    assert sum(seconds.values()) == 5.0  # the tick that straddles the change is mixed
    assert seconds["compute_bound"] == 2.0
    assert current_class(out[0]) == "compute_bound"


def test_down_devices_get_no_class_and_their_downtime_no_seconds() -> None:
    classifier = Classifier(window_seconds=5)
    classifier.process([sample(0.0)], 0.0)
    classifier.process([sample(1.0)], 1.0)
    down = classifier.process([sample(2.0, up=False)], 2.0)[0]
    assert not down.families() & {"gpu_bottleneck", "gpu_bottleneck_seconds_total"}
    assert classifier.verdict("GPU-a") is None
    back = classifier.process([sample(3.0)], 3.0)[0]
    # 1 s before the outage; the outage and the first tick after it add nothing.
    assert back.value("gpu_bottleneck_seconds_total", **{"class": "compute_bound"}) == 1.0


def test_counter_resets_are_skipped() -> None:
    classifier = Classifier(window_seconds=10)
    classifier.process([sample(10.0, sm=0.2, dram=0.1, pcie_rate=50e9)], 0.0)
    # The driver reloaded: counters restart near 0. The negative step is not a rate.
    out = classifier.process([sample(1.0, sm=0.2, dram=0.1, pcie_rate=50e9)], 1.0)
    verdict = classifier.verdict("GPU-a")
    assert verdict is not None and verdict.stats.pcie_bytes_per_second is None
    assert current_class(out[0]) == "unknown"
    out = classifier.process([sample(2.0, sm=0.2, dram=0.1, pcie_rate=50e9)], 2.0)
    assert current_class(out[0]) == "link_bound"


def test_processing_twice_replaces_the_class_readings() -> None:
    classifier = Classifier()
    once = classifier.process([sample(0.0)], 0.0)
    twice = classifier.process(once, 1.0)[0]
    assert sum(1 for r in twice.readings if r.family == "gpu_bottleneck") == len(CLASSES)


def test_pure_and_deterministic() -> None:
    def run() -> list[tuple[str, float]]:
        classifier = Classifier()
        out = []
        for t in range(5):
            out = classifier.process([sample(float(t), sm=0.1 * t, dram=0.2)], float(t))
        return [(r.family, r.value) for r in out[0].readings]

    assert run() == run()


def test_link_capacities() -> None:
    assert pcie_capacity(5, 16) == pytest.approx(63.0e9, rel=0.01)
    assert pcie_capacity(4, 16) == pytest.approx(31.5e9, rel=0.01)
    assert pcie_capacity(3, 8) == pytest.approx(7.88e9, rel=0.01)
    assert pcie_capacity(5, None) is None and pcie_capacity(99, 16) is None
    assert nvlink_capacity("hopper", 18) == H200_NVLINK
    assert nvlink_capacity("ampere", 12) == 300e9  # A100: 600 GB/s both directions
    assert nvlink_capacity("blackwell", 18) == 900e9
    assert nvlink_capacity("ada", 0) is None


def test_a_mig_instance_missing_for_a_tick_keeps_its_seconds_until_long_gone() -> None:
    from gpu_exporter.collect.classify import INSTANCE_RETENTION_SECONDS
    from gpu_exporter.model.snapshot import InstanceSample

    busy = (
        Reading("gpu_graphics_engine_active_ratio", 0.95),
        Reading("gpu_sm_active_ratio", 0.9),
        Reading("gpu_tensor_active_ratio", 0.1),
        Reading("gpu_dram_active_ratio", 0.2),
    )
    instance = InstanceSample(9, 0, "MIG-a", "1g.18gb", readings=busy)
    parent = DeviceSample(0, "GPU-a", {"architecture": "hopper"}, True, mig_enabled=True)
    with_instance = DeviceSample(
        0, "GPU-a", {"architecture": "hopper"}, True, instances=(instance,), mig_enabled=True
    )
    classifier = Classifier()
    for t in range(5):
        out = classifier.process([with_instance], float(t))[0]
    # A MIG parent has no class of its own; its instance does.
    assert out.value("gpu_bottleneck", **{"class": "unknown"}) is None
    assert out.instances[0].value("gpu_bottleneck", **{"class": "compute_bound"}) == 1.0
    before = classifier.seconds("GPU-a", "MIG-a")["compute_bound"]
    assert before == 4.0
    classifier.process([parent], 5.0)  # its read failed this tick: no instances
    after = classifier.process([with_instance], 6.0)[0]
    # Kept, and the gap is not attributed to any class.
    assert classifier.seconds("GPU-a", "MIG-a")["compute_bound"] == before
    assert (
        after.instances[0].value("gpu_bottleneck_seconds_total", **{"class": "compute_bound"})
        == before
    )
    classifier.process([parent], 7.0 + INSTANCE_RETENTION_SECONDS)
    assert classifier.seconds("GPU-a", "MIG-a")["compute_bound"] == 0.0  # reconfigured away

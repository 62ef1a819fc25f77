"""MIG through the production NVML source, on the fake NVML's `mig` scenario (manual clock).

Each test names what it would catch: parent quantities repeated on instances, instance
quantities on the parent, a GI id reused across a reconfiguration diffed as one instance, a
stale handle taken for a lost GPU, leaked GPM samples, NoPermission on the parent's
aggregate memory reported as anything but absent and counted, and instances that vanish
while an identity call hangs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter.collect.nvml.source import NvmlSource
from gpu_exporter.model.activity import AWAITED_FAMILY
from gpu_exporter.model.series import SeriesBuilder, SeriesSet
from gpu_exporter.model.snapshot import DeviceSample, InstanceSample, Snapshot
from gpu_exporter.sim.clock import ManualClock
from gpu_exporter.sim.scenario import load_scenario

MIG = load_scenario("mig")
MIG_FILE = Path(__file__).resolve().parent.parent / "gpu_exporter/sim/scenarios/mig.yaml"
PARENT_ONLY = (
    "gpu_power_watts",
    "gpu_energy_joules_total",
    "gpu_temperature_celsius",
    "gpu_clock_hertz",
    "gpu_clock_event_active",
    "gpu_pcie_bytes_total",
    "gpu_nvlink_bytes_total",
    "gpu_utilization_ratio",
)
ACTIVITY = ("gpu_sm_active_ratio", "gpu_tensor_active_ratio", "gpu_graphics_engine_active_ratio")


# One GPU that gains a GPU instance at 20 s, destroying nothing (no handle goes stale).
GROWING = {
    "name": "grow",
    "devices": [
        {
            "mig": {
                "instances": [
                    {"profile": "3g.71gb", "values": {"sm_active": 0.5}},
                    {"profile": "4g.71gb", "from": 20, "values": {"sm_active": 0.7}},
                ]
            }
        }
    ],
}


def ticks(source: NvmlSource, clock: ManualClock, n: int = 3) -> dict[int, DeviceSample]:
    samples: list[DeviceSample] = []
    for _ in range(n):
        clock.advance(1.0)
        samples = source.sample()
    return {d.index: d for d in samples}


def series_of(devices: dict[int, DeviceSample]) -> SeriesSet:
    return SeriesBuilder().build(Snapshot(0.0, tuple(devices.values())))


def by_gi(device: DeviceSample) -> dict[int, list[InstanceSample]]:
    out: dict[int, list[InstanceSample]] = {}
    for instance in device.instances:
        out.setdefault(instance.gpu_instance, []).append(instance)
    return out


@pytest.fixture
def mig(start_source: Callable[..., Any], clock: ManualClock) -> NvmlSource:
    clock.now = 10.0
    # The scenario hangs nothing: a deadline no busy machine misses, so that every tick reads
    # every GPU and what the tests count (instances, GPM samples) is the scenario's.
    source: NvmlSource = start_source("mig", xid_events=False, device_deadline_seconds=5.0)
    return source


def test_instances_carry_their_identity_and_only_their_own_quantities(
    mig: NvmlSource, clock: ManualClock
) -> None:
    devices = ticks(mig, clock)
    seven = devices[0]
    spec = MIG.devices[0].mig
    assert spec is not None
    assert [i.mig_uuid for i in seven.instances] == [i.mig_uuids[0] for i in spec.instances]
    assert {i.profile for i in seven.instances} == {"1g.18gb"}
    for instance in seven.instances:
        families = {r.family for r in instance.readings}
        assert set(ACTIVITY) | {"gpu_memory_used_bytes", "gpu_mig_instance_slices"} <= families
        assert not families & set(PARENT_ONLY), "a parent quantity on an instance"
    # Parent quantities stay on the parent, once; instance quantities are not there.
    parent = {r.family for r in seven.readings}
    assert {"gpu_power_watts", "gpu_energy_joules_total", "gpu_clock_hertz"} <= parent
    assert not parent & {*ACTIVITY, "gpu_utilization_ratio", "gpu_memory_used_bytes"}
    assert seven.value("gpu_mig_mode", state="current") == 1.0
    # The MIG-off GPU is a whole GPU as before, with its MIG mode.
    whole = devices[2]
    assert not whole.instances and whole.value("gpu_mig_mode", state="current") == 0.0
    assert whole.value("gpu_utilization_ratio") is not None


def test_series_labels_and_power_once_per_parent(mig: NvmlSource, clock: ManualClock) -> None:
    rows = series_of(ticks(mig, clock))
    power = rows.of("gpu_power_watts")
    assert sorted(dict(r.labels)["gpu"] for r in power) == ["0", "1", "2", "3"]
    assert all("mig_uuid" not in dict(r.labels) for r in power)
    sm = [dict(r.labels) for r in rows.of("gpu_sm_active_ratio")]
    launch = next(labels for labels in sm if labels.get("gpu_instance") == "9")
    assert set(launch) == {"gpu", "uuid", "gpu_instance", "mig_uuid", "mig_profile"}
    assert launch["uuid"] == MIG.devices[0].uuid and launch["mig_profile"] == "1g.18gb"
    # Whole GPU 2's series, and no other GPU's, have no instance labels.
    assert [labels for labels in sm if "mig_uuid" not in labels] == [
        {"gpu": "2", "uuid": MIG.devices[2].uuid}
    ]
    assert rows.collectors and all(status.success for status in rows.collectors)


def test_a_split_gpu_instance_and_one_without_compute_instance(
    mig: NvmlSource, clock: ManualClock
) -> None:
    a100 = ticks(mig, clock)[3]
    groups = by_gi(a100)
    assert sorted(groups) == [1, 5, 14]  # GI 13 has no compute instance: no MIG device
    shared = groups[1]
    assert [i.compute_instance for i in shared] == [0, 1, 2] and all(i.shared for i in shared)
    assert dict(shared[0].labels)["compute_instance"] == "0"
    assert "compute_instance" not in dict(groups[5][0].labels)
    for instance in shared:  # the GI's memory and activity belong to none of its CIs alone
        assert {r.family for r in instance.readings} == {
            "gpu_mig_instance_info",
            "gpu_mig_instance_slices",
        }
    # A100: MIG without GPM: memory, and no activity at all (absent, never 0).
    alone = groups[5][0]
    assert alone.value("gpu_memory_used_bytes") == 10737418240
    assert all(alone.value(family) is None for family in ACTIVITY)


def test_unprivileged_parent_memory_is_absent_and_counted_once(
    mig: NvmlSource, clock: ManualClock
) -> None:
    devices = ticks(mig, clock, n=5)
    for index in (0, 1, 3):
        assert devices[index].value("gpu_memory_used_bytes") is None
    assert devices[2].value("gpu_memory_used_bytes") is not None
    counted = {
        (e.field, e.error): e.count for e in mig.errors.snapshot() if e.error == "NoPermission"
    }
    # Learned once per MIG parent (v2 then v1), never asked again.
    assert counted == {("memory_info_v2", "NoPermission"): 3, ("memory_info", "NoPermission"): 3}
    assert all(d.up for d in devices.values())


def test_reconfiguration_replaces_instances_without_diffing_across_them(
    mig: NvmlSource, clock: ManualClock
) -> None:
    spec = MIG.devices[1].mig
    assert spec is not None
    old_2g, new_gi5, new_gi6 = spec.instances[1], spec.instances[4], spec.instances[5]
    clock.now = 80.0
    before = ticks(mig, clock)[1]
    assert {i.mig_uuid for i in before.instances} >= {old_2g.mig_uuids[0]}
    clock.now = 90.0
    first = {i.mig_uuid: i for i in ticks(mig, clock, n=1)[1].instances}
    # The stale handle of the destroyed 2g made the same tick enumerate again.
    assert old_2g.mig_uuids[0] not in first
    assert {new_gi5.mig_uuids[0], new_gi6.mig_uuids[0]} <= set(first)
    reused = first[new_gi5.mig_uuids[0]]
    assert reused.gpu_instance == 5 and reused.profile == "1g.18gb"
    # Its activity starts from a fresh window: absent first, then its own (0.3), never a
    # value diffed against the destroyed 2g's counters.
    assert reused.value("gpu_sm_active_ratio") is None
    later = {i.mig_uuid: i for i in ticks(mig, clock, n=1)[1].instances}
    assert later[new_gi5.mig_uuids[0]].value("gpu_sm_active_ratio") == pytest.approx(0.3, abs=1e-6)
    # Not a lost GPU, and a stale handle is not an error.
    assert later and ticks(mig, clock, n=1)[1].up
    stale = [e for e in mig.errors.snapshot() if e.field.startswith("mig_")]
    assert stale == []


def test_instance_activity_is_awaited_on_the_tick_of_its_first_gpm_sample(
    mig: NvmlSource, clock: ManualClock
) -> None:
    """Each Hopper instance's GPM window starts on the first tick, with its activity awaited
    (not unavailable); A100 instances have no GPM and are never awaited."""
    clock.advance(1.0)
    first = [i for d in mig.sample() for i in d.instances]
    second = [i for d in ticks(mig, clock, n=1).values() for i in d.instances]
    hopper = [i.value("gpu_sm_active_ratio") is not None for i in second]
    assert any(hopper) and not all(hopper)  # both kinds are there
    assert [i.value(AWAITED_FAMILY) for i in first] == [1.0 if h else None for h in hopper]
    assert all(i.value("gpu_sm_active_ratio") is None for i in first)
    assert all(i.value(AWAITED_FAMILY) is None for i in second)


def test_gpm_samples_of_vanished_instances_are_freed(mig: NvmlSource, clock: ManualClock) -> None:
    fake = mig.fake  # type: ignore[attr-defined]
    clock.now = 85.0
    ticks(mig, clock, n=2)
    hopper_instances = 7 + 4  # single-CI GIs on the two H200s with MIG
    whole_gpu_windows = 1
    assert len(fake._samples) == 2 * (hopper_instances + whole_gpu_windows)
    clock.now = 95.0
    ticks(mig, clock, n=2)
    assert len(fake._samples) == 2 * (hopper_instances + 1 + whole_gpu_windows)  # 2g -> 1g + 1g
    mig.close()
    assert fake._samples == {}  # all freed before NVML shuts down


def test_a_new_layout_without_a_stale_handle_is_found_at_the_slow_refresh(
    start_source: Callable[..., Any], clock: ManualClock
) -> None:
    source = start_source(GROWING, xid_events=False, slow_refresh_seconds=30.0)
    clock.now = 5.0
    assert [i.profile for i in ticks(source, clock)[0].instances] == ["3g.71gb"]
    clock.now = 25.0  # the 4g exists, nothing went stale: the next slow refresh finds it
    assert [i.profile for i in ticks(source, clock)[0].instances] == ["3g.71gb"]
    clock.now = 40.0
    assert [i.profile for i in ticks(source, clock)[0].instances] == ["3g.71gb", "4g.71gb"]


def test_a_full_re_init_frees_every_gpm_sample_before_nvml_shuts_down(
    start_source: Callable[..., Any], clock: ManualClock
) -> None:
    import pynvml

    source = start_source("mig", xid_events=False, recovery_initial_backoff_seconds=0.5)
    fake = source.fake  # type: ignore[attr-defined]
    ticks(source, clock, n=2)
    assert fake._samples, "GPM windows are open"
    real_power, real_shutdown = fake.nvmlDeviceGetPowerUsage, fake.nvmlShutdown
    replaced = {"now": True}
    held_at_shutdown: list[int] = []

    def power(*args: Any) -> int:
        return pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH if replaced["now"] else real_power(*args)

    def shutdown() -> int:
        held_at_shutdown.append(len(fake._samples))
        return int(real_shutdown())

    fake.nvmlDeviceGetPowerUsage, fake.nvmlShutdown = power, shutdown
    for name in ("nvmlDeviceGetPowerUsage", "nvmlShutdown"):
        pynvml._nvmlGetFunctionPointer_cache.pop(name, None)
    generation = fake.generation
    ticks(source, clock, n=1)  # the driver is "replaced": a full re-init is scheduled
    replaced["now"] = False
    devices = ticks(source, clock, n=4)
    assert fake.generation > generation and all(d.up for d in devices.values())
    assert held_at_shutdown == [0]
    assert devices[0].instances and devices[0].instances[0].value("gpu_sm_active_ratio") is not None


def test_a_mig_configuration_change_event_re_enumerates_at_the_next_tick(
    start_source: Callable[..., Any], clock: ManualClock
) -> None:
    import time

    source = start_source(GROWING, slow_refresh_seconds=300.0)  # with the event thread
    clock.now = 5.0
    device = ticks(source, clock)[0]
    assert [i.profile for i in device.instances] == ["3g.71gb"]
    clock.now = 25.0  # the 4g is created at 20 s: NVML reports nvmlEventMigConfigChange
    deadline = time.monotonic() + 5.0
    while source._xid_counts.mig_changes(device.uuid) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert source._xid_counts.mig_changes(device.uuid) == 1
    assert [i.profile for i in ticks(source, clock, n=1)[0].instances] == ["3g.71gb", "4g.71gb"]


def test_activity_above_one_is_clamped_and_counted(
    mig: NvmlSource, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DCGM has reported SM activity above 100 %: kept at 1, never above, and counted."""
    from gpu_exporter.sim.fake_nvml import FakeNvmlLib

    real = FakeNvmlLib._gpm_metric

    def too_high(self: Any, dev: Any, t: float, metric: int, first: Any, second: Any) -> Any:
        rc, value = real(self, dev, t, metric, first, second)
        return (rc, 130.0) if metric == 2 and first.gpu_instance == 9 else (rc, value)

    monkeypatch.setattr(FakeNvmlLib, "_gpm_metric", too_high)
    seven = ticks(mig, clock)[0]
    launch = next(i for i in seven.instances if i.gpu_instance == 9)
    assert launch.value("gpu_sm_active_ratio") == 1.0
    assert all(i.value("gpu_sm_active_ratio") < 1.0 for i in seven.instances if i is not launch)
    above = [e for e in mig.errors.snapshot() if e.error == "AboveOne"]
    assert [(e.source, e.field) for e in above] == [("gpm", "metric_2")] and above[0].count >= 1


def test_a_failed_mig_mode_read_keeps_the_instances(
    start_source: Callable[..., Any], clock: ManualClock
) -> None:
    """A transient error on nvmlDeviceGetMigMode at a slow refresh must not turn a partitioned
    GPU into a whole one (its instances gone, a class of its own) until the next refresh."""
    import pynvml

    from gpu_exporter.collect.classify import Classifier

    source = start_source("mig", xid_events=False, slow_refresh_seconds=2.0)
    fake = source.fake  # type: ignore[attr-defined]
    classifier = Classifier()
    real = fake.nvmlDeviceGetMigMode
    failing = {"now": False}

    def mode(*args: Any) -> int:
        return pynvml.NVML_ERROR_UNKNOWN if failing["now"] else int(real(*args))

    fake.nvmlDeviceGetMigMode = mode
    pynvml._nvmlGetFunctionPointer_cache.pop("nvmlDeviceGetMigMode", None)
    clock.now = 10.0
    for _ in range(3):
        clock.advance(1.0)
        classifier.process(source.sample(), clock())
    failing["now"] = True
    for _ in range(4):  # two slow refreshes fail
        clock.advance(1.0)
        seven = classifier.process(source.sample(), clock())[0]
        assert len(seven.instances) == 7 and seven.mig_enabled
        assert seven.value("gpu_bottleneck", **{"class": "unknown"}) is None  # no parent class
        assert seven.value("gpu_mig_mode", state="current") == 1.0
    no_permission = sum(e.count for e in source.errors.snapshot() if e.error == "NoPermission")
    assert no_permission == 6  # still counted once per MIG parent (v2, v1): nothing re-learned


def test_instance_memory_falls_back_to_memory_info_v1(
    start_source: Callable[..., Any], clock: ManualClock
) -> None:
    spec = {
        "name": "old-driver",
        "driver": {"missing_functions": ["nvmlDeviceGetMemoryInfo_v2"]},
        "devices": [
            {"mig": {"instances": [{"profile": "3g.71gb", "values": {"memory_used_bytes": 5e9}}]}}
        ],
    }
    source = start_source(spec, xid_events=False)
    (instance,) = ticks(source, clock)[0].instances
    # v1's `used` includes the reserved memory; there is no reserved reading without v2.
    assert instance.value("gpu_memory_used_bytes") == 5e9 + 64 * 2**20
    assert instance.value("gpu_memory_reserved_bytes") is None


def test_gpm_off_turns_off_mig_activity_too(
    start_source: Callable[..., Any], clock: ManualClock
) -> None:
    source = start_source("mig", xid_events=False, gpm=False)
    seven = ticks(source, clock)[0]
    assert seven.instances and all(i.value("gpu_sm_active_ratio") is None for i in seven.instances)
    assert source.fake._samples == {}  # type: ignore[attr-defined]


def test_a_hung_uuid_read_keeps_the_instances_unknown_and_they_return_once_it_answers(
    start_source: Callable[..., Any], clock: ManualClock
) -> None:
    """nvmlDeviceGetUUID hangs on GPU 0 (its MIG devices' UUIDs are read every tick): that tick
    the GPU is down, then it answers the rest while the call is stuck. Its instances must stay
    listed, down, with the reason, and be read again within two ticks of the call answering,
    not after the quarantine and the next slow refresh."""
    import pynvml

    hang_seconds = 1.5  # the hung call's real duration: ticks go on meanwhile
    spec = yaml.safe_load(MIG_FILE.read_text())
    hang = {"kind": "hang", "function": "nvmlDeviceGetUUID", "duration": hang_seconds}
    spec["faults"] = [{"at": 20, "device": 0, **hang}]
    clock.now = 10.0
    source = start_source(spec, xid_events=False, device_deadline_seconds=0.2)
    fake = source.fake  # type: ignore[attr-defined]
    real_uuid = fake.nvmlDeviceGetUUID
    lock, calls_in_flight = threading.Lock(), [0]

    def uuid(*args: Any) -> int:  # only watches: the fake's fault does the hanging
        with lock:
            calls_in_flight[0] += 1
        try:
            return int(real_uuid(*args))
        finally:
            with lock:
                calls_in_flight[0] -= 1

    fake.nvmlDeviceGetUUID = uuid
    pynvml._nvmlGetFunctionPointer_cache.pop("nvmlDeviceGetUUID", None)
    before = ticks(source, clock)[0]
    known = sorted((i.gpu_instance, i.mig_uuid) for i in before.instances)
    assert len(known) == 7 and all(i.up for i in before.instances)

    def listed_down(device: DeviceSample) -> bool:
        return sorted((i.gpu_instance, i.mig_uuid) for i in device.instances) == known and all(
            not i.up and not i.readings for i in device.instances
        )

    clock.now = 20.0
    hung = source.sample()[0]
    assert not hung.up and "mig_uuid" in hung.down_reason
    assert listed_down(hung), "a GPU down keeps its instances, down"
    clock.now = 25.0  # past the fault: the call answers at once when asked
    unknown_ticks = 0
    deadline = time.monotonic() + 30.0
    while calls_in_flight[0] and time.monotonic() < deadline:
        waiting = ticks(source, clock, n=1)[0]
        assert waiting.up, waiting.down_reason
        assert listed_down(waiting), [(i.mig_uuid, i.up) for i in waiting.instances]
        assert "mig_uuid hung" in waiting.instances_unknown
        unknown_ticks += 1
        time.sleep(0.05)
    assert not calls_in_flight[0], "the hung call never answered"
    assert unknown_ticks >= 1, "no tick ran while the call hung"
    # It answered: the instances are read again at the next tick or the one after.
    back = [ticks(source, clock, n=1)[0] for _ in range(2)]
    first_back = next((n for n, d in enumerate(back) if all(i.up for i in d.instances)), None)
    assert first_back is not None, [d.instances_unknown for d in back]
    device = back[-1]
    assert not device.instances_unknown
    assert sorted((i.gpu_instance, i.mig_uuid) for i in device.instances) == known
    assert all(i.value("gpu_memory_used_bytes") is not None for i in device.instances)
    series = series_of({0: device})
    assert [s.value for s in series.of("gpu_mig_instance_up")] == [1.0] * 7

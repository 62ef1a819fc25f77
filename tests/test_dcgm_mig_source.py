"""The DCGM source on MIG GPUs: activity per GPU instance (DCGM_FE_GPU_I) through the production
binding and the simulator's fake libdcgm.

Each test drives `NvmlSource` with its DCGM supplement on a manual clock over a node of an A100
in MIG mode (no GPM, so NVML gives its instances no activity) and a whole A100, and reads what
a tick gives: each instance's own activity where DCGM has it, absent (never 0, never another
instance's) where it has not, per-instance problems confined to that instance, and the whole
GPU's activity untouched throughout.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpu_exporter import sim
from gpu_exporter.collect import dcgm_api, dcgm_mig
from gpu_exporter.model.snapshot import DeviceSample, InstanceSample, Reading
from tests.test_dcgm_source import dcgm_series, errors_of, node_factory, tick, ticks

node = pytest.fixture(node_factory, name="node")

WHOLE_SM = 0.9
# GPU instance id -> its SM, Tensor and DRAM activity
ACTIVITY = {1: (0.85, 0.6, 0.4), 5: (0.12, 0.02, 0.05), 13: (0.5, 0.05, 0.88)}
SHARED_GI, EMPTY_GI = 2, 14  # three compute instances; none


def instance(gi: int, profile: str, **extra: Any) -> dict[str, Any]:
    sm, tensor, dram = ACTIVITY[gi]
    values = {
        "graphics_active": 0.95,
        "sm_active": sm,
        "tensor_active": tensor,
        "dram_active": dram,
        "memory_used_bytes": 2**31,
    }
    return {"profile": profile, "gpu_instance": gi, "values": values, **extra}


def scenario(
    instances: list[dict[str, Any]] | None = None,
    dcgm_section: dict[str, Any] | None = None,
    faults: list | None = None,
) -> dict:
    """GPU 0 a whole A100, GPU 1 an A100 in MIG mode (3g, 2g, 1g with one compute instance
    each, unless `instances` says otherwise)."""
    if instances is None:
        instances = [instance(1, "3g.40gb"), instance(5, "2g.20gb"), instance(13, "1g.10gb")]
    return {
        "name": "dcgm-mig-test",
        "defaults": {"model": "NVIDIA A100-SXM4-80GB", "architecture": "ampere"},
        "devices": [
            {"label": "whole", "values": {"utilization": 0.97, "sm_active": WHOLE_SM}},
            {"label": "mig", "mig": {"instances": instances}},
        ],
        "dcgm": dcgm_section if dcgm_section is not None else {"host_engine": "running"},
        "faults": faults or [],
    }


def by_gi(sample: DeviceSample) -> dict[int, InstanceSample]:
    assert sample.mig_enabled
    return {i.gpu_instance: i for i in sample.instances}


def activity(item: InstanceSample) -> tuple[float | None, ...]:
    return tuple(
        item.value(family)
        for family in ("gpu_sm_active_ratio", "gpu_tensor_active_ratio", "gpu_dram_active_ratio")
    )


# --- values where DCGM has them ------------------------------------------------------------------


def test_each_mig_instance_gets_its_own_gpu_instances_activity(node: Any) -> None:
    source, clock = node(scenario())
    whole, mig = ticks(source, clock, 3)  # tick 1 learns "no GPM"; the watch's first cycle
    assert whole.value("gpu_sm_active_ratio") == pytest.approx(WHOLE_SM)  # the whole GPU too
    instances = by_gi(mig)
    assert set(instances) == set(ACTIVITY)
    for gi, expected in ACTIVITY.items():
        assert activity(instances[gi]) == pytest.approx(expected), gi
        assert instances[gi].value("gpu_graphics_engine_active_ratio") == pytest.approx(0.95)
        # the same families and labels as GPM gives a Hopper instance: no other labels
        families = {r.family: r.labels for r in instances[gi].readings}
        assert families["gpu_sm_active_ratio"] == ()
    # The parent's own series: which source measured its instances; no activity of its own.
    assert mig.value("gpu_activity_source_info", source="dcgm") == 1.0
    assert mig.value("gpu_sm_active_ratio") is None
    assert dcgm_series(source) == {"gpu_exporter_dcgm_up": 1.0, "gpu_exporter_dcgm_blank_values": 0}
    assert errors_of(source) == 0
    fake = sim.installed_dcgm()
    assert fake is not None and fake.internal_errors == []


def test_split_and_empty_gpu_instances_stay_absent_never_zero(node: Any) -> None:
    """A GPU instance split into three compute instances has activity, but its own, not any
    one compute instance's: absent on their series, as with GPM. One without a compute
    instance has no MIG device (no series) and is not watched."""
    instances = [
        instance(1, "3g.40gb", gpu_instance=SHARED_GI, compute_instances=3),
        instance(5, "2g.20gb"),
        instance(13, "1g.10gb", gpu_instance=EMPTY_GI, compute_instances=0),
    ]
    source, clock = node(scenario(instances))
    _, mig = ticks(source, clock, 3)
    compute_instances = [i for i in mig.instances if i.gpu_instance == SHARED_GI]
    assert len(compute_instances) == 3 and all(i.shared for i in compute_instances)
    assert all(activity(i) == (None, None, None) for i in compute_instances)
    assert EMPTY_GI not in by_gi(mig)
    assert activity(by_gi(mig)[5]) == pytest.approx(ACTIVITY[5])
    assert source.dcgm is not None and source.dcgm._connection.session is not None
    watched = source.dcgm._connection.session.instances
    assert {w.gpu_instance for w in watched.values()} == {5}
    assert errors_of(source) == 0


# --- problems of one GPU instance -------------------------------------------------------------


def test_a_blank_field_of_one_gpu_instance_leaves_only_that_value_absent(node: Any) -> None:
    fault = {"kind": "dcgm_blank", "device": 1, "gpu_instance": 5, "field": 1002, "at": 0}
    source, clock = node(scenario(faults=[fault]))
    _, mig = ticks(source, clock, 3)
    instances = by_gi(mig)
    assert activity(instances[5]) == pytest.approx((None, *ACTIVITY[5][1:]))
    assert activity(instances[1]) == pytest.approx(ACTIVITY[1])
    assert activity(instances[13]) == pytest.approx(ACTIVITY[13])
    # Blank is DCGM's "no value now" (profiling paused, say), counted apart, not an error.
    assert dcgm_series(source)["gpu_exporter_dcgm_blank_values"] == 1
    assert errors_of(source) == 0


def test_an_error_status_on_one_gpu_instance_is_counted_and_confined_to_it(
    node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = dcgm_api.Library.latest_values
    failing = set()

    def one_instance_not_found(self: Any, *args: Any, live: bool = False) -> list:
        values = real(self, *args, live=live)
        return [
            dcgm_api.FieldValue(
                v.entity_id, v.field_id, None, "InstanceNotFound", 0, v.entity_group
            )
            if (v.entity_group, v.entity_id) in failing
            else v
            for v in values
        ]

    monkeypatch.setattr(dcgm_api.Library, "latest_values", one_instance_not_found)
    source, clock = node(scenario())
    ticks(source, clock, 3)
    assert source.dcgm is not None and source.dcgm._connection.session is not None
    watched = source.dcgm._connection.session.instances
    (entity,) = [e for e, w in watched.items() if w.gpu_instance == 13]
    failing.add((dcgm_api.FE_GPU_I, entity))
    whole, mig = tick(source, clock)
    instances = by_gi(mig)
    assert activity(instances[13]) == (None, None, None)
    assert activity(instances[1]) == pytest.approx(ACTIVITY[1])
    assert whole.value("gpu_sm_active_ratio") == pytest.approx(WHOLE_SM)
    assert errors_of(source, "InstanceNotFound") == 8  # each watched field of that instance
    assert dcgm_series(source)["gpu_exporter_dcgm_up"] == 1.0  # one entity, not the session


# --- reconfiguration: an instance disappears, DCGM numbers its instances again ----------------


def test_a_vanished_instance_goes_and_the_others_keep_their_own_activity(node: Any) -> None:
    """GPU instance 1 is destroyed at 6 s. DCGM numbers the GPU's instances again, so the
    entity id GPU instance 5 had now names GPU instance 13: the source reads the hierarchy
    before each read, watches anew, and never gives one instance another's activity."""
    change = 6.0
    instances = [
        instance(1, "1g.10gb", until=change),
        instance(13, "1g.10gb"),
        instance(5, "2g.20gb"),
    ]
    source, clock = node(scenario(instances))
    _, mig = ticks(source, clock, 4)
    assert set(by_gi(mig)) == {1, 5, 13}
    assert source.dcgm is not None and source.dcgm._connection.session is not None
    before = dict(source.dcgm._connection.session.instances)
    for _ in range(6):  # through the reconfiguration at 6 s
        _, mig = tick(source, clock)
        for gi, item in by_gi(mig).items():
            sm = item.value("gpu_sm_active_ratio")
            assert sm is None or sm == pytest.approx(ACTIVITY[gi][0]), (clock.now, gi, sm)
    assert set(by_gi(mig)) == {5, 13}
    for gi in (5, 13):
        assert activity(by_gi(mig)[gi]) == pytest.approx(ACTIVITY[gi])
    after = source.dcgm._connection.session.instances
    renumbered = {w.gpu_instance: e for e, w in after.items()}
    assert renumbered != {w.gpu_instance: e for e, w in before.items() if w.gpu_instance != 1}
    assert errors_of(source) == 0  # a reconfiguration is no error


def test_activity_goes_only_to_an_instance_of_the_size_dcgm_watched() -> None:
    """A GPU-instance id reused by a reconfiguration one side has not seen yet: the other
    side's activity for that id is not given to an instance of another size."""
    reading = Reading("gpu_sm_active_ratio", 0.7)
    sized = InstanceSample(
        5, 0, "MIG-a", "2g.20gb", readings=(Reading("gpu_mig_instance_slices", 2),)
    )
    sample = DeviceSample(1, "GPU-p", {}, True, instances=(sized,), mig_enabled=True)
    found = {("GPU-p", 5): dcgm_mig.InstanceActivity(1, (reading,))}  # DCGM: a 1-slice GI 5
    unchanged, given = dcgm_mig.with_instance_activity(sample, found)
    assert not given and unchanged.instances[0].value("gpu_sm_active_ratio") is None
    same = {("GPU-p", 5): dcgm_mig.InstanceActivity(2, (reading,))}
    merged, given = dcgm_mig.with_instance_activity(sample, same)
    assert given and merged.instances[0].value("gpu_sm_active_ratio") == 0.7


def test_an_instance_not_read_this_tick_gets_no_activity_and_is_not_awaited() -> None:
    """While a hung identity call leaves an instance unknown (listed, `up` False), DCGM's
    values for its GPU-instance id are not given to it: which instance holds that id now is
    not known. Nor is its activity marked awaited: it is unknown, not starting."""
    reading = Reading("gpu_sm_active_ratio", 0.7)
    unknown = InstanceSample(
        5, 0, "MIG-a", "2g.20gb", readings=(Reading("gpu_mig_instance_slices", 2),), up=False
    )
    sample = DeviceSample(1, "GPU-p", {}, True, instances=(unknown,), mig_enabled=True)
    found = {("GPU-p", 5): dcgm_mig.InstanceActivity(2, (reading,))}
    unchanged, given = dcgm_mig.with_instance_activity(sample, found)
    assert not given and unchanged.instances[0].value("gpu_sm_active_ratio") is None
    awaiting = dcgm_mig.awaiting_activity(sample)
    assert awaiting.instances[0].readings == unknown.readings


# --- a host engine that cannot give MIG ----------------------------------------------------------


def test_a_host_engine_that_lists_no_gpu_instances_says_so_once_whole_gpus_unaffected(
    node: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """DCGM reads MIG only as root: a host engine that is not lists no GPU instance."""
    source, clock = node(scenario(dcgm_section={"host_engine": "running", "mig": "requires_root"}))
    samples = ticks(source, clock, 6)
    whole, mig = samples
    assert whole.value("gpu_sm_active_ratio") == pytest.approx(WHOLE_SM)
    assert all(activity(i) == (None, None, None) for i in mig.instances)
    assert mig.value("gpu_activity_source_info", source="dcgm") is None
    assert errors_of(source, "NotListed") == 1  # at the watch's setup, not every tick
    assert sum("lists no GPU instance" in r.message for r in caplog.records) == 1


def test_a_libdcgm_without_the_hierarchy_call_leaves_instances_absent_only(node: Any) -> None:
    section = {"host_engine": "running", "missing_functions": ["dcgmGetGpuInstanceHierarchy"]}
    source, clock = node(scenario(dcgm_section=section))
    whole, mig = ticks(source, clock, 6)
    assert whole.value("gpu_sm_active_ratio") == pytest.approx(WHOLE_SM)
    assert all(activity(i) == (None, None, None) for i in mig.instances)
    assert errors_of(source, "GenericError") == 1  # "not in this libdcgm", once per session
    assert dcgm_series(source)["gpu_exporter_dcgm_up"] == 1.0


def test_mig_instances_alone_need_dcgm_and_make_it_up(node: Any) -> None:
    """A node whose only GPU without GPM is in MIG mode still has DCGM read (and up)."""
    spec = scenario()
    spec["devices"][0] = {
        "label": "whole",
        "model": "NVIDIA H100 80GB HBM3",
        "architecture": "hopper",
    }
    source, clock = node(spec)
    hopper, mig = ticks(source, clock, 3)
    assert hopper.value("gpu_activity_source_info", source="gpm") == 1.0
    assert activity(by_gi(mig)[1]) == pytest.approx(ACTIVITY[1])
    assert dcgm_series(source)["gpu_exporter_dcgm_up"] == 1.0

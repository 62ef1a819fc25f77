"""DRA claims resolved to GPUs and MIG devices (collect/k8s/dra.py), and what a tick then shows
(collect/k8s/labels.py, collect/k8s/dra_attribution.py): the same pod labels and gpu_pod_info as a
device-plugin allocation, plus the claim's join series; an unresolvable device is counted and
attributed to nobody."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from types import MappingProxyType

import pytest

from gpu_exporter.collect.k8s.attribution import AttributionSnapshot, ClaimMap, DeviceMap, PodRef
from gpu_exporter.collect.k8s.dra import Claim, DraDevice, SliceDevice, resolve
from gpu_exporter.collect.k8s.dra_attribution import UNRESOLVED, DraAttribution
from gpu_exporter.collect.k8s.labels import PodsOfTick
from gpu_exporter.model.series import Series
from gpu_exporter.model.snapshot import DeviceSample, InstanceSample

GPU, OTHER_GPU, MIG, PARENT = "GPU-aaaa", "GPU-bbbb", "MIG-cccc", "GPU-dddd"
TRAIN = PodRef("ml", "train-0", "main")
EVAL = PodRef("ml", "eval-0", "main")
NOTEBOOK = PodRef("lab", "nb-0", "jupyter")
PLUGIN = PodRef("batch", "legacy-0", "main")
GRACE = 30.0

WHOLE = DraDevice("gpu.nvidia.com", "node-1", "gpu-0")
SLICE = DraDevice("gpu.nvidia.com", "node-1", "gpu-3-mig-1g18gb-9-0")
MISSING = DraDevice("gpu.nvidia.com", "node-1", "gpu-7")
NO_UUID = DraDevice("gpu.nvidia.com", "node-1", "gpu-vfio-0")

SLICES: Mapping[DraDevice, SliceDevice] = MappingProxyType(
    {
        WHOLE: SliceDevice(GPU, "gpu"),
        SLICE: SliceDevice(MIG, "mig", PARENT, "1g.18gb"),
        NO_UUID: SliceDevice("", "vfio"),
    }
)
CLAIMS: Mapping[DraDevice, tuple[Claim, ...]] = MappingProxyType(
    {
        # One ResourceClaim shared by two pods.
        WHOLE: (Claim(EVAL, "ml", "shared-gpu"), Claim(TRAIN, "ml", "shared-gpu")),
        SLICE: (Claim(NOTEBOOK, "lab", "nb-0-gpu-x7k2p"),),
        MISSING: (Claim(TRAIN, "ml", "second-gpu"),),
        NO_UUID: (Claim(TRAIN, "ml", "passthrough"),),
    }
)


def test_claims_resolve_through_the_slices_uuid_and_the_rest_is_unresolved() -> None:
    resolved = resolve(CLAIMS, SLICES)
    assert resolved.holders == {GPU: (EVAL, TRAIN), MIG: (NOTEBOOK,)}
    assert [claim.claim_name for claim, _ in resolved.claims[GPU]] == ["shared-gpu"] * 2
    assert resolved.claims[MIG] == ((CLAIMS[SLICE][0], SLICE),)
    assert resolved.unresolved == (MISSING, NO_UUID)  # never guessed from the name


class FakeAttribution:
    """One kubelet answer: the device plugin's map and the claims."""

    def __init__(self, by_device: DeviceMap, claims: ClaimMap = CLAIMS) -> None:
        self.answer = AttributionSnapshot(by_device, claims)

    def snapshot(self) -> AttributionSnapshot:
        return self.answer


class FakeSlices:
    def __init__(self, devices: Mapping[DraDevice, SliceDevice]) -> None:
        self.devices_now = devices
        self.up = True

    def devices(self) -> Mapping[DraDevice, SliceDevice]:
        return self.devices_now

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def series(self) -> Iterator[Series]:
        return iter(())


def tick_devices() -> list[DeviceSample]:
    instance = InstanceSample(9, 0, MIG, "1g.18gb")
    return [
        DeviceSample(0, GPU, {}, True),
        DeviceSample(1, OTHER_GPU, {}, True),
        DeviceSample(3, PARENT, {}, True, instances=(instance,), mig_enabled=True),
    ]


def info(readings: object, family: str) -> list[dict[str, str]]:
    return [dict(r.labels) for r in readings if r.family == family]  # type: ignore[attr-defined]


def test_a_claimed_gpu_and_mig_device_get_pod_info_labels_and_the_claims_join_series() -> None:
    dra = DraAttribution(FakeSlices(SLICES), GRACE)
    pods = PodsOfTick(FakeAttribution({OTHER_GPU: (PLUGIN,)}), dra.resolved)  # type: ignore[arg-type]
    gpu, other, parent = pods.process(tick_devices(), 0.0)
    assert [d["pod"] for d in info(gpu.readings, "gpu_pod_info")] == ["eval-0", "train-0"]
    assert info(gpu.readings, "gpu_pod_resourceclaim_info") == [
        {
            "namespace": "ml",
            "pod": pod,
            "container": "main",
            "claim_namespace": "ml",
            "resourceclaim_name": "shared-gpu",
            "driver": "gpu.nvidia.com",
            "pool": "node-1",
            "device": "gpu-0",
        }
        for pod in ("eval-0", "train-0")
    ]
    # The device plugin's allocation beside them works as before, with no claim series.
    assert [d["pod"] for d in info(other.readings, "gpu_pod_info")] == ["legacy-0"]
    assert not info(other.readings, "gpu_pod_resourceclaim_info")
    (instance,) = parent.instances
    assert info(instance.readings, "gpu_pod_info") == [
        {"namespace": "lab", "pod": "nb-0", "container": "jupyter"}
    ]
    assert info(instance.readings, "gpu_pod_resourceclaim_info")[0]["device"] == SLICE.device
    assert not info(parent.readings, "gpu_pod_resourceclaim_info")
    # `labels` mode: the same labels as a device-plugin pod; a shared claim names holders.
    labels = pods.labels()
    assert dict(labels[MIG]) == {"namespace": "lab", "pod": "nb-0", "container": "jupyter"}
    assert dict(labels[GPU]) == {"holders": "ml/eval-0/main,ml/train-0/main"}
    assert pods.holders()[GPU] == (EVAL, TRAIN)


def test_a_device_both_plugin_and_claim_held_lists_every_holder() -> None:
    dra = DraAttribution(FakeSlices(SLICES), GRACE)
    held = FakeAttribution({GPU: (PLUGIN,)}, {WHOLE: CLAIMS[WHOLE]})
    pods = PodsOfTick(held, dra.resolved)  # type: ignore[arg-type]
    gpu, _, _ = pods.process(tick_devices(), 0.0)
    assert [d["pod"] for d in info(gpu.readings, "gpu_pod_info")] == [
        "legacy-0",
        "eval-0",
        "train-0",
    ]


def unresolved(dra: DraAttribution) -> float:
    return next(s.value for s in dra.series() if s.family == UNRESOLVED)


def test_unresolved_devices_are_counted_logged_once_and_followed_when_a_slice_appears(
    caplog: pytest.LogCaptureFixture,
) -> None:
    slices = FakeSlices(SLICES)
    dra = DraAttribution(slices, GRACE)
    with caplog.at_level(logging.INFO, logger="gpu_exporter.collect.k8s.dra_attribution"):
        dra.resolved(CLAIMS)
        dra.resolved(CLAIMS)
        assert unresolved(dra) == 2.0
        # The driver publishes the missing devices (a new slice): resolved at the next tick.
        slices.devices_now = MappingProxyType(
            {**SLICES, MISSING: SliceDevice(OTHER_GPU, "gpu"), NO_UUID: SliceDevice(GPU, "gpu")}
        )
        assert dra.resolved(CLAIMS).holders[OTHER_GPU] == (TRAIN,)
        assert unresolved(dra) == 0.0
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "2 claimed device(s) in no ResourceSlice" in messages[0] and "gpu-7" in messages[0]
    assert "resolved again" in messages[1]


def test_a_device_that_leaves_the_slices_keeps_its_pods_for_the_grace_period() -> None:
    """A driver restart replaces its slice: deleted, then published again. The GPU's uuid did
    not change meanwhile, so its pods keep their labels; a device gone for good is dropped."""
    now = [0.0]
    slices = FakeSlices(SLICES)
    claims = {WHOLE: CLAIMS[WHOLE]}
    dra = DraAttribution(slices, GRACE, monotonic=lambda: now[0])
    assert dra.resolved(claims).holders == {GPU: (EVAL, TRAIN)}
    slices.devices_now = MappingProxyType({})  # the old slice deleted, the new one not yet there
    now[0] = GRACE - 1
    assert dra.resolved(claims).holders == {GPU: (EVAL, TRAIN)}
    now[0] = GRACE * 2
    resolved = dra.resolved(claims)
    assert resolved.holders == {} and resolved.unresolved == (WHOLE,)


def test_while_the_reader_is_down_its_own_grace_decides_nothing_is_remembered_on_top() -> None:
    """The reader keeps its last map for the grace after its last success, then answers
    nothing: the pods go then, not a second grace later."""
    now = [0.0]
    slices = FakeSlices(SLICES)
    claims = {WHOLE: CLAIMS[WHOLE]}
    dra = DraAttribution(slices, GRACE, monotonic=lambda: now[0])
    assert dra.resolved(claims).holders == {GPU: (EVAL, TRAIN)}
    slices.up = False  # failing: the reader still answers its last map (its grace)
    now[0] = GRACE - 1
    assert dra.resolved(claims).holders == {GPU: (EVAL, TRAIN)}
    slices.devices_now = MappingProxyType({})  # its grace is over
    now[0] = GRACE
    assert dra.resolved(claims).holders == {}

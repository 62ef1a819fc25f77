"""Pods on MIG instances: every id a device plugin gives the kubelet for a MIG device finds it,
from the sampler's enumeration alone, and its series carry that pod (and only that pod), also
while its GPU is lost."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gpu_exporter.collect.k8s.attribution import AttributionSnapshot, map_devices
from gpu_exporter.collect.k8s.labels import PodsOfTick
from gpu_exporter.collect.k8s.podresources.v1 import api_pb2
from gpu_exporter.collect.nvml.source import NvmlSource
from gpu_exporter.collect.settings import KubernetesConfig
from gpu_exporter.model.series import SeriesBuilder, SeriesSet
from gpu_exporter.model.snapshot import DeviceSample, Snapshot
from gpu_exporter.sim.clock import ManualClock


class Kubelet:
    """Stands in for PodAttribution: PodsOfTick reads only its latest map."""

    def __init__(self, pods: list[api_pb2.PodResources]) -> None:
        self.map = map_devices(pods, KubernetesConfig())

    def snapshot(self) -> AttributionSnapshot:
        return AttributionSnapshot(self.map, {})


def pod(namespace: str, name: str, resource: str, *ids: str) -> api_pb2.PodResources:
    devices = api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids))
    container = api_pb2.ContainerResources(name="main", devices=[devices])
    return api_pb2.PodResources(name=name, namespace=namespace, containers=[container])


@pytest.fixture
def devices(start_source: Callable[..., Any], clock: ManualClock) -> list[DeviceSample]:
    source: NvmlSource = start_source("mig", xid_events=False)
    samples: list[DeviceSample] = []
    for _ in range(3):
        clock.advance(1.0)
        samples = source.sample()
    return samples


def test_mig_ids_of_every_form_reach_their_instance(devices: list[DeviceSample]) -> None:
    seven, mixed, whole, a100 = devices
    launch = next(i for i in seven.instances if i.gpu_instance == 9)
    legacy = next(i for i in mixed.instances if i.gpu_instance == 1)
    gke = next(i for i in mixed.instances if i.gpu_instance == 13)
    shared = [i for i in a100.instances if i.gpu_instance == 1]
    kubelet = Kubelet(
        [
            # Mixed strategy, R470+ MIG UUID, time-sliced between two pods (`::n`).
            pod("infer", "spin-a", "nvidia.com/mig-1g.18gb", f"{launch.mig_uuid}::1"),
            pod("infer", "spin-b", "nvidia.com/mig-1g.18gb", f"{launch.mig_uuid}::2"),
            # Single strategy (nvidia.com/gpu) with a pre-R470 id.
            pod("train", "big", "nvidia.com/gpu", f"MIG-{mixed.uuid}/1/0"),
            pod("gke", "small", "nvidia.com/gpu", "nvidia1/gi13"),
            # Two pods on two compute instances of one GPU instance.
            pod("a", "ci0", "nvidia.com/mig-1c.3g.40gb", shared[0].mig_uuid),
            pod("a", "ci1", "nvidia.com/mig-1c.3g.40gb", shared[1].mig_uuid),
            pod("whole", "job", "nvidia.com/gpu", whole.uuid),
        ]
    )
    pods = PodsOfTick(kubelet)  # type: ignore[arg-type]
    processed = pods.process(devices, 0.0)
    snapshot = Snapshot(0.0, tuple(processed), device_labels=pods.labels())
    rows = SeriesBuilder().build(snapshot)

    def holders(mig_uuid: str) -> list[tuple[str, str]]:
        return sorted(
            (dict(r.labels)["namespace"], dict(r.labels)["pod"])
            for r in rows.of("gpu_pod_info")
            if dict(r.labels).get("mig_uuid") == mig_uuid
        )

    assert holders(launch.mig_uuid) == [("infer", "spin-a"), ("infer", "spin-b")]
    assert holders(legacy.mig_uuid) == [("train", "big")]
    assert holders(gke.mig_uuid) == [("gke", "small")]
    assert holders(shared[0].mig_uuid) == [("a", "ci0")]
    assert holders(shared[1].mig_uuid) == [("a", "ci1")]
    # Every series of an instance carries its pod, or all of them when several share it (no
    # one of them alone); instances no pod holds carry none.
    sm = {
        dict(r.labels).get("mig_uuid", ""): dict(r.labels) for r in rows.of("gpu_sm_active_ratio")
    }
    assert "pod" not in sm[launch.mig_uuid]
    assert sm[launch.mig_uuid]["holders"] == "infer/spin-a/main,infer/spin-b/main"
    assert (sm[legacy.mig_uuid]["pod"], sm[gke.mig_uuid]["pod"]) == ("big", "small")
    held = {launch.mig_uuid, legacy.mig_uuid, gke.mig_uuid, "", *(i.mig_uuid for i in shared)}
    free = [labels for uuid, labels in sm.items() if uuid not in held]
    assert len(free) == 6 + 2 and all("pod" not in labels for labels in free)
    power = {dict(r.labels)["gpu"]: dict(r.labels) for r in rows.of("gpu_power_watts")}
    assert "pod" not in power["0"] and power["2"]["pod"] == "job"
    # The parent of pod-held instances is held by no pod itself.
    assert not [
        r
        for r in rows.of("gpu_pod_info")
        if "mig_uuid" not in dict(r.labels) and dict(r.labels)["gpu"] != "2"
    ]


def test_a_lost_mig_gpu_keeps_naming_the_pods_on_its_instances(
    start_source: Callable[..., Any], clock: ManualClock
) -> None:
    """A whole GPU that is lost keeps gpu_up{pod=...} 0; a lost MIG-enabled GPU must likewise
    keep its instances as last enumerated, down, with their pods, until it answers again."""
    spec = {
        "name": "lost-mig",
        "defaults": {"model": "NVIDIA H200", "architecture": "hopper"},
        "devices": [
            {"mig": {"instances": [{"profile": "3g.71gb"}, {"profile": "2g.35gb"}]}},
            {"label": "whole"},
        ],
        "faults": [{"at": 20, "device": 0, "kind": "gpu_lost", "until": 40}],
    }
    source: NvmlSource = start_source(
        spec,
        xid_events=False,
        recovery_initial_backoff_seconds=0.5,
        recovery_max_backoff_seconds=1.0,
    )
    clock.now = 10.0

    def tick() -> list[DeviceSample]:
        clock.advance(1.0)
        return source.sample()

    mig, whole = [tick() for _ in range(2)][-1]
    big, small = sorted(mig.instances, key=lambda i: i.profile, reverse=True)
    kubelet = Kubelet(
        [
            pod("train", "big", "nvidia.com/mig-3g.71gb", big.mig_uuid),
            pod("infer", "small", "nvidia.com/mig-2g.35gb", small.mig_uuid),
            pod("batch", "job", "nvidia.com/gpu", whole.uuid),
        ]
    )
    pods = PodsOfTick(kubelet)  # type: ignore[arg-type]

    def series_of(devices: list[DeviceSample]) -> SeriesSet:
        processed = pods.process(devices, clock())
        return SeriesBuilder().build(Snapshot(0.0, tuple(processed), device_labels=pods.labels()))

    def instance_up(rows: SeriesSet) -> dict[str, float]:
        return {dict(r.labels)["pod"]: r.value for r in rows.of("gpu_mig_instance_up")}

    assert instance_up(series_of(tick())) == {"big": 1.0, "small": 1.0}
    clock.now = 20.0
    for _ in range(5):  # lost, then down while NVML is re-initialised without it
        devices = tick()
        assert not devices[0].up and devices[1].up
        rows = series_of(devices)
        assert instance_up(rows) == {"big": 0.0, "small": 0.0}
        held = {
            (dict(r.labels)["pod"], dict(r.labels)["mig_uuid"])
            for r in rows.of("gpu_pod_info")
            if dict(r.labels)["gpu"] == "0"
        }
        assert held == {("big", big.mig_uuid), ("small", small.mig_uuid)}
        # What it cannot read is absent: only the state and the pods are left.
        assert {r.family for r in rows if dict(r.labels).get("mig_uuid")} == {
            "gpu_mig_instance_up",
            "gpu_pod_info",
        }
    clock.now = 40.0  # back after the next re-init
    for _ in range(6):
        devices = tick()
        if devices[0].up:
            break
    assert devices[0].up, devices[0].down_reason
    assert instance_up(series_of(devices)) == {"big": 1.0, "small": 1.0}

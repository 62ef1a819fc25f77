"""Pods on MIG instances: every id a device plugin gives the kubelet for a MIG device finds it,
from the sampler's enumeration alone, and its series carry that pod (and only that pod)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gpu_exporter.collect.k8s.attribution import AttributionSnapshot, map_devices
from gpu_exporter.collect.k8s.labels import PodsOfTick
from gpu_exporter.collect.k8s.podresources.v1 import api_pb2
from gpu_exporter.collect.nvml.source import NvmlSource
from gpu_exporter.collect.settings import KubernetesConfig
from gpu_exporter.model.series import SeriesBuilder
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

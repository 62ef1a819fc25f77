"""Pod attribution -> exporter labels and readings (the glue between k8s/ and the sampler)."""

from __future__ import annotations

from collections.abc import Mapping

from gpu_exporter.k8s.attribution import DeviceMap, PodAttribution, PodRef
from gpu_exporter.snapshot import DeviceSample, Labels, Reading


def pod_labels(pods: tuple[PodRef, ...]) -> Labels:
    """Labels for every series of a GPU. A GPU shared by several pods (time-slicing) gets the
    first one in sorted order; gpu_pod_info lists them all."""
    if not pods:
        return ()
    first = pods[0]
    return (("namespace", first.namespace), ("pod", first.pod), ("container", first.container))


class PodsOfTick:
    """One kubelet map per tick: `process` (a sampler processor, both modes) adds
    gpu_pod_info{namespace,pod,container} 1 per pod holding the GPU and keeps the map it used;
    `labels` (the sampler's device labels, "labels" mode), called later in the same tick,
    answers from that same map — so gpu_pod_info and the pod labels never come from two
    different kubelet answers."""

    def __init__(self, attribution: PodAttribution) -> None:
        self.attribution = attribution
        self._by_device: DeviceMap = {}

    def process(self, devices: list[DeviceSample], _now: float) -> list[DeviceSample]:
        self._by_device = by_device = self.attribution.pods_by_device()
        out = []
        for device in devices:
            pods = by_device.get(device.uuid, ())
            if not pods:
                out.append(device)
                continue
            info = tuple(
                Reading(
                    "gpu_pod_info",
                    1.0,
                    (("namespace", p.namespace), ("pod", p.pod), ("container", p.container)),
                )
                for p in pods
            )
            out.append(_with_readings(device, info))
        return out

    def labels(self) -> Mapping[str, Labels]:
        return {uuid: pod_labels(pods) for uuid, pods in self._by_device.items()}


def _with_readings(device: DeviceSample, extra: tuple[Reading, ...]) -> DeviceSample:
    return DeviceSample(
        device.index,
        device.uuid,
        device.info,
        device.up,
        device.readings + extra,
        device.down_reason,
    )

"""Pod attribution -> exporter labels and readings (the glue between k8s/ and the sampler)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gpu_exporter.k8s.attribution import PodAttribution, PodRef
from gpu_exporter.snapshot import DeviceSample, Labels, Reading


def pod_labels(pods: tuple[PodRef, ...]) -> Labels:
    """Labels for every series of a GPU. A GPU shared by several pods (time-slicing) gets the
    first one in sorted order; gpu_pod_info lists them all."""
    if not pods:
        return ()
    first = pods[0]
    return (("namespace", first.namespace), ("pod", first.pod), ("container", first.container))


def device_labels_source(attribution: PodAttribution) -> Callable[[], Mapping[str, Labels]]:
    """For Sampler(device_labels=...): pod labels on every per-GPU series ("labels" mode)."""

    def current() -> Mapping[str, Labels]:
        return {uuid: pod_labels(pods) for uuid, pods in attribution.pods_by_device().items()}

    return current


def pod_info_processor(
    attribution: PodAttribution,
) -> Callable[[list[DeviceSample], float], list[DeviceSample]]:
    """Adds gpu_pod_info{namespace,pod,container} 1 per pod holding the GPU (both modes)."""

    def process(devices: list[DeviceSample], _now: float) -> list[DeviceSample]:
        by_device = attribution.pods_by_device()
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

    return process


def _with_readings(device: DeviceSample, extra: tuple[Reading, ...]) -> DeviceSample:
    return DeviceSample(
        device.index,
        device.uuid,
        device.info,
        device.up,
        device.readings + extra,
        device.down_reason,
    )

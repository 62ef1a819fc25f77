"""Per-pod use over diagnose's profile, and the idle allocations it finds.

Each tick the profile's series give every container's use of each GPU and MIG instance (the
per-pod families, read back by model/pod_shares.py); `PodProfiles` keeps, per device and
container, what the report needs of the whole profile: the mean of its utilization shares over
the ticks that measured them, its energy charged during the profile, and whether it did
anything at all. Without per-process attribution there is nothing to keep, and the report has
no per-pod lines.

An idle allocation is GpuAllocatedButIdle's condition held over the whole profile rather than
30 minutes: a container holds a device the classifier calls idle over the profile (no per-
process data needed: the kubelet's allocation and the class say it), or, with per-process data,
it ran no process on the device during the profile, or its processes ran no kernel on it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any

from gpu_exporter.model.pod_shares import Container, pod_shares, unattributed_use
from gpu_exporter.model.series import DeviceView, InstanceView
from gpu_exporter.model.snapshot import Reading

# (GPU index, MIG UUID or "" for a whole GPU)
Device = tuple[int, str]


@dataclass
class PodProfile:
    """One container's use of one device, tick by tick over the profile."""

    ticks: int = 0
    allocated: bool = False
    processes: float | None = None  # the last tick's
    memory_bytes: float | None = None  # the last tick's
    most_processes: float | None = None
    utilization: list[float] = field(default_factory=list)  # the ticks that measured it
    encoder: list[float] = field(default_factory=list)
    decoder: list[float] = field(default_factory=list)
    # Per attribution kind: its counter where the profile first saw it (0 for one that
    # appeared during the profile: all of it was charged then), and the last value.
    energy_start: dict[str, float] = field(default_factory=dict)
    energy_last: dict[str, float] = field(default_factory=dict)

    def idle(self) -> str | None:
        """Why it did nothing with the device over the profile, or None when it did (or when
        nothing measured that it did not)."""
        if self.most_processes == 0:
            return "ran no process on it during the profile"
        if self.utilization and max(self.utilization) == 0:
            return "its processes ran no kernel on it during the profile"
        return None

    def energy(self) -> float | None:
        if not self.energy_last:
            return None
        return sum(max(0.0, last - self.energy_start[k]) for k, last in self.energy_last.items())

    def attribution(self) -> str | None:
        kinds = sorted(self.energy_last)
        return None if not kinds else kinds[0] if len(kinds) == 1 else "mixed"


@dataclass
class PodProfiles:
    """Every container's PodProfile, by device and container."""

    ticks: int = 0
    by_device: dict[Device, dict[Container, PodProfile]] = field(default_factory=dict)

    def observe(self, view: DeviceView) -> None:
        """One tick's view of one GPU (and its MIG instances)."""
        self._observe((view.index, ""), view.readings)
        for instance in view.instances:
            self._observe((view.index, instance.mig_uuid), instance.readings)

    def tick(self) -> None:
        """After a tick's views were observed."""
        self.ticks += 1

    def _observe(self, device: Device, readings: tuple[Reading, ...]) -> None:
        pods = self.by_device.setdefault(device, {})
        for share in pod_shares(readings):
            pod = pods.setdefault(share.key, PodProfile())
            pod.ticks += 1
            pod.allocated = share.allocated
            pod.processes, pod.memory_bytes = share.processes, share.memory_bytes
            if share.processes is not None:
                pod.most_processes = max(pod.most_processes or 0.0, share.processes)
            for values, value in (
                (pod.utilization, share.utilization),
                (pod.encoder, share.encoder),
                (pod.decoder, share.decoder),
            ):
                if value is not None:
                    values.append(value)
            for kind, joules in _energy(readings, share.key).items():
                pod.energy_start.setdefault(kind, joules if self.ticks == 0 else 0.0)
                pod.energy_last[kind] = joules

    def pods(self, device: Device) -> Mapping[Container, PodProfile]:
        return self.by_device.get(device, {})


def _energy(readings: tuple[Reading, ...], container: Container) -> dict[str, float]:
    out = {}
    for reading in readings:
        if reading.family == "gpu_pod_energy_joules_total":
            labels = dict(reading.labels)
            if (labels.get("namespace"), labels.get("pod"), labels.get("container")) == container:
                out[labels.get("attribution", "")] = reading.value
    return out


def _count(value: float | None) -> int | None:
    return int(value) if value is not None and math.isfinite(value) else None


def _mean(values: list[float]) -> float | None:
    return fmean(values) if values else None


def pod_use_json(profiles: PodProfiles, device: Device) -> list[dict[str, Any]]:
    """Each container's use of the device over the profile, as the report lists it."""
    return [
        {
            "namespace": namespace,
            "pod": pod,
            "container": container,
            "allocated": use.allocated,
            "processes": _count(use.processes),
            "memory_bytes": use.memory_bytes,
            "utilization": _mean(use.utilization),
            "encoder": _mean(use.encoder),
            "decoder": _mean(use.decoder),
            "energy_joules": use.energy(),
            "attribution": use.attribution(),
            "idle": use.idle() is not None,
        }
        for (namespace, pod, container), use in sorted(profiles.pods(device).items())
    ]


def unattributed_json(readings: tuple[Reading, ...]) -> list[dict[str, Any]]:
    """Processes of no known container at the end of the profile, by reason."""
    return [
        {
            "reason": use.reason,
            "processes": _count(use.processes),
            "memory_bytes": use.memory_bytes,
            "utilization": use.utilization,
        }
        for use in unattributed_use(readings)
    ]


def idle_allocations(
    profiles: PodProfiles, device: Device, view: DeviceView | InstanceView, cls: str | None
) -> list[dict[str, str]]:
    """The containers that held the device and did nothing with it over the profile
    (GpuAllocatedButIdle's condition), each once, with why; `cls` is the device's class over
    the profile."""
    found: dict[Container, str] = {}
    holders = InstanceView.pods_of(view.readings)  # gpu_pod_info: what the kubelet allocated
    if cls == "idle":
        for holder in holders:
            found.setdefault(holder, "held it while it ran no kernel (class idle)")
    for container, use in sorted(profiles.pods(device).items()):
        why = use.idle()
        # Only a holder wastes an allocation: a container that runs on the GPU without holding
        # it (the MPS control daemon) is not GpuAllocatedButIdle's either.
        if why is not None and container in holders:
            found.setdefault(container, why)
    return [
        {"namespace": namespace, "pod": pod, "container": container, "why": why}
        for (namespace, pod, container), why in sorted(found.items())
    ]

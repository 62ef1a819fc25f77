"""Who uses how much of one GPU or MIG instance, read back from its series.

The per-pod families (`gpu_pod_*`, one series per container, from the processes NVML lists:
collect/k8s/pod_use.py) and the unattributed ones (`gpu_unattributed_*`, by reason) grouped
into one row per container and one per reason, for the readers that show them to people: the
JSON API (and through it the status page) and `diagnose`. A value is None where its series is
absent, which means "not measured" (per-process attribution off, a read that failed, or a
quantity NVML has no per-process figure of, like utilization under MIG), never 0: a 0 is
always a measurement. Without per-process attribution there are no such series and every list
here is empty.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpu_exporter.model.catalog import POD_LABELS
from gpu_exporter.model.snapshot import Reading

# The per-pod gauge families, by the attribute of PodShare each fills.
_POD_GAUGES = {
    "gpu_pod_processes": "processes",
    "gpu_pod_memory_used_bytes": "memory_bytes",
    "gpu_pod_utilization_ratio": "utilization",
    "gpu_pod_encoder_utilization_ratio": "encoder",
    "gpu_pod_decoder_utilization_ratio": "decoder",
}
POD_ENERGY = "gpu_pod_energy_joules_total"
_UNATTRIBUTED = {
    "gpu_unattributed_processes": "processes",
    "gpu_unattributed_memory_used_bytes": "memory_bytes",
    "gpu_unattributed_utilization_ratio": "utilization",
}
EXCLUSIVE, APPORTIONED, MIXED = "exclusive", "apportioned", "mixed"

Container = tuple[str, str, str]  # (namespace, pod, container)


@dataclass(frozen=True)
class PodShare:
    """One container's use of the device in the last tick (None: not measured).

    `allocated`: the kubelet allocated the device to it (gpu_pod_info); a container can use a
    GPU it was not allocated (NVIDIA_VISIBLE_DEVICES=all), and one allocated a share can run
    nothing on it. `energy_joules` is its energy counter (summed over `attributions`, the kinds
    its counters have: exclusive while it was alone on the GPU, apportioned by its SM-time share
    while it shared it)."""

    namespace: str
    pod: str
    container: str
    allocated: bool = False
    processes: float | None = None
    memory_bytes: float | None = None
    utilization: float | None = None
    encoder: float | None = None
    decoder: float | None = None
    energy_joules: float | None = None
    attributions: tuple[str, ...] = ()

    @property
    def key(self) -> Container:
        return (self.namespace, self.pod, self.container)

    @property
    def attribution(self) -> str | None:
        """exclusive, apportioned, mixed (counters of both kinds), or None without energy."""
        if not self.attributions:
            return None
        return self.attributions[0] if len(self.attributions) == 1 else MIXED

    @property
    def idle_now(self) -> str | None:
        """Why it did nothing with the device in the last tick, when that was measured: it runs
        no process there, or its processes ran no kernel (GpuAllocatedButIdle's per-process
        terms, before their `for:`); None when it did something or nothing says it did not."""
        if self.processes == 0:
            return "runs no process on it"
        if self.utilization == 0:
            return "its processes ran no kernel in the last tick"
        return None


@dataclass(frozen=True)
class UnattributedUse:
    """Processes on the device that no container is known for, by `reason`: host (they run
    outside Kubernetes) or unknown (their container could not be found)."""

    reason: str
    processes: float | None = None
    memory_bytes: float | None = None
    utilization: float | None = None


def pod_shares(readings: Iterable[Reading]) -> list[PodShare]:
    """One PodShare per container with a per-pod series on the device, by namespace, pod and
    container; empty without per-process attribution."""
    values: dict[Container, dict[str, float]] = {}
    energy: dict[Container, dict[str, float]] = {}
    allocated: set[Container] = set()
    for reading in readings:
        if reading.family == "gpu_pod_info":
            allocated.add(_container(reading))
        elif reading.family in _POD_GAUGES:
            values.setdefault(_container(reading), {})[_POD_GAUGES[reading.family]] = reading.value
        elif reading.family == POD_ENERGY:
            kind = dict(reading.labels).get("attribution", "")
            energy.setdefault(_container(reading), {})[kind] = reading.value
    shares = []
    for key in sorted(values.keys() | energy.keys()):
        charged = energy.get(key, {})
        measured = values.get(key, {})
        shares.append(
            PodShare(
                *key,
                allocated=key in allocated,
                processes=measured.get("processes"),
                memory_bytes=measured.get("memory_bytes"),
                utilization=measured.get("utilization"),
                encoder=measured.get("encoder"),
                decoder=measured.get("decoder"),
                energy_joules=sum(charged.values()) if charged else None,
                attributions=tuple(sorted(charged)),
            )
        )
    return shares


def unattributed_use(readings: Iterable[Reading]) -> list[UnattributedUse]:
    """One UnattributedUse per reason with processes on the device, by reason."""
    values: dict[str, dict[str, float]] = {}
    for reading in readings:
        if reading.family in _UNATTRIBUTED:
            reason = dict(reading.labels).get("reason", "")
            values.setdefault(reason, {})[_UNATTRIBUTED[reading.family]] = reading.value
    return [UnattributedUse(reason, **found) for reason, found in sorted(values.items())]


def is_shared(readings: Iterable[Reading]) -> bool:
    """Whether several owners hold or use the device: several containers (allocated it, or
    running processes on it), or a container and processes of no known container."""
    rows = list(readings)
    owners = {share.key for share in pod_shares(rows)}
    owners |= {_container(r) for r in rows if r.family == "gpu_pod_info"}
    others = [u for u in unattributed_use(rows) if u.processes]
    return len(owners) + len(others) > 1


def _container(reading: Reading) -> Container:
    labels = dict(reading.labels)
    namespace, pod, container = (labels.get(name, "") for name in POD_LABELS)
    return (namespace, pod, container)

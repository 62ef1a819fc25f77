"""Per-pod GPU use, from the processes NVML lists: who uses how much of a shared GPU.

A sampler processor (`PodUse.process`). Each tick, for every GPU (and MIG instance) whose
processes were read, it groups the processes by the container each runs in (`owner_of`: the
PID -> container mapping of `processes.py`) and adds, per container, readings of
`gpu_pod_processes`, `gpu_pod_memory_used_bytes`, `gpu_pod_utilization_ratio`, the encoder and
decoder shares and `gpu_pod_energy_joules_total`; processes in no known container go to
`gpu_unattributed_*` by reason (`host`: outside Kubernetes, `unknown`: not mappable now).

The physics, stated where it is used:
- Memory and the utilization shares are NVML's per-process figures (measured). NVML samples a
  process only when it used an engine, so a process without a sample used none of it; a
  container that holds a share of the GPU (the kubelet's PodResources say so) but runs no
  process used none of it either: 0 is then a measurement, not a default (unless a process on
  the device could not be mapped: it may be that container's, whose use is then absent). Where
  per-process utilization was not measured (the read failed, or MIG, where NVML has none) it is
  absent.
- The shares cover the driver's sample periods that ended since the last tick, and are already
  bounded by what the device did in them (the processes collector): the SM shares' sum by the
  device's utilization over the same periods, each other engine's by 1.
- NVML measures no per-process energy, SM activity or Tensor activity. A container alone on the
  GPU gets all of the GPU's energy of the tick (`attribution="exclusive"`); containers sharing
  it get the tick's energy times their share of the SM time the processes used
  (`attribution="apportioned"`); energy of a tick in which no process was sampled busy, or whose
  processes could not be read, is charged to nobody. A process that started and ended between
  two ticks is charged by the samples of it the driver returns at the next read, if any.
- Under MIG NVML has no per-process utilization: instances get process counts and memory only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from gpu_exporter.collect.k8s.attribution import PodRef
from gpu_exporter.model.catalog import POD_LABELS
from gpu_exporter.model.snapshot import DeviceSample, ProcessSample, Reading

HOST, UNKNOWN = "host", "unknown"
EXCLUSIVE, APPORTIONED = "exclusive", "apportioned"
# Per-pod families of the utilization engines, and the one unattributed family (SM only).
_POD_ENGINES = {
    "sm": "gpu_pod_utilization_ratio",
    "encoder": "gpu_pod_encoder_utilization_ratio",
    "decoder": "gpu_pod_decoder_utilization_ratio",
}
# A container gone from a GPU for this long loses its energy counter (a pod that ended); one
# that comes back sooner continues it.
ENERGY_RETENTION_SECONDS = 600.0


@dataclass(frozen=True, order=True)
class Owner:
    """Whose a process is: a container (`pod`), or nobody's known (`reason`: host, unknown)."""

    pod: PodRef | None = None
    reason: str = ""


@dataclass
class _Use:
    """One owner's processes on one device in one tick."""

    processes: int = 0
    memory: float | None = None
    engines: dict[str, float] | None = field(default_factory=dict)  # None: not measured

    def add(self, process: ProcessSample) -> None:
        self.processes += 1
        if process.memory_bytes is not None:
            self.memory = (self.memory or 0.0) + process.memory_bytes
        if process.utilization is None or self.engines is None:
            self.engines = None  # one process unmeasured: the container's sum is unknown
            return
        for engine, value in process.utilization.items():
            self.engines[engine] = self.engines.get(engine, 0.0) + value

    def engine(self, name: str) -> float:
        return (self.engines or {}).get(name, 0.0)


@dataclass
class _Charged:
    joules: float
    seen_at: float


# The kubelet's allocation for a tick: GPU or MIG UUID -> the containers holding it.
Holders = Callable[[], Mapping[str, tuple[PodRef, ...]]]


class PodUse:
    """See the module docstring. `owner_of(pids)` maps this tick's PIDs to their owners;
    `holders()` gives the kubelet's allocation (empty without pod attribution)."""

    def __init__(
        self,
        owner_of: Callable[[Iterable[int]], Mapping[int, Owner]],
        holders: Holders = dict,
    ) -> None:
        self.owner_of = owner_of
        self.holders = holders
        self._energy: dict[str, float] = {}  # GPU uuid -> gpu_energy_joules_total last tick
        self._charged: dict[tuple[str, PodRef, str], _Charged] = {}  # (uuid, pod, attribution)

    def process(self, devices: list[DeviceSample], now: float) -> list[DeviceSample]:
        pids = {
            p.pid
            for d in devices
            for p in (*(d.processes or ()), *(p for i in d.instances for p in i.processes or ()))
        }
        owners = self.owner_of(pids) if pids else {}
        held = self.holders()
        out = []
        for device in devices:
            instances = []
            for instance in device.instances:
                if instance.processes is not None:
                    uses = _group(instance.processes, owners, held.get(instance.mig_uuid, ()))
                    readings = [r for o, u in uses.items() for r in _readings(o, u, False)]
                    instance = replace(instance, readings=instance.readings + tuple(readings))
                instances.append(instance)
            readings = list(device.readings)
            joules = self._energy_since_last_tick(device)
            if device.processes is not None:
                processes = _mps_clients_checked(device.processes)
                uses = _group(processes, owners, held.get(device.uuid, ()))
                readings += [r for o, u in uses.items() for r in _readings(o, u, True)]
                self._charge(device.uuid, uses, joules, now)
                readings += self._energy_readings(device.uuid, now)
            out.append(replace(device, readings=tuple(readings), instances=tuple(instances)))
        self._forget_gone(now)
        return out

    def _energy_since_last_tick(self, device: DeviceSample) -> float | None:
        """The GPU's energy since the previous tick; None when either reading is missing or
        the counter went back, as after a driver reload (not known: nobody is charged)."""
        energy = device.value("gpu_energy_joules_total")
        previous = self._energy.pop(device.uuid, None)
        if energy is None:
            return None
        self._energy[device.uuid] = energy
        return energy - previous if previous is not None and energy >= previous else None

    def _charge(
        self, uuid: str, uses: Mapping[Owner, _Use], joules: float | None, now: float
    ) -> None:
        pods = [owner for owner in uses if owner.pod is not None]
        shares: dict[Owner, tuple[str, float]] = {}
        if len(uses) == 1 and pods:  # one container and nothing else on the GPU
            shares[pods[0]] = (EXCLUSIVE, 1.0)
        else:
            busy = sum(use.engine("sm") for use in uses.values())
            if busy > 0.0:  # some process was sampled busy
                shares = {owner: (APPORTIONED, uses[owner].engine("sm") / busy) for owner in pods}
        for owner, (attribution, share) in shares.items():
            if share > 0.0 and joules is not None:  # no counter until something is charged
                assert owner.pod is not None
                key = (uuid, owner.pod, attribution)
                self._charged.setdefault(key, _Charged(0.0, now)).joules += joules * share
        present = {owner.pod for owner in pods}
        for (device, pod, _), charged in self._charged.items():
            if device == uuid and pod in present:  # its counters go on while it is there
                charged.seen_at = now

    def _energy_readings(self, uuid: str, now: float) -> list[Reading]:
        return [
            Reading(
                "gpu_pod_energy_joules_total",
                charged.joules,
                (*_pod_labels(pod), ("attribution", attribution)),
            )
            for (device, pod, attribution), charged in self._charged.items()
            if device == uuid and charged.seen_at == now
        ]

    def _forget_gone(self, now: float) -> None:
        for key, charged in list(self._charged.items()):
            if now - charged.seen_at > ENERGY_RETENTION_SECONDS:
                del self._charged[key]


def _mps_clients_checked(processes: tuple[ProcessSample, ...]) -> tuple[ProcessSample, ...]:
    """MPS clients' utilization, unless the driver seems to sample their work under the MPS
    server instead: that clients are sampled under their own PIDs is assumed (not checked on
    hardware), so where no client has a sample while a process that is not a client (the
    server) has, the clients' use is not known (absent), rather than 0 for each."""
    clients = [p for p in processes if p.mps]
    if not clients or any(p.utilization is None for p in clients):
        return processes
    if any(p.utilization for p in clients):
        return processes
    if not any(p.utilization for p in processes if not p.mps):
        return processes  # nothing ran on the GPU at all: every client's 0 is measured
    return tuple(replace(p, utilization=None) if p.mps else p for p in processes)


def _group(
    processes: Iterable[ProcessSample], owners: Mapping[int, Owner], held: tuple[PodRef, ...]
) -> dict[Owner, _Use]:
    """Each owner's use; a holder without processes used nothing (all of it measured zero),
    unless a process on the device is of no known container: it may be the holder's, whose use
    is then not known (absent)."""
    uses: dict[Owner, _Use] = {Owner(pod): _Use(memory=0.0) for pod in held}
    for process in processes:
        owner = owners.get(process.pid, Owner(reason=UNKNOWN))
        uses.setdefault(owner, _Use()).add(process)
    if Owner(reason=UNKNOWN) in uses:
        uses = {owner: use for owner, use in uses.items() if use.processes or owner.pod is None}
    return uses


def _readings(owner: Owner, use: _Use, utilization: bool) -> Iterable[Reading]:
    """`utilization`: whether the device has per-process utilization at all (not MIG)."""
    measured = utilization and use.engines is not None
    if owner.pod is not None:
        labels = _pod_labels(owner.pod)
        yield Reading("gpu_pod_processes", float(use.processes), labels)
        if use.memory is not None:
            yield Reading("gpu_pod_memory_used_bytes", use.memory, labels)
        if measured:
            for engine, family in _POD_ENGINES.items():
                yield Reading(family, min(1.0, use.engine(engine)), labels)
        return
    labels = (("reason", owner.reason),)
    yield Reading("gpu_unattributed_processes", float(use.processes), labels)
    if use.memory is not None:
        yield Reading("gpu_unattributed_memory_used_bytes", use.memory, labels)
    if measured:
        yield Reading("gpu_unattributed_utilization_ratio", min(1.0, use.engine("sm")), labels)


def _pod_labels(pod: PodRef) -> tuple[tuple[str, str], ...]:
    return tuple(zip(POD_LABELS, (pod.namespace, pod.pod, pod.container), strict=True))

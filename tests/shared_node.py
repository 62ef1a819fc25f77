"""A node whose GPUs are shared, with per-pod use, for the tests of what shows it (the JSON API,
the status page, diagnose, the dcgm-exporter compatible output).

The per-pod readings come from the production code that computes them (collect/k8s/pod_use.py,
fed ProcessSamples as NVML would list them) and go through the production series model, so
these tests read what the daemon will publish once the sampler runs that code; only the wiring
(the NVML process reads, /proc and the container runtime) is stood in for.

  GPU 0  H200, time-sliced: ml/train-0 (two busy processes), research/notebook-0 (holds a share,
         runs nothing: an idle allocation) and a host process outside Kubernetes
  GPU 1  H200, serving/infer-0 alone (exclusive energy)
  GPU 2  H200 with MIG: GI 9 shared by infer/chat-0 (one process) and infer/chat-1 (none), GI 7
         held by infer/embed-0 alone
  GPU 3  H200 held by batch/solo-0, its processes not read (no per-pod series at all)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace

from gpu_exporter.collect.k8s.attribution import PodRef
from gpu_exporter.collect.k8s.labels import pod_labels
from gpu_exporter.collect.k8s.pod_use import HOST, Owner, PodUse
from gpu_exporter.model.series import SeriesBuilder, SeriesSet
from gpu_exporter.model.snapshot import (
    DeviceSample,
    InstanceSample,
    Labels,
    ProcessSample,
    Reading,
    Snapshot,
    TickStats,
)

GIB = float(1 << 30)
TRAIN = PodRef("ml", "train-0", "main")
NOTEBOOK = PodRef("research", "notebook-0", "lab")
INFER = PodRef("serving", "infer-0", "srv")
CHAT0 = PodRef("infer", "chat-0", "srv")
CHAT1 = PodRef("infer", "chat-1", "srv")
EMBED = PodRef("infer", "embed-0", "srv")
SOLO = PodRef("batch", "solo-0", "work")

OWNERS = {
    101: Owner(TRAIN),
    102: Owner(TRAIN),
    201: Owner(INFER),
    301: Owner(CHAT0),
    401: Owner(EMBED),
    900: Owner(reason=HOST),
}
HOLDERS: dict[str, tuple[PodRef, ...]] = {
    "GPU-0": (TRAIN, NOTEBOOK),
    "GPU-1": (INFER,),
    "MIG-9": (CHAT0, CHAT1),
    "MIG-7": (EMBED,),
    "GPU-3": (SOLO,),
}
# GPU 0's and GPU 1's energy counters at tick 0; each tick adds 700 J.
ENERGY = {"GPU-0": 10_000.0, "GPU-1": 20_000.0}
JOULES_PER_TICK = 700.0
INFO = {"model": "NVIDIA H200", "architecture": "hopper", "driver_version": "570.124.06"}


def _owner_of(pids: Iterable[int]) -> Mapping[int, Owner]:
    return {pid: OWNERS[pid] for pid in pids if pid in OWNERS}


def _pod_info(pods: tuple[PodRef, ...]) -> tuple[Reading, ...]:
    return tuple(
        Reading("gpu_pod_info", 1.0, (("namespace", p.namespace), ("pod", p.pod),
                                      ("container", p.container)))
        for p in pods
    )  # fmt: skip


def _whole(
    index: int, utilization: float, processes: tuple[ProcessSample, ...] | None, tick: int
) -> DeviceSample:
    uuid = f"GPU-{index}"
    readings = [
        Reading("gpu_utilization_ratio", utilization),
        Reading("gpu_memory_used_bytes", 40 * GIB),
        Reading("gpu_memory_total_bytes", 141 * GIB),
        Reading("gpu_power_watts", 350.0),
    ]
    if uuid in ENERGY:
        readings.append(Reading("gpu_energy_joules_total", ENERGY[uuid] + JOULES_PER_TICK * tick))
    info = {**INFO, "pci_bus_id": f"0000:{0x18 + index:02x}:00.0"}
    readings += _pod_info(HOLDERS.get(uuid, ()))
    return DeviceSample(index, uuid, info, True, tuple(readings), processes=processes)


def _instance(gi: int, processes: tuple[ProcessSample, ...]) -> InstanceSample:
    mig_uuid = f"MIG-{gi}"
    readings = (
        Reading("gpu_memory_used_bytes", 6 * GIB),
        Reading("gpu_memory_total_bytes", 17 * GIB),
        Reading("gpu_mig_instance_slices", 1.0),
        *_pod_info(HOLDERS.get(mig_uuid, ())),
    )
    return InstanceSample(gi, 0, mig_uuid, "1g.18gb", readings=readings, processes=processes)


def devices(tick: int) -> list[DeviceSample]:
    """The node's samples at `tick`, as the NVML source and pod attribution give them."""
    sm = {"sm": 0.3, "encoder": 0.0, "decoder": 0.1}
    gpu0 = (
        ProcessSample(101, 20 * GIB, sm),
        ProcessSample(102, 10 * GIB, {"sm": 0.25}),
        ProcessSample(900, 2 * GIB, {"sm": 0.05}),
    )
    mig = DeviceSample(
        2,
        "GPU-2",
        {**INFO, "pci_bus_id": "0000:1a:00.0"},
        True,
        (Reading("gpu_mig_mode", 1.0, (("state", "current"),)), Reading("gpu_power_watts", 200.0)),
        instances=(
            _instance(7, (ProcessSample(401, 3 * GIB),)),
            _instance(9, (ProcessSample(301, 4 * GIB),)),
        ),
        mig_enabled=True,
    )
    return [
        _whole(0, 0.6, gpu0, tick),
        _whole(1, 0.8, (ProcessSample(201, 10 * GIB, {"sm": 0.8}),), tick),
        mig,
        _whole(3, 0.9, None, tick),
    ]


def ticks(count: int, mode: str = "labels") -> Iterator[tuple[Snapshot, SeriesSet]]:
    """The node's first `count` ticks, one second apart, and their series; `mode`: pod
    attribution's labels or info mode."""
    use, builder = PodUse(_owner_of, lambda: HOLDERS), SeriesBuilder()
    labels: dict[str, Labels] = {}
    if mode == "labels":
        labels = {uuid: pod_labels(pods) for uuid, pods in HOLDERS.items()}
    for tick in range(count):
        samples = use.process(devices(tick), 1.0 + tick)
        now = 1.75e9 + tick
        # The tick's own stats, as the sampler's: the exporter's own alerts see it sampling.
        stats = TickStats(ticks=tick + 1, last_tick_timestamp=now)
        snapshot = Snapshot(now, tuple(samples), device_labels=labels, stats=stats)
        yield snapshot, builder.build(snapshot)


def shared_node(mode: str = "labels") -> tuple[Snapshot, SeriesSet]:
    """The node's second tick (energy needs two) and its series."""
    *_, last = ticks(2, mode)
    return last


def with_readings(snapshot: Snapshot, index: int, *more: Reading) -> Snapshot:
    """`snapshot` with readings added to GPU `index` (a classifier's class, say)."""
    devices = tuple(
        replace(d, readings=d.readings + more) if d.index == index else d for d in snapshot.devices
    )
    return replace(snapshot, devices=devices)

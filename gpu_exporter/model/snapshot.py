"""Immutable per-tick data: what one sampler tick saw, published atomically.

A scrape, a rule evaluation or an API call only ever reads a published `Snapshot`; nothing
downstream of the sampler talks to NVML.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # classify imports this module
    from gpu_exporter.model.verdict import Verdict

Labels = tuple[tuple[str, str], ...]

# The key of DeviceSample.info that holds the device minor number (/dev/nvidia<minor>): not a
# gpu_info label, read for pod attribution (GKE's device plugin names GPUs by it).
MINOR_NUMBER = "minor_number"


class DownCause(StrEnum):
    """Why a GPU is down in a tick, weighed as evidence about the GPU (the health latch's)."""

    FAILED = "failed"  # NVML answered with a failure (lost, driver gone), or calls stay hung
    LATE = "late"  # its read did not answer within the deadline in this tick: hung if it lasts
    UNREAD = "unread"  # not read at all (every reader busy, NVML re-initialising): no evidence


@dataclass(frozen=True, slots=True)
class Reading:
    """One sample of one catalog family: `family{labels} value` (device labels added later)."""

    family: str
    value: float
    labels: Labels = ()


def find_value(readings: Iterable[Reading], family: str, labels: Mapping[str, str]) -> float | None:
    """The value of the reading of `family` with exactly `labels`, or None when absent."""
    wanted = tuple(sorted(labels.items()))
    for reading in readings:
        if reading.family == family and tuple(sorted(reading.labels)) == wanted:
            return reading.value
    return None


# The engines NVML samples per process (nvmlProcessUtilizationInfo_v1_t: smUtil, memUtil,
# encUtil, decUtil, jpgUtil, ofaUtil), by the name the exporter uses for each.
PROCESS_ENGINES = ("sm", "memory", "encoder", "decoder", "jpeg", "ofa")


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process on a GPU (or MIG instance) in one tick, as NVML lists it: its host PID, the
    memory it uses, and its share of each engine's time over the tick.

    `utilization` maps a PROCESS_ENGINES name to a ratio 0..1 over the tick; an engine is
    absent when NVML had no sample of the process for it (NVML samples a process only when it
    used the engine: absent means 0). It is None where per-process utilization was not
    measured: under MIG, where NVML has none, or when this tick's read failed.
    `mps` marks an MPS client (listed by nvmlDeviceGetMPSComputeRunningProcesses)."""

    pid: int
    memory_bytes: float | None = None  # None: NVML_VALUE_NOT_AVAILABLE
    utilization: Mapping[str, float] | None = None
    mps: bool = False


@dataclass(frozen=True, slots=True)
class InstanceSample:
    """One MIG device (a compute instance of a GPU instance) of a GPU, in one tick.

    Its readings are the instance's own quantities (memory, activity, class, pods); the
    parent's (power, clocks, links) stay on the parent's sample. `shared` is True when its GPU
    instance has several compute instances: then `compute_instance` tells them apart in the
    labels, and the GPU instance's memory and activity belong to none of them alone.

    `up` is False for an instance not read in this tick: its GPU is down, or its GPU's MIG
    layout could not be read (`DeviceSample.instances_unknown` says why). It is then the
    instance as last enumerated, identity only: no readings (what is unknown is absent), so
    that its pods stay named while its device is gone.
    """

    gpu_instance: int
    compute_instance: int
    mig_uuid: str
    profile: str
    shared: bool = False
    readings: tuple[Reading, ...] = ()
    verdict: Verdict | None = None  # the classifier's, with its reason and numbers
    # Its processes this tick; None: not read (per-process reads off, or the read failed).
    processes: tuple[ProcessSample, ...] | None = None
    up: bool = True

    @property
    def labels(self) -> Labels:
        """Its identity labels after the parent's gpu and uuid (catalog.INSTANCE_LABELS)."""
        ci = (("compute_instance", str(self.compute_instance)),) if self.shared else ()
        return (
            ("gpu_instance", str(self.gpu_instance)),
            *ci,
            ("mig_uuid", self.mig_uuid),
            ("mig_profile", self.profile),
        )

    def value(self, family: str, **labels: str) -> float | None:
        return find_value(self.readings, family, labels)


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """Everything read from one GPU in one tick.

    `up` is False when the device did not answer (lost, hung, or the driver is gone); then
    `readings` holds only what was known before (nothing) and `down_reason` says why.
    `info` holds gpu_info's labels, and the device minor number (`minor_number`, not
    exported). `instances` are its MIG devices, and `mig_enabled` whether MIG is on (as last
    read: it stays True through a tick whose MIG read failed, which then has no instances).
    `verdict` is the bottleneck classifier's for this tick (None without one, for a down GPU
    and for a MIG parent, whose instances have theirs). `instances_unknown` says why the
    MIG layout of a GPU that answered could not be read in this tick ("" when it was, or MIG
    is off); its `instances` are then the ones last known, each down (`InstanceSample.up`), as
    are a down GPU's. `down_cause` says what a down GPU's tick tells of the GPU itself.
    """

    index: int
    uuid: str
    info: Mapping[str, str]
    up: bool
    readings: tuple[Reading, ...] = ()
    down_reason: str = ""
    instances: tuple[InstanceSample, ...] = ()
    mig_enabled: bool = False
    verdict: Verdict | None = None  # the classifier's, with its reason and numbers
    # Its processes this tick (a MIG GPU's are its instances'); None: not read.
    processes: tuple[ProcessSample, ...] | None = None
    instances_unknown: str = ""
    down_cause: DownCause = DownCause.FAILED  # of a down GPU; unused when up

    @property
    def labels(self) -> Labels:
        return (("gpu", str(self.index)), ("uuid", self.uuid))

    def value(self, family: str, **labels: str) -> float | None:
        """The value of `family` with exactly these extra labels, or None when absent."""
        return find_value(self.readings, family, labels)

    def families(self) -> set[str]:
        return {reading.family for reading in self.readings}


@dataclass(frozen=True, slots=True)
class ErrorCount:
    """Cumulative count of failed reads, by source, field and NVML error name."""

    source: str
    field: str
    error: str
    count: int


@dataclass(frozen=True, slots=True)
class CollectorStatus:
    """How one producer of series did in one tick (gpu_exporter_collector_success/_duration).

    `success` is False when the producer raised; its families are then missing for that tick
    only. `duration_seconds` is the time it took, summed over GPUs for per-GPU collectors.
    """

    collector: str
    success: bool
    duration_seconds: float


@dataclass(frozen=True, slots=True)
class TickStats:
    """The sampler's own timing, cumulative since start (exported as a histogram)."""

    bucket_bounds: tuple[float, ...] = ()
    bucket_counts: tuple[int, ...] = ()  # cumulative, one per bound, then +Inf = `ticks`
    duration_sum: float = 0.0
    ticks: int = 0
    last_tick_timestamp: float = 0.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One tick: per-device samples plus node-level facts and self-telemetry."""

    timestamp: float
    devices: tuple[DeviceSample, ...]
    node_info: Mapping[str, str] = field(default_factory=dict)
    errors: tuple[ErrorCount, ...] = ()
    tick_seconds: float = 0.0
    sequence: int = 0
    stats: TickStats = field(default_factory=TickStats)
    full_tick_stats: TickStats = field(default_factory=TickStats)  # up to the previous tick
    # Pod attribution in force for this tick: GPU UUID -> namespace/pod/container labels.
    device_labels: Mapping[str, Labels] = field(default_factory=dict)
    # Per-tick outcome of every producer that ran before the snapshot was built (the NVML
    # collectors, processors such as the classifier); the series builder adds its own.
    collectors: tuple[CollectorStatus, ...] = ()

    def device(self, index: int) -> DeviceSample | None:
        for device in self.devices:
            if device.index == index:
                return device
        return None

    def degraded(self) -> list[str]:
        """What this tick could not see, one line per GPU: a GPU down, or one whose MIG
        instances are unknown (each with the reason)."""
        lines = []
        for device in self.devices:
            gpu = f"GPU {device.index}"
            if not device.up:
                lines.append(f"{gpu} down: {device.down_reason or 'not answering'}")
            elif device.instances_unknown:
                lines.append(f"{gpu} MIG instances unknown: {device.instances_unknown}")
        return lines

    def __iter__(self) -> Iterator[DeviceSample]:
        return iter(self.devices)

"""processes: the processes on the GPU (or on each MIG instance), their memory and their share
of each engine's time, every tick (`nvml.processes`, which `kubernetes.processes.enabled`
turns on). It emits no readings of its own: the processes go on the tick's samples, and the
pod-use processor (collect/k8s/pod_use.py) turns them into per-pod readings.

What NVML gives (nvml.h), and how it is read:
- `nvmlDeviceGetComputeRunningProcesses_v3`, `..GraphicsRunningProcesses_v3` and
  `..MPSComputeRunningProcesses_v3` (Volta and newer) list processes by host PID with the memory
  each uses ("all of the memory used by the application": a process on two lists is one process,
  its memory counted once); the MPS list names MPS clients, whose server is on the compute list.
  On a MIG GPU each MIG device handle lists its own instance's processes.
- `nvmlDeviceGetProcessesUtilizationInfo` returns, per driver sample period since
  `lastSeenTimeStamp`, one sample per process that used an engine (SM, memory, encoder,
  decoder, JPEG, OFA, in percent); the time stamp of the newest sample is kept per GPU, so every
  sample is used once. Drivers without it answer `nvmlDeviceGetProcessUtilization` (SM, memory,
  encoder, decoder). A process's share of an engine is the mean of its samples read in the
  tick; one without a sample used none of it. NOT_FOUND means no sample is newer: not an error,
  and not "all idle" either, since it is also the answer between two ends of the driver's sample
  period when ticks are shorter than it; the tick repeats the newest period's shares. (When every
  process did go idle, the device's utilization falls to 0 and the pod-use processor, which
  bounds the shares by it, brings them to 0.) NVML has no per-process utilization under MIG:
  instances' processes have none (never 0).
Every failure is handled at the choke point as any call's: counted, learned when it will not
change (NOT_SUPPORTED, FUNCTION_NOT_FOUND, NO_PERMISSION), never a crash; the lists then
stay unread for the tick (None), which the pod-use processor reports as nothing rather than 0.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pynvml as N

from gpu_exporter.collect.nvml.calls import GoneError
from gpu_exporter.collect.nvml.collectors.base import Collector, Device
from gpu_exporter.model.snapshot import ProcessSample, Reading

# (choke-point key, pynvml function, whether its processes are MPS clients)
_LISTS = (
    ("compute_processes", "nvmlDeviceGetComputeRunningProcesses", False),
    ("graphics_processes", "nvmlDeviceGetGraphicsRunningProcesses", False),
    ("mps_processes", "nvmlDeviceGetMPSComputeRunningProcesses", True),
)
# Sample fields per engine name (model.snapshot.PROCESS_ENGINES), both utilization calls.
_ENGINES = (
    ("sm", "smUtil"),
    ("memory", "memUtil"),
    ("encoder", "encUtil"),
    ("decoder", "decUtil"),
    ("jpeg", "jpgUtil"),
    ("ofa", "ofaUtil"),
)


class Processes(Collector):
    name = "processes"
    families = ()
    calls = (
        *(function for _, function, _ in _LISTS),
        "nvmlDeviceGetProcessesUtilizationInfo",
        "nvmlDeviceGetProcessUtilization",  # drivers without the one above
    )
    setting = "processes"
    mig_dependent = ("process_utilization", "process_utilization_info")

    def __init__(self) -> None:
        super().__init__()
        self.last_seen = 0  # the newest utilization sample's time stamp (microseconds)
        self.newest: dict[int, dict[str, float]] = {}  # the shares last read, per PID

    def read(self, nvml: Device) -> list[Reading]:
        if nvml.mig_enabled:
            by_instance = {}
            for mig_uuid, handle in nvml.mig_handles.items():
                listed = _listed(nvml, handle)
                if listed is not None:
                    by_instance[mig_uuid] = tuple(
                        ProcessSample(pid, memory, None, mps)
                        for pid, (memory, mps) in listed.items()
                    )
            nvml.report_processes(None, by_instance)
            return []
        listed = _listed(nvml, nvml.handle)
        if listed is None:
            nvml.report_processes(None)
            return []
        shares = self._shares(nvml)
        nvml.report_processes(
            tuple(
                ProcessSample(pid, memory, None if shares is None else shares.get(pid, {}), mps)
                for pid, (memory, mps) in sorted(listed.items())
            )
        )
        return []

    def _shares(self, nvml: Device) -> dict[int, dict[str, float]] | None:
        """Each sampled process's mean share of each engine since the last read; None when
        the samples could not be read this tick."""
        samples = None
        for key, function in (
            ("process_utilization_info", getattr(N, "nvmlDeviceGetProcessesUtilizationInfo", None)),
            ("process_utilization", N.nvmlDeviceGetProcessUtilization),  # older drivers
        ):
            try:
                samples = nvml.call(
                    key, function, nvml.handle, self.last_seen, gone=(N.NVMLError_NotFound,)
                )
            except GoneError:  # NOT_FOUND: no sample period ended since the last read
                return self.newest
            if samples is not None or not nvml.is_unsupported(key):
                break
        if samples is None:
            return None
        sums: defaultdict[int, dict[str, float]] = defaultdict(dict)
        counts: defaultdict[int, int] = defaultdict(int)
        for sample in samples:  # ctypes structs into a buffer: copied out at once
            pid, stamp = int(sample.pid), int(sample.timeStamp)
            self.last_seen = max(self.last_seen, stamp)
            counts[pid] += 1
            for engine, field in _ENGINES:
                value = getattr(sample, field, None)
                if value is not None:
                    sums[pid][engine] = sums[pid].get(engine, 0.0) + min(100, int(value)) / 100
        self.newest = {
            pid: {engine: total / counts[pid] for engine, total in engines.items() if total > 0}
            for pid, engines in sums.items()
        }
        return self.newest


def _listed(nvml: Device, handle: Any) -> dict[int, tuple[float | None, bool]] | None:
    """PID -> (memory in bytes or None, MPS client) from the running-process lists of one
    device handle; None when no list could be read."""
    out: dict[int, tuple[float | None, bool]] = {}
    read_any = False
    for key, function, mps in _LISTS:
        processes = nvml.call(key, getattr(N, function, None), handle)
        if processes is None:
            continue
        read_any = True
        for process in processes:
            pid = int(process.pid)
            memory = process.usedGpuMemory  # None: NVML_VALUE_NOT_AVAILABLE
            known, was_mps = out.get(pid, (None, False))
            # One process on two lists: its memory is the same "all of the memory used".
            best = memory if known is None else known if memory is None else max(known, memory)
            out[pid] = (None if best is None else float(best), was_mps or mps)
    return out if read_any else None

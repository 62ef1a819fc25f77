"""processes: the processes on the GPU (or on each MIG instance), their memory and their share
of each engine's time, every tick (`nvml.processes`, which `kubernetes.processes.enabled`
turns on). It emits no readings of its own: the processes go on the tick's samples, and the
pod-use processor (collect/k8s/pod_use.py) turns them into per-pod readings.

What NVML gives (nvml.h), and how it is read:
- `nvmlDeviceGetComputeRunningProcesses_v3`, `..GraphicsRunningProcesses_v3` and
  `..MPSComputeRunningProcesses_v3` (Volta and newer) list processes by PID with the memory
  each uses ("all of the memory used by the application": a process on two lists is one process,
  its memory counted once); the MPS list names MPS clients, whose server is on the compute list.
  On a MIG GPU each MIG device handle lists its own instance's processes. The PIDs are those of
  the caller's PID namespace: the driver leaves out processes the caller cannot see
  (open-gpu-kernel-modules, `os_find_ns_pid`), so only a daemon in the host's PID namespace sees
  other containers' processes (collect/k8s/process_attribution.py checks it).
- The driver samples utilization once per sample period into a buffer: the device's
  (`nvmlDeviceGetSamples`, NVML_GPU_UTILIZATION_SAMPLES: one sample per period) and each
  process's (`nvmlDeviceGetProcessesUtilizationInfo`: SM, memory, encoder, decoder, JPEG, OFA in
  percent; drivers without it answer `nvmlDeviceGetProcessUtilization`), the latter only "per
  process running, that had some non-zero utilization during the last sample period". Both
  take the CPU time stamp (microseconds) of the newest sample already read and return newer
  ones; NOT_FOUND means none is newer (not an error).
- The window of a tick is the device's sample periods that ended since the last read. A
  process's share of an engine over it is the sum of its samples in the window divided by the
  number of periods: a period without its sample is a period it did not use the engine, so a
  process busy in one period of ten has 0.1, not the 1.0 of its one sample. Process samples
  stamped after the window's last period wait for the next tick's window, so each sample counts
  once, in one window. A tick in which no period ended (ticks shorter than the period) repeats
  the newest window's shares: they are still the newest measurement.
- The shares are bounded by what the device did in the same window: the SM shares' sum by the
  mean of the device's utilization samples (kernels of MPS clients overlap, and each client's
  samples count its own kernels: their sum may exceed the GPU's busy time; scaled down to it
  they are each client's part of it), every other engine's sum by 1.
- NVML has no per-process utilization under MIG: instances' processes have none (never 0).
Every failure is handled at the choke point as any call's: counted, learned when it will not
change (NOT_SUPPORTED, FUNCTION_NOT_FOUND, NO_PERMISSION), never a crash; the lists then
stay unread for the tick (None), and utilization that could not be read is None, which the
pod-use processor reports as nothing rather than 0.
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
        "nvmlDeviceGetSamples",
        "nvmlDeviceGetProcessesUtilizationInfo",
        "nvmlDeviceGetProcessUtilization",  # drivers without the one above
    )
    setting = "processes"
    # What answers differently with MIG on: relearned when the mode changes.
    mig_dependent = (
        *(key for key, _, _ in _LISTS),
        "utilization_samples",
        "process_utilization",
        "process_utilization_info",
    )

    def __init__(self) -> None:
        super().__init__()
        self.device_seen = 0  # the newest device utilization sample read (microseconds)
        self.last_seen = 0  # the newest per-process sample counted in a window
        self.newest: dict[int, dict[str, float]] = {}  # the newest window's shares, per PID

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
        """Each process's share of each engine over the sample periods that ended since the
        last read (the newest window's again when none did); None when unreadable."""
        window = self._device_periods(nvml)
        if window is None:
            return None
        if not window:
            return self.newest
        end = max(stamp for stamp, _ in window)
        samples = self._process_samples(nvml)
        if samples is None:
            self.last_seen = max(self.last_seen, end)  # the next window starts after this one
            return None
        periods = len(window)
        sums: defaultdict[int, dict[str, float]] = defaultdict(dict)
        for sample in samples:  # ctypes structs into a buffer: copied out at once
            pid, stamp = int(sample.pid), int(sample.timeStamp)
            if stamp > end:
                continue  # a period the device's samples have not reached: the next window's
            self.last_seen = max(self.last_seen, stamp)
            for engine, field in _ENGINES:
                value = getattr(sample, field, None)
                if value is not None:
                    sums[pid][engine] = sums[pid].get(engine, 0.0) + min(100, int(value)) / 100
        shares = {
            pid: {engine: total / periods for engine, total in engines.items() if total > 0}
            for pid, engines in sums.items()
        }
        device = sum(value for _, value in window) / periods
        for engine, _ in _ENGINES:
            _bound(shares, engine, device if engine == "sm" else 1.0)
        self.newest = shares
        return shares

    def _device_periods(self, nvml: Device) -> list[tuple[int, float]] | None:
        """(stamp, utilization) of each device sample period that ended since the last read;
        [] when none did; None when unreadable."""
        try:
            read = nvml.call(
                "utilization_samples",
                N.nvmlDeviceGetSamples,
                nvml.handle,
                N.NVML_GPU_UTILIZATION_SAMPLES,
                self.device_seen,
                gone=(N.NVMLError_NotFound,),
            )
        except GoneError:  # NOT_FOUND: no period ended since the last read
            return []
        if read is None:
            return None
        _, samples = read
        first = self.device_seen == 0  # the whole buffer: align the processes' to it
        window = [(int(s.timeStamp), min(100, int(s.sampleValue.uiVal)) / 100) for s in samples]
        if window:
            self.device_seen = max(stamp for stamp, _ in window)
            if first:
                self.last_seen = min(stamp for stamp, _ in window) - 1
        return window

    def _process_samples(self, nvml: Device) -> list[Any] | None:
        """The per-process samples newer than the last counted ([] for NOT_FOUND: no process
        used the GPU since); None when unreadable."""
        for key, function in (
            ("process_utilization_info", getattr(N, "nvmlDeviceGetProcessesUtilizationInfo", None)),
            ("process_utilization", N.nvmlDeviceGetProcessUtilization),  # older drivers
        ):
            try:
                samples = nvml.call(
                    key, function, nvml.handle, self.last_seen, gone=(N.NVMLError_NotFound,)
                )
            except GoneError:
                return []
            if samples is not None or not nvml.is_unsupported(key):
                return None if samples is None else list(samples)
        return None


def _bound(shares: dict[int, dict[str, float]], engine: str, limit: float) -> None:
    """Scale the engine's shares down so that they add up to at most `limit`."""
    total = sum(engines.get(engine, 0.0) for engines in shares.values())
    if total > limit:
        for engines in shares.values():
            if engine in engines:
                engines[engine] *= limit / total


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

#!/usr/bin/env python3
"""Real-GPU validation: run the production NVML source while known workloads run on the GPU.

On a machine with an NVIDIA GPU and PyTorch:

    PYTHONPATH=. python3 bench/gpu_validation.py --output bench/results/gpu_validation.json

For each workload (idle, bf16 matmul, device-to-device copy, host-to-device copy, tiny kernels
with a host sync after each, tiny kernels without sync) it samples every device once a second
with `NvmlSource` and records per-workload averages of every metric family. It also records
per-call NVML latency (p50/p99), which fields and GPM metrics this GPU and driver answer, and
how GPM behaves with windows shorter than the documented 100 ms, and each GPU's MIG mode: where
MIG is already enabled (it is never changed here), its MIG devices as NVML lists them next to
the instances the daemon reports. On every GPU, as this (unprivileged) user: the recovery
action field (230) and the NVLink fabric info (v3 and v2 structs), each as the driver answered
it (the value, or the error's name), with what the exporter makes of them.

Per process: the source runs with the processes collector on (`nvml.processes`), and each tick
records what it reports of the workload child's PID on GPU 0 (as the OS sees it: no containers
here), its memory and SM share; between ticks a probe reads GPU 0's per-process calls itself
every 0.1 s, which records which of them the driver answers, their latency, the spacing of the
utilization samples' time stamps per PID (the driver's sample period), what a read sooner than
that period gets, and whether this user (its euid is recorded) gets NO_PERMISSION. MPS is never
started (nor MIG, clocks, power or accounting changed): MPS clients' PIDs are not verified.

The workloads run in a child process so that their Python loop does not disturb the timings.
Without a GPU (`--simulate SCENARIO`) the same code runs on the fake NVML with sleeping
workloads; that is how its non-GPU parts are tested. Imports stay within the NVML source (no
web stack), because the GPU machine has only PyTorch, nvidia-ml-py and prometheus-client.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import select
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from itertools import pairwise
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pynvml as N

from gpu_exporter.collect.classify import Classifier
from gpu_exporter.collect.nvml.source import NvmlConfig, NvmlSource
from gpu_exporter.collect.settings import default_deadline, default_window_seconds
from gpu_exporter.collect.source import ErrorLog
from gpu_exporter.model.series import DeviceView, SeriesBuilder
from gpu_exporter.model.snapshot import DeviceSample, Snapshot

WORKLOADS = ("idle", "matmul_bf16", "copy_d2d", "copy_h2d", "tiny_kernels_sync", "tiny_kernels")
TIME_BUDGET_SECONDS = 330.0  # the issue allows 6 minutes; keep a margin

PROBE_FIELDS: tuple[tuple[str, int, int], ...] = (
    ("sw_power_cap_ns", 74, 0),
    ("sync_boost_ns", 76, 0),
    ("sw_thermal_ns", 269, 0),
    ("hw_thermal_ns", 270, 0),
    ("hw_power_brake_ns", 271, 0),
    ("memory_temp", 82, 0),
    ("total_energy_mj", 83, 0),
    ("power_average_mw", 185, 0),
    ("power_instant_mw", 186, 0),
    ("nvlink_link_count", 91, 0),
    ("pcie_replay", 94, 0),
    ("pcie_tx_bytes", 197, 0),
    ("pcie_rx_bytes", 198, 0),
    ("nvlink_tx_kib_all", 138, 0xFFFFFFFF),
    ("nvlink_rx_kib_all", 139, 0xFFFFFFFF),
    ("nvlink_tx_kib_link0", 138, 0),
    ("ecc_sbe_volatile", 3, 0),
    ("ecc_dbe_volatile", 4, 0),
    ("remapped_cor", 142, 0),
    ("remapped_unc", 143, 0),
    ("remap_pending", 144, 0),
    ("remap_failure", 145, 0),
    # Read since the dcgm-exporter compatibility issue (only checked against nvml.h so far).
    ("board_limit_violation_ns", 77, 0),
    ("low_utilization_violation_ns", 78, 0),
    ("reliability_violation_ns", 79, 0),
    ("ecc_sbe_aggregate", 5, 0),
    ("ecc_dbe_aggregate", 6, 0),
    ("nvlink_crc_flit_errors", 38, 0),
    ("nvlink_crc_data_errors", 45, 0),
    ("nvlink_replay_errors", 52, 0),
    ("nvlink_recovery_errors", 59, 0),
)


PROCESS_POLL_SECONDS = 0.1  # the probe's reads between ticks: a "tick" shorter than a period
PROCESS_LISTS = (
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetMPSComputeRunningProcesses",
)
# The newer call first, as the processes collector tries them.
PROCESS_UTILIZATION = ("nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization")
MPS_NOT_VERIFIED = "not verified: MPS is never started here (GPU settings are left as found)"
# --simulate only: the workload child as the fake NVML shows it on GPU 0 (made up, not measured).
SIMULATED_CHILD_SM = {
    "idle": 0.0,
    "matmul_bf16": 0.95,
    "copy_d2d": 0.4,
    "copy_h2d": 0.05,
    "tiny_kernels_sync": 0.02,
    "tiny_kernels": 0.1,
}
SIMULATED_CHILD_MEMORY = 2 * 1024**3


# -- workloads (child process) -------------------------------------------------------------------


def _run_workload(name: str, seconds: float, simulate: bool) -> None:
    """Keep the GPU busy in the named way for `seconds`."""
    deadline = time.monotonic() + seconds
    if simulate or name == "idle":
        time.sleep(max(0.0, deadline - time.monotonic()))
        return
    import torch

    dev = torch.device("cuda:0")
    if name == "matmul_bf16":
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        while time.monotonic() < deadline:
            for _ in range(20):
                a @ b
            torch.cuda.synchronize()
    elif name == "copy_d2d":
        src = torch.empty(2 << 30, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        while time.monotonic() < deadline:
            for _ in range(10):
                dst.copy_(src)
            torch.cuda.synchronize()
    elif name == "copy_h2d":
        host = torch.empty(1 << 30, dtype=torch.uint8).pin_memory()
        gpu = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
        while time.monotonic() < deadline:
            gpu.copy_(host, non_blocking=True)
            torch.cuda.synchronize()
    elif name in ("tiny_kernels_sync", "tiny_kernels"):
        x = torch.zeros(1, device=dev)
        sync_each = name == "tiny_kernels_sync"
        while time.monotonic() < deadline:
            for _ in range(100):
                x.add_(1.0)
                if sync_each:
                    torch.cuda.synchronize()
            torch.cuda.synchronize()
    else:
        raise ValueError(f"unknown workload {name}")
    torch.cuda.synchronize()


def worker_main(simulate: bool) -> int:
    """The workload process: reads `NAME SECONDS` lines, answers `done` or `error ...`."""
    if not simulate:
        import torch

        torch.zeros(1, device="cuda:0")  # create the context before the first phase
    print("ready", flush=True)
    for line in sys.stdin:
        name, seconds = line.split()
        try:
            _run_workload(name, float(seconds), simulate)
            print("done", flush=True)
        except Exception as exc:  # reported, not fatal: the other workloads still run
            print(f"error {type(exc).__name__}: {exc}".replace("\n", " "), flush=True)
    return 0


class WorkloadProcess:
    """The child that runs workloads, so their Python loop does not disturb the sampling."""

    def __init__(self, simulate: bool) -> None:
        command = [sys.executable, str(Path(__file__).resolve()), "--worker"]
        if simulate:
            command.append("--simulate-worker")
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )

    def expect(self, word: str, timeout: float = 180.0) -> str:
        """The child's next line; a dead or silent child is an error, not a hang."""
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        line = self.process.stdout.readline().strip() if ready else ""
        if not line:
            code = self.process.poll()
            raise RuntimeError(f"workload process gave no {word!r} (exit status {code})")
        if not line.startswith(word) and not line.startswith("error"):
            raise RuntimeError(f"workload process said {line!r}, expected {word!r}")
        return line

    def start(self, name: str, seconds: float) -> None:
        self.process.stdin.write(f"{name} {seconds}\n")
        self.process.stdin.flush()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()


# -- measurement (parent process) ----------------------------------------------------------------


def _key(family: str, labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return family
    return family + "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"


def summarise_samples(
    samples: list[tuple[float, list[DeviceView]]],
) -> dict[str, dict[str, Any]]:
    """Per device, per series: mean/min/max over the phase's samples; counters as rates."""
    series: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    up: dict[str, list[bool]] = defaultdict(list)
    for tick_time, devices in samples:
        for device in devices:
            gpu = str(device.index)
            up[gpu].append(device.up)
            for reading in device.readings:
                series[gpu][_key(reading.family, reading.labels)].append((tick_time, reading.value))
    out: dict[str, dict[str, Any]] = {}
    for gpu, by_key in series.items():
        stats: dict[str, Any] = {"up_ratio": sum(up[gpu]) / len(up[gpu])}
        for key, points in sorted(by_key.items()):
            values = [v for _, v in points]
            entry: dict[str, Any] = {
                "mean": statistics.fmean(values),
                "min": min(values),
                "max": max(values),
                "n": len(values),
            }
            if "_total" in key.split("{")[0] and len(points) > 1:
                dt = points[-1][0] - points[0][0]
                entry["rate_per_second"] = (points[-1][1] - points[0][1]) / dt if dt > 0 else None
            stats[key] = entry
        out[gpu] = stats
    return out


def raw_series(samples: list[tuple[float, list[DeviceView]]], gpu: int) -> list[dict[str, Any]]:
    """Every reading of one GPU per tick, so later analyses (classification) can replay them."""
    start = samples[0][0] if samples else 0.0
    out = []
    for tick_time, devices in samples:
        for device in devices:
            if device.index == gpu:
                row: dict[str, Any] = {"t": round(tick_time - start, 3), "up": device.up}
                row.update({_key(r.family, r.labels): r.value for r in device.readings})
                out.append(row)
    return out


def probe_memory(handle: Any) -> dict[str, Any]:
    """Does memory info v2's `used` include `reserved` on this driver? (v1 vs v2 side by side)"""
    out: dict[str, Any] = {}
    for name, call in (
        ("v1", lambda: N.nvmlDeviceGetMemoryInfo(handle)),
        ("v2", lambda: N.nvmlDeviceGetMemoryInfo(handle, N.nvmlMemory_v2)),
    ):
        try:
            mem = call()
            out[name] = {
                k: int(getattr(mem, k))
                for k in ("total", "free", "used", "reserved")
                if hasattr(mem, k)
            }
        except N.NVMLError as exc:
            out[name] = {"error": str(exc)}
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


def latency_table(timings: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {
        key: {
            "calls": len(values),
            "p50_ms": percentile(values, 0.50) * 1e3,
            "p99_ms": percentile(values, 0.99) * 1e3,
            "max_ms": max(values) * 1e3,
        }
        for key, values in sorted(timings.items())
        if values
    }


def probe_fields(handle: Any) -> dict[str, dict[str, Any]]:
    """Which fields this GPU and driver answer, with value and NVML's own latencyUsec."""
    values = N.nvmlDeviceGetFieldValues(handle, [(fid, scope) for _, fid, scope in PROBE_FIELDS])
    out: dict[str, dict[str, Any]] = {}
    for (name, fid, scope), value in zip(PROBE_FIELDS, values, strict=True):
        entry: dict[str, Any] = {
            "field_id": fid,
            "scope": scope,
            "return": int(value.nvmlReturn),
            "value_type": int(value.valueType),  # 1 = 32-bit: would PCIe byte counters wrap?
        }
        if value.nvmlReturn == N.NVML_SUCCESS:
            from gpu_exporter.collect.nvml.values import field_value

            entry["value"] = field_value(value)
            entry["latency_usec"] = int(value.latencyUsec)
        out[name] = entry
    return out


def probe_gpm(handle: Any, windows: tuple[float, ...] = (0.02, 0.05, 0.1, 0.5)) -> dict[str, Any]:
    """GPM support, and what SM_UTIL returns for windows shorter than the documented 100 ms."""
    try:
        supported = bool(N.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except N.NVMLError as exc:
        return {"supported": False, "error": str(exc)}
    result: dict[str, Any] = {"supported": supported, "windows": {}}
    if not supported:
        return result
    first, second = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    try:
        for window in windows:
            N.nvmlGpmSampleGet(handle, first)
            time.sleep(window)
            N.nvmlGpmSampleGet(handle, second)
            request = N.c_nvmlGpmMetricsGet_t()
            request.version = N.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = 2
            request.sample1, request.sample2 = first, second
            request.metrics[0].metricId = N.NVML_GPM_METRIC_SM_UTIL
            request.metrics[1].metricId = getattr(N, "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", 61)
            try:
                N.nvmlGpmMetricsGet(request)
                result["windows"][f"{window * 1000:.0f}ms"] = {
                    "sm_util_return": int(request.metrics[0].nvmlReturn),
                    "sm_util": _finite(request.metrics[0].value),
                    "nvlink_tx_return": int(request.metrics[1].nvmlReturn),
                }
            except N.NVMLError as exc:
                result["windows"][f"{window * 1000:.0f}ms"] = {"error": str(exc)}
    finally:
        N.nvmlGpmSampleFree(first)
        N.nvmlGpmSampleFree(second)
    return result


def probe_mig(source: NvmlSource) -> dict[str, Any]:
    """Per GPU: its MIG mode and, only where MIG is already enabled, its MIG devices as NVML
    lists them directly, next to the instances the daemon's source reports. Reads only: a
    GPU's MIG mode (or any setting) is never changed here."""
    gone = (N.NVMLError_NotFound, N.NVMLError_InvalidArgument)
    daemon = {d.index: d for d in source.sample()}
    out: dict[str, Any] = {}
    for index in range(N.nvmlDeviceGetCount()):
        handle = N.nvmlDeviceGetHandleByIndex(index)
        entry: dict[str, Any] = {}
        out[str(index)] = entry
        try:
            entry["mode"] = list(N.nvmlDeviceGetMigMode(handle))
        except N.NVMLError as exc:
            entry["mode"] = str(exc)
            continue
        if entry["mode"][0] != 1:
            continue
        listed = []
        for slot in range(N.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = N.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                memory = N.nvmlDeviceGetMemoryInfo(mig)
                listed.append(
                    {
                        "slot": slot,
                        "mig_uuid": N.nvmlDeviceGetUUID(mig),
                        "name": N.nvmlDeviceGetName(mig),
                        "gpu_instance": N.nvmlDeviceGetGpuInstanceId(mig),
                        "compute_instance": N.nvmlDeviceGetComputeInstanceId(mig),
                        "memory_total": memory.total,
                    }
                )
            except gone:
                continue
            except N.NVMLError as exc:  # what an unprivileged reader cannot do: worth knowing
                listed.append({"slot": slot, "error": str(exc)})
        entry["nvml"] = listed
        sample = daemon.get(index)
        reported = sample.instances if sample is not None else ()
        entry["daemon"] = [
            {
                "mig_uuid": i.mig_uuid,
                "profile": i.profile,
                "gpu_instance": i.gpu_instance,
                "memory_total": i.value("gpu_memory_total_bytes"),
            }
            for i in reported
        ]
        entry["agree"] = {i["mig_uuid"] for i in listed if "mig_uuid" in i} == {
            i.mig_uuid for i in reported
        }
    return out


# -- per-process checks --------------------------------------------------------------------------


def child_in(devices: list[DeviceSample], pid: int) -> dict[str, Any] | None:
    """What the processes collector reported of `pid` this tick: the GPU (and MIG instance), its
    memory, its SM share (0 when NVML had no sample of it; None when not measured) and whether
    it is an MPS client; None when no GPU listed it."""
    for device in devices:
        groups = [(None, device.processes), *((i.mig_uuid, i.processes) for i in device.instances)]
        for instance, processes in groups:
            for process in processes or ():
                if process.pid == pid:
                    shares = process.utilization
                    return {
                        "gpu": device.index,
                        "instance": instance,
                        "memory_bytes": process.memory_bytes,
                        "sm": None if shares is None else shares.get("sm", 0.0),
                        "mps": process.mps,
                    }
    return None


def collector_view(ticks: list[dict[str, Any] | None]) -> dict[str, Any]:
    """A workload's ticks as the processes collector reported the workload child."""
    listed = [t for t in ticks if t is not None]
    with_memory = [t for t in listed if (t["memory_bytes"] or 0) > 0]
    shares = [t["sm"] for t in listed if t["sm"] is not None]
    return {
        "ticks": len(ticks),
        "listed": len(listed),
        "listed_with_memory_ratio": len(with_memory) / len(ticks) if ticks else None,
        "gpus": sorted({t["gpu"] for t in listed}),
        "memory_bytes_mean": statistics.fmean(t["memory_bytes"] for t in with_memory)
        if with_memory
        else None,
        "sm_share_mean": statistics.fmean(shares) if shares else None,
        "sm_share_max": max(shares) if shares else None,
        "sm_unmeasured_ticks": len(listed) - len(shares),
        "mps": any(t["mps"] for t in listed),
    }


class ProcessProbe:
    """GPU 0's per-process NVML calls read directly, beside the production collector (NVML
    keeps no per-caller state: each caller passes its own last seen time stamp)."""

    def __init__(self, handle: Any, pid: int) -> None:
        self.handle, self.pid = handle, pid
        self.utilization: str | None = None  # the utilization call the driver answers
        self.last_seen = 0
        self.device_seen = 0  # the newest device utilization sample read
        self.timings: dict[str, list[float]] = defaultdict(list)
        self.spacings_ms: list[float] = []  # every workload's
        self.device_spacings_ms: list[float] = []
        self.no_permission = False
        self._start_phase()

    def _start_phase(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.stamps: dict[int, set[int]] = defaultdict(set)
        self.device_stamps: set[int] = set()
        self.child_sm: list[float] = []
        self.ages_ms: list[float] = []

    def _call(self, name: str, *args: Any) -> tuple[str, Any]:
        function = getattr(N, name, None)
        if function is None:
            return "absent from this nvidia-ml-py", None
        started = time.perf_counter()
        try:
            result, outcome = function(self.handle, *args), "ok"
        except N.NVMLError as exc:
            result, outcome = None, type(exc).__name__
            self.no_permission |= isinstance(exc, N.NVMLError_NoPermission)
        spent = time.perf_counter() - started
        self.timings[name].append(spent)
        if name in PROCESS_UTILIZATION:
            self.timings[f"{name}: {outcome}"].append(spent)
        return outcome, result

    def which_calls(self) -> dict[str, Any]:
        """Each per-process call once: its outcome, and for a list whether the child is on it."""
        out: dict[str, Any] = {}
        for name in PROCESS_LISTS:
            outcome, listed = self._call(name)
            entry: dict[str, Any] = {"outcome": outcome}
            if listed is not None:
                pids = [int(p.pid) for p in listed]
                entry.update(entries=len(pids), pids=pids[:32], child_listed=self.pid in pids)
                mine = [p for p in listed if int(p.pid) == self.pid]
                if mine:
                    entry["child_memory_bytes"] = _memory(mine[0].usedGpuMemory)
            out[name] = entry
        for name in PROCESS_UTILIZATION:
            outcome, samples = self._call(name, 0)
            out[name] = {"outcome": outcome}
            if samples is not None:
                out[name]["samples"] = len(samples)
            if self.utilization is None and outcome in ("ok", "NVMLError_NotFound"):
                self.utilization = name
        return out

    def poll(self) -> None:
        """Each list once, and the utilization samples (the device's and the processes') newer
        than the last one seen."""
        for name in PROCESS_LISTS:
            self._call(name)
        # The processes collector's window: the device's own sample periods.
        outcome, read = self._call(
            "nvmlDeviceGetSamples", N.NVML_GPU_UTILIZATION_SAMPLES, self.device_seen
        )
        if read is not None:
            stamps = {int(sample.timeStamp) for sample in read[1]}
            self.device_stamps |= stamps
            self.device_seen = max([self.device_seen, *stamps])
        if self.utilization is None:
            return
        outcome, samples = self._call(self.utilization, self.last_seen)
        self.outcomes[outcome] += 1
        if not samples:
            return
        newest = max(int(sample.timeStamp) for sample in samples)
        self.ages_ms.append((time.time() * 1e6 - newest) / 1e3)
        self.last_seen = max(self.last_seen, newest)
        for sample in samples:
            pid = int(sample.pid)
            self.stamps[pid].add(int(sample.timeStamp))
            if pid == self.pid:
                self.child_sm.append(min(100, int(sample.smUtil)) / 100)

    def begin_phase(self) -> None:
        """Read past what came before the workload (the samples of its warm-up and of the
        workload before it), then count afresh."""
        self.poll()
        self._start_phase()

    def end_phase(self) -> dict[str, Any]:
        """What the polls during one workload saw; the next workload's start afresh."""
        spacings = [
            (later - earlier) / 1e3
            for stamps in self.stamps.values()
            for earlier, later in pairwise(sorted(stamps))
        ]
        self.spacings_ms += spacings
        device_spacings = [(b - a) / 1e3 for a, b in pairwise(sorted(self.device_stamps))]
        self.device_spacings_ms += device_spacings
        process_stamps = set().union(*self.stamps.values()) if self.stamps else set()
        polls = sum(self.outcomes.values())
        out = {
            "polls": polls,
            "outcomes": dict(self.outcomes),
            "not_found_ratio": self.outcomes["NVMLError_NotFound"] / polls if polls else None,
            "pids_sampled": sorted(self.stamps),
            "sample_spacing_ms": _spread(spacings),
            "device_sample_spacing_ms": _spread(device_spacings),
            # Assumed by the processes collector: one sampler, so the processes' time stamps
            # are the device's periods' (a share is its samples over the device's periods).
            "process_stamps_on_device_stamps": (
                len(process_stamps & self.device_stamps) / len(process_stamps)
                if process_stamps and self.device_stamps
                else None
            ),
            # How old the newest sample was when read: are the time stamps wall-clock µs?
            "newest_sample_age_ms_p50": statistics.median(self.ages_ms) if self.ages_ms else None,
            "child_samples": len(self.child_sm),
            "child_sm_mean_of_samples": statistics.fmean(self.child_sm) if self.child_sm else None,
        }
        self._start_phase()
        return out

    def summary(self, report: dict[str, Any]) -> dict[str, Any]:
        """The run's per-process findings, from the workloads' probe results in `report`."""
        period = statistics.median(self.spacings_ms) if self.spacings_ms else None
        busy = report["workloads"].get("matmul_bf16", {}).get("processes", {}).get("probe", {})
        polls, not_found = busy.get("polls", 0), busy.get("outcomes", {}).get("NVMLError_NotFound")
        answer = None
        if polls and period is not None:
            answer = bool(not_found) and period > PROCESS_POLL_SECONDS * 1e3
        return {
            "utilization_call": self.utilization,
            "sample_period_ms": period,
            "sample_spacing_ms": _spread(self.spacings_ms),
            "device_sample_period_ms": (
                statistics.median(self.device_spacings_ms) if self.device_spacings_ms else None
            ),
            "short_reads": {
                "poll_seconds": PROCESS_POLL_SECONDS,
                "busy_polls": polls,
                "busy_not_found": not_found or 0,
                "not_found_when_sooner_than_the_period": answer,
            },
            "no_permission": self.no_permission,
            "latency": latency_table(self.timings),
            "mps_client_pids": MPS_NOT_VERIFIED,
        }


def _memory(value: Any) -> int | None:
    """usedGpuMemory: None where NVML says NVML_VALUE_NOT_AVAILABLE."""
    return None if value is None else int(value)


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "n": len(values),
        "p50": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


class SimulatedChild:
    """--simulate: the workload child as a process on GPU 0 of the fake NVML, under its real
    PID, with each workload's SM share (`SIMULATED_CHILD_SM`), so that the per-process checks
    run on the fake as on a GPU. Not where GPU 0 has MIG on (its processes need an instance)."""

    def __init__(self, fake: Any, pid: int) -> None:
        self.fake, self.pid = fake, pid
        gpu0 = fake.scenario.devices[0]
        self.registered = not (gpu0.mig is not None and gpu0.mig.enabled)
        self.workload("idle")

    def workload(self, name: str) -> None:
        if not self.registered:
            return
        from gpu_exporter import sim

        sm = SIMULATED_CHILD_SM.get(name, 0.0)
        entry: dict[str, Any] = {"pid": self.pid, "gpu": 0, "memory_bytes": SIMULATED_CHILD_MEMORY}
        if sm:
            entry["utilization"] = {"sm": sm, "memory": sm / 2}
        child = sim.load_scenario({"name": "child", "devices": [{}], "processes": [entry]})
        self.fake.set_processes([*self.fake.scenario.processes, *child.processes])

    def describe(self) -> str:
        if not self.registered:
            return "not registered: GPU 0 has MIG on"
        return f"PID {self.pid} on GPU 0 of the fake, SM share per workload {SIMULATED_CHILD_SM}"


def probe_calls(handle: Any) -> dict[str, Any]:
    """The NVML calls read since the dcgm-exporter compatibility issue, as this GPU answers
    them (value, or the error's name)."""
    calls = {
        "encoder_utilization": N.nvmlDeviceGetEncoderUtilization,
        "decoder_utilization": N.nvmlDeviceGetDecoderUtilization,
        "power_management_limit_mw": N.nvmlDeviceGetPowerManagementLimit,
        "enforced_power_limit_mw": N.nvmlDeviceGetEnforcedPowerLimit,
    }
    out: dict[str, Any] = {}
    for name, call in calls.items():
        try:
            out[name] = call(handle)
        except N.NVMLError as exc:
            out[name] = {"error": type(exc).__name__}
    return out


def _recovery_action(handle: Any) -> dict[str, Any]:
    """NVML_FI_DEV_GET_GPU_RECOVERY_ACTION as the driver answers it, and the exporter's label."""
    from gpu_exporter.collect.nvml.values import field_value, return_code_name
    from gpu_exporter.model.nvml_facts import RECOVERY_ACTION_FIELD, recovery_action

    try:
        (value,) = N.nvmlDeviceGetFieldValues(handle, [RECOVERY_ACTION_FIELD])
    except N.NVMLError as exc:
        return {"error": type(exc).__name__}
    if value.nvmlReturn != N.NVML_SUCCESS:
        return {"return": int(value.nvmlReturn), "error": return_code_name(value.nvmlReturn)}
    number = field_value(value)
    return {
        "return": 0,
        "value": number,
        "value_type": int(value.valueType),
        "action": recovery_action(number),
    }


def _fabric_info(handle: Any) -> dict[str, Any]:
    """nvmlDeviceGetGpuFabricInfoV with each struct version this binding has (v3, v2): the
    fields, or the error's name; what the exporter exports of the newest answer."""
    import ctypes

    from gpu_exporter.collect.nvml.collectors.fabric import STRUCTS, fabric_readings

    out: dict[str, Any] = {}
    for key, struct_name in STRUCTS:
        struct = getattr(N, struct_name, None)
        version = key.rsplit("_", 1)[1]
        if struct is None or not hasattr(N, "nvmlDeviceGetGpuFabricInfoV"):
            out[version] = {"error": "not in this nvidia-ml-py"}
            continue
        info = struct()
        started = time.perf_counter()
        try:
            N.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
        except N.NVMLError as exc:
            out[version] = {"error": type(exc).__name__}
            continue
        out[version] = {
            "latency_ms": (time.perf_counter() - started) * 1e3,
            "state": int(info.state),
            "status": int(info.status),
            "health_mask": f"{int(info.healthMask):#x}",
            "health_summary": int(getattr(info, "healthSummary", 0)) if version == "v3" else None,
            "cluster_uuid": bytes(info.clusterUuid).hex(),
            "clique_id": int(info.cliqueId),
        }
        if "exported" not in out:
            out["exported"] = {
                f"{r.family}{{{r.labels[0][0]}={r.labels[0][1]!r}}}": r.value
                for r in fabric_readings(info)
            }
    return out


def probe_health(count: int) -> dict[str, Any]:
    """Field 230 and the fabric info of every GPU, read as this user (no privileges asked)."""
    out: dict[str, Any] = {}
    for index in range(count):
        try:
            handle = N.nvmlDeviceGetHandleByIndex(index)
        except N.NVMLError as exc:
            out[str(index)] = {"error": type(exc).__name__}
            continue
        out[str(index)] = {
            "recovery_action": _recovery_action(handle),
            "fabric": _fabric_info(handle),
        }
    return out


def health_lines(report: dict[str, Any]) -> list[str]:
    """The recovery action and fabric findings of `render_summary`, one line per GPU."""
    lines = []
    for index, entry in report.get("health", {}).items():
        if "error" in entry:
            lines.append(f"GPU {index}: no handle ({entry['error']})")
            continue
        field = entry["recovery_action"]
        action = (
            f"{field['action']} (field 230 = {field['value']:g})"
            if "action" in field
            else f"field 230 {field['error']}"
        )
        fabric = []
        for version in ("v3", "v2"):
            answer = entry["fabric"].get(version, {})
            if "error" in answer:
                fabric.append(f"{version} {answer['error']}")
            else:
                fabric.append(
                    f"{version} state {answer['state']}, status {answer['status']}, "
                    f"mask {answer['health_mask']}, summary {answer['health_summary']}"
                )
        lines.append(f"GPU {index}: recovery action {action}; fabric {'; '.join(fabric)}")
    return ["", "Health reads (unprivileged):", *lines] if lines else []


def answered_tick(source: NvmlSource, tries: int = 5) -> tuple[DeviceSample, ...]:
    """A tick in which every GPU answered, within `tries`: a busy machine can make a tick's
    reads miss the deadline, and a GPU down for that tick has no families to list."""
    for _ in range(tries):
        devices = tuple(source.sample())
        if all(device.up for device in devices):
            break
    return devices


def probe_compat(source: NvmlSource) -> dict[str, Any]:
    """/metrics/dcgm of two ticks a second apart, as the daemon would write it: which
    dcgm-exporter families this GPU gives, and GPU 0's line of each."""
    from gpu_exporter.web.dcgm_compat.render import Counters, render

    builder = SeriesBuilder()
    first = builder.build(Snapshot(time.time(), answered_tick(source)))
    time.sleep(1.0)
    second = builder.build(Snapshot(time.time(), answered_tick(source)))
    text = render(second, Counters.of(first), ("hostname", platform.node()))
    lines = text.decode().splitlines()
    families = [line.split(" ")[2] for line in lines if line.startswith("# TYPE ")]
    gpu0 = {}
    for line in lines:
        name, brace, _ = line.partition("{")
        if brace and 'gpu="0"' in line and name not in gpu0:
            gpu0[name] = line
    return {"families": families, "gpu0_lines": gpu0, "bytes": len(text)}


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def microbench(handle: Any, calls: int) -> dict[str, dict[str, float]]:
    """Tight loops of the hottest per-tick calls, for the fake's latency model."""
    batch = [(fid, scope) for _, fid, scope in PROBE_FIELDS[:13]]
    cases = {
        "nvmlDeviceGetPowerUsage": lambda: N.nvmlDeviceGetPowerUsage(handle),
        "nvmlDeviceGetUtilizationRates": lambda: N.nvmlDeviceGetUtilizationRates(handle),
        "nvmlDeviceGetClockInfo": lambda: N.nvmlDeviceGetClockInfo(handle, N.NVML_CLOCK_SM),
        "nvmlDeviceGetMemoryInfo_v2": lambda: N.nvmlDeviceGetMemoryInfo(handle, N.nvmlMemory_v2),
        "nvmlDeviceGetTemperature": lambda: N.nvmlDeviceGetTemperature(handle, 0),
        "nvmlDeviceGetTemperatureV": lambda: N.nvmlDeviceGetTemperatureV(handle, 0),
        "nvmlDeviceGetFieldValues_13": lambda: N.nvmlDeviceGetFieldValues(handle, batch),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda: N.nvmlDeviceGetCurrentClocksEventReasons(
            handle
        ),
        "nvmlDeviceGetPcieThroughput": lambda: N.nvmlDeviceGetPcieThroughput(handle, 0),
    }
    timings: dict[str, list[float]] = {}
    for name, fn in cases.items():
        repeat = max(5, calls // 10) if name == "nvmlDeviceGetPcieThroughput" else calls
        values = []
        for _ in range(repeat):
            started = time.perf_counter()
            try:
                fn()
            except Exception:  # unsupported here, or a wrapper this binding lacks
                break
            values.append(time.perf_counter() - started)
        timings[name] = values
    return latency_table(timings)


def run(args: argparse.Namespace, report: dict[str, Any]) -> dict[str, Any]:
    """Fills `report` as it goes, so a failure part-way still leaves what was measured."""
    started = time.monotonic()
    fake = None
    if args.simulate:
        from gpu_exporter import sim

        fake = sim.install(sim.load_scenario(args.simulate))
    errors = ErrorLog()
    source = NvmlSource(
        settings=NvmlConfig(device_deadline_seconds=args.deadline, processes=True),
        errors=errors,
        record_timings=True,
    )
    source.start()
    worker = WorkloadProcess(bool(args.simulate))
    simulated = SimulatedChild(fake, worker.process.pid) if fake is not None else None
    report.update(
        {
            "host": platform.node(),
            "python": platform.python_version(),
            "nvml_binding": _binding_version(),
            "node": source.node_info(),
            "simulated": bool(args.simulate),
            "phase_seconds": args.seconds,
            "workloads": {},
        }
    )
    try:
        worker.expect("ready")
        handle = N.nvmlDeviceGetHandleByIndex(0)
        report["devices"] = [{"index": s.index, "uuid": s.uuid, **s.info} for s in source.sample()]
        report["fields"] = probe_fields(handle)
        report["gpm_short_windows"] = probe_gpm(handle)
        report["memory_info"] = probe_memory(handle)
        report["mig"] = probe_mig(source)
        report["calls"] = probe_calls(handle)
        report["health"] = probe_health(N.nvmlDeviceGetCount())
        report["dcgm_compat"] = probe_compat(source)
        probe = ProcessProbe(handle, worker.process.pid)
        report["processes"] = {
            "child_pid": worker.process.pid,
            "euid": os.geteuid(),
            "calls": probe.which_calls(),
        }
        if simulated is not None:
            report["processes"]["simulated_child"] = simulated.describe()
        for name in args.workloads:
            if time.monotonic() - started > TIME_BUDGET_SECONDS:
                report["workloads"][name] = {"skipped": "time budget spent"}
                continue
            if simulated is not None:
                simulated.workload(name)
            report["workloads"][name] = _measure_phase(source, worker, name, args, probe)
        report["processes"].update(probe.summary(report))
        report["microbench"] = microbench(handle, args.calls)
        report["call_latency"] = latency_table(source.timings)
        report["unsupported"] = source.unsupported_by_device()
        report["errors"] = [_err(e) for e in errors.snapshot()]
    finally:
        worker.close()
        source.close()
    report["wall_seconds"] = time.monotonic() - started
    report["checks"] = acceptance_checks(report)
    return report


def _mean(report: dict[str, Any], workload: str, key: str) -> float | None:
    entry = report["workloads"].get(workload, {}).get("devices", {}).get("0", {}).get(key)
    if not entry:
        return None
    return entry.get("rate_per_second", entry["mean"]) if "_total" in key else entry["mean"]


def acceptance_checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What a correct exporter must show for each workload on a real GPU.

    Each check holds the measured value and whether it passed; None means not measured (a
    metric this GPU does not give, or a workload that was skipped).
    """
    checks = {
        "idle: SM activity below 0.05": (
            _mean(report, "idle", "gpu_sm_active_ratio"), lambda v: v < 0.05),
        "matmul: Tensor activity above 0.3": (
            _mean(report, "matmul_bf16", "gpu_tensor_active_ratio"), lambda v: v > 0.3),
        "matmul: utilization above 0.9": (
            _mean(report, "matmul_bf16", "gpu_utilization_ratio"), lambda v: v > 0.9),
        "d2d copy: DRAM activity above 0.5": (
            _mean(report, "copy_d2d", "gpu_dram_active_ratio"), lambda v: v > 0.5),
        "h2d copy: PCIe rx above 5 GB/s": (
            _mean(report, "copy_h2d", 'gpu_pcie_bytes_total{direction="rx"}'), lambda v: v > 5e9),
        "tiny kernels: SM activity below 0.3": (
            _mean(report, "tiny_kernels", "gpu_sm_active_ratio"), lambda v: v < 0.3),
        "matmul: energy rate close to power": (
            _ratio(report, "matmul_bf16"), lambda v: 0.8 < v < 1.2),
        "tiny kernels (sync): classified launch_bound": (
            _class(report, "tiny_kernels_sync"), lambda v: v == "launch_bound"),
        "matmul: classified tensor_bound or compute_bound": (
            _class(report, "matmul_bf16"), lambda v: v in ("tensor_bound", "compute_bound")),
        "d2d copy: classified memory_bound": (
            _class(report, "copy_d2d"), lambda v: v == "memory_bound"),
        "processes, matmul: the workload's PID listed with memory, every tick": (
            _child(report, "matmul_bf16", "listed_with_memory_ratio"), lambda v: v == 1.0),
        "processes, matmul: the workload's SM share above 0": (
            _child(report, "matmul_bf16", "sm_share_mean"), lambda v: v > 0.0),
        "processes, idle: the workload's SM share below 0.05": (
            _child(report, "idle", "sm_share_mean"), lambda v: v < 0.05),
    }  # fmt: skip
    return {
        name: {"value": value, "passed": None if value is None else bool(test(value))}
        for name, (value, test) in checks.items()
    }


def _child(report: dict[str, Any], workload: str, key: str) -> Any:
    """What the processes collector reported of the workload child in a workload."""
    phase = report["workloads"].get(workload, {})
    return phase.get("processes", {}).get("collector", {}).get(key)


def _class(report: dict[str, Any], workload: str) -> str | None:
    return report["workloads"].get(workload, {}).get("class", {}).get("0")


def _ratio(report: dict[str, Any], workload: str) -> float | None:
    energy = _mean(report, workload, "gpu_energy_joules_total")
    power = _mean(report, workload, "gpu_power_watts")
    return energy / power if energy and power else None


def _err(error: Any) -> dict[str, Any]:
    return {
        "source": error.source,
        "field": error.field,
        "error": error.error,
        "count": error.count,
    }


def _measure_phase(
    source: NvmlSource,
    worker: WorkloadProcess,
    name: str,
    args: argparse.Namespace,
    probe: ProcessProbe | None = None,
) -> dict[str, Any]:
    worker.start(name, args.seconds + args.warmup)
    time.sleep(args.warmup)
    samples: list[tuple[float, list[DeviceView]]] = []
    builder = SeriesBuilder()
    classifier = Classifier(window_seconds=default_window_seconds(args.interval))  # as the daemon's
    classes: dict[str, list[str]] = defaultdict(list)
    child: list[dict[str, Any] | None] = []
    if probe is not None:
        probe.begin_phase()
    phase_end = time.monotonic() + args.seconds
    while time.monotonic() < phase_end:
        tick = time.monotonic()
        sampled = source.sample()
        child.append(child_in(sampled, worker.process.pid))
        classified = classifier.process(sampled, tick)
        # Read as the daemon publishes them: through the one series model.
        devices = builder.build(Snapshot(time.time(), tuple(classified))).devices()
        samples.append((tick, devices))
        for device in devices:
            current = [r.labels[0][1] for r in device.readings if r.family == "gpu_bottleneck"
                       and r.value == 1.0]  # fmt: skip
            classes[str(device.index)] += current
        next_tick = tick + args.interval
        while (left := next_tick - time.monotonic()) > 0:
            if probe is not None:
                probe.poll()
            time.sleep(min(PROCESS_POLL_SECONDS, left))
    reply = worker.expect("done")
    summary: dict[str, Any] = {
        "samples": len(samples),
        "devices": summarise_samples(samples),
        "series_gpu0": raw_series(samples, 0),
        # The class the daemon would show, most of the phase (after its window filled).
        "class": {gpu: max(set(seen), key=seen.count) for gpu, seen in classes.items() if seen},
        "processes": {"collector": collector_view(child)},
    }
    if probe is not None:
        summary["processes"]["probe"] = probe.end_phase()
    if reply.startswith("error"):
        summary["workload_error"] = reply.removeprefix("error ")
    return summary


def _binding_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nvidia-ml-py")
    except PackageNotFoundError:
        return "unknown"


HEADLINE = (
    ("util", "gpu_utilization_ratio"),
    ("sm", "gpu_sm_active_ratio"),
    ("occ", "gpu_sm_occupancy_ratio"),
    ("tensor", "gpu_tensor_active_ratio"),
    ("dram", "gpu_dram_active_ratio"),
    ("W", "gpu_power_watts"),
    ("sm MHz", 'gpu_clock_hertz{clock="sm"}'),
    ("°C", 'gpu_temperature_celsius{sensor="gpu"}'),
)


def render_summary(report: dict[str, Any]) -> str:
    """A Markdown summary for BENCHMARKS.md."""
    if "node" not in report:
        return f"No measurement: {report.get('failure', 'unknown failure')}\n"
    lines = [
        f"Driver {report['node'].get('driver_version', '?')}, "
        f"NVML {report['node'].get('nvml_version', '?')}, binding {report['nvml_binding']}, "
        f"{'simulated' if report['simulated'] else 'real GPU'}; "
        f"{report['phase_seconds']:.0f} s per workload, "
        f"wall {report.get('wall_seconds', 0):.0f} s.",
        "",
        "| workload (GPU 0) | "
        + " | ".join(label for label, _ in HEADLINE)
        + " | PCIe tx/rx GB/s |",
        "|---" * (len(HEADLINE) + 2) + "|",
    ]
    for name, phase in report["workloads"].items():
        gpu0 = phase.get("devices", {}).get("0", {})
        cells = []
        for label, key in HEADLINE:
            entry = gpu0.get(key)
            if entry is None:
                cells.append("absent")
            elif label == "sm MHz":
                cells.append(f"{entry['mean'] / 1e6:.0f}")
            elif label in ("W", "°C"):
                cells.append(f"{entry['mean']:.0f}")
            else:
                cells.append(f"{entry['mean']:.2f}")
        pcie = [
            gpu0.get(f'gpu_pcie_bytes_total{{direction="{d}"}}', {}).get("rate_per_second")
            for d in ("tx", "rx")
        ]
        pcie_text = "/".join("?" if v is None else f"{v / 1e9:.1f}" for v in pcie)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {pcie_text} |")
    lines += ["", "| NVML call (source, per tick) | calls | p50 ms | p99 ms |", "|---|---|---|---|"]
    for key, entry in report.get("call_latency", {}).items():
        lines.append(
            f"| {key} | {entry['calls']} | {entry['p50_ms']:.3f} | {entry['p99_ms']:.3f} |"
        )
    lines += ["", "| NVML call (tight loop) | calls | p50 ms | p99 ms |", "|---|---|---|---|"]
    for key, entry in report.get("microbench", {}).items():
        lines.append(
            f"| {key} | {entry['calls']} | {entry['p50_ms']:.3f} | {entry['p99_ms']:.3f} |"
        )
    unanswered = [
        f"{name} ({entry['field_id']}: return {entry['return']})"
        for name, entry in report.get("fields", {}).items()
        if entry["return"] != 0
    ]
    if unanswered:
        lines += ["", "Fields not answered: " + ", ".join(unanswered)]
    gpm = report.get("gpm_short_windows", {})
    lines += ["", f"GPM supported: {gpm.get('supported')}; short windows: {gpm.get('windows')}"]
    for index, entry in report.get("mig", {}).items():
        listed = entry.get("nvml")
        found = "" if listed is None else f"; {len(listed)} MIG devices, daemon agrees: "
        lines.append(f"MIG on GPU {index}: mode {entry['mode']}{found}{entry.get('agree', '')}")
    lines += process_lines(report)
    lines += health_lines(report)
    lines += ["", "| check | value | passed |", "|---|---|---|"]
    for name, check in report.get("checks", {}).items():
        value = check["value"]
        value = "—" if value is None else value if isinstance(value, str) else f"{value:.3g}"
        lines.append(f"| {name} | {value} | {check['passed']} |")
    if "failure" in report:
        lines += ["", f"**Run failed part-way:** {report['failure']}"]
    return "\n".join(lines) + "\n"


def process_lines(report: dict[str, Any]) -> list[str]:
    """The per-process findings of `render_summary`."""
    found = report.get("processes")
    if not found:
        return []
    calls = ", ".join(f"{name} {entry['outcome']}" for name, entry in found["calls"].items())
    short = found.get("short_reads", {})
    lines = [
        "",
        f"Per process (workload child PID {found['child_pid']}, euid {found['euid']}): {calls}; "
        f"samples from {found.get('utilization_call')}, period {found.get('sample_period_ms')} ms "
        f"(the device's samples: {found.get('device_sample_period_ms')} ms); "
        f"reads every {short.get('poll_seconds')} s during matmul: {short.get('busy_not_found')} "
        f"of {short.get('busy_polls')} NOT_FOUND; NO_PERMISSION: {found.get('no_permission')}; "
        f"MPS clients: {found.get('mps_client_pids')}.",
        "",
        "| workload (child on GPU 0) | ticks listed | memory GiB | SM share (collector) "
        "| SM of its samples (probe) | probe reads NOT_FOUND |",
        "|---|---|---|---|---|---|",
    ]
    for name, phase in report["workloads"].items():
        seen = phase.get("processes", {})
        mine, probe = seen.get("collector", {}), seen.get("probe", {})
        memory = mine.get("memory_bytes_mean")
        lines.append(
            f"| {name} | {mine.get('listed')}/{mine.get('ticks')} "
            f"| {'—' if memory is None else f'{memory / 2**30:.2f}'} "
            f"| {_num(mine.get('sm_share_mean'))} | {_num(probe.get('child_sm_mean_of_samples'))} "
            f"| {_num(probe.get('not_found_ratio'))} |"
        )
    lines += ["", "| per-process call (probe) | calls | p50 ms | p99 ms |", "|---|---|---|---|"]
    for key, entry in found.get("latency", {}).items():
        lines.append(
            f"| {key} | {entry['calls']} | {entry['p50_ms']:.3f} | {entry['p99_ms']:.3f} |"
        )
    return lines


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="bench/results/gpu_validation.json", help="JSON path")
    parser.add_argument("--summary", help="Markdown summary path (default: OUTPUT with .md)")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per workload")
    parser.add_argument(
        "--warmup", type=float, default=2.0, help="seconds a workload runs before sampling"
    )
    parser.add_argument("--interval", type=float, default=1.0, help="sampling interval")
    parser.add_argument(
        "--deadline",
        type=float,
        help=f"per-device read deadline (default: the daemon's, {default_deadline(1.0):g} s "
        "or less for a short --interval)",
    )
    parser.add_argument("--calls", type=int, default=500, help="calls per microbenchmark")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--simulate", metavar="SCENARIO", help="use the fake NVML (no GPU)")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.interval <= 0 or args.warmup < 0:
        parser.error("--seconds and --interval must be positive, --warmup not negative")
    if args.deadline is None:
        args.deadline = default_deadline(args.interval)
    if (args.seconds + args.warmup) * len(args.workloads) > TIME_BUDGET_SECONDS:
        parser.error(
            f"{len(args.workloads)} workloads x {args.seconds + args.warmup:g} s exceed the "
            f"{TIME_BUDGET_SECONDS:.0f} s budget"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        return worker_main(simulate="--simulate-worker" in argv)
    args = parse_args(argv)
    report: dict[str, Any] = {}
    status = 0
    try:
        run(args, report)
    except Exception as exc:  # keep what was measured; say what broke
        report["failure"] = f"{type(exc).__name__}: {exc}"
        status = 1
    finally:
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    summary = render_summary(report)
    Path(args.summary or output.with_suffix(".md")).write_text(summary)
    sys.stdout.write(summary)
    return status


if __name__ == "__main__":
    sys.exit(main())

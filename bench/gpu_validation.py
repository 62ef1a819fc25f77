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
the instances the daemon reports.

The workloads run in a child process so that their Python loop does not disturb the timings.
Without a GPU (`--simulate SCENARIO`) the same code runs on the fake NVML with sleeping
workloads; that is how its non-GPU parts are tested. Imports stay within the NVML source (no
web stack), because the GPU machine has only PyTorch, nvidia-ml-py and prometheus-client.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import select
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pynvml as N

from gpu_exporter.collect.classify import Classifier
from gpu_exporter.collect.nvml.source import NvmlConfig, NvmlSource
from gpu_exporter.collect.settings import default_deadline, default_window_seconds
from gpu_exporter.collect.source import ErrorLog
from gpu_exporter.model.series import DeviceView, SeriesBuilder
from gpu_exporter.model.snapshot import Snapshot

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


def probe_compat(source: NvmlSource) -> dict[str, Any]:
    """/metrics/dcgm of two ticks a second apart, as the daemon would write it: which
    dcgm-exporter families this GPU gives, and GPU 0's line of each."""
    from gpu_exporter.web.dcgm_compat.render import Counters, render

    builder = SeriesBuilder()
    first = builder.build(Snapshot(time.time(), tuple(source.sample())))
    time.sleep(1.0)
    second = builder.build(Snapshot(time.time(), tuple(source.sample())))
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
    if args.simulate:
        from gpu_exporter import sim

        sim.install(sim.load_scenario(args.simulate))
    errors = ErrorLog()
    source = NvmlSource(
        settings=NvmlConfig(device_deadline_seconds=args.deadline),
        errors=errors,
        record_timings=True,
    )
    source.start()
    worker = WorkloadProcess(bool(args.simulate))
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
        report["dcgm_compat"] = probe_compat(source)
        for name in args.workloads:
            if time.monotonic() - started > TIME_BUDGET_SECONDS:
                report["workloads"][name] = {"skipped": "time budget spent"}
                continue
            report["workloads"][name] = _measure_phase(source, worker, name, args)
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
    }  # fmt: skip
    return {
        name: {"value": value, "passed": None if value is None else bool(test(value))}
        for name, (value, test) in checks.items()
    }


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
    source: NvmlSource, worker: WorkloadProcess, name: str, args: argparse.Namespace
) -> dict[str, Any]:
    worker.start(name, args.seconds + args.warmup)
    time.sleep(args.warmup)
    samples: list[tuple[float, list[DeviceView]]] = []
    builder = SeriesBuilder()
    classifier = Classifier(window_seconds=default_window_seconds(args.interval))  # as the daemon's
    classes: dict[str, list[str]] = defaultdict(list)
    phase_end = time.monotonic() + args.seconds
    while time.monotonic() < phase_end:
        tick = time.monotonic()
        classified = classifier.process(source.sample(), tick)
        # Read as the daemon publishes them: through the one series model.
        devices = builder.build(Snapshot(time.time(), tuple(classified))).devices()
        samples.append((tick, devices))
        for device in devices:
            current = [r.labels[0][1] for r in device.readings if r.family == "gpu_bottleneck"
                       and r.value == 1.0]  # fmt: skip
            classes[str(device.index)] += current
        time.sleep(max(0.0, args.interval - (time.monotonic() - tick)))
    reply = worker.expect("done")
    summary: dict[str, Any] = {
        "samples": len(samples),
        "devices": summarise_samples(samples),
        "series_gpu0": raw_series(samples, 0),
        # The class the daemon would show, most of the phase (after its window filled).
        "class": {gpu: max(set(seen), key=seen.count) for gpu, seen in classes.items() if seen},
    }
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
    lines += ["", "| check | value | passed |", "|---|---|---|"]
    for name, check in report.get("checks", {}).items():
        value = check["value"]
        value = "—" if value is None else value if isinstance(value, str) else f"{value:.3g}"
        lines.append(f"| {name} | {value} | {check['passed']} |")
    if "failure" in report:
        lines += ["", f"**Run failed part-way:** {report['failure']}"]
    return "\n".join(lines) + "\n"


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

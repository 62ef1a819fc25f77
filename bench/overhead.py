"""Overhead over bare NVML: the same pynvml reads as a daemon tick, done by a bare loop.

Both run in this process on the same fake NVML, scenario, latency model and manual clock
(1 s of scenario time per tick, ticks back to back). The bare loop makes the calls
`DeviceReader.read_tick` makes, in the same order and on the same schedule (identity on the
first tick, the slow-changing reads every 30 s, GPM from the second tick), with no error
handling beyond "stop calling what failed" and no output; `same_calls` reports whether the
fake saw exactly the same symbol counts from both. Measured per tick: wall time, process CPU
time, and the CPU time spent inside the fake itself (a second pass with `FakeCpuMeter`), so
that the daemon's own cost can be separated from the simulator's.

Variants of the daemon: the NVML source alone (`source.sample()`: worker threads, deadline,
choke point), a full tick without rules (snapshot and rendering), and a full tick with the
shipped rules.
"""

from __future__ import annotations

import concurrent.futures as futures
import gc
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pynvml as N

from bench import scenarios
from bench.inproc import FakeCpuMeter, ManualClock, build
from bench.stats import ratio, summarize
from gpu_exporter import sim
from gpu_exporter.sources import gpm
from gpu_exporter.sources.nvml_device import CLOCKS, FIELDS, field_value

STATIC_REFRESH_SECONDS = 30.0


@dataclass
class BareDevice:
    """Just enough state for the bare loop: a handle, what failed, the GPM buffers."""

    handle: Any
    failed: set[str] = field(default_factory=set)
    identity_done: bool = False
    static_at: float = float("-inf")
    nvlink_links: int = 0
    gpm_samples: list[Any] = field(default_factory=list)
    gpm_checked: bool = False

    def call(self, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        if key in self.failed:
            return None
        try:
            return fn(*args)
        except N.NVMLError:
            self.failed.add(key)
            return None


def _identity(d: BareDevice) -> None:
    h = d.handle
    d.call("uuid", N.nvmlDeviceGetUUID, h)
    d.call("pci", N.nvmlDeviceGetPciInfo, h)
    d.call("arch", N.nvmlDeviceGetArchitecture, h)
    d.call("cc", N.nvmlDeviceGetCudaComputeCapability, h)
    d.call("name", N.nvmlDeviceGetName, h)
    d.identity_done = True


def _static(d: BareDevice) -> None:
    h = d.handle
    for label, clock_type in CLOCKS:
        d.call(f"max_clock_{label}", N.nvmlDeviceGetMaxClockInfo, h, clock_type)
    d.call("max_gen", N.nvmlDeviceGetMaxPcieLinkGeneration, h)
    d.call("max_width", N.nvmlDeviceGetMaxPcieLinkWidth, h)
    d.call("supported_reasons", N.nvmlDeviceGetSupportedClocksEventReasons, h)
    d.call("ecc", N.nvmlDeviceGetEccMode, h)
    for cause in (
        N.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        N.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
    ):
        d.call(f"retired_{cause}", N.nvmlDeviceGetRetiredPages, h, cause)
    d.call("retired_pending", N.nvmlDeviceGetRetiredPagesPendingStatus, h)
    count = d.call("links", N.nvmlDeviceGetFieldValues, h, [N.NVML_FI_DEV_NVLINK_LINK_COUNT])
    ok = count is not None and count[0].nvmlReturn == N.NVML_SUCCESS
    d.nvlink_links = int(field_value(count[0])) if ok else 0
    for link in range(d.nvlink_links):
        d.call("nvlink_state", N.nvmlDeviceGetNvLinkState, h, link)


def _gpm(d: BareDevice, now: float) -> None:
    h = d.handle
    if not d.gpm_checked:
        d.gpm_checked = True
        support = d.call("gpm_support", N.nvmlGpmQueryDeviceSupport, h)
        if support is not None and support.isSupportedDevice:
            d.gpm_samples = [N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()]
            d.call("gpm_sample", N.nvmlGpmSampleGet, h, d.gpm_samples[0])
        return
    if not d.gpm_samples:
        return
    baseline, current = d.gpm_samples
    d.call("gpm_sample", N.nvmlGpmSampleGet, h, current)
    request = N.c_nvmlGpmMetricsGet_t()
    request.version = N.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(gpm.METRICS)
    request.sample1, request.sample2 = baseline, current
    for slot, metric in zip(request.metrics, gpm.METRICS, strict=False):
        slot.metricId = metric.metric_id
    d.call("gpm_metrics", N.nvmlGpmMetricsGet, request)
    d.gpm_samples = [current, baseline]


_FIELD_REQUEST = [(spec.field_id, spec.scope) for spec in FIELDS]


def bare_device_tick(d: BareDevice, now: float) -> None:
    """The reads of one `DeviceReader.read_tick`, without the daemon around them."""
    h = d.handle
    if not d.identity_done:
        _identity(d)
    if now - d.static_at >= STATIC_REFRESH_SECONDS:
        _static(d)
        d.static_at = now
    d.call("util", N.nvmlDeviceGetUtilizationRates, h)
    d.call("memory", N.nvmlDeviceGetMemoryInfo, h, N.nvmlMemory_v2)
    d.call("power", N.nvmlDeviceGetPowerUsage, h)
    d.call("limit", N.nvmlDeviceGetEnforcedPowerLimit, h)
    d.call("temp", N.nvmlDeviceGetTemperatureV, h, N.NVML_TEMPERATURE_GPU)
    for label, clock_type in CLOCKS:
        d.call(f"clock_{label}", N.nvmlDeviceGetClockInfo, h, clock_type)
    d.call("reasons", N.nvmlDeviceGetCurrentClocksEventReasons, h)
    d.call("pstate", N.nvmlDeviceGetPerformanceState, h)
    d.call("gen", N.nvmlDeviceGetCurrPcieLinkGeneration, h)
    d.call("width", N.nvmlDeviceGetCurrPcieLinkWidth, h)
    request = _FIELD_REQUEST if d.nvlink_links else _non_nvlink_fields()
    d.call("fields", N.nvmlDeviceGetFieldValues, h, request)
    _gpm(d, now)


def _non_nvlink_fields() -> list[tuple[int, int]]:
    return [(s.field_id, s.scope) for s in FIELDS if not s.needs_nvlink]


class BareLoop:
    """All devices, sequentially on this thread or concurrently on one thread per device."""

    def __init__(self, clock: ManualClock, concurrent: bool) -> None:
        N.nvmlInit()
        self.clock = clock
        count = N.nvmlDeviceGetCount()
        self.devices = [BareDevice(N.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
        for device in self.devices:  # the daemon keys devices by UUID at start
            N.nvmlDeviceGetUUID(device.handle)
        self._pool = futures.ThreadPoolExecutor(count) if concurrent else None

    def tick(self, interval: float) -> None:
        self.clock.advance(interval)
        now = self.clock()
        if self._pool is None:
            for device in self.devices:
                bare_device_tick(device, now)
            return
        jobs = [self._pool.submit(bare_device_tick, d, now) for d in self.devices]
        for job in jobs:
            job.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        for device in self.devices:
            for sample in device.gpm_samples:
                N.nvmlGpmSampleFree(sample)
        N.nvmlShutdown()


@dataclass(frozen=True)
class OverheadSettings:
    ticks: int = 120
    warmup_ticks: int = 3
    interval: float = 1.0
    devices: int = 8
    latency_models: tuple[str, ...] = ("mixed", "nvml-like")

    @classmethod
    def quick(cls) -> OverheadSettings:
        return cls(ticks=8, warmup_ticks=2, latency_models=("mixed",))


def scenario_for(model: str, devices: int) -> dict[str, Any]:
    """`mixed` keeps the built-in latency model (only the 20 ms PCIe call costs time, and the
    daemon does not make it while byte counters exist); `nvml-like` adds 0.36 ms per call."""
    latency = scenarios.NVML_LIKE_LATENCY if model == "nvml-like" else None
    return scenarios.generate(devices, name=f"bench-overhead-{model}", latency=latency)


def _timed(tick: Callable[[], None], ticks: int) -> dict[str, Any]:
    walls = []
    gc.collect()
    cpu0 = time.process_time()
    for _ in range(ticks):
        started = time.perf_counter()
        tick()
        walls.append(time.perf_counter() - started)
    cpu = time.process_time() - cpu0
    return {"wall": summarize(walls), "cpu_seconds_per_tick": cpu / ticks}


Variant = Callable[[Mapping[str, Any]], tuple[Callable[[], None], Callable[[], None], Any]]


def _bare(concurrent: bool) -> Variant:
    def make(scenario: Mapping[str, Any]) -> tuple[Callable[[], None], Callable[[], None], Any]:
        clock = ManualClock()
        fake = sim.install(scenario, clock=clock)
        loop = BareLoop(clock, concurrent)

        def close() -> None:
            loop.close()
            sim.uninstall()

        return (lambda: loop.tick(1.0)), close, fake

    return make


def _daemon(kind: str) -> Variant:
    def make(scenario: Mapping[str, Any]) -> tuple[Callable[[], None], Callable[[], None], Any]:
        pipeline = build(scenario, rules=None if kind == "tick_shipped_rules" else [])
        if kind == "source_only":

            def tick() -> None:
                pipeline.clock.advance(pipeline.interval)
                pipeline.source.sample()

            return tick, pipeline.close, pipeline.fake
        return pipeline.tick, pipeline.close, pipeline.fake

    return make


VARIANTS: dict[str, Variant] = {
    "bare_sequential": _bare(concurrent=False),
    "bare_concurrent": _bare(concurrent=True),
    "source_only": _daemon("source_only"),
    "tick_no_rules": _daemon("tick_no_rules"),
    "tick_shipped_rules": _daemon("tick_shipped_rules"),
}


def measure_variant(
    name: str, scenario: Mapping[str, Any], settings: OverheadSettings
) -> dict[str, Any]:
    """Two passes: plain (wall, CPU), then with the fake's CPU metered."""
    tick, close, fake = VARIANTS[name](scenario)
    try:
        for _ in range(settings.warmup_ticks):
            tick()
        before = Counter(fake.call_counts)
        result = _timed(tick, settings.ticks)
        calls = Counter(fake.call_counts) - before
    finally:
        close()
    tick, close, fake = VARIANTS[name](scenario)
    try:
        meter = FakeCpuMeter(fake)
        for _ in range(settings.warmup_ticks):
            tick()
        meter.reset()
        metered = _timed(tick, settings.ticks)
        result["fake_cpu_seconds_per_tick"] = meter.seconds / settings.ticks
        result["fake_calls_per_tick"] = meter.calls / settings.ticks
        result["metered_cpu_seconds_per_tick"] = metered["cpu_seconds_per_tick"]
    finally:
        close()
    result["cpu_net_of_fake_per_tick"] = (
        result["cpu_seconds_per_tick"] - result["fake_cpu_seconds_per_tick"]
    )
    result["calls"] = dict(sorted(calls.items()))  # during the measured ticks
    return result


def same_calls(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, Any]:
    """Whether two call-count maps match, and where they differ."""
    keys = sorted(set(a) | set(b))
    differ = {k: [a.get(k, 0), b.get(k, 0)] for k in keys if a.get(k, 0) != b.get(k, 0)}
    return {"same": not differ, "differences": differ}


def xid_polling_cpu(scenario: Mapping[str, Any], seconds: float) -> float:
    """CPU seconds per second the fake spends polling in `nvmlEventSetWait` (real NVML
    blocks in the kernel instead) while the daemon's XID thread waits for events."""
    from gpu_exporter.sources.base import ErrorLog
    from gpu_exporter.sources.xid import XidCounts, XidWatcher

    fake = sim.install(scenario)
    meter = FakeCpuMeter(fake)
    N.nvmlInit()
    try:
        handles = {
            N.nvmlDeviceGetUUID(h): h
            for h in (N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount()))
        }
        watcher = XidWatcher(handles, XidCounts(), ErrorLog())
        watcher.start()
        time.sleep(0.5)
        meter.reset()
        time.sleep(seconds)
        spent = meter.seconds
        watcher.stop(join=True)
    finally:
        N.nvmlShutdown()
        sim.uninstall()
    return spent / seconds


def ratios(variants: Mapping[str, Mapping[str, Any]]) -> dict[str, float | None]:
    """Daemon variants against the bare loops: wall vs the concurrent one, CPU vs the
    sequential one (cheaper in CPU), and the daemon's own CPU per tick (the difference)."""
    bare = variants["bare_concurrent"]
    bare_seq = variants["bare_sequential"]
    out: dict[str, float | None] = {}
    for name in ("source_only", "tick_no_rules", "tick_shipped_rules"):
        v = variants[name]
        out[f"{name}_wall_vs_bare_concurrent"] = ratio(v["wall"]["mean"], bare["wall"]["mean"])
        out[f"{name}_cpu_vs_bare"] = ratio(
            v["cpu_seconds_per_tick"], bare_seq["cpu_seconds_per_tick"]
        )
        # Net of the fake, the bare loop costs a fraction of a millisecond, so a ratio of
        # the two would be noise; the daemon's own cost is reported as a difference instead.
        out[f"{name}_own_cpu_seconds_per_tick"] = (
            v["cpu_seconds_per_tick"] - bare_seq["cpu_seconds_per_tick"]
        )
    return out


def run(settings: OverheadSettings) -> dict[str, Any]:
    models: dict[str, Any] = {}
    for model in settings.latency_models:
        scenario = scenario_for(model, settings.devices)
        variants = {name: measure_variant(name, scenario, settings) for name in VARIANTS}
        models[model] = {
            "variants": variants,
            "ratios": ratios(variants),
            "same_calls": same_calls(
                variants["bare_sequential"]["calls"], variants["source_only"]["calls"]
            ),
        }
    polling = xid_polling_cpu(scenario_for("mixed", settings.devices), 5.0)
    return {
        "settings": settings.__dict__ | {"latency_models": list(settings.latency_models)},
        "models": models,
        "fake_xid_polling_cpu_seconds_per_second": polling,
    }

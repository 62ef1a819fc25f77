"""Overhead over bare NVML: the same pynvml reads as a daemon tick, done by a bare loop.

Both run in this process on the same fake NVML, scenario, latency model and manual clock
(1 s of scenario time per tick, ticks back to back). The bare loop runs the daemon's own
collectors (`gpu_exporter/collect/nvml/collectors/`, as `collectors.enabled` picks them for the
daemon's settings) on the same schedule (identity on the first tick, the slow-changing reads
every `slow_refresh_seconds`, GPM from the second tick), so it makes exactly the calls a
daemon tick makes without mirroring them: a collector's new call is in both. What it leaves out
is the daemon around the calls: its choke point is bare ("stop calling what failed", no error
accounting, quarantine or tick ownership), no guard, no worker threads or deadline, no
snapshot. The collectors still build their readings, which are dropped. `same_calls` reports
whether the fake saw exactly the same symbol counts from both. Measured per tick: wall time,
process CPU time, and the CPU time spent inside the fake itself (a second pass with
`FakeCpuMeter`), so that the daemon's own cost can be separated from the simulator's.

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
from dataclasses import dataclass, replace
from typing import Any

import pynvml as N

from bench import scenarios
from bench.inproc import FakeCpuMeter, ManualClock, build
from bench.stats import ratio, summarize
from gpu_exporter import sim
from gpu_exporter.collect.nvml import collectors
from gpu_exporter.collect.nvml.collectors import Collector
from gpu_exporter.collect.nvml.device import DeviceReader, Phase
from gpu_exporter.collect.nvml.xid import XidCounts
from gpu_exporter.collect.settings import NvmlConfig
from gpu_exporter.collect.source import ErrorLog
from gpu_exporter.config.load import load_config
from gpu_exporter.model.snapshot import CollectorStatus, Reading

# The daemon's settings, as `inproc.build` makes them: the XID thread is off there (it waits in
# real time), so its collector is too.
SETTINGS: NvmlConfig = load_config(None, {"nvml.xid_events": False}, environ={}).nvml


class BareDevice(DeviceReader):
    """A GPU's collectors behind a bare choke point: a failed call is simply not made again."""

    def call(self, key: str, fn: Callable[..., Any] | None, *args: Any) -> Any:
        if key in self.unsupported:
            return None
        if fn is None:
            self.unsupported.add(key)
            return None
        try:
            return fn(*args)
        except N.NVMLError:
            self.unsupported.add(key)
            return None


_OK = CollectorStatus("bare", True, 0.0)  # the runner must say how a phase went; nobody reads it


def bare_device(index: int, handle: Any, clock: ManualClock) -> BareDevice:
    """The daemon's collectors for one GPU (topology aside: it makes no per-tick calls)."""
    return BareDevice(
        index=index,
        handle=handle,
        errors=ErrorLog(),
        xid_counts=XidCounts(),
        settings=SETTINGS,
        collectors=collectors.build(SETTINGS, topology=False),
        clock=clock,
    )


def _plain(d: BareDevice) -> Callable[[Collector, Phase], tuple[list[Reading], CollectorStatus]]:
    """Runs a collector's phase as it is: no guard, no timing, no check of its families."""
    return lambda collector, phase: (phase(d), _OK)


def bare_device_tick(d: BareDevice, now: float) -> None:
    """The reads of one `DeviceReader.read_tick`, without the daemon around them."""
    d.collect(now, _plain(d))


class BareLoop:
    """All devices, sequentially on this thread or concurrently on one thread per device."""

    def __init__(self, clock: ManualClock, concurrent: bool) -> None:
        N.nvmlInit()
        self.clock = clock
        count = N.nvmlDeviceGetCount()
        handles = [N.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        for handle in handles:  # the daemon keys devices by UUID at start
            N.nvmlDeviceGetUUID(handle)
        self.devices = [bare_device(i, handle, clock) for i, handle in enumerate(handles)]
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
            device.close()  # frees the GPM samples
        N.nvmlShutdown()


@dataclass(frozen=True)
class OverheadSettings:
    ticks: int = 120
    warmup_ticks: int = 3
    interval: float = 1.0
    devices: int = 8
    latency_models: tuple[str, ...] = ("mixed", "nvml-like")
    pairs: int = 9  # paired_read_path: odd, so the median is a pair's
    ticks_per_pair: int = 40

    @classmethod
    def quick(cls) -> OverheadSettings:
        return cls(ticks=8, warmup_ticks=2, latency_models=("mixed",), pairs=3, ticks_per_pair=4)


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
    from gpu_exporter.collect.nvml.xid import XidWatcher

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


def paired_read_path(scenario: Mapping[str, Any], settings: OverheadSettings) -> dict[str, Any]:
    """The read path's ratio again, as pairs measured back to back (the bare loop, then the
    NVML source, `settings.pairs` times): this machine's speed drifts by tens of percent over
    a minute, which one block of each moves with; the median of the pairs' ratios does not."""
    each = replace(settings, ticks=settings.ticks_per_pair)
    cpu: dict[str, list[float]] = {"bare_sequential": [], "source_only": []}
    for _ in range(settings.pairs):
        for name in cpu:
            tick, close, _fake = VARIANTS[name](scenario)
            try:
                for _ in range(each.warmup_ticks):
                    tick()
                cpu[name].append(_timed(tick, each.ticks)["cpu_seconds_per_tick"])
            finally:
                close()
    pairs = [ratio(s, b) for s, b in zip(cpu["source_only"], cpu["bare_sequential"], strict=True)]
    known = sorted(r for r in pairs if r is not None)
    return {
        "ticks_per_pair": each.ticks,
        "cpu_seconds_per_tick": cpu,
        "ratios": pairs,
        "median": known[len(known) // 2] if known else None,
    }


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
            "read_path_paired": paired_read_path(scenario, settings),
        }
    polling = xid_polling_cpu(scenario_for("mixed", settings.devices), 5.0)
    return {
        "settings": settings.__dict__ | {"latency_models": list(settings.latency_models)},
        "models": models,
        "fake_xid_polling_cpu_seconds_per_second": polling,
    }

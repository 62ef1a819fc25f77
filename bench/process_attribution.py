"""Per-process attribution: what it adds to a tick, and to the daemon's memory, at 8 GPUs and
at 64 GPUs with 10 processes on every GPU.

The scenarios are `scenarios.generate_processes`: mixed's GPUs with pods and processes on each
(GPUs time-sliced by two to five pods, an MPS GPU with the control daemon and three client
pods, exclusive pods, a container that holds no GPU, a host process, idle processes): 80
processes at 8 GPUs, 640 at 64. Both sides run the node as `serve --simulate` does
(`bench.inproc.build(node=True)`): the fake kubelet and pod attribution, as in a DaemonSet, and
the shipped rules. "off" gives `kubernetes.processes.enabled: false`, the default users deploy;
"on" reads NVML's process lists and per-process samples on every GPU, the simulated node's
/proc and its CRI runtime, and publishes the per-pod use. Both run in this process on the
manual clock with 16 minutes of rule history, in alternating rounds so that drift on the
machine hits both alike.

The container runtime is asked on a thread of its own every `refresh_seconds` (10 s by default)
of real time, which ticks run back to back never reach: one refresh is measured apart (CPU on
the calling thread, and of the whole process with the fake runtime answering in it) and added
per tick at the default cadence. Where the added CPU goes is measured on one more pipeline of
each side, with CPU clocks around the parts (`breakdown`). Resident memory comes from the real
daemon (`gpu-exporter serve --simulate`), on and off, after a few ticks.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import scenarios
from bench.inproc import FakeCpuMeter, Pipeline, build
from bench.procs import OUR_TICK_FAMILY, OURS, free_port, our_command, running
from bench.scaling import measure_ticks
from bench.stats import ratio, summarize
from gpu_exporter.collect.k8s.pod_use import PodUse
from gpu_exporter.collect.k8s.processes import ProcessOwners
from gpu_exporter.collect.nvml.collectors.processes import Processes

DEVICES = {"8gpu": 8, "64gpu": 64}
PROCESSES_PER_GPU = 10
# The fake's per-process entry points (the running-process lists and the utilization samples).
PER_PROCESS_CALLS = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetProcessesUtilizationInfo",
    "nvmlDeviceGetProcessUtilization",
)
PER_POD_PREFIXES = ("gpu_pod_", "gpu_unattributed_", "gpu_exporter_process_attribution_")
OFF_ENV = {"GPU_EXPORTER_KUBERNETES__PROCESSES__ENABLED": "false"}


@dataclass(frozen=True)
class ProcessSettings:
    rounds: int = 4
    ticks_per_round: int = 20
    history_seconds: float = 960.0  # as the scaling benchmark's steady phase
    breakdown_ticks: int = 10
    refreshes: int = 20
    rss_ticks: int = 5  # daemon ticks before RSS is read; 0: no daemon
    configs: tuple[str, ...] = tuple(DEVICES)

    @classmethod
    def quick(cls) -> ProcessSettings:
        return cls(
            rounds=1,
            ticks_per_round=3,
            history_seconds=60.0,
            breakdown_ticks=2,
            refreshes=3,
            rss_ticks=2,
            configs=("8gpu",),
        )


def scenario(name: str) -> dict[str, Any]:
    return scenarios.generate_processes(DEVICES[name], name=f"bench-{name}-processes")


def _steady(on: bool, spec: dict[str, Any], history_seconds: float) -> Pipeline:
    """A pipeline of one side, two ticks in, with `history_seconds` of rule history and the
    first evaluation over it done."""
    pipeline = build(spec, node=True, processes=on)
    try:
        pipeline.tick()
        pipeline.tick()
        pipeline.prefill(history_seconds)
        pipeline.tick()
    except BaseException:
        pipeline.close()
        raise
    return pipeline


def _tick_cpu(on: bool, spec: dict[str, Any], settings: ProcessSettings) -> float:
    pipeline = _steady(on, spec, settings.history_seconds)
    try:
        cpu: float = measure_ticks(pipeline, settings.ticks_per_round)["cpu_seconds_per_tick"]
        return cpu
    finally:
        pipeline.close()


# -- where the CPU goes --------------------------------------------------------------------------


class Clocks:
    """CPU seconds by part, from wrappers around methods (`wrapped`): the calling thread's CPU
    clock, or the whole process's for a part that waits on threads of its own."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    def wrap(
        self, function: Callable[..., Any], part: str, clock: Callable[[], float]
    ) -> Callable[..., Any]:
        def measured(*args: Any, **kwargs: Any) -> Any:
            started = clock()
            try:
                return function(*args, **kwargs)
            finally:
                spent = clock() - started
                with self._lock:
                    self.seconds[part] = self.seconds.get(part, 0.0) + spent

        return measured

    def reset(self) -> None:
        with self._lock:
            self.seconds.clear()


# (class, method, part): the per-process parts a tick runs; each method's own thread's CPU.
_PARTS = (
    (Processes, "read", "processes collector"),
    (PodUse, "process", "per-pod processor"),
    (ProcessOwners, "owners", "process owners"),
    (ProcessOwners, "_cgroup_owner", "/proc reads"),
)


@contextmanager
def _parts_measured(clocks: Clocks) -> Iterator[None]:
    """The per-process classes' methods measured while inside (set before the pipeline is
    built: the assembly binds the per-pod processor when it wires it)."""
    saved = [(cls, name, cls.__dict__[name]) for cls, name, _ in _PARTS]
    try:
        for cls, name, part in _PARTS:
            setattr(cls, name, clocks.wrap(getattr(cls, name), part, time.thread_time))
        yield
    finally:
        for cls, name, original in saved:
            setattr(cls, name, original)


def _thread_cpu(name: str) -> float:
    """CPU seconds of the live threads called `name` (0 when there is none)."""
    total = 0.0
    for thread in threading.enumerate():
        if thread.name == name and thread.ident is not None:
            try:
                total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
            except (OSError, ProcessLookupError):
                continue
    return total


def breakdown(on: bool, spec: dict[str, Any], settings: ProcessSettings) -> dict[str, Any]:
    """CPU per tick of one side by part: the NVML reads (the source, its worker threads
    included), of which inside the fake NVML and inside its per-process calls, the
    per-process collector, the per-pod processor and in it the PID -> container lookups
    and their /proc reads, and the simulated node's own thread; then the runtime's refresh
    (on only), and what the tick publishes."""
    clocks = Clocks()
    with _parts_measured(clocks):
        return _breakdown(on, spec, settings, clocks)


def _breakdown(
    on: bool, spec: dict[str, Any], settings: ProcessSettings, clocks: Clocks
) -> dict[str, Any]:
    pipeline = _steady(on, spec, settings.history_seconds)
    try:
        source = pipeline.source
        source.sample = clocks.wrap(source.sample, "NVML reads", time.process_time)  # type: ignore[method-assign]
        fake_all = FakeCpuMeter(pipeline.fake)
        fake_processes = FakeCpuMeter(pipeline.fake, PER_PROCESS_CALLS)
        ticks = settings.breakdown_ticks
        pipeline.tick()  # the wrappers in place before the window starts
        clocks.reset()
        fake_all.reset()
        fake_processes.reset()
        node0 = _thread_cpu("sim-node")
        measured = measure_ticks(pipeline, ticks)
        node_cpu = _thread_cpu("sim-node") - node0
        per_tick = {part: seconds / ticks for part, seconds in clocks.seconds.items()}
        # The per-process calls are timed inside the fake on top of the wrapper around all.
        per_tick["inside the fake NVML"] = fake_all.seconds / ticks
        per_tick["inside its per-process calls"] = fake_processes.seconds / ticks
        per_tick["simulated node's thread"] = node_cpu / ticks
        out: dict[str, Any] = {
            "tick_cpu": measured["cpu_seconds_per_tick"],
            "parts_cpu_per_tick": per_tick,
            **published(pipeline),
        }
        if on:
            out["runtime_refresh"] = runtime_refresh(pipeline, settings.refreshes)
        return out
    finally:
        pipeline.close()


def runtime_refresh(pipeline: Pipeline, refreshes: int) -> dict[str, Any]:
    """CPU of one refresh of the container runtime's map (ListContainers and ListPodSandbox
    over gRPC): on the calling thread (the daemon's refresh thread), and of the whole process
    (the fake runtime's server answering in it), with the runtime's refresh interval."""
    assert pipeline.assembly is not None and pipeline.assembly.processes is not None
    runtime = pipeline.assembly.processes.runtime
    caller, process, ok = [], [], 0
    for _ in range(refreshes):
        thread0, process0 = time.thread_time(), time.process_time()
        ok += runtime.refresh()
        caller.append(time.thread_time() - thread0)
        process.append(time.process_time() - process0)
    return {
        "refreshes": refreshes,
        "answered": ok,
        "caller_cpu": summarize(caller),
        "process_cpu": summarize(process),
        "refresh_seconds": runtime.refresh_seconds,
        "per_tick_cpu": summarize(process)["mean"] * pipeline.interval / runtime.refresh_seconds,
    }


def published(pipeline: Pipeline) -> dict[str, Any]:
    """What the last tick published: its series (the per-pod ones apart), text exposition
    bytes, and the processes the NVML lists named, mapped to pods, to hosts or to nobody."""
    series_set = pipeline.sampler.series
    snapshot = pipeline.sampler.latest
    assert series_set is not None and snapshot is not None
    per_pod = sum(1 for s in series_set if s.family.startswith(PER_POD_PREFIXES))
    rendered = pipeline.sampler.rendered
    listed = 0
    for device in snapshot.devices:
        groups = [device.processes, *(i.processes for i in device.instances)]
        listed += sum(len(group) for group in groups if group)
    in_pods = sum(s.value for s in series_set.of("gpu_pod_processes"))
    unattributed: dict[str, float] = {}
    for s in series_set.of("gpu_unattributed_processes"):
        reason = dict(s.labels).get("reason", "")
        unattributed[reason] = unattributed.get(reason, 0.0) + s.value
    return {
        "series": sum(1 for _ in series_set),
        "pod_series": per_pod,  # gpu_pod_info (pod attribution) and what this adds
        "text_bytes": len(rendered.body(False, False)) if rendered is not None else 0,
        "processes_listed": listed,
        "processes_in_pods": in_pods,
        "processes_unattributed": unattributed,
    }


# -- the real daemon's memory --------------------------------------------------------------------


def daemon_memory(name: str, settings: ProcessSettings, workdir: Path) -> dict[str, Any]:
    """RSS of `gpu-exporter serve --simulate` on the scenario, with per-process attribution off
    (given, as a user who leaves it off) and on (as serve --simulate turns it on for a node
    with processes), after `rss_ticks` ticks; and whether the per-pod families are there."""
    path = scenarios.write_yaml(scenario(name), workdir / f"{name}-processes.yaml")
    out: dict[str, Any] = {"ticks": settings.rss_ticks}
    for side, env in (("off", OFF_ENV), ("on", None)):
        port = free_port()
        argv = our_command(path, port, 1.0)
        with running(OURS, argv, port, workdir, OUR_TICK_FAMILY, env) as target:
            target.wait_ready(timeout=120.0, ticks=settings.rss_ticks)
            memory = target.memory()
            text = target.metrics_text()
        out[side] = {
            "rss_mib": memory.rss_mib,
            "per_pod_families": "gpu_pod_processes{" in text,
        }
    out["on_minus_off_mib"] = out["on"]["rss_mib"] - out["off"]["rss_mib"]
    return out


# -- the benchmark -------------------------------------------------------------------------------


def attribution_complete(data: dict[str, Any]) -> bool:
    """Every process NVML listed is in a pod or a host process: none unknown."""
    unattributed = data.get("processes_unattributed", {})
    host = unattributed.get("host", 0.0)
    return (
        data.get("processes_listed", 0) > 0
        and not unattributed.get("unknown", 0.0)
        and data["processes_in_pods"] + host == data["processes_listed"]
    )


def run(settings: ProcessSettings, workdir: Path) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    for name in settings.configs:
        spec = scenario(name)
        devices = DEVICES[name]
        off: list[float] = []
        on: list[float] = []
        for _ in range(settings.rounds):
            off.append(_tick_cpu(False, spec, settings))
            on.append(_tick_cpu(True, spec, settings))
            gc.collect()
        off_mean, on_mean = sum(off) / len(off), sum(on) / len(on)
        parts_off = breakdown(False, spec, settings)
        parts_on = breakdown(True, spec, settings)
        refresh = parts_on["runtime_refresh"]["per_tick_cpu"]
        fake_off = parts_off["parts_cpu_per_tick"]["inside the fake NVML"]
        fake_on = parts_on["parts_cpu_per_tick"]["inside the fake NVML"]
        results[name] = {
            "gpus": devices,
            "processes": devices * PROCESSES_PER_GPU,
            "tick_cpu_off": off,
            "tick_cpu_on": on,
            "tick_cpu_off_mean": off_mean,
            "tick_cpu_on_mean": on_mean,
            "on_vs_off": ratio(on_mean, off_mean),
            "added_cpu_per_tick": on_mean - off_mean,
            "added_cpu_per_gpu": (on_mean - off_mean) / devices,
            "on_with_refresh_vs_off": ratio(on_mean + refresh, off_mean),
            # The fake NVML's own CPU taken out of both sides (measured in `breakdown`).
            "net_of_fake_on_vs_off": ratio(on_mean - fake_on, off_mean - fake_off),
            "breakdown_off": parts_off,
            "breakdown_on": parts_on,
            "attribution_complete": attribution_complete(parts_on),
        }
        if settings.rss_ticks:
            results[name]["memory"] = daemon_memory(name, settings, workdir)
    return {"settings": settings.__dict__ | {"configs": list(settings.configs)}, "configs": results}

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
per tick at the default cadence. Where the added CPU goes is measured on the same pipelines
after their unmetered ticks, with CPU clocks around the parts (`one_round`; medians over the
rounds in `breakdown`). Resident memory comes from the real daemon (`gpu-exporter serve
--simulate`, its fake NVML, kubelet, /proc and runtime in its process), on and off, after a few
ticks.
"""

from __future__ import annotations

import gc
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import promtext, scenarios
from bench.inproc import FakeCpuMeter, Pipeline, build
from bench.procs import (
    OUR_FULL_TICK_FAMILY,
    OUR_TICK_FAMILY,
    OURS,
    free_port,
    our_command,
    running,
)
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
PUBLISHED = (
    "series",
    "pod_series",
    "text_bytes",
    "processes_listed",
    "processes_in_pods",
    "processes_unattributed",
)


@dataclass(frozen=True)
class ProcessSettings:
    rounds: int = 5
    ticks_per_round: int = 20
    history_seconds: float = 960.0  # as the scaling benchmark's steady phase
    breakdown_ticks: int = 10  # metered ticks after each round's unmetered ones
    refreshes: int = 5  # of the runtime's map, per round
    rss_ticks: int = 5  # daemon ticks before RSS is read; 0: no daemon
    configs: tuple[str, ...] = tuple(DEVICES)

    @classmethod
    def quick(cls) -> ProcessSettings:
        return cls(
            rounds=1,
            ticks_per_round=3,
            history_seconds=60.0,
            breakdown_ticks=2,
            refreshes=2,
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


# -- where the CPU goes --------------------------------------------------------------------------


class Clocks:
    """CPU seconds by part, from wrappers around methods (`wrap`), counted only while `active`:
    the calling thread's CPU clock, or the whole process's for a part that waits on threads of
    its own. An inactive wrapper costs one more Python call."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.active = False
        self._lock = threading.Lock()

    def wrap(
        self, function: Callable[..., Any], part: str, clock: Callable[[], float]
    ) -> Callable[..., Any]:
        def measured(*args: Any, **kwargs: Any) -> Any:
            if not self.active:
                return function(*args, **kwargs)
            started = clock()
            try:
                return function(*args, **kwargs)
            finally:
                spent = clock() - started
                with self._lock:
                    self.seconds[part] = self.seconds.get(part, 0.0) + spent

        return measured

    def start(self) -> None:
        with self._lock:
            self.seconds.clear()
            self.active = True

    def stop(self) -> dict[str, float]:
        with self._lock:
            self.active = False
            return dict(self.seconds)


# (class, method, part): the per-process parts a tick runs; each method's own thread's CPU.
_PARTS = (
    (Processes, "read", "processes collector"),
    (PodUse, "process", "per-pod processor"),
    (ProcessOwners, "owners", "process owners"),
    (ProcessOwners, "_cgroup_owner", "/proc reads"),
)


@contextmanager
def parts_measured(clocks: Clocks) -> Iterator[None]:
    """The per-process classes' methods wrapped while inside (from before the pipelines are
    built: the assembly binds the per-pod processor when it wires it), counting when
    `clocks.active`."""
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


def one_round(
    on: bool, spec: dict[str, Any], settings: ProcessSettings, clocks: Clocks
) -> dict[str, Any]:
    """One side's pipeline: CPU per tick over `ticks_per_round` ticks as the daemon runs them;
    then, with the meters in place, `breakdown_ticks` more by part (`parts_cpu_per_tick`: the
    NVML reads, the source's worker threads included, of which inside the fake NVML and inside
    its per-process calls; the per-process collector; the per-pod processor and in it the PID
    -> container lookups and their /proc reads; the simulated node's own thread); what the
    last tick published; and on the "on" side the runtime's refresh."""
    pipeline = _steady(on, spec, settings.history_seconds)
    try:
        cpu = measure_ticks(pipeline, settings.ticks_per_round)["cpu_seconds_per_tick"]
        source = pipeline.source
        source.sample = clocks.wrap(source.sample, "NVML reads", time.process_time)  # type: ignore[method-assign]
        fake_all = FakeCpuMeter(pipeline.fake)
        fake_processes = FakeCpuMeter(pipeline.fake, PER_PROCESS_CALLS)  # inside fake_all's
        ticks = settings.breakdown_ticks
        fake_all.reset()
        fake_processes.reset()
        node0 = _thread_cpu("sim-node")
        clocks.start()
        try:
            metered = measure_ticks(pipeline, ticks)["cpu_seconds_per_tick"]
        finally:
            parts = clocks.stop()
        per_tick = {part: seconds / ticks for part, seconds in parts.items()}
        per_tick["inside the fake NVML"] = fake_all.seconds / ticks
        per_tick["inside its per-process calls"] = fake_processes.seconds / ticks
        per_tick["simulated node's thread"] = (_thread_cpu("sim-node") - node0) / ticks
        out: dict[str, Any] = {
            "tick_cpu": cpu,
            "metered_tick_cpu": metered,
            "parts_cpu_per_tick": per_tick,
            **published(pipeline),
        }
        if on:
            out["runtime_refresh"] = runtime_refresh(pipeline, settings.refreshes)
        return out
    finally:
        pipeline.close()


def _median_parts(rounds: list[dict[str, Any]]) -> dict[str, float]:
    names = dict.fromkeys(part for r in rounds for part in r["parts_cpu_per_tick"])
    return {
        part: statistics.median(r["parts_cpu_per_tick"].get(part, 0.0) for r in rounds)
        for part in names
    }


def breakdown(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's rounds summed up: each part's median over the rounds, the instrumented
    tick's, what the last round's tick published, and the runtime's refreshes pooled."""
    last = rounds[-1]
    out: dict[str, Any] = {
        "tick_cpu": statistics.median(r["metered_tick_cpu"] for r in rounds),
        "parts_cpu_per_tick": _median_parts(rounds),
        **{key: last[key] for key in PUBLISHED},
    }
    refreshes = [r["runtime_refresh"] for r in rounds if "runtime_refresh" in r]
    if refreshes:
        out["runtime_refresh"] = pooled_refresh(refreshes)
    return out


def runtime_refresh(pipeline: Pipeline, refreshes: int) -> dict[str, Any]:
    """CPU of refreshes of the container runtime's map (ListContainers and ListPodSandbox
    over gRPC): on the calling thread (the daemon's refresh thread), and of the whole process
    (the fake runtime's server answering in it); with the runtime's refresh interval and the
    daemon's tick interval."""
    assert pipeline.assembly is not None and pipeline.assembly.processes is not None
    runtime = pipeline.assembly.processes.runtime
    caller, process, ok = [], [], 0
    for _ in range(refreshes):
        thread0, process0 = time.thread_time(), time.process_time()
        ok += runtime.refresh()
        caller.append(time.thread_time() - thread0)
        process.append(time.process_time() - process0)
    return {
        "answered": ok,
        "caller": caller,
        "process": process,
        "refresh_seconds": runtime.refresh_seconds,
        "interval": pipeline.interval,
    }


def pooled_refresh(measured: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds' refreshes together; `per_tick_cpu`: the whole process's CPU of a refresh
    spread over the ticks between two refreshes."""
    caller = [seconds for m in measured for seconds in m["caller"]]
    process = [seconds for m in measured for seconds in m["process"]]
    first = measured[0]
    whole = summarize(process)
    return {
        "refreshes": len(process),
        "answered": sum(m["answered"] for m in measured),
        "caller_cpu": summarize(caller),
        "process_cpu": whole,
        "refresh_seconds": first["refresh_seconds"],
        "per_tick_cpu": whole["mean"] * first["interval"] / first["refresh_seconds"],
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
        full = promtext.sum_and_count(text, OUR_FULL_TICK_FAMILY)
        out[side] = {
            "rss_mib": memory.rss_mib,
            "per_pod_families": "gpu_pod_processes{" in text,
            # whole ticks in real time, and the GPUs read: did it keep up with its 1 s?
            "full_tick_mean_seconds": full[0] / full[1] if full and full[1] else None,
            "gpus_up": sum(1 for line in text.splitlines() if gpu_up(line)),
        }
    out["on_minus_off_mib"] = out["on"]["rss_mib"] - out["off"]["rss_mib"]
    return out


def gpu_up(line: str) -> bool:
    """Whether an exposition line is a GPU's `gpu_up` at 1."""
    name, _, value = line.rpartition(" ")
    if not name.startswith("gpu_up{"):
        return False
    try:
        return float(value) == 1.0
    except ValueError:
        return False


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
    clocks = Clocks()
    for name in settings.configs:
        spec = scenario(name)
        devices = DEVICES[name]
        rounds: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
        with parts_measured(clocks):
            for _ in range(settings.rounds):
                for side in ("off", "on"):
                    rounds[side].append(one_round(side == "on", spec, settings, clocks))
                    gc.collect()
        off = [r["tick_cpu"] for r in rounds["off"]]
        on = [r["tick_cpu"] for r in rounds["on"]]
        off_mean, on_mean = sum(off) / len(off), sum(on) / len(on)
        parts_off, parts_on = breakdown(rounds["off"]), breakdown(rounds["on"])
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
            "on_vs_off_medians": ratio(statistics.median(on), statistics.median(off)),
            "added_cpu_per_tick": on_mean - off_mean,
            "added_cpu_per_gpu": (on_mean - off_mean) / devices,
            "on_with_refresh_vs_off": ratio(on_mean + refresh, off_mean),
            # The fake NVML's own CPU (medians of the metered ticks) out of both sides.
            "net_of_fake_on_vs_off": ratio(on_mean - fake_on, off_mean - fake_off),
            "breakdown_off": parts_off,
            "breakdown_on": parts_on,
            "attribution_complete": all(attribution_complete(r) for r in rounds["on"]),
        }
        if settings.rss_ticks:
            results[name]["memory"] = daemon_memory(name, settings, workdir)
    return {"settings": settings.__dict__ | {"configs": list(settings.configs)}, "configs": results}

"""`gpu-exporter diagnose`: a one-shot report on this node's GPUs, in a fixed diagnosis order.

1. Versions: driver, NVML, CUDA driver API, the Python binding and the exporter (a result is
   only reproducible with the software it came from).
2. Topology, as `nvidia-smi topo -m`: which GPU pairs talk over NVLink or cross PCIe switches,
   host bridges or sockets, and which CPUs / NUMA node are nearest each GPU.
3. Per-GPU state: clocks against their maximum, power against its limit, active clock-event
   (throttle) reasons, PCIe link against its maximum, NVLink links, health (ECC, row remapping,
   XIDs, whether the GPU answers).
4. An activity profile over `--duration` seconds with the production NVML source and the
   bottleneck classifier: utilization next to SM / Tensor / DRAM activity, link traffic, the
   class, and what to look at next for that class.

MIG: a GPU with MIG enabled has no class of its own; its MIG instances are listed under it,
each with its profile, class, pods and memory, and judged as a whole GPU is (a launch-bound
instance needs attention and gets the same advice). NVML reads an instance's activity with
GPM, per GPU instance, on Hopper and newer only: an A100/A30 instance (or a compute instance
of a GPU instance split into several) says its activity is unavailable and why, instead of a
generic "unknown".

Pods: with the kubelet's PodResources socket (`--kubelet-socket`, by default the kubelet's
own path when it exists and the node is not simulated), each GPU and MIG instance names the
pods holding it, read once before the profile, as the daemon's pod attribution reads them.

Exit status: 0 nothing needs attention; 1 something does; 2 bad input (flags, scenario);
3 no NVIDIA driver to read: NVML cannot start, or its start (nvmlInit, the GPU count, XID
registration) does not answer within `--start-timeout`, which names the stuck step and how
long it waited (a driver that hangs there gives nothing to report on; a GPU whose own start
calls hang is down in the report instead, with why). "Needs attention" means a GPU that is
down or unhealthy (XID, uncorrectable ECC, row remap pending or failed, retired pages pending,
NVLink links down, P2P over NVLink unavailable, PCIe link down-trained while busy), clocks
held down by a HW / thermal / power-brake reason, or a class in ATTENTION_CLASSES: throttled,
launch_bound and link_bound waste a GPU that is nominally busy. memory_bound is reported but is
not a fault: on the roofline, low-intensity work (LLM decode, elementwise ops) is memory-bound
by nature; idle, tensor_bound and compute_bound are not problems, and unknown means missing
data, not a fault.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from typing import Any, TextIO

from gpu_exporter import __version__
from gpu_exporter.classify import CLASSES, THROTTLE_REASONS, Classifier, Thresholds, Verdict
from gpu_exporter.k8s import defaults as k8s_defaults
from gpu_exporter.nvml_facts import ARCHITECTURES
from gpu_exporter.series import DeviceView, InstanceView, SeriesBuilder
from gpu_exporter.snapshot import DeviceSample, Snapshot
from gpu_exporter.sources.settings import NvmlSettings
from gpu_exporter.sources.startup import StartupProgress
from gpu_exporter.topology import Topology, read_topology
from gpu_exporter.xids import xid_severity

EXIT_OK = 0
EXIT_ATTENTION = 1
EXIT_USAGE = 2
EXIT_NO_DRIVER = 3

SCHEMA_VERSION = 1
# How long NVML's start may take before diagnose gives up: as long as the source waits for one
# call before it counts it hung (nvmlInit without persistence mode takes seconds per GPU).
DEFAULT_START_TIMEOUT_SECONDS = NvmlSettings.hang_quarantine_seconds
MAX_START_TIMEOUT_SECONDS = 3600.0
_SIMULATE_HINT = "run `gpu-exporter diagnose --simulate` to see a report on a simulated node"
ATTENTION_CLASSES = frozenset({"throttled", "launch_bound", "link_bound"})

NEXT_STEPS: Mapping[str, tuple[str, ...]] = {
    "idle": (
        "No kernel ran. If a job should be using this GPU, check that it was given this GPU "
        "(CUDA_VISIBLE_DEVICES, the pod's nvidia.com/gpu allocation) and is not stuck before "
        "its first kernel (data loading, NCCL initialisation, a lock).",
    ),
    "throttled": (
        "The clocks are held down, so every measurement on this GPU understates it.",
        "HW/SW thermal slowdown: check cooling (inlet temperature, airflow, fans, chassis "
        "alerts); `nvidia-smi -q -d PERFORMANCE,TEMPERATURE` shows the limits.",
        "Power brake or HW slowdown without heat: the board or its power supply asserted it; "
        "check the PSUs and the BMC event log.",
    ),
    "launch_bound": (
        "Kernels ran but kept few SMs busy: tiny kernels, launch overhead, host syncs or a "
        "starved input pipeline. Record an Nsight Systems timeline (`nsys profile`) or a "
        "PyTorch Profiler trace and look for gaps between kernels and CPU-side stalls.",
        "Remedies: CUDA Graphs, torch.compile (mode='reduce-overhead'), larger batches, fewer "
        ".item() / .cpu() / torch.cuda.synchronize() calls in the step, more DataLoader workers "
        "with pin_memory=True.",
    ),
    "link_bound": (
        "Transfers dominate: PCIe or NVLink near capacity while the SMs wait.",
        "Check the topology above: do communicating GPUs share NVLink, or cross NODE/SYS? "
        "NCCL_DEBUG=INFO shows the transport NCCL chose.",
        "Overlap communication with compute, keep data on the GPU, and use pinned memory with "
        "non_blocking copies for host transfers; run data loaders on the GPU's NUMA node.",
    ),
    "memory_bound": (
        "HBM bandwidth is the limit (roofline: arithmetic intensity below the ridge point).",
        "Raise intensity: fuse elementwise ops (torch.compile, fused kernels such as "
        "FlashAttention), larger batches for decode, lower precision for activations and KV "
        "cache. Nsight Compute's memory workload analysis confirms it per kernel.",
    ),
    "tensor_bound": (
        "Tensor Cores are the busiest unit: the GPU does what it is built for.",
        "Faster needs cheaper FLOPs: FP8 (Transformer Engine) or lower precision, matrix "
        "dimensions that are multiples of 16, or more GPUs.",
    ),
    "compute_bound": (
        "SMs are busy on non-Tensor-Core work (FP32/FP64/integer pipes).",
        "If the model is matmul-heavy, make the matmuls reach Tensor Cores: bf16/fp16 autocast, "
        "TF32 (torch.backends.cuda.matmul.allow_tf32), dimensions multiple of 8. NVIDIA's DCGM "
        "guidance: SM activity below 0.8 still leaves headroom.",
    ),
    "unknown": (
        "Without SM/Tensor/DRAM activity the class would be a guess, so none is given.",
        "NVML GPM gives these on Hopper and newer; on older GPUs run DCGM (dcgm-exporter's "
        "profiling fields 1002-1005) or profile with Nsight Systems / PyTorch Profiler.",
    ),
}
# A MIG instance whose activity NVML cannot read: what it is instead of "unknown"'s steps.
MIG_NO_GPM_STEPS: tuple[str, ...] = (
    "NVML reads a MIG instance's activity with GPM, one GPU instance at a time, on Hopper and "
    "newer GPUs only: on an A100 or A30 it gives the instance's memory and size, not its "
    "activity, so no class is given. Nothing is wrong with the instance or the exporter.",
    "For activity per MIG instance here run DCGM (dcgm-exporter's DCGM_FI_PROF_* profiling "
    "fields, which DCGM attributes to MIG devices on A100), or profile the workload inside its "
    "pod with Nsight Systems / PyTorch Profiler.",
)
MIG_SHARED_STEPS: tuple[str, ...] = (
    "GPM measures a GPU instance as a whole; this one is split into several compute "
    "instances, which share its SMs' counters and its memory, so none has activity of its own.",
    "To see one workload's activity, give it a GPU instance of its own (a profile without "
    "compute-instance sharing), or profile it inside its pod with Nsight Systems.",
)

_COLOURS = {
    "idle": "2",
    "throttled": "31",
    "launch_bound": "33",
    "link_bound": "33",
    "memory_bound": "36",
    "tensor_bound": "32",
    "compute_bound": "32",
    "unknown": "35",
}


# -- command line -----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--simulate",
        nargs="?",
        const="mixed",
        metavar="SCENARIO",
        help="diagnose a simulated node: a built-in scenario name (default mixed) or a file",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="length of the activity profile (default 10)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="sampling interval of the profile, at least 0.2 (default 1)",
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=DEFAULT_START_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="how long NVML may take to start before diagnose gives up with exit status 3 "
        f"(default {DEFAULT_START_TIMEOUT_SECONDS:g})",
    )
    parser.add_argument(
        "--kubelet-socket",
        metavar="PATH",
        help="the kubelet's PodResources socket, to name the pod holding each GPU and MIG "
        f"instance (default: {k8s_defaults.SOCKET_PATH} when it exists and the node is not "
        "simulated)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--no-color", action="store_true", help="never colour the output")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "diagnose",
        help="one-shot report: versions, topology, GPU state, activity profile, next steps",
        description="Diagnose this node's GPUs. Exit status: 0 nothing needs attention, "
        "1 something does, 2 bad input, 3 no NVIDIA driver.",
    )
    add_arguments(parser)
    return parser


def check_arguments(args: argparse.Namespace) -> str:
    """Why these arguments cannot run, or ""."""
    if not 0 < args.duration <= 3600:
        return f"--duration must be > 0 and at most 3600 seconds, got {args.duration:g}"
    if not 0.2 <= args.interval <= 3600:  # GPM needs >= 100 ms between samples
        return f"--interval must be 0.2-3600 seconds, got {args.interval:g}"
    if args.interval > args.duration:
        return f"--interval ({args.interval:g}) must not exceed --duration ({args.duration:g})"
    if not 0 < args.start_timeout <= MAX_START_TIMEOUT_SECONDS:
        return (
            f"--start-timeout must be > 0 and at most {MAX_START_TIMEOUT_SECONDS:g} seconds, "
            f"got {args.start_timeout:g}"
        )
    return ""


def use_colour(args: argparse.Namespace, stream: TextIO) -> bool:
    """Colour only on a terminal, and never with --no-color, --json or NO_COLOR (no-color.org)."""
    if args.no_color or args.json or os.environ.get("NO_COLOR"):
        return False
    return hasattr(stream, "isatty") and stream.isatty()


def run(args: argparse.Namespace) -> int:
    problem = check_arguments(args)
    if problem:
        print(f"gpu-exporter diagnose: {problem}", file=sys.stderr)
        return EXIT_USAGE
    simulated, kubelet = False, None
    if args.simulate:
        from gpu_exporter import sim

        try:
            scenario = sim.load_scenario(args.simulate)
        except ValueError as exc:  # ScenarioError names the file, field and line
            print(f"scenario error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        sim.install(scenario)
        simulated = True
        if args.kubelet_socket is None and scenario.pods:
            from gpu_exporter.sim.kubelet import start_for

            kubelet = start_for(scenario)  # the scenario's pods, as a kubelet reports them
            args.kubelet_socket = kubelet.socket_path if kubelet is not None else None
    try:
        return _diagnose(args, sys.stdout)
    finally:
        if simulated:
            from gpu_exporter import sim

            sim.uninstall()
        if kubelet is not None:
            kubelet.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-exporter diagnose", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


# -- the diagnosis ----------------------------------------------------------------------------


@dataclass
class _Profile:
    classifier: Classifier
    # By NVML index: a GPU whose UUID could not be read has none, and two such are two GPUs.
    last: dict[int, DeviceView]  # each GPU as the last tick's series show it
    last_up: dict[tuple[int, str], DeviceView]  # ... as the last tick in which it answered
    ticks: int


Processor = Callable[[list[DeviceSample], float], list[DeviceSample]]


@dataclass(frozen=True)
class _Pods:
    """Where the pods came from: `socket` None when none were asked for; `read` whether the
    kubelet answered; `processor` adds gpu_pod_info to each tick's samples (None: no pods)."""

    socket: str | None
    read: bool
    devices: int = 0  # device ids held by pods, as the kubelet listed them
    processor: Processor | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kubelet_socket": self.socket, "read": self.read, "devices_held": self.devices}


def _read_pods(args: argparse.Namespace) -> _Pods:
    """The kubelet's pods, read once (a profile is short: pods do not move during it)."""
    socket = args.kubelet_socket
    if socket is None:
        if args.simulate or not os.path.exists(k8s_defaults.SOCKET_PATH):
            return _Pods(None, False)
        socket = k8s_defaults.SOCKET_PATH
    # grpc and protobuf only when pods are read
    from gpu_exporter.k8s.attribution import AttributionSettings, PodAttribution
    from gpu_exporter.k8s.labels import PodsOfTick

    attribution = PodAttribution(AttributionSettings(socket_path=socket))
    if not attribution.refresh():
        return _Pods(socket, False)
    return _Pods(socket, True, len(attribution.pods_by_device()), PodsOfTick(attribution).process)


def _diagnose(args: argparse.Namespace, out: TextIO) -> int:
    from gpu_exporter.sources.base import ErrorLog
    from gpu_exporter.sources.nvml import NvmlSource
    from gpu_exporter.sources.settings import default_deadline

    settings = NvmlSettings(
        device_deadline_seconds=default_deadline(args.interval),
        slow_refresh_seconds=3600.0,  # the static data once is enough for a short profile
    )
    source = NvmlSource(settings=settings, errors=ErrorLog(), topology_reader=read_topology)
    try:
        # Not `start()`: that waits for ever on a driver whose nvmlInit hangs.
        source.begin()
        deadline = time.monotonic() + args.start_timeout
        problem = _not_started(source.progress, args.start_timeout)
        if problem:
            print(f"gpu-exporter diagnose: {problem}", file=sys.stderr)
            return EXIT_NO_DRIVER
        colour = use_colour(args, out)
        versions = _versions(source.node_info())
        if source.progress.wait_finished(max(0.0, deadline - time.monotonic())):
            topology = source.topology or Topology((), (), ("topology could not be read",))
        else:
            note = f"the topology read did not finish within {args.start_timeout:g}s"
            topology = Topology((), (), (note,))
        pods = _read_pods(args)
        text = None if args.json else _Text(out, colour)
        if text:
            text.header(args.simulate, versions, topology, args.duration, pods)
        profile = _run_profile(source.sample, args.duration, args.interval, pods.processor)
        report = build_report(args, versions, topology, profile, pods)
        if text:
            text.body(report)
        else:
            out.write(json.dumps(report, indent=2) + "\n")
        return report["exit_status"]
    finally:
        source.close()


def _not_started(progress: StartupProgress, timeout: float) -> str:
    """Why the GPUs cannot be sampled after waiting up to `timeout` for NVML's start ("" once
    they can): its error, or the step that has not answered and for how long."""
    from gpu_exporter.sources.base import SourceUnavailableError

    if progress.wait_ready(timeout):
        return ""
    failure = progress.failure
    if isinstance(failure, SourceUnavailableError):  # no driver, or more GPUs than we take
        return f"{str(failure).partition('; ')[0]}; {_SIMULATE_HINT}."
    if failure is not None:
        return f"NVML start-up failed: {type(failure).__name__}: {failure}"
    return (
        f"NVML does not answer: {progress.reason()} (--start-timeout {timeout:g}); the driver "
        "looks hung: check `dmesg` for NVRM and Xid messages and whether `nvidia-smi` answers"
    )


def _run_profile(
    sample: Callable[[], list[DeviceSample]],
    duration: float,
    interval: float,
    pods: Processor | None = None,
) -> _Profile:
    # One window over the whole profile: the class describes all of it, not its last seconds.
    classifier = Classifier(Thresholds(), window_seconds=duration + interval)
    profile = _Profile(classifier, {}, {}, 0)
    builder = SeriesBuilder()  # the daemon's own series model: diagnose reads what it exports
    ticks = max(2, round(duration / interval) + 1)  # GPM needs two samples for one window
    start = time.monotonic()
    for tick in range(ticks):
        delay = start + tick * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        now = time.monotonic()
        devices = classifier.process(sample(), now)
        if pods is not None:
            devices = pods(devices, now)
        for view in builder.build(Snapshot(time.time(), tuple(devices))).devices():
            profile.last[view.index] = view
            if view.up:
                profile.last_up[view.index, view.uuid] = view
        profile.ticks += 1
    return profile


def _versions(node_info: Mapping[str, str]) -> dict[str, str | None]:
    try:
        binding: str | None = metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        binding = None
    return {
        "exporter": __version__,
        "nvidia_ml_py": binding,
        "driver": node_info.get("driver_version"),
        "nvml": node_info.get("nvml_version"),
        "cuda_driver": _cuda_version(node_info.get("cuda_driver_version")),
    }


def _cuda_version(raw: str | None) -> str | None:
    """NVML's 12080 -> "12.8"."""
    if not raw or not raw.isdigit():
        return raw
    number = int(raw)
    return f"{number // 1000}.{number % 1000 // 10}"


# -- the report (a plain dict: the --json schema) ---------------------------------------------


def build_report(
    args: argparse.Namespace,
    versions: Mapping[str, str | None],
    topology: Topology,
    profile: _Profile,
    pods: _Pods | None = None,
) -> dict[str, Any]:
    devices = [
        _device_report(sample, profile, topology)
        for sample in sorted(profile.last.values(), key=lambda s: s.index)
    ]
    attention = any(d["problems"] or any(i["problems"] for i in d["instances"]) for d in devices)
    return {
        "schema_version": SCHEMA_VERSION,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "simulated": args.simulate,
        "versions": dict(versions),
        "topology": {**topology.to_dict(), "matrix": topology.matrix_text()},
        "profile": {
            "duration_seconds": args.duration,
            "interval_seconds": args.interval,
            "samples": profile.ticks,
        },
        "attention_classes": sorted(ATTENTION_CLASSES),
        "pods": (pods or _Pods(None, False)).to_dict(),
        "devices": devices,
        "needs_attention": attention,
        "exit_status": EXIT_ATTENTION if attention else EXIT_OK,
    }


def _device_report(last: DeviceView, profile: _Profile, topology: Topology) -> dict[str, Any]:
    sample = profile.last_up.get((last.index, last.uuid), last)
    mig = _mig_mode(last)
    partitioned = bool(mig and mig["current"])
    # A GPU that is down at the end has no class: what limits it now is not known. A GPU with
    # MIG on has none either: its instances have theirs.
    up = last.up
    verdict = profile.classifier.verdict(last.uuid) if up and not partitioned else None
    cls = verdict.cls if verdict else None
    state = _state(sample, topology)
    instances = [
        _instance_report(last, instance, profile, state)
        for instance in sorted(last.instances, key=lambda instance: instance.order_key)
        if up
    ]
    numbers = _profile_numbers(verdict, profile.classifier.seconds(last.uuid))
    reason = verdict.why if verdict else None
    if partitioned:
        numbers = _parent_numbers(last, profile, numbers)
        reason = f"MIG is on: each of its {len(instances)} MIG instances has its own class"
    report = {
        "index": last.index,
        "uuid": last.uuid,
        "model": last.info.get("model"),
        "architecture": last.info.get("architecture"),
        "pci_bus_id": last.info.get("pci_bus_id"),
        "up": up,
        "down_reason": last.down_reason or None,
        "mig": mig,
        "pods": _pods_json(InstanceView.pods_of(last.readings)),
        "state": state,
        "profile": numbers,
        "class": cls,
        "class_reason": reason,
        "next_steps": list(NEXT_STEPS[cls]) if cls else [],
        "instances": instances,
    }
    busy = any((i["profile"]["utilization"] or 0.0) >= 0.5 for i in instances)
    report["problems"] = _problems(last, verdict, state, topology, busy)
    return report


def _mig_mode(device: DeviceView) -> dict[str, bool] | None:
    """gpu_mig_mode's states; None on a GPU without MIG support."""
    current = device.value("gpu_mig_mode", state="current")
    pending = device.value("gpu_mig_mode", state="pending")
    if current is None and pending is None:
        return None
    return {"current": current == 1.0, "pending": pending == 1.0}


def _pods_json(pods: Iterable[tuple[str, str, str]]) -> list[dict[str, str]]:
    """Every pod holding the GPU or instance (its gpu_pod_info), as the report lists them."""
    return [
        {"namespace": namespace, "pod": pod, "container": container}
        for namespace, pod, container in pods
    ]


def _instance_report(
    parent: DeviceView, instance: InstanceView, profile: _Profile, state: Mapping[str, Any]
) -> dict[str, Any]:
    """One MIG instance, judged as a whole GPU is; the clocks and links are its parent's."""
    identity = instance.identity
    verdict = profile.classifier.verdict(parent.uuid, instance.mig_uuid)
    cls = verdict.cls if verdict else None
    unavailable, steps = _activity_unavailable(parent, instance)
    reason = verdict.why if verdict else None
    if cls == "unknown" and unavailable:
        reason = unavailable
    elif cls is not None:
        steps = NEXT_STEPS[cls]
    seconds = profile.classifier.seconds(parent.uuid, instance.mig_uuid)
    return {
        "gpu_instance": instance.gpu_instance_id,
        "compute_instance": instance.compute_instance_id,
        "mig_uuid": instance.mig_uuid,
        "mig_profile": identity.get("mig_profile"),
        "size": instance.size,
        "pods": _pods_json(instance.pods()),
        "memory_used_bytes": instance.value("gpu_memory_used_bytes"),
        "memory_total_bytes": instance.value("gpu_memory_total_bytes"),
        "activity_unavailable": unavailable,
        "profile": _profile_numbers(verdict, seconds),
        "class": cls,
        "class_reason": reason,
        "next_steps": list(steps) if cls else [],
        "problems": _class_problems(verdict, state, own_clocks=False) if verdict else [],
    }


def _activity_unavailable(
    parent: DeviceView, instance: InstanceView
) -> tuple[str | None, tuple[str, ...]]:
    """Why NVML gives this instance no activity (and what to do instead), or (None, ())
    when it does, or may once GPM has two samples."""
    if instance.has_activity:
        return None, ()
    architecture = parent.info.get("architecture", "")
    if ARCHITECTURES.get(architecture, ARCHITECTURES["hopper"]) < ARCHITECTURES["hopper"]:
        model = parent.info.get("model") or "this GPU"
        return (
            f"activity unavailable: no GPM before Hopper ({model}, {architecture}), and NVML "
            "reads a MIG instance's activity only with GPM: memory and size only",
            MIG_NO_GPM_STEPS,
        )
    if "compute_instance" in instance.identity:
        gi = instance.identity.get("gpu_instance", "?")
        return (
            f"activity unavailable: GPU instance {gi} is split into several compute instances, "
            "and GPM measures the GPU instance as a whole",
            MIG_SHARED_STEPS,
        )
    return None, ()


def _parent_numbers(parent: DeviceView, profile: _Profile, own: dict[str, Any]) -> dict[str, Any]:
    """A MIG parent's profile: no activity of its own (its instances have it), but the links
    and clocks its instances' windows saw, which are the physical GPU's."""
    for instance in parent.instances:
        verdict = profile.classifier.verdict(parent.uuid, instance.mig_uuid)
        if verdict is not None:
            shared = _profile_numbers(verdict, {})
            for key in ("pcie_bytes_per_second", "nvlink_bytes_per_second", "link_utilization"):
                own[key] = shared[key]
            own["throttle_fraction"] = shared["throttle_fraction"]
            own["samples"] = shared["samples"]
            break
    return own


def _state(sample: DeviceView, topology: Topology) -> dict[str, Any]:
    value = sample.value
    node = topology.gpu(sample.uuid)
    return {
        "sm_clock_hz": value("gpu_clock_hertz", clock="sm"),
        "sm_clock_max_hz": value("gpu_clock_max_hertz", clock="sm"),
        "memory_clock_hz": value("gpu_clock_hertz", clock="memory"),
        "memory_clock_max_hz": value("gpu_clock_max_hertz", clock="memory"),
        "power_watts": value("gpu_power_watts"),
        "power_limit_watts": value("gpu_power_limit_watts"),
        "temperature_celsius": value("gpu_temperature_celsius", sensor="gpu"),
        "memory_temperature_celsius": value("gpu_temperature_celsius", sensor="memory"),
        "clock_events_active": sorted(
            dict(r.labels)["reason"]
            for r in sample.readings
            if r.family == "gpu_clock_event_active" and r.value
        ),
        "pcie": {
            "generation": value("gpu_pcie_link_generation", state="current"),
            "max_generation": value("gpu_pcie_link_generation", state="max"),
            "width": value("gpu_pcie_link_width", state="current"),
            "max_width": value("gpu_pcie_link_width", state="max"),
        },
        "nvlink_links_active": value("gpu_nvlink_links_active"),
        "nvlink_links": node.nvlink_links if node else None,
        "health": _health(sample),
    }


def _health(sample: DeviceView) -> dict[str, Any]:
    value = sample.value
    xids = {
        dict(r.labels)["xid"]: int(r.value)
        for r in sample.readings
        if r.family == "gpu_xid_errors_total"
    }
    return {
        "gpu_up": sample.up,
        "ecc_enabled": value("gpu_ecc_enabled"),
        "ecc_errors_corrected": value("gpu_ecc_errors_total", error="corrected"),
        "ecc_errors_uncorrected": value("gpu_ecc_errors_total", error="uncorrected"),
        "row_remap_pending": value("gpu_row_remap_pending"),
        "row_remap_failure": value("gpu_row_remap_failure"),
        "retired_pages_pending": value("gpu_retired_pages_pending"),
        "xid_errors": xids,
    }


def _profile_numbers(verdict: Verdict | None, seconds: Mapping[str, float]) -> dict[str, Any]:
    s = verdict.stats if verdict else None
    return {
        "samples": s.samples if s else 0,
        "utilization": s.utilization if s else None,
        "sm_active": s.sm_active if s else None,
        "tensor_active": s.tensor_active if s else None,
        "dram_active": s.dram_active if s else None,
        "pcie_bytes_per_second": s.pcie_bytes_per_second if s else None,
        "nvlink_bytes_per_second": s.nvlink_bytes_per_second if s else None,
        "link_utilization": s.link_utilization if s else None,
        "throttle_fraction": s.throttle_fraction if s else None,
        "class_seconds": {c: round(seconds.get(c, 0.0), 3) for c in CLASSES},
    }


def _problems(
    last: DeviceView,
    verdict: Verdict | None,
    state: Mapping[str, Any],
    topology: Topology,
    instances_busy: bool = False,
) -> list[str]:
    """A GPU's own problems; its MIG instances' classes are theirs (`instances_busy`: one of
    them is, for the PCIe check)."""
    if not last.up:
        return [f"GPU not answering: {last.down_reason or 'unknown reason'}"]
    out = _health_problems(state["health"])
    busy = instances_busy or (verdict is not None and (verdict.stats.utilization or 0.0) >= 0.5)
    out += _link_problems(last.uuid, state, busy, topology)
    if verdict is not None:
        out += _class_problems(verdict, state)
    elif (mig := _mig_mode(last)) and mig["current"]:
        out += _clock_problems(state, "MIG")
    return out


def _health_problems(health: Mapping[str, Any]) -> list[str]:
    out = []
    if health["ecc_errors_uncorrected"]:
        count = int(health["ecc_errors_uncorrected"])
        out.append(f"{count} uncorrectable ECC error(s) since the driver loaded")
    if health["row_remap_failure"]:
        out.append("a row remap failed: the GPU needs service")
    if health["row_remap_pending"]:
        out.append("a row remap is pending: reset the GPU")
    if health["retired_pages_pending"]:
        out.append("a page retirement is pending: reset the GPU")
    for xid, count in sorted(health["xid_errors"].items(), key=lambda kv: int(kv[0])):
        level = xid_severity(int(xid))  # the rule pack's, from gpu_exporter/xids.py
        severity = f"{level} " if level else ""
        out.append(f"{severity}XID {xid} seen {count} time(s) during the profile")
    return out


def _link_problems(
    uuid: str, state: Mapping[str, Any], busy: bool, topology: Topology
) -> list[str]:
    out = []
    links, active = state["nvlink_links"], state["nvlink_links_active"]
    if links and active is not None and active < links:
        out.append(f"{links - int(active)} of {links} NVLink links are not active")
    broken = [
        f"GPU{p.peer_index}"
        for p in topology.peers_of(uuid)
        if p.nvlink_links and p.p2p.get("nvlink", "ok") != "ok"
    ]
    if broken:
        out.append(
            f"NVLink to {', '.join(broken)} but P2P over NVLink is unavailable "
            "(on NVSwitch systems: is nvidia-fabricmanager running?)"
        )
    pcie = state["pcie"]
    for key, unit in (("generation", "Gen"), ("width", "x")):
        now, best = pcie[key], pcie[f"max_{key}"]
        if busy and now is not None and best is not None and now < best:
            out.append(f"PCIe link at {unit}{now:g} while busy; it can do {unit}{best:g}")
    return out


def _class_problems(
    verdict: Verdict, state: Mapping[str, Any], own_clocks: bool = True
) -> list[str]:
    """The class's problem; `own_clocks` False for a MIG instance, whose clocks are its
    parent's (reported once, on the parent)."""
    if verdict.cls in ATTENTION_CLASSES:
        return [f"{verdict.cls}: {verdict.why}"]
    return _clock_problems(state, verdict.cls) if own_clocks else []


def _clock_problems(state: Mapping[str, Any], what: str) -> list[str]:
    active = [r for r in state["clock_events_active"] if r in THROTTLE_REASONS]
    if active:  # e.g. a power brake asserted on an idle GPU
        return [f"clocks held down by {', '.join(active)} ({what})"]
    return []


# -- terminal output --------------------------------------------------------------------------


class _Text:
    """Readable tables; ANSI colour only when asked for."""

    def __init__(self, out: TextIO, colour: bool) -> None:
        self.out = out
        self.colour = colour

    def paint(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.colour and code else text

    def line(self, text: str = "") -> None:
        self.out.write(text + "\n")

    def section(self, title: str) -> None:
        self.line()
        self.line(self.paint(title, "1"))

    def table(self, header: list[str], rows: list[list[str]], codes: list[list[str]]) -> None:
        """Pads before painting, so colour codes never shift the columns."""
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        heading = (h.ljust(w) for h, w in zip(header, widths, strict=True))
        self.line(("  " + "  ".join(heading)).rstrip())
        for row, row_codes in zip(rows, codes, strict=True):
            cells = [
                self.paint(cell.ljust(w), code)
                for cell, w, code in zip(row, widths, row_codes, strict=True)
            ]
            self.line("  " + "  ".join(cells).rstrip())

    def header(
        self,
        simulated: str | None,
        versions: Mapping[str, str | None],
        topology: Topology,
        duration: float,
        pods: _Pods | None = None,
    ) -> None:
        where = f' (simulated node: scenario "{simulated}")' if simulated else ""
        self.line(self.paint(f"gpu-exporter diagnose{where}", "1"))
        self.section("1. Versions")
        labels = {
            "driver": "NVIDIA driver",
            "nvml": "NVML",
            "cuda_driver": "CUDA (driver API)",
            "nvidia_ml_py": "nvidia-ml-py",
            "exporter": "gpu-exporter",
        }
        for key, label in labels.items():
            self.line(f"  {label:<18} {versions.get(key) or 'n/a'}")
        self.section("2. Topology (as nvidia-smi topo -m)")
        for text in topology.matrix_text().splitlines():
            self.line(f"  {text}".rstrip())
        for error in topology.errors:
            self.line(f"  {self.paint('could not read', '33')} {error}")
        self.line()
        if pods is not None and pods.socket is not None:
            if pods.read:
                held = f"{pods.devices} device(s) held by pods"
                self.line(f"Pods: from the kubelet at {pods.socket} ({held})")
            else:
                self.line(
                    f"Pods: {self.paint('not read', '33')}: the kubelet at {pods.socket} "
                    "did not answer"
                )
        self.line(f"Profiling for {duration:g} s ...")
        self.out.flush()

    def body(self, report: Mapping[str, Any]) -> None:
        devices = report["devices"]
        self.section("3. GPU state")
        self.table(*_state_table(devices))
        self.section(f"4. Activity profile ({report['profile']['samples']} samples)")
        self.table(*_profile_table(devices, report["pods"]["kubelet_socket"] is not None))
        if any(d["instances"] for d in devices):
            self.line(
                "  MIG instances: util is graphics-engine activity (NVML has no utilization "
                "under MIG); PCIe, NVLink and link are their GPU's."
            )
        self.section("5. What to look at next")
        self._next_steps(devices)
        self.section("Needs attention")
        self._problems(devices)
        self.line()
        status = report["exit_status"]
        verdict = "something needs attention" if status else "nothing needs attention"
        self.line(f"Exit status {status}: {verdict}.")

    def _next_steps(self, devices: list[Mapping[str, Any]]) -> None:
        """Per class, the GPUs and MIG instances in it, then the steps (once per distinct
        list: an instance without activity has its own)."""
        judged = [(_where(d, i), i or d) for d in devices for i in (None, *d["instances"])]
        for cls in CLASSES:
            groups: dict[tuple[str, ...], list[tuple[str, Mapping[str, Any]]]] = {}
            for where, entry in judged:
                if entry["class"] == cls:
                    groups.setdefault(tuple(entry["next_steps"]), []).append((where, entry))
            for steps, members in groups.items():
                names = ", ".join(where for where, _ in members)
                self.line(f"  {self.paint(cls, _COLOURS[cls])} ({names})")
                reasons: dict[str, list[str]] = {}  # one line for the same reason
                for where, entry in members:
                    reasons.setdefault(entry["class_reason"], []).append(where)
                for reason, places in reasons.items():
                    self.line(f"    {', '.join(places)}: {reason}")
                for step in steps:
                    self.line(
                        textwrap.fill(
                            step, 100, initial_indent="    - ", subsequent_indent="      "
                        )
                    )

    def _problems(self, devices: list[Mapping[str, Any]]) -> None:
        found = False
        for d in devices:
            for instance in (None, *d["instances"]):
                for problem in (instance or d)["problems"]:
                    found = True
                    self.line(f"  {_where(d, instance)}: {self.paint(problem, '31')}")
        if not found:
            self.line("  nothing")


def _where(device: Mapping[str, Any], instance: Mapping[str, Any] | None = None) -> str:
    """ "GPU 0", or a MIG instance's "GPU 0 GI 9" ("GPU 3 GI 1 CI 2" in a shared GPU instance)."""
    where = f"GPU {device['index']}"
    return f"{where} {_instance_name(instance)}" if instance is not None else where


def _instance_name(instance: Mapping[str, Any]) -> str:
    name = f"GI {instance['gpu_instance']}"
    if instance["compute_instance"] is not None:
        name += f" CI {instance['compute_instance']}"
    return name


def _na(value: float | None, fmt: str = "{:.2f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def _gigabytes(rate: float | None) -> str:
    return _na(None if rate is None else rate / 1e9, "{:.1f}")


def _pair(now: float | None, best: float | None, scale: float, unit: str) -> str:
    if now is None:
        return "n/a"
    top = f"/{best / scale:.0f}" if best is not None else ""
    return f"{now / scale:.0f}{top} {unit}"


# (header, rows, per-cell colour codes), as _Text.table takes them
_Table = tuple[list[str], list[list[str]], list[list[str]]]


def _state_table(devices: list[Mapping[str, Any]]) -> _Table:
    header = ["GPU", "model", "up", "SM clock", "power", "temp", "clock events", "PCIe", "NVLink"]
    header.append("health")
    rows: list[list[str]] = []
    codes: list[list[str]] = []
    for d in devices:
        s, pcie = d["state"], d["state"]["pcie"]
        events = [e for e in s["clock_events_active"] if e != "gpu_idle"] or ["-"]
        throttled = any(e in THROTTLE_REASONS for e in events)
        link = "n/a"
        if pcie["generation"] is not None and pcie["width"] is not None:
            link = f"Gen{pcie['generation']:g} x{pcie['width']:g}"
            if pcie["max_generation"] is not None and pcie["max_width"] is not None:
                link += f" (max Gen{pcie['max_generation']:g} x{pcie['max_width']:g})"
        nvlink = _na(s["nvlink_links_active"], "{:.0f}")
        if s["nvlink_links"] == 0:
            nvlink = "none"
        elif s["nvlink_links"] is not None and s["nvlink_links_active"] is not None:
            nvlink = f"{s['nvlink_links_active']:.0f}/{s['nvlink_links']}"
        # A MIG GPU's count includes its instances' (a launch-bound instance is one).
        problems = len(d["problems"]) + sum(len(i["problems"]) for i in d["instances"])
        health = "ok" if not problems else f"{problems} problem(s)"
        rows.append(
            [
                str(d["index"]),
                d["model"] or "n/a",
                "yes" if d["up"] else "NO",
                _pair(s["sm_clock_hz"], s["sm_clock_max_hz"], 1e6, "MHz"),
                _pair(s["power_watts"], s["power_limit_watts"], 1.0, "W"),
                _na(s["temperature_celsius"], "{:.0f} C"),
                ",".join(events),
                link,
                nvlink,
                health,
            ]
        )
        red_if = ["", "", not d["up"], False, False, False, throttled, False, False]
        codes.append(["31" if bad else "" for bad in [*red_if, bool(problems)]])
    return header, rows, codes


def _profile_table(devices: list[Mapping[str, Any]], pods: bool = False) -> _Table:
    """One row per GPU, and under a MIG GPU one per instance (its util is its graphics-engine
    activity; the links are the GPU's, on the GPU's row); a pod column when pods were read."""
    header = ["GPU", "util", "SM", "tensor", "DRAM", "PCIe GB/s", "NVLink GB/s", "link", "class"]
    if pods:
        header.append("pod")
    rows: list[list[str]] = []
    codes: list[list[str]] = []
    for d in devices:
        p = d["profile"]
        mig = d["mig"] is not None and d["mig"]["current"] and d["up"]
        cls = d["class"] or "n/a (down)"
        code = _COLOURS.get(d["class"] or "", "31")
        if mig:
            count = len(d["instances"])
            cls, code = f"MIG: {count} instance{'' if count == 1 else 's'}", "1"
        row = [
            str(d["index"]),
            _na(p["utilization"]),
            _na(p["sm_active"]),
            _na(p["tensor_active"]),
            _na(p["dram_active"]),
            _gigabytes(p["pcie_bytes_per_second"]),
            _gigabytes(p["nvlink_bytes_per_second"]),
            _na(p["link_utilization"], "{:.0%}"),
            cls,
        ]
        rows.append([*row, _pod_names(d["pods"])] if pods else row)
        codes.append([""] * 8 + [code] + ([""] if pods else []))
        for i in d["instances"]:
            q = i["profile"]
            row = [
                f"  {_instance_name(i)} {i['mig_profile'] or ''}".rstrip(),
                _na(q["utilization"]),
                _na(q["sm_active"]),
                _na(q["tensor_active"]),
                _na(q["dram_active"]),
                "",
                "",
                "",
                i["class"] or "n/a",
            ]
            rows.append([*row, _pod_names(i["pods"])] if pods else row)
            codes.append([""] * 8 + [_COLOURS.get(i["class"] or "", "31")] + ([""] if pods else []))
    return header, rows, codes


def _pod_names(pods: list[Mapping[str, str]]) -> str:
    return ", ".join(f"{p['namespace']}/{p['pod']}" for p in pods) or "-"


if __name__ == "__main__":
    sys.exit(main())

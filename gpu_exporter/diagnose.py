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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from typing import Any, TextIO

from gpu_exporter import __version__
from gpu_exporter.classify import CLASSES, THROTTLE_REASONS, Classifier, Thresholds, Verdict
from gpu_exporter.series import DeviceView, SeriesBuilder
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
    simulated = False
    if args.simulate:
        from gpu_exporter import sim

        try:
            sim.install(sim.load_scenario(args.simulate))
        except ValueError as exc:  # ScenarioError names the file, field and line
            print(f"scenario error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        simulated = True
    try:
        return _diagnose(args, sys.stdout)
    finally:
        if simulated:
            from gpu_exporter import sim

            sim.uninstall()


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
        text = None if args.json else _Text(out, colour)
        if text:
            text.header(args.simulate, versions, topology, args.duration)
        profile = _run_profile(source.sample, args.duration, args.interval)
        report = build_report(args, versions, topology, profile)
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
    sample: Callable[[], list[DeviceSample]], duration: float, interval: float
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
        devices = classifier.process(sample(), time.monotonic())
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
) -> dict[str, Any]:
    devices = [
        _device_report(sample, profile, topology)
        for sample in sorted(profile.last.values(), key=lambda s: s.index)
    ]
    attention = any(d["problems"] for d in devices)
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
        "devices": devices,
        "needs_attention": attention,
        "exit_status": EXIT_ATTENTION if attention else EXIT_OK,
    }


def _device_report(last: DeviceView, profile: _Profile, topology: Topology) -> dict[str, Any]:
    sample = profile.last_up.get((last.index, last.uuid), last)
    # A GPU that is down at the end has no class: what limits it now is not known.
    verdict = profile.classifier.verdict(last.uuid) if last.up else None
    cls = verdict.cls if verdict else None
    state = _state(sample, topology)
    report = {
        "index": last.index,
        "uuid": last.uuid,
        "model": last.info.get("model"),
        "architecture": last.info.get("architecture"),
        "pci_bus_id": last.info.get("pci_bus_id"),
        "up": last.up,
        "down_reason": last.down_reason or None,
        "state": state,
        "profile": _profile_numbers(verdict, profile.classifier.seconds(last.uuid)),
        "class": cls,
        "class_reason": verdict.why if verdict else None,
        "next_steps": list(NEXT_STEPS[cls]) if cls else [],
    }
    report["problems"] = _problems(last, verdict, state, topology)
    return report


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
    last: DeviceView, verdict: Verdict | None, state: Mapping[str, Any], topology: Topology
) -> list[str]:
    if not last.up:
        return [f"GPU not answering: {last.down_reason or 'unknown reason'}"]
    out = _health_problems(state["health"])
    out += _link_problems(last.uuid, state, verdict, topology)
    if verdict is not None:
        out += _class_problems(verdict, state)
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
    uuid: str, state: Mapping[str, Any], verdict: Verdict | None, topology: Topology
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
    busy = verdict is not None and (verdict.stats.utilization or 0.0) >= 0.5
    for key, unit in (("generation", "Gen"), ("width", "x")):
        now, best = pcie[key], pcie[f"max_{key}"]
        if busy and now is not None and best is not None and now < best:
            out.append(f"PCIe link at {unit}{now:g} while busy; it can do {unit}{best:g}")
    return out


def _class_problems(verdict: Verdict, state: Mapping[str, Any]) -> list[str]:
    if verdict.cls in ATTENTION_CLASSES:
        return [f"{verdict.cls}: {verdict.why}"]
    active = [r for r in state["clock_events_active"] if r in THROTTLE_REASONS]
    if active:  # e.g. a power brake asserted on an idle GPU
        return [f"clocks held down by {', '.join(active)} ({verdict.cls})"]
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
        self.line(f"Profiling for {duration:g} s ...")
        self.out.flush()

    def body(self, report: Mapping[str, Any]) -> None:
        devices = report["devices"]
        self.section("3. GPU state")
        self.table(*_state_table(devices))
        self.section(f"4. Activity profile ({report['profile']['samples']} samples)")
        self.table(*_profile_table(devices))
        self.section("5. What to look at next")
        self._next_steps(devices)
        self.section("Needs attention")
        self._problems(devices)
        self.line()
        status = report["exit_status"]
        verdict = "something needs attention" if status else "nothing needs attention"
        self.line(f"Exit status {status}: {verdict}.")

    def _next_steps(self, devices: list[Mapping[str, Any]]) -> None:
        for cls in CLASSES:
            members = [d for d in devices if d["class"] == cls]
            if not members:
                continue
            gpus = ", ".join(str(d["index"]) for d in members)
            self.line(f"  {self.paint(cls, _COLOURS[cls])} (GPU {gpus})")
            for d in members:
                self.line(f"    GPU {d['index']}: {d['class_reason']}")
            for step in NEXT_STEPS[cls]:
                self.line(
                    textwrap.fill(step, 100, initial_indent="    - ", subsequent_indent="      ")
                )

    def _problems(self, devices: list[Mapping[str, Any]]) -> None:
        found = False
        for d in devices:
            for problem in d["problems"]:
                found = True
                self.line(f"  GPU {d['index']}: {self.paint(problem, '31')}")
        if not found:
            self.line("  nothing")


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
        health = "ok" if not d["problems"] else f"{len(d['problems'])} problem(s)"
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
        codes.append(["31" if bad else "" for bad in [*red_if, bool(d["problems"])]])
    return header, rows, codes


def _profile_table(devices: list[Mapping[str, Any]]) -> _Table:
    header = ["GPU", "util", "SM", "tensor", "DRAM", "PCIe GB/s", "NVLink GB/s", "link", "class"]
    rows: list[list[str]] = []
    codes: list[list[str]] = []
    for d in devices:
        p = d["profile"]
        rows.append(
            [
                str(d["index"]),
                _na(p["utilization"]),
                _na(p["sm_active"]),
                _na(p["tensor_active"]),
                _na(p["dram_active"]),
                _gigabytes(p["pcie_bytes_per_second"]),
                _gigabytes(p["nvlink_bytes_per_second"]),
                _na(p["link_utilization"], "{:.0%}"),
                d["class"] or "n/a (down)",
            ]
        )
        codes.append([""] * 8 + [_COLOURS.get(d["class"] or "", "31")])
    return header, rows, codes


if __name__ == "__main__":
    sys.exit(main())

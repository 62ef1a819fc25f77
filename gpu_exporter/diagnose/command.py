"""The command line of `gpu-exporter diagnose` and the run: NVML's start, the profile (the
daemon's series model, classifier and health rules fed each tick), the settings read after it,
then the report."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from importlib import metadata
from typing import TYPE_CHECKING, TextIO

from pydantic import ValidationError

from gpu_exporter import __version__
from gpu_exporter.collect.classify import Classifier
from gpu_exporter.collect.health_latch import HealthLatch
from gpu_exporter.collect.nvml.topology import Topology, read_topology
from gpu_exporter.collect.settings import (
    DcgmConfig,
    KubernetesConfig,
    NvmlConfig,
    ProcessesConfig,
    add_dcgm_arguments,
)
from gpu_exporter.collect.startup import StartupProgress
from gpu_exporter.diagnose.exit_status import EXIT_NO_DRIVER, EXIT_USAGE
from gpu_exporter.diagnose.health import HealthRules
from gpu_exporter.diagnose.report import PodsRead, Profile, Run, build_report
from gpu_exporter.diagnose.text import Text
from gpu_exporter.model.series import SeriesBuilder
from gpu_exporter.model.snapshot import DeviceSample, Snapshot, TickStats

if TYPE_CHECKING:  # the gRPC client (h2, protobuf) only when pods or processes are read
    from gpu_exporter.collect.k8s.labels import PodsOfTick
    from gpu_exporter.collect.k8s.process_attribution import ProcessAttribution

# How long NVML's start may take before diagnose gives up: as long as the source waits for one
# call before it counts it hung (nvmlInit without persistence mode takes seconds per GPU).
DEFAULT_START_TIMEOUT_SECONDS = NvmlConfig().hang_quarantine_seconds
MAX_START_TIMEOUT_SECONDS = 3600.0
KUBELET_SOCKET = KubernetesConfig().socket_path  # where the daemon looks by default
_SIMULATE_HINT = "run `gpu-exporter diagnose --simulate` to see a report on a simulated node"

Processor = Callable[[list[DeviceSample], float], list[DeviceSample]]


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
        f"instance (default: {KUBELET_SOCKET} when it exists and the node is not "
        "simulated)",
    )
    parser.add_argument(
        "--health-rules",
        action="append",
        metavar="FILE",
        help="rule files whose gpu-health group defines an unhealthy GPU (default: the "
        "shipped rule pack; repeat for several)",
    )
    parser.add_argument(
        "--processes",
        action="store_true",
        help="per-pod use of shared GPUs: map each GPU process to its container through the "
        "host's /proc and the container runtime (on by itself on a simulated node with "
        "processes)",
    )
    parser.add_argument(
        "--proc-root",
        default=ProcessesConfig().proc_root,
        metavar="PATH",
        help="with --processes: the host's /proc (default /proc)",
    )
    parser.add_argument(
        "--runtime-socket",
        default=ProcessesConfig().runtime_socket,
        metavar="PATH",
        help="with --processes: the container runtime's CRI socket (default auto: "
        "containerd's, CRI-O's or cri-dockerd's default, the first that exists)",
    )
    add_dcgm_arguments(parser, DcgmConfig().address)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--no-color", action="store_true", help="never colour the output")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "diagnose",
        help="one-shot report: health, steady and comparable, where the time goes, hot spots",
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
    try:
        DcgmConfig(address=args.dcgm_address)
    except ValidationError as exc:  # as serve refuses it, in its words
        return f"--dcgm-address: {exc.errors()[0]['msg'].removeprefix('Value error, ')}"
    for flag, key in (("--proc-root", "proc_root"), ("--runtime-socket", "runtime_socket")):
        try:
            ProcessesConfig.model_validate({key: getattr(args, key)})
        except ValidationError as exc:
            return f"{flag}: {exc.errors()[0]['msg']}"
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
            for problem in str(exc).splitlines():  # one line per problem, each on its own
                print(f"scenario error: {problem}", file=sys.stderr)
            return EXIT_USAGE
        fake = sim.install(scenario)
        simulated = True
        if args.dcgm is None and scenario.dcgm is not None:
            args.dcgm = "auto"  # the simulated node runs a host engine for the exporter
        if args.kubelet_socket is None and scenario.pods:
            from gpu_exporter.sim.kubelet import start_for

            # The scenario's pods as a kubelet reports them, on the fake NVML's clock.
            kubelet = start_for(scenario, fake.clock)
            args.kubelet_socket = kubelet.socket_path if kubelet is not None else None
        node = sim.installed_node()
        if node is not None:  # the scenario's /proc and runtime, where not given
            defaults = ProcessesConfig()
            args.processes = True
            if args.proc_root == defaults.proc_root:
                args.proc_root = str(node.proc_root)
            if args.runtime_socket == defaults.runtime_socket:
                args.runtime_socket = str(node.cri_socket_path)
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


def _read_pods(args: argparse.Namespace) -> tuple[PodsRead, PodsOfTick | None]:
    """The kubelet's pods, read once (a profile is short: pods do not move during it), and
    what adds gpu_pod_info to each tick's samples (None: no pods)."""
    socket = args.kubelet_socket
    if socket is None:
        if args.simulate or not os.path.exists(KUBELET_SOCKET):
            return PodsRead(None, False), None
        socket = KUBELET_SOCKET
    # the gRPC client (h2, protobuf) only when pods are read
    from gpu_exporter.collect.k8s.attribution import PodAttribution
    from gpu_exporter.collect.k8s.labels import PodsOfTick

    attribution = PodAttribution(KubernetesConfig(socket_path=socket))
    if not attribution.refresh():
        return PodsRead(socket, False), None
    pods = PodsRead(socket, True, len(attribution.pods_by_device()))
    return pods, PodsOfTick(attribution)


def _processors(
    args: argparse.Namespace, pods: PodsRead, of_tick: PodsOfTick | None
) -> tuple[PodsRead, list[Processor], ProcessAttribution | None]:
    """The pod processors of each tick: gpu_pod_info, then with --processes per-pod use
    (its container runtime started: the caller stops it)."""
    processors: list[Processor] = [] if of_tick is None else [of_tick.process]
    if not args.processes:
        return pods, processors, None
    from gpu_exporter.collect.k8s.process_attribution import ProcessAttribution

    settings = ProcessesConfig(
        enabled=True, proc_root=args.proc_root, runtime_socket=args.runtime_socket
    )
    attribution = (
        ProcessAttribution(settings)
        if of_tick is None
        else ProcessAttribution(settings, of_tick.holders)
    )
    attribution.start()  # one bounded refresh now, then on its thread
    processors.append(attribution.process)
    runtime = attribution.runtime
    return (
        replace(pods, runtime_socket=runtime.socket, runtime_read=runtime.up),
        processors,
        attribution,
    )


def _load_health_rules(args: argparse.Namespace) -> HealthRules | str:
    """The health rules, or why they cannot be used (a file:line error from the loader)."""
    from gpu_exporter.alerting.rules.loader import RuleFileError

    try:
        return HealthRules(args.health_rules or None)
    except RuleFileError as exc:
        return f"--health-rules: {exc}"


def _diagnose(args: argparse.Namespace, out: TextIO) -> int:
    from gpu_exporter.collect import dcgm
    from gpu_exporter.collect.nvml.device_config import read_device_config
    from gpu_exporter.collect.nvml.source import NvmlSource
    from gpu_exporter.collect.source import ErrorLog, SourceUnavailableError

    health = _load_health_rules(args)
    if isinstance(health, str):
        print(f"gpu-exporter diagnose: {health}", file=sys.stderr)
        return EXIT_USAGE
    errors = ErrorLog()
    try:
        dcgm_source = dcgm.configured(
            DcgmConfig(mode=args.dcgm or "off", address=args.dcgm_address), errors, args.interval
        )
    except SourceUnavailableError as exc:
        print(f"gpu-exporter diagnose: {exc}", file=sys.stderr)
        return EXIT_USAGE
    source = NvmlSource(
        # The static data once is enough for a short profile.
        settings=NvmlConfig(slow_refresh_seconds=3600.0, processes=args.processes),
        interval_seconds=args.interval,
        errors=errors,
        topology_reader=read_topology,
        dcgm=dcgm_source,
    )
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
        pods, of_tick = _read_pods(args)
        pods, processors, attribution = _processors(args, pods, of_tick)
        text = None if args.json else Text(out, colour)
        if text:
            text.header(args.simulate, args.duration, pods)
        try:
            profile = _run_profile(source.sample, args.duration, args.interval, health, processors)
        finally:
            if attribution is not None:
                attribution.stop()
        # The settings once, after the profile: no extra NVML calls while it measures.
        profile.config = source.read_each_device(read_device_config, source.deadline_seconds)
        run = Run(args.simulate, args.duration, args.interval)
        report = build_report(run, versions, topology, profile, pods)
        if text:
            text.body(report)
        else:
            out.write(json.dumps(report, indent=2) + "\n")
        return int(report["exit_status"])
    finally:
        source.close()


def _not_started(progress: StartupProgress, timeout: float) -> str:
    """Why the GPUs cannot be sampled after waiting up to `timeout` for NVML's start ("" once
    they can): its error, or the step that has not answered and for how long."""
    from gpu_exporter.collect.source import SourceUnavailableError

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
    health: HealthRules,
    processors: Sequence[Processor] = (),
) -> Profile:
    # One window over the whole profile: the class describes all of it, not its last seconds.
    classifier = Classifier(window_seconds=duration + interval)
    # The health verdict the rule pack's health alerts read, and the report shows.
    latch = HealthLatch()
    profile = Profile(classifier, health, latch=latch)
    builder = SeriesBuilder()  # the daemon's own series model: diagnose reads what it exports
    ticks = max(2, round(duration / interval) + 1)  # GPM needs two samples for one window
    start = time.monotonic()
    for tick in range(ticks):
        delay = start + tick * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        now = time.monotonic()
        devices = latch.process(classifier.process(sample(), now), now)
        profile.links.observe(devices, classifier)  # which link link-bound seconds waited on
        for processor in processors:  # pod info, then per-pod use
            devices = processor(devices, now)
        wall = time.time()
        # The tick's own stats, as the sampler's: the exporter's alerts see a live exporter.
        stats = TickStats(ticks=tick + 1, last_tick_timestamp=wall)
        series_set = builder.build(Snapshot(wall, tuple(devices), stats=stats))
        health.observe(series_set)
        for view in series_set.devices():
            profile.last[view.index] = view
            profile.pods.observe(view)
            profile.watch.observe(view)  # clocks and settings, tick by tick
        profile.pods.tick()
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

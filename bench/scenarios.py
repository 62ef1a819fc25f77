"""Scenarios and rule files generated for the benchmarks (plain dicts, written as YAML).

Devices are the 8 behaviours of the built-in `mixed` scenario, repeated: "64 devices" means
64 full GPUs (8 HGX boards' worth). `generate_mig` partitions such GPUs into MIG instances
(the simulator's `mig:` mapping, docs/scenarios.md "MIG"), so "8 GPUs x 7 instances" is 64
series-producing devices too: 8 parents plus 56 instances.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gpu_exporter.sim.mig import GPU_SLICES, INSTANCE_QUANTITIES
from gpu_exporter.sim.values import GIB, MIB

HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
PCIE_BYTE_FIELDS = (197, 198)  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES / RX_BYTES
# The fake's default latency model for a "real NVML" variant: ~0.36 ms per call, the only
# published per-call figure (about 2,743 nvmlDeviceGetPowerUsage calls a second on a Tesla
# K40m, wookayin/gpustat#76), plus the documented 20 ms window of the PCIe throughput call.
NVML_LIKE_LATENCY = {"default_ms": 0.36, "functions": {"nvmlDeviceGetPcieThroughput": 20}}


def builtin(name: str = "mixed") -> dict[str, Any]:
    """A built-in scenario as a mutable dict."""
    text = (resources.files("gpu_exporter.sim") / "scenarios" / f"{name}.yaml").read_text()
    return yaml.safe_load(text)


def bus_id(index: int) -> str:
    """Unique PCI bus ids past 8 GPUs: one PCI domain per 8-GPU board."""
    return f"{index // len(HGX_BUSES):04X}:{HGX_BUSES[index % len(HGX_BUSES)]:02X}:00.0"


def generate(
    devices: int,
    *,
    name: str | None = None,
    latency: Mapping[str, Any] | None = None,
    pcie_byte_fields: bool = True,
    faults: Sequence[Mapping[str, Any]] = (),
    base: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """`devices` GPUs cycling through `base`'s devices (default: `mixed`).

    `latency` replaces the scenario's latency model; `pcie_byte_fields=False` makes the driver
    lack the PCIe byte-counter fields, so readers fall back to the 20 ms throughput call.
    """
    if devices < 1:
        raise ValueError("at least one device")
    scenario = copy.deepcopy(dict(base) if base is not None else builtin("mixed"))
    templates = scenario["devices"]
    generated = []
    for index in range(devices):
        device = copy.deepcopy(templates[index % len(templates)])
        device["label"] = f"{device.get('label', 'gpu')}-{index}"
        device["pci_bus_id"] = bus_id(index)
        device["numa_node"] = index * 2 // max(devices, 2) if devices > 1 else 0
        generated.append(device)
    scenario["devices"] = generated
    # No pods: a scenario's pods start a fake kubelet and pod attribution, which every
    # measurement here (and its committed baselines) leaves out; their indices fit 8 GPUs only.
    scenario.pop("pods", None)
    scenario["name"] = name or f"bench-{devices}gpu"
    scenario["description"] = f"{devices} GPUs generated from {scenario.get('name')} for bench/"
    if latency is not None:
        scenario["latency"] = dict(latency)
    if not pcie_byte_fields:
        driver = scenario.setdefault("driver", {})
        fields = set(driver.get("unsupported_fields", [])) | set(PCIE_BYTE_FIELDS)
        driver["unsupported_fields"] = sorted(fields)
    if faults:
        scenario["faults"] = [*scenario.get("faults", []), *map(dict, faults)]
    return scenario


# What a MIG parent does not report itself (NVML: utilization is not supported under MIG;
# memory and GPM activity are the instances'): removed from the parents' values.
PARENT_ACTIVITY = ("utilization", "memory_utilization", *INSTANCE_QUANTITIES)
MIG_PROFILE = "1g.18gb"  # the H200's smallest GPU instance: 7 fit on one GPU
FIRST_1G_GPU_INSTANCE = 7  # NVML's GPU-instance ids for 1-slice profiles are 7..13
# A 1g instance serving inference, and one spinning on tiny kernels (the engine busy, the SMs
# not): the `mig` scenario's "serving" anchor and its launch-bound GI 9.
MIG_SERVING: dict[str, Any] = {
    "graphics_active": {"sine": {"mean": 0.9, "amplitude": 0.03, "period": 20}},
    "sm_active": {"sine": {"mean": 0.75, "amplitude": 0.03, "period": 20}, "noise": 0.01},
    "sm_occupancy": 0.45,
    "tensor_active": {"sine": {"mean": 0.55, "amplitude": 0.03, "period": 25}},
    "dram_active": 0.45,
    "fp16_active": 0.2,
    "memory_used_bytes": 15032385536,
}
MIG_LAUNCH_BOUND: dict[str, Any] = {
    "graphics_active": 0.95,
    "sm_active": {"sine": {"mean": 0.1, "amplitude": 0.02, "period": 20}, "noise": 0.01},
    "sm_occupancy": 0.04,
    "tensor_active": 0.01,
    "dram_active": 0.04,
    "memory_used_bytes": 4294967296,
}
# An idle whole GPU's parked clocks and power make no sense on a parent of busy instances.
_IDLE_ONLY = ("clock_event_reasons", "sm_clock_mhz", "power_watts", "temperature_celsius")
MIG_PARENT_POWER: dict[str, Any] = {
    "sine": {"mean": 420, "amplitude": 10, "period": 30},
    "noise": 4,
}


def mig_instances(gpu: int, count: int) -> list[dict[str, Any]]:
    """`count` 1g.18gb instances of GPU `gpu`: all serving but one launch-bound (a different
    one on each GPU)."""
    if not 1 <= count <= GPU_SLICES:
        raise ValueError(f"1 to {GPU_SLICES} 1-slice instances fit on one GPU, not {count}")
    launch_bound = gpu % count
    return [
        {
            "profile": MIG_PROFILE,
            "gpu_instance": FIRST_1G_GPU_INSTANCE + position,
            "values": copy.deepcopy(MIG_LAUNCH_BOUND if position == launch_bound else MIG_SERVING),
        }
        for position in range(count)
    ]


def generate_mig(
    devices: int,
    instances_per_gpu: int = GPU_SLICES,
    *,
    name: str | None = None,
    latency: Mapping[str, Any] | None = None,
    pcie_byte_fields: bool = True,
) -> dict[str, Any]:
    """`generate(devices)` (H200s, `mixed`'s behaviours) with MIG on every GPU, each
    partitioned as `instances_per_gpu` x 1g.18gb (see `mig_instances`).

    The parents keep their power, temperature, clock, clock-event and link behaviours (so the
    parent series match the whole-GPU configurations'); their activity and memory values go,
    since under MIG those are the instances'. The daemon is unprivileged (no MIG monitor
    capability), as in the built-in `mig` scenario.
    """
    scenario = generate(
        devices,
        name=name or f"bench-{devices}gpu-mig-{instances_per_gpu}x1g",
        latency=latency,
        pcie_byte_fields=pcie_byte_fields,
    )
    for gpu, device in enumerate(scenario["devices"]):
        values = {k: v for k, v in device.get("values", {}).items() if k not in PARENT_ACTIVITY}
        if "gpu_idle" in (values.get("clock_event_reasons") or []):
            values = {k: v for k, v in values.items() if k not in _IDLE_ONLY}
            values["power_watts"] = copy.deepcopy(MIG_PARENT_POWER)
        device["values"] = values
        device["label"] = f"mig-{device['label']}"
        device["mig"] = {"instances": mig_instances(gpu, instances_per_gpu)}
    scenario["description"] = (
        f"{devices} H200s, each as {instances_per_gpu} x {MIG_PROFILE}, generated for bench/"
    )
    return scenario


def thermal_faults(devices: int, faults: Sequence[tuple[int, float]]) -> dict[str, Any]:
    """`generate(devices)` where each (gpu, at) GPU enters HW thermal slowdown at scenario
    time `at` (clock-event reasons step from none to hw_slowdown + hw_thermal_slowdown)."""
    scenario = generate(devices, name="bench-thermal-faults")
    for gpu, at in faults:
        values = scenario["devices"][gpu].setdefault("values", {})
        throttled = ["hw_slowdown", "hw_thermal_slowdown"]
        values["clock_event_reasons"] = {"steps": [[0, []], [at, throttled]]}
        values["temperature_celsius"] = {"steps": [[0, 60], [at, 92]]}
    return scenario


# -- processes on the GPUs (per-process attribution) -----------------------------------------

# Who runs on each GPU of an 8-GPU board, repeated past 8: (namespace, pod, container, replica,
# processes, SM share of each, kind). `replica`: the time-slicing (or MPS) share the kubelet
# reports the container holding (None: the whole GPU; "-": the container holds nothing, as a
# sidecar that sees the GPU anyway or the MPS control daemon); pod None: a host process.
# Ten processes a GPU; pod names get the GPU's index.
ProcessHolder = tuple[str | None, str, str, int | str | None, int, float, str]
PROCESS_LAYOUTS: tuple[tuple[ProcessHolder, ...], ...] = (
    (  # time-sliced by four pods: a fine-tune, two light ones and an idle notebook
        ("research", "llm-finetune", "trainer", 0, 4, 0.15, "compute"),
        ("research", "embed-batch", "worker", 1, 3, 0.05, "compute"),
        ("research", "eval", "worker", 2, 2, 0.02, "compute"),
        ("research", "notebook", "notebook", 3, 1, 0.0, "compute"),
    ),
    (  # MPS: the device plugin's control daemon and three client pods of three processes
        ("nvidia-device-plugin", "mps-control-daemon", "mps-ctr", "-", 1, 0.0, "mps_server"),
        ("infer", "asr", "server", 0, 3, 0.1, "mps"),
        ("infer", "tts", "server", 1, 3, 0.05, "mps"),
        ("infer", "ocr", "server", 2, 3, 0.05, "mps"),
    ),
    (  # exclusive: one pod, its trainer's eight processes and a sidecar's two
        ("train", "pretrain", "trainer", None, 8, 0.1, "compute"),
        ("train", "pretrain", "profiler", "-", 2, 0.0, "compute"),
    ),
    (  # time-sliced by two serving pods
        ("infer", "serve-a", "server", 0, 6, 0.1, "compute"),
        ("infer", "serve-b", "server", 1, 4, 0.08, "compute"),
    ),
    (  # exclusive, and a host process outside Kubernetes
        ("infer", "llm-server", "server", None, 9, 0.1, "compute"),
        (None, "ollama", "", "-", 1, 0.05, "compute"),
    ),
    tuple(  # time-sliced by five pods of two processes
        ("batch", f"sweep{n}", "solver", n, 2, 0.04, "compute") for n in range(5)
    ),
    (("train", "ddp", "trainer", None, 10, 0.09, "compute"),),  # exclusive, ten ranks' workers
    (  # time-sliced by two pods, one of them idle
        ("batch", "etl-a", "worker", 0, 5, 0.1, "compute"),
        ("batch", "etl-b", "worker", 1, 5, 0.0, "compute"),
    ),
)
FIRST_PID = 100_000  # GPU g's processes are FIRST_PID + 100 g + 0..99


def process_layout(gpu: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The `pods:` and `processes:` entries of GPU `gpu` (`PROCESS_LAYOUTS`, cycling)."""
    pods: list[dict[str, Any]] = []
    processes: list[dict[str, Any]] = []
    for namespace, pod, container, replica, count, sm, kind in PROCESS_LAYOUTS[
        gpu % len(PROCESS_LAYOUTS)
    ]:
        name = f"{pod}-{gpu}"
        owner = None
        if namespace is not None:
            owner = {"namespace": namespace, "pod": name, "container": container}
        if owner is not None and replica != "-":
            holder = {**owner, "gpu": gpu}
            if replica is not None:
                holder["replica"] = replica
            pods.append(holder)
        for _ in range(count):
            entry: dict[str, Any] = {
                "pid": FIRST_PID + 100 * gpu + len(processes),
                "gpu": gpu,
                "kind": kind,
                "memory_bytes": 2 * GIB if sm else 512 * MIB,
            }
            if owner is None:
                entry["name"] = pod
            else:
                entry["pod"] = dict(owner)
            if sm:
                entry["utilization"] = {"sm": sm, "memory": sm / 2}
            processes.append(entry)
    return pods, processes


def generate_processes(devices: int, *, name: str | None = None) -> dict[str, Any]:
    """`generate(devices)` with pods and 10 processes on every GPU (`PROCESS_LAYOUTS`): GPUs
    time-sliced by two to five pods, an MPS GPU, exclusive pods (one with a second container
    that holds no GPU), a host process and idle processes. Its `pods:` start a fake kubelet
    and its `processes:` the simulated node's /proc and CRI runtime (sim.install)."""
    scenario = generate(devices, name=name or f"bench-{devices}gpu-processes")
    pods: list[dict[str, Any]] = []
    processes: list[dict[str, Any]] = []
    for gpu in range(devices):
        held, running = process_layout(gpu)
        pods += held
        processes += running
    scenario["pods"] = pods
    scenario["processes"] = processes
    scenario["description"] = (
        f"{devices} GPUs generated from mixed for bench/, each with 10 processes of pods"
    )
    return scenario


def add_job_churn(
    scenario: dict[str, Any],
    *,
    until: float,
    every: float,
    gpu: int = 7,
    replica: int = 2,
    processes: int = 2,
) -> dict[str, Any]:
    """Batch jobs coming and going on one time-slicing share of `gpu`, up to scenario time
    `until`: job n is the pod `batch/job-<n>` from `n * every` for 80 % of `every`, with
    `processes` processes, so new pods (new UIDs, new per-pod series) appear and old ones end
    all run long. Jobs n and n + 2 use the same PIDs (another pod, a later start time): the
    reuse a busy node shows. Changes `scenario` (one with `pods:` and `processes:`) in place."""
    if every <= 0 or until <= 0:
        raise ValueError("job churn needs a positive period and end")
    devices = len(scenario["devices"])
    if not 0 <= gpu < devices:
        raise ValueError(f"job churn on GPU {gpu}: the scenario has {devices} GPUs")
    first_pid = FIRST_PID + 100 * devices  # past every GPU's own processes
    jobs = int(-(-until // every))  # ceil
    for n in range(jobs):
        start = n * every
        owner = {"namespace": "batch", "pod": f"job-{n}", "container": "worker"}
        span = {"from": start, "until": start + 0.8 * every}
        scenario["pods"].append({**owner, "gpu": gpu, "replica": replica, **span})
        for k in range(processes):
            scenario["processes"].append(
                {
                    "pid": first_pid + processes * (n % 2) + k,
                    "gpu": gpu,
                    "pod": dict(owner),
                    "memory_bytes": 1 * GIB,
                    "utilization": {"sm": 0.05, "memory": 0.02},
                    **span,
                }
            )
    return scenario


def write_yaml(data: Mapping[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(data), sort_keys=False))
    return path


# -- rule files --------------------------------------------------------------------------------

_RULE_SHAPES = (
    # {gpu}, {threshold} and {fraction} are filled per rule.
    'gpu_power_watts{{gpu="{gpu}"}} > {threshold}',
    'rate(gpu_clock_event_seconds_total{{gpu="{gpu}",reason="hw_slowdown"}}[5m]) > {fraction}',
    'avg_over_time(gpu_temperature_celsius{{gpu="{gpu}",sensor="gpu"}}[1m]) > {threshold}',
)


def rule_expressions(series: int, devices: int = 8) -> list[str]:
    """`series` alerting-rule expressions, each selecting exactly one series of one GPU.

    Shapes rotate through an instant comparison, a 5-minute rate and a 1-minute average, so
    the store keeps realistic histories; thresholds vary so that rules are not duplicates.
    """
    out = []
    for index in range(series):
        template = _RULE_SHAPES[index % len(_RULE_SHAPES)]
        out.append(
            template.format(
                gpu=index % devices,
                threshold=100 + index,
                fraction=f"{0.5 + index / (10 * max(series, 1)):.6f}",
            )
        )
    return out


def rule_file(series: int, devices: int = 8, group_size: int = 100) -> dict[str, Any]:
    """A rule file of `series` alerting rules (see `rule_expressions`) in groups."""
    return alert_rule_file(rule_expressions(series, devices), group_size)


# Rules as users write them with subqueries and the functions beyond the first subset, over
# the daemon's own families: `{gpu}` is filled once per GPU. Each selects one GPU's series.
SUBQUERY_SHAPES_PER_GPU = (
    # idle for 10 minutes: no 1-minute average above 10 % in that time
    'max_over_time(avg_over_time(gpu_utilization_ratio{{gpu="{gpu}"}}[1m])[10m:1m]) < 0.1',
    # heading for 90 degrees within 10 minutes
    'predict_linear(gpu_temperature_celsius{{gpu="{gpu}",sensor="gpu"}}[10m], 600) > 90',
    'quantile_over_time(0.9, gpu_power_watts{{gpu="{gpu}"}}[5m]) > 650',
    # sustained draw: the lowest 1-minute power (from the energy counter) of 5 minutes
    'min_over_time(rate(gpu_energy_joules_total{{gpu="{gpu}"}}[1m])[5m:30s]) > 600',
    'label_replace(avg_over_time(gpu_sm_active_ratio{{gpu="{gpu}"}}[5m]),'
    ' "device", "GPU $1", "gpu", "(.+)") < 0.2',
    # an SM clock that will not settle
    'stddev_over_time(gpu_clock_hertz{{gpu="{gpu}",clock="sm"}}[5m]) > 1e8',
    # memory that keeps growing (a leak), bytes per second over 10 minutes
    'deriv(gpu_memory_used_bytes{{gpu="{gpu}"}}[10m]) > 1e7',
    # busy but the SMs are not: launch-bound over 5 minutes
    'avg_over_time(gpu_sm_active_ratio{{gpu="{gpu}"}}[5m:15s])'
    ' / clamp_min(avg_over_time(gpu_utilization_ratio{{gpu="{gpu}"}}[5m:15s]), 0.01) < 0.3',
    # in HW thermal slowdown a quarter of the last 10 minutes (by the throttle-time counter,
    # which the default metrics profile exports in place of the sampled reason bit)
    'avg_over_time(rate(gpu_clock_event_seconds_total{{gpu="{gpu}",reason="hw_thermal_slowdown"}}'
    "[1m])[10m:30s]) > 0.25",
    'max_over_time(deriv(gpu_temperature_celsius{{gpu="{gpu}",sensor="memory"}}[2m])[10m:1m])'
    " > 0.5",
    'max_over_time(irate(gpu_pcie_bytes_total{{gpu="{gpu}",direction="rx"}}[1m])[5m:10s]) > 2e10',
    # an SM clock that keeps changing (gpu_performance_state is not in the default profile)
    'changes(gpu_clock_hertz{{gpu="{gpu}",clock="sm"}}[15m]) > 40',
)
# ... and over the whole node, once each.
SUBQUERY_SHAPES_NODE = (
    "topk(3, avg_over_time(gpu_power_watts[5m])) > 600",
    "bottomk(2, quantile_over_time(0.5, gpu_utilization_ratio[10m:1m])) < 0.05",
    'sum by (reason) (max_over_time(rate(gpu_clock_event_seconds_total{reason=~"hw_.*"}[1m])'
    "[10m:1m])) > 0",
    'count(max_over_time(gpu_temperature_celsius{sensor="gpu"}[5m]) > 85) > 2',
)


def subquery_rule_expressions(devices: int = 8) -> list[str]:
    """Each of `SUBQUERY_SHAPES_PER_GPU` for every GPU, then `SUBQUERY_SHAPES_NODE`: 100
    rules at 8 GPUs, as many as the 100-rule-series file."""
    per_gpu = [shape.format(gpu=gpu) for shape in SUBQUERY_SHAPES_PER_GPU for gpu in range(devices)]
    return [*per_gpu, *SUBQUERY_SHAPES_NODE]


def subquery_rule_file(devices: int = 8, group_size: int = 100) -> dict[str, Any]:
    """A rule file of `subquery_rule_expressions` in groups."""
    return alert_rule_file(subquery_rule_expressions(devices), group_size)


def alert_rule_file(expressions: Sequence[str], group_size: int = 100) -> dict[str, Any]:
    """Alerting rules for `expressions` (`for: 1m`, one severity label and annotation), in
    groups of `group_size`, evaluated at the daemon's default interval."""
    groups = []
    for start in range(0, len(expressions), group_size):
        chunk = expressions[start : start + group_size]
        rules = [
            {
                "alert": f"BenchRule{start + offset}",
                "expr": expr,
                "for": "1m",
                "labels": {"severity": "none"},
                "annotations": {"summary": "GPU {{ $labels.gpu }} bench rule"},
            }
            for offset, expr in enumerate(chunk)
        ]
        groups.append({"name": f"bench-{start // group_size}", "rules": rules})
    return {"groups": groups}


def detection_rule_file(shipped_rule: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The rule both detection paths evaluate: HW thermal slowdown time counted, no `for`.

    `shipped_rule` (a rule mapping from the shipped pack) is added as a second rule, to
    measure a realistic rule with a `for` too.
    """
    rules: list[dict[str, Any]] = [
        {
            "alert": "BenchHwThermalSlowdown",
            # The driver's throttle-time counter, which the default metrics profile exports in
            # place of the sampled reason bit: up since the sample before, the tick after.
            "expr": 'increase(gpu_clock_event_seconds_total{reason="hw_thermal_slowdown"}[1m]) > 0',
            "labels": {"severity": "warning"},
            "annotations": {"summary": "GPU {{ $labels.gpu }} in HW thermal slowdown"},
        }
    ]
    if shipped_rule is not None:
        rules.append(dict(shipped_rule))
    return {"groups": [{"name": "bench-detection", "rules": rules}]}


def shipped_rule(name: str) -> dict[str, Any]:
    """One alerting rule of the shipped pack, by alert name."""
    text = (
        resources.files("gpu_exporter.alerting") / "rulepack" / "gpu-exporter.rules.yaml"
    ).read_text()
    for group in yaml.safe_load(text)["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == name:
                return rule
    raise KeyError(name)

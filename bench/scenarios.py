"""Scenarios and rule files generated for the benchmarks (plain dicts, written as YAML).

Devices are the 8 behaviours of the built-in `mixed` scenario, repeated. MIG instances are
not simulated by the fake, so "64 devices" means 64 full GPUs (8 HGX boards' worth).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
PCIE_BYTE_FIELDS = (197, 198)  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES / RX_BYTES
# The fake's default latency model for a "real NVML" variant: ~0.36 ms per call, the only
# published per-call figure (nvitop/gpustat, reference/nvml.md section 10.4), plus the
# documented 20 ms window of the PCIe throughput call.
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
    expressions = rule_expressions(series, devices)
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
    """The rule both detection paths evaluate: HW thermal slowdown active, no `for`.

    `shipped_rule` (a rule mapping from the shipped pack) is added as a second rule, to
    measure a realistic rule with a `for` too.
    """
    rules: list[dict[str, Any]] = [
        {
            "alert": "BenchHwThermalSlowdown",
            "expr": 'gpu_clock_event_active{reason="hw_thermal_slowdown"} == 1',
            "labels": {"severity": "warning"},
            "annotations": {"summary": "GPU {{ $labels.gpu }} in HW thermal slowdown"},
        }
    ]
    if shipped_rule is not None:
        rules.append(dict(shipped_rule))
    return {"groups": [{"name": "bench-detection", "rules": rules}]}


def shipped_rule(name: str) -> dict[str, Any]:
    """One alerting rule of the shipped pack, by alert name."""
    text = (resources.files("gpu_exporter") / "rulepack" / "gpu-exporter.rules.yaml").read_text()
    for group in yaml.safe_load(text)["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == name:
                return rule
    raise KeyError(name)

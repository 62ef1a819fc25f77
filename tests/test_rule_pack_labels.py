"""The shipped rule pack keeps the target labels of the series it alerts on.

On the Prometheus path every scraped series carries the labels relabeling adds (`node`; with pod
attribution `namespace`, `pod`, `container` on every per-GPU reading; often `cluster`). The
daemon evaluates the same rules on series without `node` and adds `node` as an external label.
Alertmanager deduplicates the two copies of an alert only when their label sets are equal, so
a rule must never drop a label of the series it alerts on: an `on (...)` one-to-one match or an
aggregation that leaves `node` or the pod labels out splits every alert in two.

For every shipped alerting rule, each scenario below gives input series (values taken from
rules/tests/) that make it fire. The test adds the target labels to the input series, in three
variants (VARIANTS), and expects the alert to carry every label of the scenario's first series
(the series the alert is about) except those listed in DROPPED_ON_PURPOSE, plus the rule's own
labels. It runs the expectation on the daemon's evaluator (`gpu-exporter rules test`'s runner)
and on promtool, from the same generated promtool unit-test files, so both must agree.

The recording rules aggregate on purpose (by namespace, node, cluster); what they promise is to
keep `cluster`, which test_recording_rules_keep_cluster checks on both evaluators.
"""

from __future__ import annotations

import math
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter.alerting.rules import promql
from gpu_exporter.alerting.rules.engine import GroupEvaluator
from gpu_exporter.alerting.rules.loader import Rule, load_rule_files, parse_duration
from gpu_exporter.alerting.rules.series_notation import load_input_series, parse_series
from gpu_exporter.alerting.rules.unit_tests import run_test_file
from gpu_exporter.alerting.store import Labels, SeriesStore
from tests.support import promtool, require_tool

ROOT = Path(__file__).resolve().parent.parent
RULE_FILES = sorted((ROOT / "rules").glob("*.yaml"))
ALERTING_RULES: dict[str, Rule] = {
    rule.name: rule
    for group in load_rule_files(RULE_FILES)
    for rule in group.rules
    if rule.is_alert
}

TARGET_LABELS = {
    "node": "node-7",
    "namespace": "team-a",
    "pod": "train-0",
    "container": "trainer",
    "cluster": "eu-1",
}
POD_LABELS = ("namespace", "pod", "container")
GPU_LABELS = {"gpu": "0", "uuid": "GPU-0"}
# A MIG instance's own labels (its parent's gpu and uuid come from GPU_LABELS), on the instance
# series of the MIG scenarios: the efficiency alerts keep them, and the parent's alerts join
# them on (gpu, uuid).
MIG = 'gpu_instance="9",mig_uuid="MIG-0009",mig_profile="1g.18gb"'
# Per-GPU families that exporters before gpu_exporter/model/series.py did not pod-label.
NOT_POD_LABELLED_BEFORE = frozenset({"gpu_info", "gpu_up"})

# Labels of the alerted series that a rule leaves out on purpose: rule -> {label: reason}.
# Never a target label: node, namespace, pod, container and cluster must always survive.
DROPPED_ON_PURPOSE: dict[str, dict[str, str]] = {
    "GpuPcieLinkWidthDegraded": {
        "state": 'the rule compares the link\'s state="current" series with its state="max" '
        "series (`ignoring (state)`); the alert is about the link, not one side of it",
    },
    "GpuPcieLinkGenerationDegraded": {
        "state": 'the rule compares the link\'s state="current" series with its state="max" '
        "series (`ignoring (state)`); the alert is about the link, not one side of it",
    },
}


@dataclass(frozen=True)
class Scenario:
    alert: str
    eval_time: str
    # (series without target labels, promtool values). The first is the series the alert is
    # about; series of per-GPU metrics (gpu_*, not gpu_exporter_*) get gpu="0",uuid="GPU-0".
    series: tuple[tuple[str, str], ...]
    branch: str = ""

    @property
    def id(self) -> str:
        return f"{self.alert}-{self.branch}" if self.branch else self.alert


SCENARIOS = [
    # --- gpu-efficiency ----------------------------------------------------------------------
    Scenario(
        "GpuBusyButIdle",
        "10m",
        (
            ("gpu_utilization_ratio", "0.97x40"),
            ("gpu_sm_active_ratio", "0.12x40"),
            ('gpu_bottleneck{class="link_bound"}', "0x40"),
        ),
    ),
    Scenario(
        "GpuActivityMetricsUnavailable",
        "20m",
        # Awaited on the first sample only (GPM's first window), then missing for good.
        (("gpu_utilization_ratio", "0.9x40"), ("gpu_activity_awaited", "1 stale")),
        branch="missing",
    ),
    Scenario(
        "GpuActivityMetricsUnavailable",
        "20m",
        (("gpu_utilization_ratio", "0.99x40"), ("gpu_sm_active_ratio", "0x40")),
        branch="stuck-at-zero",
    ),
    Scenario(
        "GpuTensorCoresIdle",
        "15m",
        (
            ("gpu_sm_active_ratio", "0.85x40"),
            ("gpu_tensor_active_ratio", "0.02x40"),
            ('gpu_info{architecture="hopper"}', "1x40"),
            ("gpu_dram_active_ratio", "0.3x40"),
        ),
    ),
    Scenario(
        "GpuMemoryBandwidthBound",
        "15m",
        (("gpu_dram_active_ratio", "0.9x40"), ("gpu_tensor_active_ratio", "0.1x40")),
    ),
    Scenario(
        "GpuLinkBound",
        "10m",
        (('gpu_bottleneck{class="link_bound"}', "1x40"),),
    ),
    Scenario(
        "GpuAllocatedButIdle",
        "35m",
        (("gpu_pod_info", "1x40"), ('gpu_bottleneck{class="idle"}', "1x40")),
        branch="device-idle",
    ),
    Scenario(
        "GpuAllocatedButIdle",
        "35m",
        (("gpu_pod_utilization_ratio", "0x40"), ("gpu_pod_info", "1x40")),
        branch="share-idle",
    ),
    Scenario(
        "GpuAllocatedButIdle",
        "35m",
        ((f"gpu_pod_processes{{{MIG}}}", "0x40"), (f"gpu_pod_info{{{MIG}}}", "1x40")),
        branch="mig-no-process",
    ),
    Scenario(
        "GpuBusyButIdle",
        "10m",
        (
            (f"gpu_graphics_engine_active_ratio{{{MIG}}}", "0.95x40"),
            (f"gpu_sm_active_ratio{{{MIG}}}", "0.1x40"),
        ),
        branch="mig",
    ),
    Scenario(
        "GpuActivityMetricsUnavailable",
        "20m",
        (
            (f"gpu_graphics_engine_active_ratio{{{MIG}}}", "0.9x40"),
            (f"gpu_sm_active_ratio{{{MIG}}}", "0x40"),
        ),
        branch="mig-stuck-at-zero",
    ),
    Scenario(
        "GpuActivityMetricsUnavailable",
        "20m",
        (
            (f"gpu_memory_used_bytes{{{MIG}}}", "21474836480x40"),
            (f"gpu_mig_instance_slices{{{MIG}}}", "1x40"),
        ),
        branch="mig-no-activity",
    ),
    # --- gpu-throttling ----------------------------------------------------------------------
    Scenario(
        "GpuHardwareSlowdown",
        "5m",
        (
            ('gpu_clock_event_active{reason="hw_slowdown"}', "1x40"),
            ('gpu_clock_event_active{reason="hw_thermal_slowdown"}', "0x40"),
            ('gpu_clock_event_active{reason="hw_power_brake_slowdown"}', "0x40"),
            ('gpu_clock_event_seconds_total{reason="hw_thermal_slowdown"}', "0x40"),
        ),
    ),
    Scenario(
        "GpuThermalSlowdown",
        "5m",
        (('gpu_clock_event_seconds_total{reason="hw_thermal_slowdown"}', "0+60x40"),),
        branch="counter",
    ),
    Scenario(
        "GpuThermalSlowdown",
        "5m",
        (('gpu_clock_event_active{reason="hw_thermal_slowdown"}', "1x40"),),
        branch="reason-bit",
    ),
    Scenario(
        "GpuSoftwareThermalSlowdown",
        "20m",
        (('gpu_clock_event_seconds_total{reason="sw_thermal_slowdown"}', "0+30x40"),),
    ),
    Scenario(
        "GpuPowerBrakeSlowdown",
        "3m",
        (('gpu_clock_event_seconds_total{reason="hw_power_brake_slowdown"}', "0+6x40"),),
        branch="counter",
    ),
    Scenario(
        "GpuPowerBrakeSlowdown",
        "5m",
        (('gpu_clock_event_active{reason="hw_power_brake_slowdown"}', "1x40"),),
        branch="reason-bit",
    ),
    Scenario(
        "GpuPowerCappedWhileBusy",
        "25m",
        (
            ('gpu_clock_event_seconds_total{reason="sw_power_cap"}', "0+45x40"),
            ("gpu_utilization_ratio", "0.99x40"),
        ),
    ),
    Scenario(
        "GpuClocksLowWhileBusy",
        "12m",
        (
            ('gpu_clock_hertz{clock="sm"}', "990000000x40"),
            ('gpu_clock_max_hertz{clock="sm"}', "1980000000x40"),
            ("gpu_utilization_ratio", "0.98x40"),
            ('gpu_clock_event_active{reason="sw_power_cap"}', "0x40"),
            ('gpu_clock_event_seconds_total{reason="hw_thermal_slowdown"}', "0x40"),
        ),
    ),
    Scenario(
        "GpuPowerCappedWhileBusy",
        "25m",
        (
            ('gpu_clock_event_seconds_total{reason="sw_power_cap"}', "0+45x40"),
            (f"gpu_graphics_engine_active_ratio{{{MIG}}}", "0.99x40"),
        ),
        branch="mig",
    ),
    Scenario(
        "GpuClocksLowWhileBusy",
        "12m",
        (
            ('gpu_clock_hertz{clock="sm"}', "990000000x40"),
            ('gpu_clock_max_hertz{clock="sm"}', "1980000000x40"),
            (f"gpu_graphics_engine_active_ratio{{{MIG}}}", "0.98x40"),
            ('gpu_clock_event_active{reason="sw_power_cap"}', "0x40"),
        ),
        branch="mig",
    ),
    # --- gpu-health --------------------------------------------------------------------------
    Scenario(
        "GpuXidCritical",
        "6m",
        (
            ('gpu_xid_last_timestamp_seconds{xid="79"}', "_x4 240x20"),
            ('gpu_health_action_info{action="reboot_node",reason="xid_79"}', "_x4 1x20"),
            ('gpu_health_xid_info{xid="79"}', "_x4 1x20"),
            ('gpu_health_verdict{verdict="critical"}', "0x4 1x20"),
        ),
    ),
    Scenario(
        "GpuRecoveryActionRequired",
        "6m",
        (
            (
                'gpu_health_action_info{action="reboot_node",reason="recovery_action_node_reboot"}',
                "_x4 1x20",
            ),
            ('gpu_health_verdict{verdict="critical"}', "0x4 1x20"),
        ),
    ),
    Scenario(
        "GpuXidWarning",
        "6m",
        (('gpu_xid_last_timestamp_seconds{xid="94"}', "_x4 240x20"),),
    ),
    Scenario(
        "GpuUncorrectableEccErrors",
        "7m",
        (('gpu_ecc_errors_total{error="uncorrected"}', "0x5 2x20"),),
    ),
    Scenario("GpuRowRemapPending", "1m", (("gpu_row_remap_pending", "1x25"),)),
    Scenario("GpuRowRemapFailure", "1m", (("gpu_row_remap_failure", "1x25"),)),
    Scenario("GpuRetiredPagesPending", "1m", (("gpu_retired_pages_pending", "1x25"),)),
    Scenario(
        "GpuPcieLinkWidthDegraded",
        "10m",
        (
            ('gpu_pcie_link_width{state="current"}', "8x30"),
            ('gpu_pcie_link_width{state="max"}', "16x30"),
            ("gpu_utilization_ratio", "0.9x30"),
        ),
    ),
    Scenario(
        "GpuPcieLinkGenerationDegraded",
        "10m",
        (
            ('gpu_pcie_link_generation{state="current"}', "3x30"),
            ('gpu_pcie_link_generation{state="max"}', "5x30"),
            ("gpu_utilization_ratio", "0.95x30"),
        ),
    ),
    Scenario(
        "GpuPcieLinkWidthDegraded",
        "10m",
        (
            ('gpu_pcie_link_width{state="current"}', "8x30"),
            ('gpu_pcie_link_width{state="max"}', "16x30"),
            (f"gpu_graphics_engine_active_ratio{{{MIG}}}", "0.9x30"),
        ),
        branch="mig",
    ),
    Scenario(
        "GpuPcieLinkGenerationDegraded",
        "10m",
        (
            ('gpu_pcie_link_generation{state="current"}', "3x30"),
            ('gpu_pcie_link_generation{state="max"}', "5x30"),
            (f"gpu_graphics_engine_active_ratio{{{MIG}}}", "0.95x30"),
        ),
        branch="mig",
    ),
    Scenario(
        "GpuLost",
        "2m",
        (("gpu_up", "0x10"), ('gpu_health_verdict{verdict="critical"}', "1x10")),
    ),
    Scenario("GpuCountDropped", "16m", (("gpu_exporter_devices", "8x10 7x15"),)),
    Scenario(
        "GpuExporterNotSampling",
        "7m",
        (("gpu_exporter_last_tick_timestamp_seconds", "0+60x5 300x10"),),
    ),
    Scenario(
        "GpuExporterCollectorFailing",
        "16m",
        (('gpu_exporter_collector_success{collector="ecc"}', "1x2 0x20"),),
    ),
    Scenario(
        "GpuExporterDcgmUnavailable",
        "13m",
        (('gpu_exporter_dcgm_up{mode="standalone"}', "1x2 0x12"),),
    ),
    Scenario(
        "GpuExporterDown",
        "6m",
        (('up{job="gpu-exporter",instance="10.0.0.7:9449"}', "1x3 0x10"),),
    ),
]


def _every_series(name: str) -> dict[str, str]:
    """Every target label on every input series: pod attribution in "labels" mode, which puts
    the pod labels on every per-GPU family (gpu_exporter/model/series.py), behind a relabeling that
    adds node and cluster (and the exporter pod's own labels on its self-metrics and `up`)."""
    return dict(TARGET_LABELS)


def _info_mode(name: str) -> dict[str, str]:
    """No pod labels at all (attribution off, or in "info" mode): node and cluster only."""
    return {k: v for k, v in TARGET_LABELS.items() if k not in POD_LABELS}


def _mixed(name: str) -> dict[str, str]:
    """Pod labels on some families only, as exporters before gpu_exporter/model/series.py wrote them
    (on the readings, not on gpu_info or gpu_up): joins across families must not depend on
    their label sets being equal."""
    labels = dict(TARGET_LABELS)
    if not _per_gpu(name) or name in NOT_POD_LABELLED_BEFORE:
        for key in POD_LABELS:
            del labels[key]
    return labels


VARIANTS = {"every-series": _every_series, "info-mode": _info_mode, "mixed": _mixed}


def _per_gpu(name: str) -> bool:
    return name.startswith("gpu_") and not name.startswith("gpu_exporter_")


def _with_target_labels(series: str, variant: str) -> Labels:
    labels = dict(parse_series(series))
    name = labels["__name__"]
    extra = {**(GPU_LABELS if _per_gpu(name) else {}), **VARIANTS[variant](name)}
    assert not set(extra) & set(labels), f"{series} already has {set(extra) & set(labels)}"
    return tuple(sorted({**labels, **extra}.items()))


def _series_text(labels: Labels) -> str:
    pairs = dict(labels)
    name = pairs.pop("__name__")
    inner = ",".join(f'{k}="{v}"' for k, v in pairs.items())
    return f"{name}{{{inner}}}"


def _expected_alert_labels(scenario: Scenario, variant: str) -> dict[str, str]:
    rule = ALERTING_RULES[scenario.alert]
    alerted = dict(_with_target_labels(scenario.series[0][0], variant))
    del alerted["__name__"]
    for label in DROPPED_ON_PURPOSE.get(scenario.alert, {}):
        alerted.pop(label, None)
    return {**alerted, **rule.labels}


def _test_case(scenario: Scenario, variant: str) -> dict[str, Any]:
    return {
        "name": f"{scenario.id} ({variant})",
        "interval": "1m",
        "input_series": [
            {"series": _series_text(_with_target_labels(series, variant)), "values": values}
            for series, values in scenario.series
        ],
        "alert_rule_test": [
            {
                "eval_time": scenario.eval_time,
                "alertname": scenario.alert,
                "exp_alerts": [{"exp_labels": _expected_alert_labels(scenario, variant)}],
            }
        ],
    }


def _write_rule_pack(directory: Path) -> list[str]:
    """The shipped rule files without annotations (this test is about labels; the annotation
    templates are checked by rules/tests/), as promtool and the runner both read them."""
    names = []
    for path in RULE_FILES:
        pack = yaml.safe_load(path.read_text())
        for group in pack["groups"]:
            for rule in group["rules"]:
                rule.pop("annotations", None)
        (directory / path.name).write_text(yaml.safe_dump(pack, sort_keys=False))
        names.append(path.name)
    return names


def _write_test_file(directory: Path, cases: list[dict[str, Any]]) -> Path:
    spec = {
        "rule_files": _write_rule_pack(directory),
        "evaluation_interval": "1m",
        "tests": cases,
    }
    path = directory / "labels.test.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_every_alerting_rule_has_a_scenario() -> None:
    assert len(ALERTING_RULES) >= 20
    covered = {scenario.alert for scenario in SCENARIOS}
    assert covered == set(ALERTING_RULES), (
        f"no scenario for {sorted(set(ALERTING_RULES) - covered)}; "
        f"unknown rules {sorted(covered - set(ALERTING_RULES))}"
    )


def test_dropped_labels_are_never_target_labels() -> None:
    for alert, labels in DROPPED_ON_PURPOSE.items():
        assert alert in ALERTING_RULES, alert
        assert not set(labels) & set(TARGET_LABELS), (alert, labels)
        assert all(reason.strip() for reason in labels.values()), alert


@pytest.mark.parametrize("alert", sorted(ALERTING_RULES))
def test_scenarios_read_what_the_rule_reads(alert: str) -> None:
    """Every metric the rule selects has an input series in some scenario (so every join of the
    expression sees labelled series), and the alerted series is one the rule reads."""
    rule = ALERTING_RULES[alert]
    reads = promql.referenced_metrics(rule.expr)
    assert reads is not None, f"{alert} reads a selector without a metric name"
    scenarios = [s for s in SCENARIOS if s.alert == alert]
    given = {dict(parse_series(series))["__name__"] for s in scenarios for series, _ in s.series}
    assert reads <= given, f"{alert}: no input series for {sorted(reads - given)}"
    for scenario in scenarios:
        first = dict(parse_series(scenario.series[0][0]))["__name__"]
        assert first in reads, f"{scenario.id}: the alerted series {first} is not read by the rule"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.id)
def test_alert_keeps_the_labels_of_its_series(
    tmp_path: Path, scenario: Scenario, variant: str
) -> None:
    """The daemon's evaluator, through the promtool-compatible runner."""
    path = _write_test_file(tmp_path, [_test_case(scenario, variant)])
    outcome = run_test_file(path)
    assert outcome.passed, "\n".join(outcome.errors)


def test_promtool_agrees(tmp_path: Path) -> None:
    """The same expectations, every scenario and variant in one file, on real promtool."""
    cases = [_test_case(s, v) for s in SCENARIOS for v in sorted(VARIANTS)]
    path = _write_test_file(tmp_path, cases)
    result = promtool("test", "rules", str(path), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


# --- recording rules -------------------------------------------------------------------------

RECORDING_TEST = ROOT / "rules/tests/recording.test.yaml"


def test_recording_rules_keep_cluster(tmp_path: Path) -> None:
    """Every recorded series keeps `cluster` when its inputs have it (a multi-cluster
    Prometheus), and the per-node rollups keep `node`: computed on the daemon's evaluator from
    the fleet scenario (the first test) of rules/tests/recording.test.yaml with `cluster` added
    to every input series, then confirmed sample for sample by promtool."""
    spec = yaml.safe_load(RECORDING_TEST.read_text())
    case = spec["tests"][0]  # the two-node fleet: every recording rule has samples there
    eval_time = parse_duration("10m")
    inputs = [
        {**entry, "series": _series_text(_add(parse_series(entry["series"]), cluster="eu-1"))}
        for entry in case["input_series"]
    ]
    recording_files = [(RECORDING_TEST.parent / p).resolve() for p in spec["rule_files"]]
    groups = load_rule_files(recording_files)
    records = [rule.name for group in groups for rule in group.rules if not rule.is_alert]
    assert records

    store = SeriesStore(retention_seconds=math.inf)
    load_input_series(store, inputs, parse_duration(case["interval"]), until=eval_time)
    evaluator = GroupEvaluator(groups, store)
    for minute in range(int(eval_time // 60) + 1):
        assert not evaluator.evaluate_all(minute * 60.0)

    expr_tests = []
    for name in records:
        result = promql.evaluate(promql.parse(name), store, eval_time)
        assert isinstance(result, list)
        assert result, f"{name}: no samples"
        for element in result:
            labels = dict(element.labels)
            assert labels.get("cluster") == "eu-1", f"{name} lost cluster: {labels}"
            if name.startswith("node:"):
                assert "node" in labels, f"{name} lost node: {labels}"
        expr_tests.append(
            {
                "expr": name,
                "eval_time": "10m",
                "exp_samples": [
                    {"labels": _series_text(e.labels), "value": e.value} for e in result
                ],
            }
        )
    for path in recording_files:
        (tmp_path / path.name).write_text(path.read_text())
    test_file = tmp_path / "recording-cluster.test.yaml"
    test_file.write_text(
        yaml.safe_dump(
            {
                "rule_files": [p.name for p in recording_files],
                "evaluation_interval": spec.get("evaluation_interval", "1m"),
                "tests": [
                    {"interval": case["interval"], "input_series": inputs,
                     "promql_expr_test": expr_tests}
                ],
            },
            sort_keys=False,
        )
    )  # fmt: skip
    result = subprocess.run(
        [require_tool("promtool"), "test", "rules", str(test_file)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _add(labels: Labels, **extra: str) -> Labels:
    return tuple(sorted({**dict(labels), **extra}.items()))

"""The health verdict table (gpu_exporter/model/health_verdict.py): every row, through the latch
that applies it (collect/health_latch.py), against the verdict and step written here by hand;
how several inputs add up; and the places that must say the same (runbook, rule pack, xids.py,
nvml.h's recovery actions)."""

from __future__ import annotations

import re
from pathlib import Path

import pynvml
import pytest
import yaml

from gpu_exporter.collect.health_latch import HealthLatch
from gpu_exporter.model import health_verdict as table
from gpu_exporter.model import xids
from gpu_exporter.model.catalog import BY_NAME
from gpu_exporter.model.snapshot import DeviceSample, Reading

ROOT = Path(__file__).resolve().parent.parent
PACK = ROOT / "rules/gpu-exporter.rules.yaml"
ACTIONS = (
    "none",
    "gpu_reset",
    "node_reboot",
    "drain_p2p",
    "drain_and_reset",
    "recover_imex_domain",
    "bus_reset",
    "system_reboot",
    "unknown",
)


def recovery(action: str) -> tuple[Reading, ...]:
    """gpu_recovery_action as the contract's state set: 1 for `action`, 0 for the others."""
    return tuple(
        Reading("gpu_recovery_action", float(a == action), (("action", a),)) for a in ACTIONS
    )


def xid(*numbers: int) -> tuple[Reading, ...]:
    return tuple(Reading("gpu_xid_errors_total", 1.0, (("xid", str(n)),)) for n in numbers)


def flag(family: str, value: float = 1.0) -> tuple[Reading, ...]:
    return (Reading(family, value),)


def fabric_issue(issue: str) -> tuple[Reading, ...]:
    issues = (
        "degraded_bandwidth",
        "route_recovery",
        "route_unhealthy",
        "access_timeout_recovery",
        "incorrect_configuration",
    )
    return tuple(
        Reading("gpu_fabric_health_issue", float(i == issue), (("issue", i),)) for i in issues
    )


def fabric_summary(summary: str) -> tuple[Reading, ...]:
    return tuple(
        Reading("gpu_fabric_health_summary", float(s == summary), (("summary", s),))
        for s in ("healthy", "unhealthy", "limited_capacity")
    )


def judged(readings: tuple[Reading, ...], up: bool = True) -> tuple[str, str, str]:
    """(verdict, action, reason) of one GPU after one tick with `readings`."""
    (device,) = HealthLatch().process([DeviceSample(0, "GPU-a", {}, up, readings)], 100.0)
    return outputs(device)


def outputs(device: DeviceSample) -> tuple[str, str, str]:
    verdicts = [r for r in device.readings if r.family == "gpu_health_verdict"]
    assert sorted(dict(r.labels)["verdict"] for r in verdicts) == sorted(table.VERDICTS)
    (current,) = [dict(r.labels)["verdict"] for r in verdicts if r.value == 1.0]
    assert sum(r.value for r in verdicts) == 1.0
    (info,) = [r for r in device.readings if r.family == "gpu_health_action_info"]
    assert info.value == 1.0
    labels = dict(info.labels)
    return current, labels["action"], labels["reason"]


# (case, readings, up, verdict, action, reason): each row of the table, written out by hand.
ROWS = [
    # The driver's recovery action (nvml.h nvmlDeviceGpuRecoveryAction_t).
    ("recovery none", recovery("none"), True, "pass", "none", "healthy"),
    ("recovery gpu_reset", recovery("gpu_reset"), True, "critical", "reset_gpu", None),
    ("recovery node_reboot", recovery("node_reboot"), True, "critical", "reboot_node", None),
    ("recovery drain_p2p", recovery("drain_p2p"), True, "critical", "drain_p2p", None),
    (
        "recovery drain_and_reset",
        recovery("drain_and_reset"),
        True,
        "critical",
        "drain_and_reset",
        None,
    ),
    (
        "recovery recover_imex_domain",
        recovery("recover_imex_domain"),
        True,
        "critical",
        "recover_imex_domain",
        None,
    ),
    ("recovery bus_reset", recovery("bus_reset"), True, "critical", "bus_reset", None),
    ("recovery system_reboot", recovery("system_reboot"), True, "critical", "reboot_node", None),
    ("recovery unknown", recovery("unknown"), True, "warning", "unknown", None),
    # XIDs by NVSentinel's resolution bucket.
    *(
        (f"xid {n} RESTART_APP", xid(n), True, "info", "restart_app", f"xid_{n}")
        for n in (13, 31, 68, 69)
    ),
    ("xid 94 RESTART_APP, contained ECC", xid(94), True, "warning", "restart_app", "xid_94"),
    *((f"xid {n} IGNORE", xid(n), True, "info", "none", f"xid_{n}") for n in (43, 63, 92)),
    *(
        (f"xid {n} RESET_GPU", xid(n), True, "critical", "reset_gpu", f"xid_{n}")
        for n in (46, 62, 64, 95, 109, 119, 120, 140, 143, 155, 156, 158)
    ),
    ("xid 48 solo", xid(48), True, "critical", "reset_gpu", "xid_48"),
    ("xid 48 with 63", xid(48, 63), True, "critical", "drain_and_reset", "xid_48"),
    ("xid 48 with 64", xid(48, 64), True, "critical", "drain_and_reset", "xid_48"),
    *(
        (f"xid {n} NVLink workflow", xid(n), True, "critical", "reset_gpu", f"xid_{n}")
        for n in (74, 144, 145, 146, 147, 148, 149, 150)
    ),
    ("xid 79 RESTART_BM", xid(79), True, "critical", "reboot_node", "xid_79"),
    ("xid 160 RESTART_BM", xid(160), True, "critical", "reboot_node", "xid_160"),
    ("xid 61 REPORT_ISSUE", xid(61), True, "warning", "report_issue", "xid_61"),
    ("xid 151 RESTART_VM", xid(151), True, "critical", "restart_vm", "xid_151"),
    # Memory.
    (
        "uncorrected ECC",
        (Reading("gpu_ecc_errors_total", 3.0, (("error", "uncorrected"),)),),
        True,
        "critical",
        "drain_and_reset",
        "uncorrected_ecc",
    ),
    (
        "no uncorrected ECC",
        (Reading("gpu_ecc_errors_total", 0.0, (("error", "uncorrected"),)),),
        True,
        "pass",
        "none",
        "healthy",
    ),
    (
        "row remap failure",
        flag("gpu_row_remap_failure"),
        True,
        "critical",
        "service",
        "row_remap_failure",
    ),
    (
        "row remap pending",
        flag("gpu_row_remap_pending"),
        True,
        "warning",
        "reset_gpu",
        "row_remap_pending",
    ),
    (
        "retired pages pending",
        flag("gpu_retired_pages_pending"),
        True,
        "warning",
        "reboot_node",
        "retired_pages_pending",
    ),
    # The GPU's presence.
    ("gpu lost", (), False, "critical", "reset_gpu", "gpu_lost"),
    # The fabric.
    (
        "fabric degraded bandwidth",
        fabric_issue("degraded_bandwidth"),
        True,
        "warning",
        "check_fabric",
        "fabric_degraded_bandwidth",
    ),
    (
        "fabric route unhealthy",
        fabric_issue("route_unhealthy"),
        True,
        "critical",
        "check_fabric",
        "fabric_route_unhealthy",
    ),
    (
        "fabric incorrect configuration",
        fabric_issue("incorrect_configuration"),
        True,
        "critical",
        "check_fabric",
        "fabric_incorrect_configuration",
    ),
    (
        "fabric route recovery",
        fabric_issue("route_recovery"),
        True,
        "info",
        "none",
        "fabric_route_recovery",
    ),
    (
        "fabric access timeout recovery",
        fabric_issue("access_timeout_recovery"),
        True,
        "info",
        "none",
        "fabric_access_timeout_recovery",
    ),
    (
        "fabric unhealthy",
        fabric_summary("unhealthy"),
        True,
        "critical",
        "check_fabric",
        "fabric_unhealthy",
    ),
    (
        "fabric limited capacity",
        fabric_summary("limited_capacity"),
        True,
        "warning",
        "check_fabric",
        "fabric_limited_capacity",
    ),
    ("fabric healthy", fabric_summary("healthy"), True, "pass", "none", "healthy"),
    ("nothing read", (), True, "pass", "none", "healthy"),
]


@pytest.mark.parametrize(
    ("readings", "up", "verdict", "action", "reason"),
    [pytest.param(*row[1:], id=row[0]) for row in ROWS],
)
def test_each_row(
    readings: tuple[Reading, ...], up: bool, verdict: str, action: str, reason: str | None
) -> None:
    got = judged(readings, up)
    if reason is None:  # a recovery action's row
        (current,) = [r for r in readings if r.value == 1.0]
        reason = f"recovery_action_{dict(current.labels)['action']}"
    assert got == (verdict, action, reason)


# Rows whose input is no reading of the GPU's own: each has a test of its own below.
OWN_TESTS = {"mig_instances_unknown"}


def test_every_row_of_the_table_has_a_case_above() -> None:
    covered = (
        {row[5] for row in ROWS if row[5]}
        | OWN_TESTS
        | {f"recovery_action_{a}" for a in ACTIONS if a != "none"}
    )
    assert {row.reason for row in table.all_rows()} | {"healthy"} == covered


def test_mig_instances_unknown_warns_until_they_are_listed_again() -> None:
    latch = HealthLatch()

    def tick(now: float, unknown: str = "", up: bool = True) -> tuple[str, str, str]:
        sample = DeviceSample(0, "GPU-a", {}, up, (), mig_enabled=True, instances_unknown=unknown)
        (device,) = latch.process([sample], now)
        return outputs(device)

    hung = "NVML call mig_uuid hung (asked again once it answers)"
    assert tick(1.0) == ("pass", "none", "healthy")
    assert tick(2.0, hung) == ("warning", "none", "mig_instances_unknown")
    # A GPU down says nothing about its layout: the hold stays under gpu_lost.
    assert tick(3.0, up=False) == ("critical", "reset_gpu", "gpu_lost")
    assert tick(4.0, hung) == ("warning", "none", "mig_instances_unknown")
    assert tick(5.0) == ("pass", "none", "healthy")


def test_the_recovery_actions_are_nvml_h_values_in_order() -> None:
    """RECOVERY_ACTION_ROWS' keys are nvml.h's NVML_GPU_RECOVERY_ACTION_* names (values 1..7 in
    order, after NONE = 0), then "unknown" for any later value."""
    names = (table.NO_RECOVERY_ACTION, *table.RECOVERY_ACTION_ROWS)
    assert names == ACTIONS
    for value, name in enumerate(names[:-1]):
        assert getattr(pynvml, f"NVML_GPU_RECOVERY_ACTION_{name.upper()}") == value


# -- how inputs add up --------------------------------------------------------------------------


def test_the_worst_verdict_wins_and_its_most_thorough_step() -> None:
    readings = (*xid(13), *flag("gpu_row_remap_pending"), *flag("gpu_retired_pages_pending"))
    # Two warnings: a reboot (retired pages) also resets the GPU (remap pending).
    assert judged(readings) == ("warning", "reboot_node", "row_remap_pending")
    readings += (*recovery("gpu_reset"),)
    assert judged(readings) == ("critical", "reset_gpu", "recovery_action_gpu_reset")


def test_an_xid_is_the_reason_before_the_readings_that_show_the_same_fault() -> None:
    """A double-bit ECC error is XID 48 and a count of uncorrected errors: the reason is the
    XID, the step the count's (drain, then reset)."""
    ecc = (Reading("gpu_ecc_errors_total", 1.0, (("error", "uncorrected"),)),)
    assert judged((*ecc, *xid(48))) == ("critical", "drain_and_reset", "xid_48")
    assert judged((*xid(79),), up=False) == ("critical", "reboot_node", "xid_79")
    lost_and_failed = (*flag("gpu_row_remap_failure"), *xid(64))
    assert judged(lost_and_failed) == ("critical", "service", "xid_64")


def test_decide_keeps_the_reason_shown_among_equals() -> None:
    rows = [table.XID_ROWS[64].row(), table.XID_ROWS[46].row(), table.GPU_LOST]
    assert table.decide(rows).reason == "xid_46"  # the first XID in table order
    assert table.decide(rows, shown="xid_64").reason == "xid_64"
    assert table.decide(rows, shown="gpu_lost").reason == "xid_46"  # an XID before a reading
    # Among readings, the one shown stays the reason; the step is the most thorough one.
    decided = table.decide([table.UNCORRECTED_ECC, table.GPU_LOST], shown="gpu_lost")
    assert (decided.reason, decided.action) == ("gpu_lost", table.NextStep.DRAIN_AND_RESET)
    assert table.decide([]) == table.HEALTHY


# -- the places that must say the same ---------------------------------------------------------


def test_the_runbook_embeds_the_table() -> None:
    runbook = (ROOT / "docs/runbook.md").read_text()
    begin, end = "<!-- verdicts:begin -->\n", "\n<!-- verdicts:end -->"
    embedded = runbook[runbook.index(begin) + len(begin) : runbook.index(end)]
    assert embedded == table.markdown_table(), (
        "docs/runbook.md's verdict table is stale: regenerate it from "
        "`python -m gpu_exporter.model.health_verdict`"
    )


def test_the_runbook_says_what_each_step_means() -> None:
    runbook = (ROOT / "docs/runbook.md").read_text()
    steps = runbook.split("### Next steps", 1)[1].split("\n### ", 1)[0]
    for action in table.ACTIONS:
        assert f"- `{action}`:" in steps, f"docs/runbook.md, Next steps: no {action}"


def test_xids_py_lists_are_the_tables_grades() -> None:
    assert {
        n for n, r in table.XID_ROWS.items() if r.verdict is table.HealthVerdict.CRITICAL
    } == xids.CRITICAL_XIDS
    assert {
        n for n, r in table.XID_ROWS.items() if r.verdict is table.HealthVerdict.WARNING
    } == xids.WARNING_XIDS
    assert set(xids.NOT_ALERTED) == set(table.XID_ROWS) - xids.CRITICAL_XIDS - xids.WARNING_XIDS
    for number, row in table.XID_ROWS.items():
        assert xids.meaning(number) == row.meaning


def test_gpu_xid_warning_holds_as_long_as_the_verdict() -> None:
    rules = {
        rule["alert"]: rule["expr"]
        for group in yaml.safe_load(PACK.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    (window,) = re.findall(r"time\(\)\s*-\s*(\d+)", rules["GpuXidWarning"])
    assert float(window) == table.EVENT_HOLD_SECONDS
    for alert in ("GpuXidCritical", "GpuLost"):
        assert 'gpu_health_verdict{verdict="critical"} == 1' in rules[alert], alert


def test_the_families_say_they_are_latched_and_what_clears_them() -> None:
    verdict, action = BY_NAME["gpu_health_verdict"], BY_NAME["gpu_health_action_info"]
    assert verdict.labels == ("verdict",) and action.labels == ("action", "reason")
    assert "Latched" in verdict.help and "GPU reset" in verdict.help
    assert "restart" in verdict.help and "absent reading clears nothing" in verdict.help
    assert "latched and cleared with gpu_health_verdict" in action.help


def test_the_table_has_a_row_for_every_recovery_action_the_collector_exports() -> None:
    from gpu_exporter.model import health_verdict, nvml_facts

    rows = (health_verdict.NO_RECOVERY_ACTION, *health_verdict.RECOVERY_ACTION_ROWS)
    assert tuple(rows) == tuple(nvml_facts.RECOVERY_ACTIONS)

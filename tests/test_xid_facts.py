"""One list of alerted XIDs: gpu_exporter/model/xids.py, which `gpu-exporter diagnose` reads,
and the rule pack's GpuXidCritical / GpuXidWarning matchers, which Prometheus reads, must
agree."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from gpu_exporter import diagnose
from gpu_exporter.alerting.rules.loader import load_rule_files
from gpu_exporter.model import xids

ROOT = Path(__file__).resolve().parent.parent
RULE_FILES = sorted((ROOT / "rules").glob("*.yaml"))
CHART_RULE_FILES = sorted((ROOT / "helm/gpu-exporter/files/rules").glob("*.yaml"))
PROMETHEUS_RULE = ROOT / "deploy/prometheusrule.yaml"
XID_MATCHER = re.compile(r'\bxid\s*=~\s*"([^"]*)"')
RULE_LISTS = {"GpuXidCritical": xids.CRITICAL_XIDS, "GpuXidWarning": xids.WARNING_XIDS}


def _alert_exprs(groups: list[dict]) -> dict[str, str]:
    return {
        rule["alert"]: rule["expr"]
        for group in groups
        for rule in group["rules"]
        if "alert" in rule
    }


def _packs() -> dict[str, dict[str, str]]:
    """Alert name -> expression, for each copy of the rule pack Prometheus may read."""
    packs = {}
    for path in [*RULE_FILES, *CHART_RULE_FILES]:
        packs[str(path.relative_to(ROOT))] = _alert_exprs(
            yaml.safe_load(path.read_text())["groups"]
        )
    manifest = yaml.safe_load(PROMETHEUS_RULE.read_text())
    packs[str(PROMETHEUS_RULE.relative_to(ROOT))] = _alert_exprs(manifest["spec"]["groups"])
    return packs


def _xids_in(expr: str) -> tuple[str, frozenset[int]]:
    (value,) = XID_MATCHER.findall(expr)  # exactly one xid matcher
    assert re.fullmatch(r"\d+(\|\d+)*", value), f"not a plain list of XIDs: {value!r}"
    return value, frozenset(int(x) for x in value.split("|"))


@pytest.mark.parametrize("alert", sorted(RULE_LISTS))
def test_rule_matcher_is_the_python_list(alert: str) -> None:
    expected = RULE_LISTS[alert]
    checked = 0
    for source, exprs in _packs().items():
        if alert not in exprs:
            continue
        value, numbers = _xids_in(exprs[alert])
        assert numbers == expected, (
            f"{source}: {alert} matches XIDs {sorted(numbers)}, gpu_exporter/model/xids.py lists "
            f"{sorted(expected)}; change both (the YAML is what Prometheus reads)"
        )
        assert value == xids.matcher(expected), f"{source}: write it as {xids.matcher(expected)}"
        checked += 1
    assert checked >= 3, f"{alert} missing from the rule pack, its chart copy or deploy/"


def test_only_these_rules_alert_on_xids() -> None:
    """A new XID rule needs its own list in gpu_exporter/model/xids.py and a place in this test."""
    reading = {
        rule.name
        for group in load_rule_files(RULE_FILES)
        for rule in group.rules
        if rule.is_alert and "gpu_xid_" in rule.expr_text
    }
    assert reading == set(RULE_LISTS)


def test_lists_are_disjoint_and_explained() -> None:
    tables = (xids.CRITICAL, xids.WARNING, xids.NOT_ALERTED)
    seen: set[int] = set()
    for table in tables:
        assert not seen & set(table), f"XIDs in two lists: {sorted(seen & set(table))}"
        seen |= set(table)
        for number, meaning in table.items():
            assert isinstance(number, int) and number > 0
            assert meaning.strip(), f"XID {number} has no meaning"
    # A contained ECC error (94) stops only the application that hit it: a warning, whereas its
    # uncontained twin (95) takes the whole GPU down.
    assert 94 in xids.WARNING_XIDS and 95 in xids.CRITICAL_XIDS


def test_xid_severity_is_the_rule_packs_severity_label() -> None:
    rules = {rule.name: rule for group in load_rule_files(RULE_FILES) for rule in group.rules}
    for alert, numbers in RULE_LISTS.items():
        for number in numbers:
            assert xids.xid_severity(number) == rules[alert].labels["severity"]
    for number in xids.NOT_ALERTED:
        assert xids.xid_severity(number) == ""


def test_runbook_names_the_critical_xids() -> None:
    runbook = (ROOT / "docs/runbook.md").read_text()
    section = runbook.split("### GpuXidCritical", 1)[1].split("\n### ", 1)[0]
    for number in xids.CRITICAL_XIDS | xids.NOT_ALERTED.keys():
        assert re.search(rf"\b{number}\b", section), f"runbook's GpuXidCritical omits {number}"
    warning = runbook.split("### GpuXidWarning", 1)[1].split("\n### ", 1)[0]
    for number in xids.WARNING_XIDS:
        assert re.search(rf"\b{number}\b", warning), f"runbook's GpuXidWarning omits {number}"


def test_diagnose_grades_xids_as_the_rules_do(capsys, tmp_path: Path) -> None:
    """On the fake NVML: 95 critical, 94 a warning (not critical), both the rule pack's alerts;
    13 is not alerted, so a note and no health finding."""
    scenario = tmp_path / "xids.yaml"
    scenario.write_text(
        "name: xids\n"
        "defaults: {model: NVIDIA H200, values: {utilization: 0.98, sm_active: 0.9,"
        " tensor_active: 0.6, dram_active: 0.4}}\n"
        "devices:\n"
        "  - {}\n"
        "faults:\n"
        # After the event set is registered (NVML drops earlier events), inside the profile.
        "  - {at: 1, device: 0, kind: xid, xid: 13}\n"
        "  - {at: 1, device: 0, kind: xid, xid: 94}\n"
        "  - {at: 1, device: 0, kind: xid, xid: 95}\n"
    )
    status = diagnose.main(["--simulate", str(scenario), "--duration", "3", "--json"])
    report = json.loads(capsys.readouterr().out)
    (device,) = report["devices"]
    assert device["state"]["health"]["xid_errors"] == {"13": 1, "94": 1, "95": 1}
    graded = sorted(
        (f["labels"]["xid"], f["alert"], f["severity"]) for f in device["health_findings"]
    )
    assert graded == [("94", "GpuXidWarning", "warning"), ("95", "GpuXidCritical", "critical")]
    assert [n for n in device["notes"] if "XID" in n] == [
        f"XID 13 seen 1 time(s) during the profile: {xids.NOT_ALERTED[13]}"
    ]
    assert status == diagnose.EXIT_ATTENTION

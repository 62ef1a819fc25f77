"""`gpu-exporter diagnose` puts health first: findings from the shipped rule pack, ordered next
steps that replace performance advice, a consistent report for a GPU that is down (real time,
short profiles on the fake NVML)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter import diagnose
from gpu_exporter.alerting.pack import HEALTH_GROUP, default_rule_files
from gpu_exporter.alerting.rules import promql
from gpu_exporter.alerting.rules.loader import load_rule_files
from gpu_exporter.diagnose import health
from gpu_exporter.model.catalog import BY_NAME
from gpu_exporter.model.health_verdict import UNCORRECTED_ECC, XID_ROWS, cleared_by, decide

FP8_TIP = "FP8"  # tensor_bound's advice: what a double-bit ECC GPU must not be told
# The built-in faults scenario: XID 79 on GPU 1 at 8 s, lost from 15 s; XID 48 on GPU 2 at
# 10 s. A profile past 15 s sees all of them.
FAULTS_SECONDS = "17"


def diagnose_json(*argv: str) -> tuple[int, dict[str, Any]]:
    """`python -m gpu_exporter diagnose --json` in its own interpreter."""
    result = subprocess.run(
        [sys.executable, "-m", "gpu_exporter", "diagnose", "--json", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout)


@pytest.fixture(scope="module")
def faults() -> tuple[int, dict[str, Any]]:
    return diagnose_json("--simulate", "faults", "--duration", FAULTS_SECONDS)


def performance_steps() -> set[str]:
    return {step for steps in diagnose.NEXT_STEPS.values() for step in steps}


def test_faults_xid_ecc_and_lost_gpus_get_health_steps_first(faults) -> None:
    status, report = faults
    devices = {d["index"]: d for d in report["devices"]}
    alerts = {i: {(f["alert"], f["labels"].get("xid")) for f in d["health_findings"]}
              for i, d in devices.items()}  # fmt: skip
    assert ("GpuXidCritical", "79") in alerts[1] and ("GpuLost", None) in alerts[1]
    assert ("GpuXidCritical", "48") in alerts[2]
    for index in (1, 2):
        device = devices[index]
        assert device["next_steps_for"] == "health"
        first = device["health_findings"][0]["steps"][0]
        assert first["action"] == health.Action.DRAIN.value
        assert device["next_steps"][0] == first["text"]
        assert device["next_steps"][0] == health.DRAIN.for_gpu(str(index))
        # Performance advice never reaches an unhealthy GPU: not even its class's.
        assert not performance_steps() & set(device["next_steps"])
        assert not any(FP8_TIP in step for step in device["next_steps"])
        assert device["problems"][0].startswith(("GPU not answering", "Gpu"))
        # The order of the steps is the actions' order: out of service first, RMA last.
        actions = [s["action"] for f in device["health_findings"] for s in f["steps"]]
        assert actions[0] == "drain" and "replace" in actions
    # GPU 2 (XID 48, double-bit ECC) keeps its class but gets no tensor_bound tips.
    assert devices[2]["class"] == "tensor_bound"
    lost = devices[1]
    assert any(f["alert"] == "GpuLost" and f["state"] == "pending" for f in lost["health_findings"])
    assert status == report["exit_status"] == diagnose.EXIT_ATTENTION


def test_faults_verdicts_follow_the_table_and_make_the_node_critical(faults) -> None:
    """XID 79 (GPU 1) and XID 48 (GPU 2) are critical, held by the latch to the end of the
    profile; GPU 2's step is the most thorough of its critical inputs (XID 48 and the
    uncorrected ECC count it raises: drain_and_reset, not XID 48's own reset_gpu)."""
    status, report = faults
    verdicts = {d["index"]: d["health_verdict"] for d in report["devices"]}
    xid_79 = XID_ROWS[79].row()
    assert verdicts[1] == {
        "verdict": "critical",
        "action": xid_79.action.value,
        "reason": "xid_79",
        "meaning": xid_79.meaning,
        "cleared_by": cleared_by(xid_79),
    }
    assert xid_79.action.value == "reboot_node"
    expected_48 = decide([XID_ROWS[48].row(), UNCORRECTED_ECC])
    assert (verdicts[2]["verdict"], verdicts[2]["action"], verdicts[2]["reason"]) == (
        "critical", expected_48.action.value, "xid_48",
    )  # fmt: skip
    assert expected_48.action.value == "drain_and_reset"
    for index in (0, 3):  # no fault injected
        assert verdicts[index]["verdict"] == "pass" and verdicts[index]["reason"] == "healthy"
    assert all(d["health_verdict_unavailable"] is None for d in report["devices"])
    assert report["health"]["node_verdict"] == {
        "verdict": "critical", "gpus": [1, 2], "not_judged": [],
    }  # fmt: skip
    uuids = {d["index"]: d["uuid"] for d in report["devices"]}
    hv = report["health_validation"]
    assert hv["verdict"] == "CRITICAL" and hv["node"]
    assert hv["affected_components"] == [
        {"check_ids": ["xid_79"], "entities": [uuids[1]], "category": "GPU",
         "max_severity": "CRITICAL", "recommended_action": "reboot_node"},
        {"check_ids": ["xid_48"], "entities": [uuids[2]], "category": "GPU",
         "max_severity": "CRITICAL", "recommended_action": "drain_and_reset"},
    ]  # fmt: skip
    assert all(uuid.startswith("GPU-") for uuid in uuids.values())
    assert status == report["exit_status"] == diagnose.EXIT_ATTENTION


def test_faults_healthy_gpu_keeps_its_performance_advice(faults) -> None:
    _, report = faults
    healthy = report["devices"][0]
    assert healthy["health_findings"] == []
    assert healthy["next_steps_for"] == healthy["class"] == "tensor_bound"
    assert healthy["next_steps"] == list(diagnose.NEXT_STEPS["tensor_bound"])


def test_a_down_gpu_has_no_stale_state_and_consistent_up(faults) -> None:
    _, report = faults
    for device in report["devices"]:
        assert device["up"] is device["state"]["health"]["gpu_up"]
    lost = report["devices"][1]
    assert lost["up"] is False and lost["down_reason"]
    state = lost["state"]
    assert state["unavailable"].startswith("GPU not answering")
    for key in ("sm_clock_hz", "power_watts", "power_limit_watts", "temperature_celsius",
                "memory_clock_hz", "nvlink_links_active"):  # fmt: skip
        assert state[key] is None, key
    assert state["clock_events_active"] == []
    assert set(state["pcie"].values()) == {None}
    assert lost["state"]["health"]["xid_errors"] == {"79": 1}  # known without NVML
    assert lost["class"] is None and lost["config"]["settings"] is None


def test_faults_settings_checks_show_the_misconfigured_gpu(faults) -> None:
    _, report = faults
    devices = report["devices"]
    config = devices[0]["config"]
    assert {f["setting"] for f in config["findings"]} == {
        "power_limit", "persistence_mode", "application_clocks",
    }  # fmt: skip
    settings = config["settings"]
    assert settings["power_limit_watts"] == 650 and settings["power_default_limit_watts"] == 700
    assert settings["persistence_mode"] is False
    assert settings["application_sm_clock_mhz"] == 1410
    assert settings["default_application_sm_clock_mhz"] == 1980
    assert any(p.startswith("power_limit: power limit lowered to 650 W")
               for p in devices[0]["problems"])  # fmt: skip
    consumer = devices[3]["config"]
    # A GeForce board has neither: NVML answers NOT_SUPPORTED, so nothing is judged.
    assert "nvmlDeviceGetPowerManagementDefaultLimit" in consumer["settings"]["unsupported"]
    assert "nvmlDeviceGetApplicationsClock" in consumer["settings"]["unsupported"]
    assert consumer["findings"] == []


def test_faults_topology_names_the_gpu_reachable_only_over_pcie(faults) -> None:
    _, report = faults
    meaning = report["topology"]["interpretation"]
    assert meaning["nvlink"] == "partial"
    texts = {tuple(n["gpus"]): n["text"] for n in meaning["notes"]}
    assert "GPU 3 reaches the other GPUs only over PCIe (NODE)" in texts[3,]
    assert any("no NUMA affinity" in n["text"] for n in meaning["notes"] if n["gpus"] == [3])
    assert (
        "kernel log" in report["health"]["earlier_xids"]
        or "journalctl -k" in (report["health"]["earlier_xids"])
    )


SICK = """\
name: sick
defaults: {model: NVIDIA H200, values: {utilization: 0.98, sm_active: 0.9, tensor_active: 0.7,
           dram_active: 0.4}}
devices:
  - values: {row_remap_pending: 1}
  - {}
faults:
  - {at: 0.5, device: 0, kind: xid, xid: 48}
"""


def pack_copy(tmp_path: Path, alert: str, old: str, new: str) -> Path:
    """The shipped pack with one alert's expression changed (comments dropped)."""
    data = yaml.safe_load(Path(default_rule_files()[0]).read_text())
    (group,) = [g for g in data["groups"] if g["name"] == HEALTH_GROUP]
    (rule,) = [r for r in group["rules"] if r.get("alert") == alert]
    assert old in rule["expr"]
    rule["expr"] = rule["expr"].replace(old, new)
    path = tmp_path / f"pack-{alert}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (None, {"GpuXidCritical", "GpuRowRemapPending"}),
        # Without 48 in the pack's critical XIDs, diagnose no longer calls it one.
        (("GpuXidCritical", "|48|", "|"), {"GpuRowRemapPending"}),
        # With the remap threshold moved, a pending remap (1) is no longer a finding.
        (("GpuRowRemapPending", "== 1", "== 2"), {"GpuXidCritical"}),
    ],
)
def test_health_findings_follow_the_rule_pack_not_a_list_of_its_own(
    tmp_path: Path, change: tuple[str, str, str] | None, expected: set[str]
) -> None:
    scenario = tmp_path / "sick.yaml"
    scenario.write_text(SICK)
    extra = ["--health-rules", str(pack_copy(tmp_path, *change))] if change else []
    status, report = diagnose_json(
        "--simulate", str(scenario), "--duration", "2", "--interval", "0.5", *extra
    )
    sick, well = report["devices"]
    assert {f["alert"] for f in sick["health_findings"]} == expected
    assert well["health_findings"] == [] and well["next_steps_for"] == "tensor_bound"
    assert sick["next_steps_for"] == "health" and sick["next_steps"][0].startswith("Drain")
    if "GpuXidCritical" not in expected:  # then 48 is only something seen, not a fault
        assert any(n.startswith("XID 48 seen 1 time(s)") for n in sick["notes"])
    assert report["health"]["rule_files"] == ([str(extra[1])] if extra else default_rule_files())
    assert status == diagnose.EXIT_ATTENTION


def test_health_rules_without_the_group_or_broken_exit_2(tmp_path: Path) -> None:
    empty = tmp_path / "other.yaml"
    rules = "groups:\n  - name: {}\n    rules:\n      - alert: X\n        expr: {}\n"
    empty.write_text(rules.format("elsewhere", "vector(1)"))
    broken = tmp_path / "broken.yaml"
    broken.write_text(rules.format("gpu-health", "("))
    for path, message in ((empty, "no rule group named 'gpu-health'"), (broken, "broken.yaml:5")):
        result = subprocess.run(
            [sys.executable, "-m", "gpu_exporter.diagnose", "--simulate", "--duration", "0.5",
             "--interval", "0.5", "--health-rules", str(path)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == diagnose.EXIT_USAGE, result.stderr
        assert message in result.stderr and str(path) in result.stderr
        assert result.stdout == "" and "Traceback" not in result.stderr


def per_gpu_alerts() -> set[str]:
    """The gpu-health alerts that read a per-GPU family: those a node can act on."""
    (group,) = [g for g in load_rule_files(default_rule_files()) if g.name == HEALTH_GROUP]
    out = set()
    for rule in group.rules:
        names = promql.referenced_metrics(rule.expr) or frozenset()
        if any(name in BY_NAME and BY_NAME[name].per_device for name in names):
            out.add(rule.name)
    return out


def test_every_per_gpu_health_alert_has_next_steps_and_no_step_names_an_unknown_alert() -> None:
    alerts = per_gpu_alerts()
    assert {"GpuXidCritical", "GpuLost", "GpuRowRemapFailure"} <= alerts
    assert alerts <= health.HEALTH_STEPS.keys()
    (group,) = [g for g in load_rule_files(default_rule_files()) if g.name == HEALTH_GROUP]
    assert health.HEALTH_STEPS.keys() <= {rule.name for rule in group.rules}
    for name, steps in health.HEALTH_STEPS.items():
        ranks = [health.ACTION_ORDER[s.action] for s in steps]
        assert ranks == sorted(ranks), f"{name}'s steps are not in action order"


def test_mixed_healthy_hardware_prints_no_problem_count_and_interprets_the_mesh() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpu_exporter", "diagnose", "--simulate", "mixed",
         "--duration", "1", "--interval", "0.5"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    out = result.stdout
    assert "problem(s)" not in out
    state = out.split("State at the end of the profile:\n")[1].split("\n\n")[0]
    rows = [line.split() for line in state.splitlines()[1:] if line.strip()]
    assert [row[-1] for row in rows] == ["ok"] * 8  # the health column: the hardware is fine
    assert "In short: full NVLink mesh: all 8 GPUs reach each other through NVSwitch (NV18)" in out
    assert "no gpu-health alert was pending or firing" in out
    assert "journalctl -k | grep -i xid" in out
    assert "4. Hot spots: what to look at next (performance)" in out
    assert result.returncode == diagnose.EXIT_ATTENTION  # launch-, link-bound, throttled GPUs


def test_pre_hopper_is_a_full_nvswitch_mesh_without_notes(capsys) -> None:
    status = diagnose.main(["--simulate", "pre-hopper", "--duration", "0.5", "--interval",
                            "0.5", "--json"])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    meaning = report["topology"]["interpretation"]
    assert meaning == {
        "nvlink": "nvswitch",
        "summary": "full NVLink mesh: all 4 GPUs reach each other through NVSwitch (NV12)",
        "notes": [],
    }
    assert status == diagnose.EXIT_OK


LOST_WITH_PODS = """\
name: lost-with-pods
defaults: {model: NVIDIA H200, values: {utilization: 0.98, sm_active: 0.9, tensor_active: 0.7,
           dram_active: 0.4}}
devices:
  - {}
  - {}
faults:  # lost once its identity has been read, even on a loaded machine
  - {at: 1.0, device: 1, kind: gpu_lost}
pods:
  - {namespace: train, pod: llama-0, container: trainer, gpu: 0}
  - {namespace: train, pod: llama-1, container: trainer, gpu: 1}
"""


def test_text_report_names_the_pod_and_prints_no_stale_values_for_a_lost_gpu(
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "lost.yaml"
    scenario.write_text(LOST_WITH_PODS)
    result = subprocess.run(
        [sys.executable, "-m", "gpu_exporter", "diagnose", "--simulate", str(scenario),
         "--duration", "1.5", "--interval", "0.5"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == diagnose.EXIT_ATTENTION, result.stderr
    state = out.split("State at the end of the profile:\n")[1].split("\n\n")[0]
    lost_row = next(line for line in state.splitlines() if line.startswith("  1 "))
    assert lost_row.split()[3:7] == ["NO", "n/a", "n/a", "n/a"], lost_row
    assert "MHz" not in lost_row and " W " not in lost_row and " C " not in lost_row
    assert "GPU 1: GPU not answering" in state and "no current clocks" in state
    profile = out.split("Activity profile (")[1].split("Time by category")[0]
    assert "train/llama-0" in profile and "train/llama-1" in profile
    health_text = out.split("1. Health")[1].split("2. Steady and comparable")[0]
    assert "GPU 1 (train/llama-1):" in health_text and "GpuLost [critical, pending]" in health_text
    assert "1. Drain:" in health_text
    # The healthy one has its verdict line and no health entry.
    assert [line for line in health_text.splitlines() if "GPU 0" in line] == [
        "    GPU 0: pass (no input shows a fault)"
    ]

"""`gpu-exporter diagnose` shows the daemon's latched health verdict: each GPU's (verdict, next
step, reason), the node's (the worst of its GPUs'), `health_validation` in NVIDIA Health
Validation's shape, and a warning or critical node verdict needs attention (exit status 1).
The faults scenario's verdicts are tested with its profile in tests/test_diagnose_health.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_exporter import diagnose
from gpu_exporter.collect.classify import Classifier
from gpu_exporter.collect.nvml.topology import Topology
from gpu_exporter.diagnose import health
from gpu_exporter.diagnose.report import Profile, Run, build_report
from gpu_exporter.diagnose.verdict import NOT_JUDGED, node_verdict
from gpu_exporter.model import xids
from gpu_exporter.model.health_verdict import XID_ROWS, NextStep
from tests.shared_node import ticks
from tests.test_diagnose import parse, run_json
from tests.test_diagnose_health import pack_copy

# GPU 0 reports XID 61 (warning: NVIDIA wants a bug report), GPU 1 XID 13 (info: an application
# bug), GPU 2 nothing; all three busy with tensor work, which needs no attention.
WARNED = """\
name: warned
defaults: {model: NVIDIA H200, values: {utilization: 0.98, sm_active: 0.9, tensor_active: 0.7,
           dram_active: 0.4}}
devices:
  - {}
  - {}
  - {}
faults:
  - {at: 1.5, device: 0, kind: xid, xid: 61}
  - {at: 1.5, device: 1, kind: xid, xid: 13}
"""
# Only the info: nothing to do to the GPU, so nothing needs attention.
INFO_ONLY = WARNED.replace("  - {at: 1.5, device: 0, kind: xid, xid: 61}\n", "")
# NVML reports XIDs from its registration on, and a busy machine can take a second to get
# there: the XIDs come at 1.5 s, and the profile lasts long enough to see them delivered.
SHORT = ("--duration", "3", "--interval", "0.5")


def scenario(tmp_path: Path, text: str) -> str:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return str(path)


def test_mixed_node_passes_and_needs_attention_only_for_its_classes(capsys) -> None:
    """No health input of the mixed scenario shows a fault (its throttling is a class, not a
    health verdict input), so every GPU passes; its exit status 1 is the launch-, link-bound
    and throttled GPUs', not the verdict's."""
    status, report = run_json(capsys, "--simulate", "mixed", *SHORT)
    assert [d["health_verdict"]["verdict"] for d in report["devices"]] == ["pass"] * 8
    assert {d["health_verdict"]["action"] for d in report["devices"]} == {"none"}
    assert report["health"]["node_verdict"] == {
        "verdict": "pass", "gpus": list(range(8)), "not_judged": [],
    }  # fmt: skip
    assert report["health_validation"]["verdict"] == "PASS"
    assert report["health_validation"]["affected_components"] == []
    problems = [p for d in report["devices"] for p in d["problems"]]
    assert problems and all(
        p.startswith(("launch_bound", "link_bound", "throttled")) for p in problems
    )
    assert status == report["exit_status"] == diagnose.EXIT_ATTENTION


def test_xid_61_is_a_warning_whose_step_is_a_bug_report(tmp_path: Path, capsys) -> None:
    status, report = run_json(capsys, "--simulate", scenario(tmp_path, WARNED), *SHORT)
    warned, informed, quiet = report["devices"]
    assert warned["health_verdict"]["verdict"] == "warning"
    assert warned["health_verdict"]["action"] == XID_ROWS[61].action.value == "report_issue"
    assert warned["health_verdict"]["reason"] == "xid_61"
    assert informed["health_verdict"]["verdict"] == "info"
    assert informed["health_verdict"]["action"] == "restart_app"
    assert quiet["health_verdict"]["verdict"] == "pass"
    assert report["health"]["node_verdict"]["verdict"] == "warning"
    assert report["health"]["node_verdict"]["gpus"] == [0]
    hv = report["health_validation"]
    assert hv["verdict"] == "WARNING"
    assert [(c["check_ids"], c["max_severity"], c["recommended_action"])
            for c in hv["affected_components"]] == [
        (["xid_61"], "WARNING", "report_issue"), (["xid_13"], "INFO", "restart_app"),
    ]  # fmt: skip
    # GpuXidWarning's step for 61 is the table's: a bug report, not restarting the application.
    (finding,) = warned["health_findings"]
    assert finding["alert"] == "GpuXidWarning"
    assert [s["text"] for s in finding["steps"]] == [health.REPORT_ISSUE.for_gpu("0")]
    assert not any("Restart the application" in step for step in warned["next_steps"])
    assert status == report["exit_status"] == diagnose.EXIT_ATTENTION


def test_text_report_opens_health_with_the_node_and_gpu_verdicts(tmp_path: Path, capsys) -> None:
    status = diagnose.run(parse("--simulate", scenario(tmp_path, WARNED), *SHORT))
    out = capsys.readouterr().out
    health_text = out.split("1. Health")[1].split("2. Steady and comparable")[0]
    lines = health_text.splitlines()
    assert lines[1] == "  node verdict: warning (GPU 0)"
    assert lines[2].startswith("    GPU 0: warning, next step report_issue (xid_61: XID 61:")
    assert any(line.startswith("    GPU 1: info, next step restart_app (xid_13:") for line in lines)
    assert "    GPU 2: pass (no input shows a fault)" in lines
    assert status == diagnose.EXIT_ATTENTION


def test_an_info_verdict_alone_needs_no_attention(tmp_path: Path, capsys) -> None:
    status, report = run_json(capsys, "--simulate", scenario(tmp_path, INFO_ONLY), *SHORT)
    assert report["health"]["node_verdict"] == {"verdict": "info", "gpus": [1], "not_judged": []}
    assert report["health_validation"]["verdict"] == "INFO"
    assert status == report["exit_status"] == diagnose.EXIT_OK, report["devices"]


def test_a_gpu_the_latch_never_saw_has_no_verdict_and_says_why() -> None:
    """A report from a profile whose latch was fed nothing: no verdict (null), never pass."""
    profile = Profile(Classifier(), diagnose.HealthRules())
    for _, series in ticks(2):
        for view in series.devices():
            profile.last[view.index] = view
        profile.ticks += 1
    report = build_report(
        Run("shared-node", 2.0, 1.0), {}, Topology((), (), ()), profile, None, "n1"
    )
    assert report["devices"]
    for device in report["devices"]:
        assert device["health_verdict"] is None
        assert device["health_verdict_unavailable"] == NOT_JUDGED
    indexes = [d["index"] for d in report["devices"]]
    assert report["health"]["node_verdict"] == {
        "verdict": "pass",
        "gpus": [],
        "not_judged": indexes,
    }
    assert report["health_validation"] == {
        "node": "n1",
        "verdict": "PASS",
        "affected_components": [],
    }


def test_the_node_verdict_is_its_worst_gpus() -> None:
    def device(index: int, verdict: str | None) -> dict[str, Any]:
        return {"index": index, "health_verdict": None if verdict is None else {"verdict": verdict}}

    devices = [device(0, "info"), device(1, "critical"), device(2, None), device(3, "critical")]
    assert node_verdict(devices) == {"verdict": "critical", "gpus": [1, 3], "not_judged": [2]}
    assert node_verdict([device(0, "pass"), device(1, "pass")])["gpus"] == [0, 1]
    assert node_verdict([])["verdict"] == "pass"


def test_every_warning_xid_has_the_step_its_table_row_names() -> None:
    """GpuXidWarning's steps come from the verdict table, for every XID it alerts on."""
    expected = {
        NextStep.RESTART_APP: health.RESTART_APP,
        NextStep.REPORT_ISSUE: health.REPORT_ISSUE,
    }
    for xid in xids.WARNING_XIDS:
        finding = health.HealthFinding(
            "GpuXidWarning", "warning", "firing", True, 0, {"xid": str(xid)}, "", ""
        )
        assert finding.steps == (expected[XID_ROWS[xid].action],), xid


def test_a_warning_verdict_needs_attention_even_without_a_finding(tmp_path: Path, capsys) -> None:
    """With a pack that no longer alerts on XID 61, the verdict alone makes the exit status 1,
    names itself among the GPU's problems and keeps performance advice off the GPU."""
    pack = pack_copy(tmp_path, "GpuXidWarning", '"61|94"', '"94"')
    status, report = run_json(
        capsys, "--simulate", scenario(tmp_path, WARNED), *SHORT, "--health-rules", str(pack)
    )
    warned = report["devices"][0]
    assert warned["health_findings"] == [] and warned["health_verdict"]["verdict"] == "warning"
    assert warned["problems"][0].startswith("health verdict warning: XID 61:")
    assert warned["next_steps"] == [] and warned["idle_allocations"] == []
    assert report["devices"][2]["next_steps_for"] == "tensor_bound"  # the passing GPU keeps it
    assert status == report["exit_status"] == diagnose.EXIT_ATTENTION

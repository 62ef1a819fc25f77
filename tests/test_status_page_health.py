"""The status page of a real `gpu-exporter serve --simulate`, read in headless Chromium.

Each test starts the daemon as a user would, waits (through its API) until what the page is to
show exists, then loads `/` with the daemon's own CSP and reads the rendered DOM (see
tests/test_status_page.py for the browser and DOM helpers):
  - `mixed` (the default scenario, whose `pods:` the built-in fake kubelet serves): pods, class
    chips coloured by kind (a free GPU's too), the classifier's reason, link columns;
  - `faults`: the XID 79 and XID 48 GPUs unhealthy, with the XID that happened, standing out;
  - rules disabled: the health column says there is no verdict, and why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from gpu_exporter import sim
from gpu_exporter.alerting.health import (
    GROUP_MISSING,
    HEALTH_GROUP,
    NOT_YET,
    RULES_DISABLED,
    HealthView,
)
from gpu_exporter.alerting.rules.manager import RuleManager
from gpu_exporter.alerting.settings import RulesConfig
from gpu_exporter.collect.classify import class_kind
from gpu_exporter.collect.nvml.source import NvmlSource
from gpu_exporter.collect.source import ErrorLog
from gpu_exporter.model.xids import CRITICAL
from gpu_exporter.pipeline.sampler import Sampler
from tests.conftest import ManualClock
from tests.daemon import Daemon, serve
from tests.support import wait_for
from tests.test_status_page import Dom, chromium

# What each GPU of `mixed` is built to be (gpu_exporter/sim/scenarios/mixed.yaml).
MIXED_CLASSES = {
    "0": "idle",
    "1": "compute_bound",
    "2": "tensor_bound",
    "3": "memory_bound",
    "4": "launch_bound",
    "5": "throttled",
    "6": "throttled",
    "7": "link_bound",
}


def mixed_pods() -> dict[str, set[str]]:
    """GPU index -> the "namespace/pod"s that hold it during `mixed` (its `pods:` block; one
    GPU's pod is replaced mid-run)."""
    scenario = sim.load_scenario("mixed")
    gpu = {d.uuid: str(d.index) for d in scenario.devices}
    held: dict[str, set[str]] = {}
    for p in scenario.pods:
        held.setdefault(gpu[p.device_id], set()).add(f"{p.namespace}/{p.pod}")
    return held


def devices(daemon: Daemon) -> list[dict[str, Any]]:
    try:
        answer = daemon.get("/api/v1/devices")
    except httpx.TransportError:
        return []
    return answer.json()["data"]["devices"] if answer.status_code == 200 else []


def page(daemon: Daemon, tmp_path: Path) -> dict[str, dict[str, Any]]:
    """The GPU rows (not MIG instance rows) of the daemon's own page, by GPU index."""
    dom = Dom(chromium(tmp_path, f"{daemon.url}/", "--dump-dom"))
    assert dom.attrs("div", id="error").get("hidden") is not None  # the API answered
    return {row["gpu"]: row for row in dom.rows["gpus"]}


def test_mixed_shows_pods_class_kinds_reasons_and_links(tmp_path: Path) -> None:
    with serve(tmp_path, "--simulate") as daemon:
        daemon.wait_ready(timeout=30)

        def settled() -> list[dict[str, Any]]:
            found = devices(daemon)
            classes = {str(d["index"]): d["bottleneck"] for d in found}
            evaluated = all(d["health"]["state"] != "unknown" for d in found)
            return found if classes == MIXED_CLASSES and evaluated else []

        answer = wait_for(settled, 60, "mixed's classes and the first health evaluation")
        gpus = page(daemon, tmp_path)

    assert sorted(gpus) == sorted(MIXED_CLASSES)
    held = mixed_pods()
    for gpu, row in gpus.items():
        assert row["pod"] in held.get(gpu, {"—"}), (gpu, row)
    # The idle GPU is held (idle but allocated); one GPU is free.
    assert "0" in held and len(held) == len(MIXED_CLASSES) - 1
    for gpu, cls in MIXED_CLASSES.items():
        assert gpus[gpu]["bottleneck"] == cls
        assert gpus[gpu]["kind"] == class_kind(cls, held=gpu in held), gpus[gpu]
        assert gpus[gpu]["health"] == "ok" and gpus[gpu]["attrs"]["data-health"] == "healthy"
    # Held and idle is waste; at a hardware roof is fine, whichever roof it is.
    assert gpus["0"]["kind"] == gpus["4"]["kind"] == gpus["5"]["kind"] == "waste"
    assert gpus["2"]["kind"] == gpus["3"]["kind"] == "fine"
    # The reason is the classifier's line (the API's, a tick or two apart: the same words).
    reasons = {str(d["index"]): d["bottleneck_reason"] for d in answer}
    for gpu, row in gpus.items():
        conclusion, numbers = row["why"].split(": ", 1)
        assert reasons[gpu].startswith(conclusion + ": ") and "%" in numbers, (row, reasons)
    assert gpus["0"]["why"].startswith("no kernel running")
    assert gpus["7"]["why"].startswith("SMs wait on transfers: NVLink")
    assert gpus["4"]["why"].startswith("SMs mostly empty")
    # Link columns: GPU 7's NVLink near capacity (the hot bar), PCIe Gen5 x16 capacity.
    assert gpus["7"]["nvlink"].endswith(" / 450 GB/s") and gpus["7"]["hot"] == {"nvlink"}
    assert float(gpus["7"]["nvlink"].split(" / ")[0]) >= 0.6 * 450, gpus["7"]
    assert all(row["pcie"].endswith(" / 63 GB/s") for row in gpus.values()), gpus
    assert not any(row["hot"] & {"pcie", "nvlink"} for gpu, row in gpus.items() if gpu != "7")


def test_faults_xid_gpus_are_unhealthy_name_their_xid_and_stand_out(tmp_path: Path) -> None:
    with serve(tmp_path, "--simulate", "faults") as daemon:
        daemon.wait_ready(timeout=30)

        def xids_firing() -> list[dict[str, Any]]:
            found = devices(daemon)
            states = {d["index"]: d["health"]["state"] for d in found}
            return found if states.get(1) == states.get(2) == "unhealthy" else []

        answer = wait_for(xids_firing, 60, "GpuXidCritical firing for GPUs 1 and 2")
        gpus = page(daemon, tmp_path)

    for gpu, xid in (("1", 79), ("2", 48)):
        row = gpus[gpu]
        assert (f"XID {xid}: {CRITICAL[xid]}", "firing") in row["problems"], row
        assert "unhealthy" in row["attrs"]["class"].split(), row  # the row style
        assert row["attrs"]["data-health"] == "unhealthy"
    # The others have no health alert firing: no row style, no firing problem.
    healthy = [str(d["index"]) for d in answer if d["health"]["state"] != "unhealthy"]
    assert "0" in healthy and "3" in healthy, answer
    for gpu in healthy:
        assert "unhealthy" not in gpus[gpu]["attrs"]["class"].split(), gpus[gpu]
        assert all(state != "firing" for _, state in gpus[gpu]["problems"]), gpus[gpu]


def test_without_in_daemon_rules_health_says_there_is_no_verdict(tmp_path: Path) -> None:
    config = tmp_path / "no-rules.yaml"
    config.write_text("rules:\n  enabled: false\n")
    with serve(tmp_path, "--simulate", "faults", "--config", str(config)) as daemon:
        daemon.wait_ready(timeout=30)
        wait_for(lambda: devices(daemon), 30, "the first snapshot")
        gpus = page(daemon, tmp_path)

    assert len(gpus) == 4
    for row in gpus.values():
        assert row["health"] == "unknown" and row["titles"]["health"] == RULES_DISABLED, row
        assert row["attrs"]["data-health"] == "unknown" and row["problems"] == []


# -- where the verdict comes from -------------------------------------------------------------


def test_the_shipped_pack_defines_what_the_health_column_shows() -> None:
    rules = RuleManager(RulesConfig())  # the shipped rule pack
    rules.load()
    groups = {group["name"]: group for group in rules.rules_json()}
    assert HEALTH_GROUP in groups, sorted(groups)
    names = {rule["name"] for rule in groups[HEALTH_GROUP]["rules"]}
    assert {
        "GpuXidCritical", "GpuXidWarning", "GpuUncorrectableEccErrors", "GpuRowRemapPending",
        "GpuRowRemapFailure", "GpuRetiredPagesPending", "GpuLost", "GpuRecoveryActionRequired",
    } <= names  # fmt: skip
    # Before its first evaluation the group has no verdict to give.
    assert HealthView(rules.rules_json()).of(0) == {
        "state": "unknown",
        "why": NOT_YET,
        "problems": [],
    }


def test_a_pending_health_alert_makes_the_gpu_pending_and_other_groups_do_not_count(
    tmp_path: Path,
) -> None:
    rules_file = tmp_path / "health.rules.yaml"
    rules_file.write_text(f"""groups:
  - name: {HEALTH_GROUP}
    rules:
      - alert: GpuAlwaysPending
        expr: gpu_up{{gpu="1"}} == 1
        for: 1h
        labels: {{severity: warning}}
        annotations: {{summary: "GPU {{{{ $labels.gpu }}}} waits"}}
  - name: other
    rules:
      - alert: NotAboutHealth
        expr: gpu_up == 1
""")
    clock = ManualClock()
    sim.install("mixed", clock=clock)
    errors = ErrorLog()
    source = NvmlSource(errors=errors, clock=clock)
    try:
        source.start()
        rules = RuleManager(RulesConfig(files=[str(rules_file)], evaluation_interval_seconds=5.0))
        rules.load()
        sampler = Sampler(source, errors, interval=5.0, wall_clock=lambda: 1.75e9 + clock.now)
        sampler.add_listener(rules)
        clock.advance(5.0)
        sampler.tick()
        groups = rules.rules_json()
    finally:
        source.close()
        sim.uninstall()

    health = HealthView(groups)
    assert health.of(1) == {"state": "pending", "why": None, "problems": [{
        "alertname": "GpuAlwaysPending", "state": "pending", "severity": "warning",
        "text": "GpuAlwaysPending", "summary": "GPU 1 waits",
    }]}  # fmt: skip
    assert health.of(0) == {"state": "healthy", "why": None, "problems": []}  # NotAboutHealth
    others = [group for group in groups if group["name"] != HEALTH_GROUP]
    assert HealthView(others).of(1)["why"] == GROUP_MISSING
    assert HealthView(None).of(1)["why"] == RULES_DISABLED

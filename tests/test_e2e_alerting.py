"""End to end with real servers: the daemon on `--simulate mixed` evaluates rules and sends
alerts to a real Alertmanager (webhook receiver in the test); a real Prometheus scrapes the
daemon and evaluates the exported PrometheusRule; both must raise the same alerts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.daemon import free_port, serve, serve_with_live_rules
from tests.servers import Recorder, alertmanager, prometheus
from tests.support import wait_for

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "tests/e2e/alerts.rules.yaml"
NODE = "e2e-node"
LAUNCH_BOUND, COMPUTE_BOUND, THERMAL, POWER_BRAKE = "4", "1", "5", "6"


def exported_rules(tmp_path: Path) -> Path:
    """`gpu-exporter rules export` -> the PrometheusRule's spec as a Prometheus rule file."""
    result = subprocess.run(
        [sys.executable, "-m", "gpu_exporter", "rules", "export", str(RULES)],
        capture_output=True,
        text=True,
        check=True,
    )
    manifest = yaml.safe_load(result.stdout)
    assert manifest["kind"] == "PrometheusRule"
    path = tmp_path / "exported.rules.yaml"
    path.write_text(yaml.safe_dump(manifest["spec"]))
    return path


def firing(url: str) -> set[tuple[tuple[str, str], ...]]:
    alerts = httpx.get(f"{url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    return {tuple(sorted(a["labels"].items())) for a in alerts if a["state"] == "firing"}


def by_gpu(alerts: set[tuple[tuple[str, str], ...]], name: str) -> set[str]:
    return {dict(a)["gpu"] for a in alerts if dict(a)["alertname"] == name}


def webhook_alerts(hook: Recorder) -> list[dict[str, Any]]:
    return [alert for request in hook.requests for alert in request.body.get("alerts", [])]


def test_daemon_and_prometheus_raise_the_same_alerts(tmp_path: Path) -> None:
    with (
        Recorder() as hook,
        alertmanager(tmp_path / "am", f"{hook.url}/hook") as am_url,
        serve(
            tmp_path,
            "--simulate",
            "mixed",
            "--interval",
            "0.5",
            "--rules",
            str(RULES),
            "--alertmanager-url",
            am_url,
            "--external-label",
            f"node={NODE}",
        ) as daemon,
    ):
        daemon.wait_ready()
        with prometheus(
            tmp_path / "prom", f"127.0.0.1:{daemon.port}", exported_rules(tmp_path), am_url, NODE
        ) as prom_url:
            expected = {
                ("GpuBusyButIdle", LAUNCH_BOUND),
                ("GpuThermalSlowdown", THERMAL),
                ("GpuPowerBrakeSlowdown", POWER_BRAKE),
            }

            def both_fire() -> bool:
                ours, theirs = firing(daemon.url), firing(prom_url)
                return all(
                    gpu in by_gpu(ours, name) and gpu in by_gpu(theirs, name)
                    for name, gpu in expected
                )

            wait_for(both_fire, 60, "both paths to fire the expected alerts")
            ours, theirs = firing(daemon.url), firing(prom_url)
            # The daemon's alerts get `node` as an external label when sent; Prometheus' series
            # get it from relabeling. With it added, the label sets are the same.
            ours_sent = {tuple(sorted((*a, ("node", NODE)))) for a in ours}
            for name, _ in expected:
                mine = {a for a in ours_sent if dict(a)["alertname"] == name}
                prom = {a for a in theirs if dict(a)["alertname"] == name}
                assert mine == prom, (name, mine ^ prom)
            assert COMPUTE_BOUND not in by_gpu(ours, "GpuBusyButIdle")
            assert COMPUTE_BOUND not in by_gpu(ours, "GpuThermalSlowdown")

            # Alertmanager's webhook received them, with the daemon's external label.
            def delivered() -> bool:
                got = {
                    (a["labels"]["alertname"], a["labels"].get("gpu"))
                    for a in webhook_alerts(hook)
                    if a["status"] == "firing" and a["labels"].get("node") == NODE
                }
                return expected <= got

            wait_for(delivered, 30, "the webhook to receive the alerts")
            received = webhook_alerts(hook)
            assert not [
                a for a in received
                if a["labels"]["alertname"] == "GpuBusyButIdle"
                and a["labels"]["gpu"] == COMPUTE_BOUND
            ]  # fmt: skip


def test_alerts_survive_alertmanager_downtime(tmp_path: Path) -> None:
    am_port = free_port()
    late_rule = tmp_path / "late.rules.yaml"
    late_rule.write_text(
        "groups:\n- name: late\n  rules:\n"
        "  - alert: GpuLateAlert\n    expr: gpu_up == 1\n    for: 8s\n"
        "    labels: {severity: info}\n"
    )
    config = tmp_path / "daemon.yaml"
    config.write_text("alerting:\n  resend_delay_seconds: 600\n")  # no help from resending
    with Recorder() as hook:
        am_url = f"http://127.0.0.1:{am_port}"
        with serve(
            tmp_path,
            "--simulate",
            "mixed",
            "--metrics-profile",
            "full",  # the notifier's queue length with the rest
            "--interval",
            "0.5",
            "--config",
            str(config),
            "--rules",
            str(late_rule),
            "--alertmanager-url",
            am_url,
        ) as daemon:
            daemon.wait_ready()
            # Alertmanager is down when the alert starts firing (after 8 s) ...
            wait_for(lambda: by_gpu(firing(daemon.url), "GpuLateAlert"), 20, "the alert to fire")
            metrics = daemon.metrics_text()
            assert "gpu_exporter_notifications_queue_length{" in metrics
            # ... and comes up later: the queued alerts are delivered.
            with alertmanager(tmp_path / "am", f"{hook.url}/hook", port=am_port):

                def all_eight() -> bool:
                    gpus = {
                        a["labels"]["gpu"]
                        for a in webhook_alerts(hook)
                        if a["labels"]["alertname"] == "GpuLateAlert"
                    }
                    return gpus == {str(i) for i in range(8)}

                wait_for(all_eight, 30, "the queued alerts after Alertmanager started")
            text = daemon.metrics_text()
            errors = [
                line for line in text.splitlines()
                if line.startswith("gpu_exporter_notifications_errors_total{")
            ]  # fmt: skip
            assert errors and float(errors[0].rsplit(" ", 1)[1]) > 0, "the failed POSTs counted"


def test_sighup_reloads_rules_and_a_broken_file_keeps_the_last_good_ones(tmp_path: Path) -> None:
    first = "groups:\n- name: live\n  rules:\n  - alert: First\n    expr: gpu_up == 1\n"
    with serve_with_live_rules(tmp_path, first) as (daemon, rules):
        assert daemon.rule_names() == ["First"]
        rules.write_text(rules.read_text().replace("First", "Second"))
        daemon.reload_rules()
        wait_for(lambda: daemon.rule_names() == ["Second"], 10, "the reload after SIGHUP")
        rules.write_text("groups:\n- name: live\n  rules:\n  - alert: Third\n    expr: 'up >'\n")
        daemon.reload_rules()
        wait_for(
            lambda: "gpu_exporter_rule_reload_success 0.0" in daemon.metrics_text(),
            10,
            "the failed reload to be reported",
        )
        assert daemon.rule_names() == ["Second"]
        assert daemon.process.poll() is None


def test_firing_and_resolution_during_an_alertmanager_restart_are_delivered(
    tmp_path: Path,
) -> None:
    """Alertmanager runs, stops, and comes back: an alert that fired and resolved while it
    was down still reaches it (nothing is dropped while the queue has room)."""
    scenario = tmp_path / "blip.yaml"
    scenario.write_text(
        "name: blip\n"
        "defaults: {model: NVIDIA H200, values: {utilization: 0.5}}\n"
        "devices: [{label: a}, {label: b}]\n"
        "faults: [{at: 6, device: 1, kind: gpu_lost, until: 10}]\n"
    )
    rules = tmp_path / "down.rules.yaml"
    rules.write_text("groups:\n- name: down\n  rules:\n  - alert: GpuDown\n    expr: gpu_up == 0\n")
    config = tmp_path / "daemon.yaml"
    config.write_text(
        "alerting:\n  resend_delay_seconds: 600\n"
        "nvml:\n  recovery_initial_backoff_seconds: 0.5\n  recovery_max_backoff_seconds: 1\n"
    )
    am_port = free_port()
    with Recorder() as hook:
        with alertmanager(tmp_path / "am1", f"{hook.url}/hook", port=am_port) as am_url:
            daemon_cm = serve(
                tmp_path, "--simulate", str(scenario), "--interval", "0.5", "--config",
                str(config), "--rules", str(rules), "--alertmanager-url", am_url,
            )  # fmt: skip
            daemon = daemon_cm.__enter__()
        try:
            daemon.wait_ready()
            # Alertmanager is gone before the GPU is lost (6 s) and back after it recovered.
            wait_for(lambda: by_gpu(firing(daemon.url), "GpuDown") == {"1"}, 20, "GpuDown")
            wait_for(lambda: not by_gpu(firing(daemon.url), "GpuDown"), 20, "the resolution")
            with alertmanager(tmp_path / "am2", f"{hook.url}/hook", port=am_port):

                def sent() -> float:
                    for line in daemon.metrics_text().splitlines():
                        if line.startswith("gpu_exporter_notifications_sent_total{"):
                            return float(line.rsplit(" ", 1)[1])
                    return 0.0

                # The firing and the resolved notification, both queued while it was down,
                # are accepted by Alertmanager. (Its webhook stays quiet: Alertmanager does not
                # announce the resolution of an alert it never announced as firing.)
                wait_for(lambda: sent() >= 2, 20, "both notifications to be delivered")
            text = daemon.metrics_text()
            errors = [
                line for line in text.splitlines()
                if line.startswith("gpu_exporter_notifications_errors_total{")
            ]  # fmt: skip
            # Connection refused while it was down: counted as unreachable, and kept.
            [unreachable] = [line for line in errors if 'reason="unreachable"' in line]
            assert float(unreachable.rsplit(" ", 1)[1]) > 0, "POSTs failed while it was down"
            text = daemon.metrics_text()
            assert 'gpu_exporter_notifications_dropped_total{alertmanager="' in text
            dropped = [
                line for line in text.splitlines()
                if line.startswith("gpu_exporter_notifications_dropped_total{")
            ]  # fmt: skip
            assert float(dropped[0].rsplit(" ", 1)[1]) == 0
        finally:
            daemon_cm.__exit__(None, None, None)


def test_busy_but_idle_fires_for_the_launch_bound_mig_instance_only(tmp_path: Path) -> None:
    """`--simulate mig`: GI 9 of GPU 0 is launch-bound (engine busy, SMs nearly empty); the
    other instances serve, idle, or have no activity (A100). One alert, on both paths, with
    the instance's labels."""
    from gpu_exporter.sim.scenario import load_scenario

    spec = load_scenario("mig").devices[0]
    assert spec.mig is not None
    launch_bound = next(i for i in spec.mig.instances if i.gpu_instance == 9).mig_uuids[0]
    with (
        Recorder() as hook,
        alertmanager(tmp_path / "am", f"{hook.url}/hook") as am_url,
        serve(
            tmp_path, "--simulate", "mig", "--interval", "0.5", "--rules", str(RULES),
            "--alertmanager-url", am_url, "--external-label", f"node={NODE}",
        ) as daemon,
    ):  # fmt: skip
        daemon.wait_ready()
        with prometheus(
            tmp_path / "prom", f"127.0.0.1:{daemon.port}", exported_rules(tmp_path), am_url, NODE
        ) as prom_url:

            def busy_but_idle(url: str, node: bool) -> set[tuple[tuple[str, str], ...]]:
                return {
                    tuple(sorted((*a, ("node", NODE)) if node else a))
                    for a in firing(url)
                    if dict(a)["alertname"] == "GpuBusyButIdle"
                }

            def both_fire() -> bool:
                return bool(busy_but_idle(daemon.url, True) and busy_but_idle(prom_url, False))

            assert wait_for(both_fire, 60, "both paths to fire GpuBusyButIdle"), daemon.output()
            ours, theirs = busy_but_idle(daemon.url, True), busy_but_idle(prom_url, False)
            assert ours == theirs, ours ^ theirs
            (alert,) = (dict(a) for a in ours)
            assert alert["gpu"] == "0" and alert["uuid"] == spec.uuid
            assert (alert["gpu_instance"], alert["mig_profile"]) == ("9", "1g.18gb")
            assert alert["mig_uuid"] == launch_bound


def test_the_e2e_busy_but_idle_is_the_shipped_rule_with_short_windows() -> None:
    """The end-to-end runs judge the shipped expression, not a copy that drifted from it."""
    import re

    def expr(path: Path, alert: str) -> str:
        groups = yaml.safe_load(path.read_text())["groups"]
        (found,) = [r["expr"] for g in groups for r in g["rules"] if r.get("alert") == alert]
        found = re.sub(r"#[^\n]*", "", found)  # PromQL comments
        return " ".join(re.sub(r"\[\d+[smh]\]", "[range]", found).split())

    shipped = ROOT / "rules/gpu-exporter.rules.yaml"
    assert expr(RULES, "GpuBusyButIdle") == expr(shipped, "GpuBusyButIdle")

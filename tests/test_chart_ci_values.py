"""Every values file in helm/gpu-exporter/ci/ (the chart's CI scenarios, also linted by
scripts/check-deploy.sh) renders into files the daemon accepts: the configuration ConfigMap,
the rules ConfigMap and the web-config Secret are laid out as the pod mounts them and checked
with `gpu-exporter config check --root`, as `serve` loads them at start. A scenario the daemon
would refuse fails here, naming the file, line and setting, although helm renders it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_values_schema import CHART, HELM, pod_files

CI_VALUES = sorted(path.name for path in (CHART / "ci").glob("*-values.yaml"))


def render(chart: Path, values: Path) -> list[dict[str, Any]]:
    assert HELM.exists(), f"{HELM} is missing: run scripts/install-tools.sh"
    result = subprocess.run(
        [
            str(HELM),
            "template",
            "gpu-exporter",
            str(chart),
            "-n",
            "gpu-exporter",
            "-f",
            str(values),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"{values.name}: {result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def config_check(chart: Path, values: Path, root: Path) -> subprocess.CompletedProcess[str]:
    """`gpu-exporter config check` on what the chart renders with `values`, as the pod sees it."""
    config = pod_files(render(chart, values), root)
    return subprocess.run(
        [sys.executable, "-m", "gpu_exporter", "config", "check", "--root", str(root), str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_ci_scenarios_cover_the_modes_that_change_the_configuration():
    assert {
        "all-on-values.yaml",
        "alertmanager-auth-values.yaml",
        "dcgm-embedded-values.yaml",
        "dcgm-operator-values.yaml",
        "restricted-values.yaml",
    } <= set(CI_VALUES)


@pytest.mark.parametrize("name", CI_VALUES)
def test_every_ci_scenario_renders_a_configuration_the_daemon_accepts(name, tmp_path):
    root = tmp_path / "pod"
    result = config_check(CHART, CHART / "ci" / name, root)
    assert result.returncode == 0, f"ci/{name}: {result.stderr}"
    assert result.stdout.endswith(": OK\n"), result.stdout
    # The check read the chart's rule files where the pod mounts them, when there are rules.
    rules = sorted((root / "etc/gpu-exporter/rules").glob("*.yaml"))
    config = yaml.safe_load((root / "etc/gpu-exporter/config/config.yaml").read_text())
    assert bool(rules) is config["rules"]["enabled"]


def test_a_scenario_the_daemon_refuses_fails_although_helm_renders_it(tmp_path):
    """Settings valid one by one (the schema passes them, the templates write them) that the
    daemon refuses together: a device deadline as long as the sampling interval."""
    chart = tmp_path / "gpu-exporter"
    shutil.copytree(CHART, chart)
    bad = chart / "ci" / "bad-values.yaml"
    bad.write_text("config:\n  intervalSeconds: 1\n  nvml: {device_deadline_seconds: 1}\n")
    result = config_check(chart, bad, tmp_path / "pod")
    assert result.returncode == 2
    assert "nvml.device_deadline_seconds (1) must be shorter than interval_seconds (1)" in (
        result.stderr
    )

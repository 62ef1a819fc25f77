"""What reaches a person, end to end: the shipped pack's own annotations, evaluated by the
daemon on `--simulate` (the default scenario, with pods from its fake kubelet) and by a real
Prometheus from the exported PrometheusRule, both delivering to a real Alertmanager.

Every alert there must carry an absolute runbook_url that the daemon answers with HTTP 200 and
a section for that alert, and a summary that names the node and, for an alert about a pod's
GPU, the pod. Only the windows and `for` durations are shortened (the text, labels and
expressions are the shipped ones), so that alerts fire within seconds.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from gpu_exporter.alerting.rules.runbook import anchor_of
from tests.daemon import serve
from tests.servers import Recorder, alertmanager, prometheus
from tests.support import wait_for

ROOT = Path(__file__).resolve().parent.parent
NODE = "gpu-node-7"
# Alerts the default scenario raises within seconds once windows are short.
EXPECTED = {
    "GpuAllocatedButIdle",
    "GpuBusyButIdle",
    "GpuLinkBound",
    "GpuMemoryBandwidthBound",
    "GpuThermalSlowdown",
    "GpuPowerBrakeSlowdown",
}
# One cause, one alert: a GPU with the first never also has the others.
FOLLOW_ONS = {
    "GpuLinkBound": {"GpuBusyButIdle"},
    "GpuMemoryBandwidthBound": {"GpuTensorCoresIdle"},
    "GpuThermalSlowdown": {"GpuClocksLowWhileBusy"},
    "GpuPowerBrakeSlowdown": {"GpuClocksLowWhileBusy"},
}


def fast_pack(tmp_path: Path) -> Path:
    """The shipped alerting rules with 20 s windows, 8 s `for` and 1 s group intervals (a `for`
    longer than the first seconds, when rates and classes are still settling, as the shipped
    minutes are)."""
    text = (ROOT / "rules/gpu-exporter.rules.yaml").read_text()
    text = re.sub(r"\[(\d+)m\]", "[20s]", text)
    text = re.sub(r"for: \d+[mh]", "for: 8s", text)
    text = re.sub(r"interval: \d+s", "interval: 1s", text)
    path = tmp_path / "fast.rules.yaml"
    path.write_text(text)
    return path


def exported(tmp_path: Path, rules: Path, base_url: str) -> Path:
    """`gpu-exporter rules export --runbook-base-url` -> a Prometheus rule file."""
    command = ["rules", "export", "--runbook-base-url", base_url, str(rules)]
    result = subprocess.run(
        [sys.executable, "-m", "gpu_exporter", *command],
        capture_output=True,
        text=True,
        check=True,
    )
    path = tmp_path / "exported.rules.yaml"
    path.write_text(yaml.safe_dump(yaml.safe_load(result.stdout)["spec"]))
    return path


def am_alerts(am_url: str) -> list[dict[str, Any]]:
    return httpx.get(f"{am_url}/api/v2/alerts", timeout=5).json()


def test_every_alert_in_alertmanager_links_its_runbook_and_names_node_and_pod(
    tmp_path: Path,
) -> None:
    rules = fast_pack(tmp_path)
    with (
        Recorder() as hook,
        alertmanager(tmp_path / "am", f"{hook.url}/hook") as am_url,
        serve(
            tmp_path,
            "--simulate",
            "--interval",
            "0.5",
            "--rules",
            str(rules),
            "--alertmanager-url",
            am_url,
            env={"NODE_NAME": NODE},
        ) as daemon,
    ):
        daemon.wait_ready()
        base = f"http://127.0.0.1:{daemon.port}/runbook"
        with prometheus(
            tmp_path / "prom", f"127.0.0.1:{daemon.port}", exported(tmp_path, rules, base),
            am_url, NODE,
        ):  # fmt: skip
            wait_for(
                lambda: {a["labels"]["alertname"] for a in am_alerts(am_url)} >= EXPECTED,
                90,
                f"Alertmanager to hold {sorted(EXPECTED)}",
            )
            alerts = am_alerts(am_url)
        page = httpx.get(base, timeout=5)
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")

    with_pods = 0
    for alert in alerts:
        labels, annotations = alert["labels"], alert["annotations"]
        name = labels["alertname"]
        url = annotations["runbook_url"]
        parts = urlsplit(url)
        assert parts.scheme == "http" and parts.netloc, (name, url)
        assert url == f"{base}#{anchor_of(name)}", (name, url)
        assert f'id="{parts.fragment}"' in page.text, (name, url)
        assert labels["node"] == NODE, labels
        assert f" on {NODE}" in annotations["summary"], (name, annotations["summary"])
        if "pod" in labels:
            with_pods += 1
            where = f"({labels['namespace']}/{labels['pod']})"
            assert where in annotations["summary"], (name, annotations["summary"])
        assert "{{" not in annotations["summary"] + annotations["description"], annotations
    # The default scenario's pods hold the GPUs these alerts are about.
    assert with_pods, [a["labels"] for a in alerts]
    # Its idle notebook, and nothing else, holds a GPU it does nothing with.
    idle = {
        (a["labels"]["namespace"], a["labels"]["pod"])
        for a in alerts
        if a["labels"]["alertname"] == "GpuAllocatedButIdle"
    }
    assert idle == {("research", "notebook-alice-0")}, idle
    by_gpu: dict[str, set[str]] = {}
    for alert in alerts:
        by_gpu.setdefault(alert["labels"].get("gpu", ""), set()).add(alert["labels"]["alertname"])
    for gpu, names in by_gpu.items():
        for cause, follow_ons in FOLLOW_ONS.items():
            if cause in names:
                assert not names & follow_ons, (gpu, sorted(names))
    # Both paths delivered, and Alertmanager merged them: one alert per label set.
    keys = [tuple(sorted(a["labels"].items())) for a in alerts]
    assert len(keys) == len(set(keys))

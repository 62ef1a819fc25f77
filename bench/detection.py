"""Detection latency: from a fault's start in the scenario to a webhook receiving the alert.

One daemon (`bench/run_daemon.py`: scenario time anchored to a known wall time, 1 s interval)
evaluates the rule itself and sends to a real Alertmanager with external label
`path=daemon`; a real Prometheus (scrape 15 s, evaluation 15 s, external label
`path=prometheus`) scrapes the same daemon, evaluates the same rule file and sends to the same
Alertmanager, whose webhook goes to a recorder here. Alertmanager groups by every label
(`group_wait: 0s`), so each path's alert is delivered on its own. Faults: HW thermal slowdown
steps on at known scenario times on GPUs that were not throttled before.

Rules: `BenchHwThermalSlowdown` (the clock-event bit, no `for`) shows the pipeline's own
latency; with `--full`, the shipped `GpuThermalSlowdown` (5-minute rate > 0.05 for 2m) too.
The servers come from tests/servers.py (Debian's `prometheus` and `prometheus-alertmanager`).
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any

from bench import scenarios
from bench.procs import BENCH, OUR_TICK_FAMILY, OURS, ROOT, free_port, running

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests import servers  # the test suite's server helpers

BENCH_RULE = "BenchHwThermalSlowdown"
SHIPPED_RULE = "GpuThermalSlowdown"

# tests/servers.py's Prometheus configuration with the production-like intervals; its
# `prometheus()` helper formats this template, so the same placeholders are kept.
PROMETHEUS_15S_CONFIG = """\
global:
  scrape_interval: {scrape}
  scrape_timeout: 10s
  evaluation_interval: {evaluation}
  external_labels:
    path: prometheus
rule_files: [{{rules}}]
alerting:
  alertmanagers:
  - static_configs:
    - targets: ['{{alertmanager}}']
scrape_configs:
- job_name: gpu-exporter
  static_configs:
  - targets: ['{{target}}']
  relabel_configs:
  - target_label: node
    replacement: {{node}}
  metric_relabel_configs:
  - action: labeldrop
    regex: instance|job
"""


@dataclass(frozen=True)
class DetectionSettings:
    faults: tuple[tuple[int, float], ...] = ((2, 20.0), (3, 47.0))  # (gpu, scenario seconds)
    shipped_rule: bool = True
    scrape_interval: str = "15s"
    evaluation_interval: str = "15s"
    timeout_after_last_fault: float = 240.0

    @classmethod
    def quick(cls) -> DetectionSettings:
        return cls(faults=((2, 10.0),), shipped_rule=False, timeout_after_last_fault=60.0)


class TimedRecorder(servers.Recorder):
    """The tests' webhook recorder, noting the wall time each request arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[float] = []

    def _record(self, path: str, headers: Message, body: bytes) -> int:
        arrived = time.time()
        status = super()._record(path, headers, body)
        self.arrivals.append(arrived)
        return status


def unavailable() -> str:
    missing = [t for t in ("prometheus", "prometheus-alertmanager") if shutil.which(t) is None]
    return f"not installed: {', '.join(missing)}" if missing else ""


@contextlib.contextmanager
def _prometheus_config(template: str) -> Iterator[None]:
    saved = servers.PROMETHEUS_CONFIG
    servers.PROMETHEUS_CONFIG = template
    try:
        yield
    finally:
        servers.PROMETHEUS_CONFIG = saved


def first_firing(requests: list[Any], arrivals: list[float]) -> dict[tuple[str, str, str], float]:
    """(alertname, path, gpu) -> wall time of the first webhook that carried it firing."""
    seen: dict[tuple[str, str, str], float] = {}
    for request, arrived in zip(requests, arrivals, strict=False):
        for alert in request.body.get("alerts", []):
            if alert.get("status") != "firing":
                continue
            labels = alert.get("labels", {})
            key = (labels.get("alertname", ""), labels.get("path", ""), labels.get("gpu", ""))
            seen.setdefault(key, arrived)
    return seen


def expected(settings: DetectionSettings) -> list[tuple[str, str, str]]:
    rules = [BENCH_RULE, *([SHIPPED_RULE] if settings.shipped_rule else [])]
    return [
        (rule, path, str(gpu))
        for rule in rules
        for path in ("daemon", "prometheus")
        for gpu, _ in settings.faults
    ]


def latencies(
    seen: dict[tuple[str, str, str], float], epoch: float, settings: DetectionSettings
) -> list[dict[str, Any]]:
    at = {str(gpu): when for gpu, when in settings.faults}
    rows = []
    for rule, path, gpu in expected(settings):
        arrived = seen.get((rule, path, gpu))
        rows.append(
            {
                "rule": rule,
                "path": path,
                "gpu": gpu,
                "fault_at_scenario_seconds": at[gpu],
                "latency_seconds": arrived - (epoch + at[gpu]) if arrived is not None else None,
            }
        )
    return rows


def _wait(hook: TimedRecorder, settings: DetectionSettings, deadline: float) -> None:
    wanted = set(expected(settings))
    while time.time() < deadline:
        if wanted <= set(first_firing(list(hook.requests), list(hook.arrivals))):
            return
        time.sleep(0.2)


def run(settings: DetectionSettings, workdir: Path) -> dict[str, Any]:
    missing = unavailable()
    if missing:
        return {"unavailable": missing}
    workdir.mkdir(parents=True, exist_ok=True)
    scenario = scenarios.write_yaml(
        scenarios.thermal_faults(8, settings.faults), workdir / "detection-scenario.yaml"
    )
    shipped = scenarios.shipped_rule(SHIPPED_RULE) if settings.shipped_rule else None
    rules = scenarios.write_yaml(
        scenarios.detection_rule_file(shipped), workdir / "detection.rules.yaml"
    )
    config = PROMETHEUS_15S_CONFIG.format(
        scrape=settings.scrape_interval, evaluation=settings.evaluation_interval
    )
    with (
        TimedRecorder() as hook,
        servers.alertmanager(workdir / "am", f"{hook.url}/hook") as am_url,
    ):
        port = free_port()
        epoch = time.time()
        argv = [
            sys.executable,
            str(BENCH / "run_daemon.py"),
            "--scenario",
            str(scenario),
            "--epoch",
            repr(epoch),
            "--",
            *("--listen-address", f"127.0.0.1:{port}", "--interval", "1"),
            *("--rules", str(rules), "--alertmanager-url", am_url),
            *("--external-label", "path=daemon", "--log-level", "warning"),
        ]
        with (
            running(OURS, argv, port, workdir, OUR_TICK_FAMILY) as daemon,
            _prometheus_config(config),
        ):
            daemon.wait_ready()
            with servers.prometheus(
                workdir / "prometheus", f"127.0.0.1:{port}", rules, am_url, "bench-node"
            ):
                last_fault = max(at for _, at in settings.faults)
                _wait(hook, settings, epoch + last_fault + settings.timeout_after_last_fault)
        seen = first_firing(list(hook.requests), list(hook.arrivals))
    rows = latencies(seen, epoch, settings)
    return {
        "settings": settings.__dict__ | {"faults": [list(f) for f in settings.faults]},
        "rows": rows,
        "webhook_requests": len(hook.requests),
    }

"""End to end on the simulated A100 node with a DCGM host engine (`pre-hopper-dcgm`).

`serve --simulate` runs the production DCGM source through the fake libdcgm; a real Prometheus
scrapes it and evaluates the shipped pack (short `for`). Shown here:
- the A100s' SM/Tensor/DRAM activity is served, from DCGM (`gpu_activity_source_info`), and
  so is each MIG instance's on the A100 in MIG mode (GPU 4), from its GPU instance;
- the launch-bound GPU 2 is classed `launch_bound`, the idle GPU 1 `idle`, GPU 4's instances
  each their own class, and GpuBusyButIdle fires for GPU 2 and GPU 4's launch-bound GPU
  instance 5 alone, with the same labels in the daemon and in Prometheus;
- the host engine stops mid-run: the activity goes absent while NVML sampling goes on (ticks,
  utilization), and it comes back when the host engine does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from gpu_exporter.sim.scenario import builtin_path
from tests.daemon import Daemon, parse_samples, serve
from tests.servers import Recorder, alertmanager, prometheus

ROOT = Path(__file__).resolve().parent.parent
NODE = "a100-node"
DOWN_AT, UP_AT = 25.0, 33.0  # scenario seconds: the host engine stops, then restarts
MIG_GPU = "4"
# The MIG A100's GPU instances with a compute instance each: their classes (the free 1g, GI
# 14, reads all zeros: idle)
MIG_CLASSES = {"1": "tensor_bound", "5": "launch_bound", "13": "memory_bound", "14": "idle"}
ACTIVITY = ("gpu_sm_active_ratio", "gpu_tensor_active_ratio", "gpu_dram_active_ratio")


def scenario_file(tmp_path: Path) -> Path:
    spec = yaml.safe_load(builtin_path("pre-hopper-dcgm").read_text())
    spec["faults"] = [{"kind": "dcgm_down", "at": DOWN_AT, "until": UP_AT}]
    path = tmp_path / "pre-hopper-dcgm-restart.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def rule_file(tmp_path: Path) -> Path:
    pack = yaml.safe_load((ROOT / "rules/gpu-exporter.rules.yaml").read_text())
    for group in pack["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "2s"
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(pack, sort_keys=False))
    return path


def label(series: str, name: str) -> str:
    return series.partition(f'{name}="')[2].partition('"')[0]


def sm_by_gpu(daemon: Daemon) -> dict[str, float]:
    """The whole GPUs' SM activity (MIG instances' series have a mig_uuid)."""
    out = {}
    for series, value in parse_samples(daemon.metrics_text()).items():
        if series.startswith("gpu_sm_active_ratio{") and "mig_uuid=" not in series:
            out[label(series, "gpu")] = value
    return out


def mig_activity(daemon: Daemon) -> dict[str, dict[str, float]]:
    """GPU instance id -> {family: value} of the MIG GPU's instances' activity series."""
    out: dict[str, dict[str, float]] = {}
    for series, value in parse_samples(daemon.metrics_text()).items():
        family = series.partition("{")[0]
        if family in ACTIVITY and 'mig_uuid="' in series and label(series, "gpu") == MIG_GPU:
            out.setdefault(label(series, "gpu_instance"), {})[family] = value
    return out


def busy_but_idle(url: str, add_node: bool) -> set[frozenset[tuple[str, str]]]:
    alerts = httpx.get(f"{url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    out = set()
    for alert in alerts:
        if alert["labels"]["alertname"] == "GpuBusyButIdle" and alert["state"] == "firing":
            labels = dict(alert["labels"])
            if add_node:
                labels.setdefault("node", NODE)
            out.add(frozenset(labels.items()))
    return out


def wait_for(what: str, check: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout:g}s: {what}")


def test_launch_bound_a100_is_flagged_and_dcgm_outage_leaves_only_activity_absent(
    tmp_path: Path,
) -> None:
    rules = rule_file(tmp_path)
    with (
        Recorder() as hook,
        alertmanager(tmp_path / "am", f"{hook.url}/hook") as am_url,
        serve(
            tmp_path, "--simulate", str(scenario_file(tmp_path)), "--interval", "0.5",
            "--rules", str(rules), "--alertmanager-url", am_url,
            "--external-label", f"node={NODE}",
        ) as daemon,
    ):  # fmt: skip
        daemon.wait_ready()
        started = time.monotonic()
        with prometheus(
            tmp_path / "prom", f"127.0.0.1:{daemon.port}", rules, am_url, NODE
        ) as prom_url:
            sm = wait_for("activity of all four A100s", lambda: len(sm_by_gpu(daemon)) == 4, 10)
            assert sm
            metrics = parse_samples(daemon.metrics_text())
            sources = [s for s in metrics if s.startswith("gpu_activity_source_info{")]
            assert len(sources) == 5 and all('source="dcgm"' in s for s in sources)  # + MIG
            devices = {
                d["index"]: d for d in daemon.get("/api/v1/devices").json()["data"]["devices"]
            }
            assert devices[2]["bottleneck"] == "launch_bound", devices[2]
            assert devices[1]["bottleneck"] == "idle", devices[1]
            assert devices[0]["bottleneck"] == "compute_bound", devices[0]

            def agreed() -> set[frozenset[tuple[str, str]]]:
                mine = busy_but_idle(daemon.url, add_node=True)
                return mine if mine and mine == busy_but_idle(prom_url, add_node=False) else set()

            alerts = wait_for("GpuBusyButIdle on both paths", agreed, 15)
            fired = {(a["gpu"], a.get("gpu_instance", "")) for a in map(dict, alerts)}
            assert fired == {("2", ""), (MIG_GPU, "5")}

        # The host engine stops at DOWN_AT (scenario time counts from the daemon's start).
        time.sleep(max(0.0, DOWN_AT + 2.0 - (time.monotonic() - started)))
        ticks_before = daemon.sample("gpu_exporter_ticks_total")
        wait_for("activity absent while the host engine is down", lambda: not sm_by_gpu(daemon), 5)
        samples = parse_samples(daemon.metrics_text())
        utilization = [s for s in samples if s.startswith("gpu_utilization_ratio{")]
        assert len(utilization) == 4  # NVML is sampled as ever
        assert samples['gpu_exporter_dcgm_up{mode="auto"}'] == 0.0
        assert any(
            s.startswith("gpu_exporter_errors_total{")
            and 'source="dcgm"' in s
            and 'error="ConnectionNotValid"' in s
            for s in samples
        )
        assert not mig_activity(daemon)  # the MIG instances' activity is DCGM's too
        time.sleep(1.5)
        assert daemon.sample("gpu_exporter_ticks_total") > ticks_before

        # Back once the host engine is (within the reconnect back-off).
        wait_for(
            "activity back after the host engine restarted",
            lambda: len(sm_by_gpu(daemon)) == 4,
            UP_AT - DOWN_AT + 15,
        )
        assert daemon.metrics_text().count('gpu_exporter_dcgm_up{mode="auto"} 1.0') == 1


def test_a_mig_instance_of_an_a100_has_activity_and_a_class(tmp_path: Path) -> None:
    """`serve --simulate pre-hopper-dcgm`: GPU 4, an A100 in MIG mode, has no GPM and no NVML
    utilization, yet each of its MIG instances has SM, Tensor and DRAM activity (DCGM's
    profiling fields per GPU instance) and a bottleneck class of its own."""
    with serve(tmp_path, "--simulate", "pre-hopper-dcgm", "--interval", "0.5") as daemon:
        daemon.wait_ready()
        activity = wait_for(
            "activity of GPU 4's MIG instances",
            lambda: (found := mig_activity(daemon)) and set(found) == set(MIG_CLASSES) and found,
            10,
        )
        for gi, values in activity.items():
            assert set(values) == set(ACTIVITY), gi
        assert activity["1"]["gpu_tensor_active_ratio"] > 0.5  # each its own, as the scenario
        assert activity["5"]["gpu_sm_active_ratio"] < 0.2
        assert activity["13"]["gpu_dram_active_ratio"] > 0.8
        sources = [
            (series, value)
            for series, value in parse_samples(daemon.metrics_text()).items()
            if series.startswith("gpu_activity_source_info{") and f'gpu="{MIG_GPU}"' in series
        ]
        assert len(sources) == 1 and 'source="dcgm"' in sources[0][0] and sources[0][1] == 1.0

        def classes() -> dict[str, str | None]:
            devices = daemon.get("/api/v1/devices").json()["data"]["devices"]
            (mig,) = [d for d in devices if str(d["index"]) == MIG_GPU]
            return {i["identity"]["gpu_instance"]: i["bottleneck"] for i in mig["instances"]}

        assert wait_for("GPU 4's instances classed", lambda: classes() == MIG_CLASSES, 10)
        current = [
            series
            for series, value in parse_samples(daemon.metrics_text()).items()
            if series.startswith("gpu_bottleneck{") and 'gpu_instance="5"' in series and value
        ]
        assert len(current) == 1 and 'class="launch_bound"' in current[0]  # on /metrics too

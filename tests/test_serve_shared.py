"""`serve --simulate shared`, end to end: per-process attribution as a real node runs it (the
simulated node's /proc and CRI runtime), through /metrics, promtool, a real Prometheus and a
real Alertmanager.

What must show (docs/workloads.md): on the time-sliced GPU several pods each with their memory
and utilization share, summing to no more than the GPU's own figures, and the GPU's series naming
all holders, none alone; MPS clients as pods of their own; the host process unattributed; the
activity counters growing by ratio times elapsed time; and GpuAllocatedButIdle for the idle
shares, with the same labels from the daemon and from Prometheus.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.alert_paths import firing_on_both_paths
from tests.daemon import Daemon, serve
from tests.support import promtool_check_metrics, wait_for

NODE = "gpu-node-3"
Samples = dict[str, list[tuple[dict[str, str], float]]]

# Every family: these tests read families the default metrics profile leaves out.
FULL = ("--metrics-profile", "full")


def samples(text: str) -> Samples:
    out: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name].append((dict(sample.labels), sample.value))
    return out


def on_gpu(found: Samples, name: str, gpu: str) -> list[tuple[dict[str, str], float]]:
    return [(labels, value) for labels, value in found[name] if labels.get("gpu") == gpu]


def by_pod(found: Samples, name: str, gpu: str) -> dict[str, float]:
    return {labels["pod"]: value for labels, value in on_gpu(found, name, gpu)}


def scrape_with_pods(daemon: Daemon) -> Samples:
    """A scrape taken once the driver's first per-process sample period has ended (before
    it, every process has used nothing yet: measured, all 0)."""

    def ready() -> Samples | None:
        found = samples(daemon.metrics_text())
        return found if any(by_pod(found, "gpu_pod_utilization_ratio", "0").values()) else None

    found = wait_for(ready, 30, "per-pod utilization")
    assert found is not None, daemon.output()
    return found


def test_shared_gpus_show_each_pods_use_and_no_sum_exceeds_the_gpus(tmp_path: Path) -> None:
    with serve(tmp_path, "--simulate", "shared", "--interval", "0.5", *FULL) as daemon:
        daemon.wait_ready()
        found = scrape_with_pods(daemon)
        text = daemon.metrics_text()
        checked = promtool_check_metrics(text.encode())
        assert checked.returncode == 0, checked.stdout + checked.stderr

    # GPU 0, time-sliced: several pods with memory and a share; sums bounded by the GPU's own.
    memory = by_pod(found, "gpu_pod_memory_used_bytes", "0")
    share = by_pod(found, "gpu_pod_utilization_ratio", "0")
    assert sum(1 for pod, value in share.items() if value > 0 and memory[pod] > 0) >= 2, share
    ((gpu_labels, utilization),) = on_gpu(found, "gpu_utilization_ratio", "0")
    ((_, used),) = on_gpu(found, "gpu_memory_used_bytes", "0")
    assert sum(share.values()) <= utilization + 1e-9 and sum(memory.values()) <= used
    # Its device series name every holder and no single pod.
    assert "pod" not in gpu_labels, gpu_labels
    assert {h.split("/")[1] for h in gpu_labels["holders"].split(",")} == set(share)
    # GPU 1, MPS: each client a pod of its own.
    mps = by_pod(found, "gpu_pod_processes", "1")
    assert mps["asr-0"] == mps["tts-0"] == 1.0, mps
    # GPU 3: the host process is nobody's, and no pod is charged with it.
    host = on_gpu(found, "gpu_unattributed_processes", "3")
    assert [(labels["reason"], value) for labels, value in host] == [("host", 1.0)]
    assert all("pod" not in labels for labels, _ in host)
    assert set(by_pod(found, "gpu_pod_processes", "3")) == {"ocr-0"}


def test_activity_counters_grow_by_ratio_times_elapsed_time(tmp_path: Path) -> None:
    # GPU 4's 2g instance (GI 5) has a constant SM activity of 0.55 in the scenario.
    def instance(found: Samples, name: str) -> float | None:
        values = [v for labels, v in found[name] if labels.get("gpu_instance") == "5"]
        return values[0] if values else None

    def only(found: Samples, name: str) -> float:
        ((_, value),) = found[name]
        return value

    with serve(tmp_path, "--simulate", "shared", "--interval", "0.5", *FULL) as daemon:
        daemon.wait_ready()
        scrapes: dict[float, Samples] = {}  # tick number -> its scrape

        def consecutive() -> tuple[Samples, Samples] | None:
            found = samples(daemon.metrics_text())
            if instance(found, "gpu_sm_active_seconds_total") is not None:
                scrapes[only(found, "gpu_exporter_ticks_total")] = found
            return next(
                ((scrapes[n - 1], scrapes[n]) for n in sorted(scrapes) if n - 1 in scrapes), None
            )

        pair = wait_for(consecutive, 30, "two consecutive ticks, both scraped", interval=0.05)
    # Two consecutive ticks with the ratio: the counter grew by ratio x the time between them.
    first, second = pair
    for found in (first, second):
        assert abs((instance(found, "gpu_sm_active_ratio") or 0) - 0.55) < 1e-9
    elapsed = only(second, "gpu_exporter_last_tick_timestamp_seconds") - only(
        first, "gpu_exporter_last_tick_timestamp_seconds"
    )
    grown = (instance(second, "gpu_sm_active_seconds_total") or 0) - (
        instance(first, "gpu_sm_active_seconds_total") or 0
    )
    assert elapsed > 0 and abs(grown - 0.55 * elapsed) < 1e-6, (grown, elapsed)
    # Over every tick scraped: never more than the ratio times the time (a tick whose reading
    # was missing, as a GPU late for its deadline, adds nothing).
    ticks = sorted(scrapes)
    whole = [scrapes[ticks[0]], scrapes[ticks[-1]]]
    total = (instance(whole[1], "gpu_sm_active_seconds_total") or 0) - (
        instance(whole[0], "gpu_sm_active_seconds_total") or 0
    )
    span = only(whole[1], "gpu_exporter_last_tick_timestamp_seconds") - only(
        whole[0], "gpu_exporter_last_tick_timestamp_seconds"
    )
    assert total <= 0.55 * span + 1e-6


def test_allocated_but_idle_names_the_idle_shares_on_both_alert_paths(tmp_path: Path) -> None:
    both = firing_on_both_paths(tmp_path, "shared", "GpuAllocatedButIdle", NODE)
    pods = {dict(labels)["pod"] for labels in both}
    # The idle notebook, the share held with no process, and the MIG instance held with none.
    assert pods == {"notebook-ana", "notebook-ben", "chat-small-1"}, pods

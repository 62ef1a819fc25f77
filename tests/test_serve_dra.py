"""`serve --simulate dra`, end to end: GPUs handed out through DRA ResourceClaims, attributed as a
real node does it (the fake kubelet's `dynamic_resources` over gRPC, the fake API server's
ResourceSlices over HTTPS with a bearer token), through /metrics, promtool, a real Prometheus
and the shipped rules.

What must show (docs/kubernetes.md "DRA"): claimed GPUs and MIG devices carry their pods'
labels as device-plugin ones do; the join series carries the claim and the device; the
device-plugin pod beside them still works; the claim on a device no slice publishes is counted,
not guessed; the slice the driver replaces at 60 s is followed; and GpuAllocatedButIdle fires
for the idle claimed MIG device on both alert paths alike.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.alert_paths import firing_on_both_paths
from tests.daemon import Daemon, serve
from tests.support import promtool_check_metrics, wait_for
from tests.test_serve_shared import Samples, on_gpu, samples

ROOT = Path(__file__).resolve().parent.parent
NODE = "sim-node"

# Every family: these tests read families the default metrics profile leaves out.
FULL = ("--metrics-profile", "full")


def attributed(daemon: Daemon) -> Samples:
    """A scrape once the ResourceSlices were read (claimed GPU 0 carries its pod), of a tick in
    which every GPU answered (on a busy machine a read can be late: that GPU has no readings)."""

    def ready() -> Samples | None:
        found = samples(daemon.metrics_text())
        labels = [labels for labels, _ in on_gpu(found, "gpu_utilization_ratio", "0")]
        all_up = all(value == 1 for _, value in found.get("gpu_up", []))
        return found if all_up and labels and labels[0].get("pod") == "trainer-0" else None

    found = wait_for(ready, 30, "the claimed GPU's pod labels")
    assert found is not None, daemon.output()
    return found


def claims(found: Samples, gpu: str) -> list[dict[str, str]]:
    return [labels for labels, _ in on_gpu(found, "gpu_pod_resourceclaim_info", gpu)]


def only(found: Samples, name: str) -> float:
    ((_, value),) = found[name]
    return value


def test_claimed_gpus_and_mig_devices_carry_their_pods_and_claims(tmp_path: Path) -> None:
    with serve(tmp_path, "--simulate", "dra", "--interval", "0.5", *FULL) as daemon:
        daemon.wait_ready()
        found = attributed(daemon)
        text = daemon.metrics_text()
    checked = promtool_check_metrics(text.encode())
    assert checked.returncode == 0, checked.stdout + checked.stderr

    # GPU 0: a whole GPU through a claim, labelled as a device-plugin GPU would be.
    ((labels, _),) = on_gpu(found, "gpu_utilization_ratio", "0")
    assert (labels["namespace"], labels["pod"], labels["container"]) == (
        "ml",
        "trainer-0",
        "trainer",
    )
    (claim,) = claims(found, "0")
    assert claim == {
        "gpu": "0",
        "uuid": labels["uuid"],
        "namespace": "ml",
        "pod": "trainer-0",
        "container": "trainer",
        "claim_namespace": "ml",
        "resourceclaim_name": "trainer-0-gpu-7fk2x",
        "driver": "gpu.nvidia.com",
        "pool": NODE,
        "device": "gpu-0",
    }
    # GPU 1: one claim shared by two pods: both listed, the GPU's series blame neither alone.
    assert sorted(c["pod"] for c in claims(found, "1")) == ["eval-a", "eval-b"]
    assert {c["resourceclaim_name"] for c in claims(found, "1")} == {"shared-eval-gpu"}
    ((labels, _),) = on_gpu(found, "gpu_utilization_ratio", "1")
    assert "pod" not in labels and labels["holders"] == "ml/eval-a/main,ml/eval-b/main"
    # GPU 2, MIG: each claimed instance its pod; the unclaimed ones none.
    instances = {
        labels["gpu_instance"]: labels.get("pod")
        for labels, _ in on_gpu(found, "gpu_memory_used_bytes", "2")
        if "gpu_instance" in labels
    }
    assert instances == {"1": "chat-large-0", "5": None, "13": "notebook-dra-0", "14": None}
    assert {c["gpu_instance"]: c["device"] for c in claims(found, "2")} == {
        "1": "gpu-2-mig-3g71gb-1-0",
        "13": "gpu-2-mig-1g18gb-13-4",
    }
    # GPU 3: the device-plugin pod beside the claims, as before; no claim series.
    ((labels, _),) = on_gpu(found, "gpu_utilization_ratio", "3")
    assert labels["pod"] == "legacy-batch-0" and not claims(found, "3")
    # The claim on gpu-9, a device no slice publishes: counted, attributed to nobody.
    assert only(found, "gpu_exporter_dra_unresolved_devices") == 1.0
    assert not [p for p, _ in found["gpu_pod_info"] if p["pod"] == "stale-claim-0"]
    assert only(found, "gpu_exporter_dra_up") == 1.0


def test_the_replaced_slice_is_followed_without_losing_a_pod(tmp_path: Path) -> None:
    """The driver replaces its slice (deleted, then a new one added; at 4 s here): through the
    watch, the claimed GPU keeps its pod on every scrape across it."""
    scenario = tmp_path / "dra-soon.yaml"
    text = (ROOT / "gpu_exporter/sim/scenarios/dra.yaml").read_text()
    scenario.write_text(text.replace("republish: [60]", "republish: [4]"))
    with serve(tmp_path, "--simulate", str(scenario), "--interval", "0.5", *FULL) as daemon:
        daemon.wait_ready()
        attributed(daemon)
        scrapes = []
        until = time.monotonic() + 8.0  # the scenario's clock started before the daemon did
        while time.monotonic() < until:
            found = samples(daemon.metrics_text())
            scrapes.append([labels.get("pod") for labels, _ in on_gpu(
                found, "gpu_utilization_ratio", "0")])  # fmt: skip
            time.sleep(0.2)
        found = samples(daemon.metrics_text())
    # Followed through the watch (DELETED, then ADDED), not by listing again, and still up.
    assert only(found, "gpu_exporter_dra_lists_total") == 1.0
    assert only(found, "gpu_exporter_dra_up") == 1.0
    assert scrapes and all(pods == ["trainer-0"] for pods in scrapes), scrapes


def test_allocated_but_idle_fires_for_the_idle_claimed_mig_device_on_both_paths(
    tmp_path: Path,
) -> None:
    both = firing_on_both_paths(tmp_path, "dra", "GpuAllocatedButIdle", NODE)
    assert {dict(labels)["pod"] for labels in both} == {"notebook-dra-0"}

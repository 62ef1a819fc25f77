"""Per-process attribution end to end in one process: the production NVML source and the
processes collector on the fake NVML of the `shared` scenario, mapped through its fake /proc and
its fake CRI runtime (real gRPC), into per-pod readings; and every failure of /proc and of the
runtime ending as `unknown`, counted, never a crash or a wrong pod."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpu_exporter import sim
from gpu_exporter.collect.k8s.attribution import PodAttribution
from gpu_exporter.collect.k8s.labels import PodsOfTick
from gpu_exporter.collect.k8s.process_attribution import ProcessAttribution
from gpu_exporter.collect.settings import KubernetesConfig, ProcessesConfig
from gpu_exporter.model.snapshot import DeviceSample
from gpu_exporter.sim.clock import ManualClock
from gpu_exporter.sim.kubelet import start_for
from gpu_exporter.sim.scenario import load_scenario


class Node:
    """The shared scenario's GPUs read by the NVML source, the kubelet's allocation from its fake
    kubelet, and the attribution on top, as the assembly wires them."""

    def __init__(self, source: Any, clock: ManualClock, timeout: float = 2.0) -> None:
        self.source, self.clock = source, clock
        node = sim.installed_node()
        assert node is not None
        self.node = node
        kubelet = start_for(load_scenario("shared"), clock)
        assert kubelet is not None
        self.kubelet = kubelet
        self.pods = PodsOfTick(
            PodAttribution(KubernetesConfig(enabled=True, socket_path=kubelet.socket_path))
        )
        settings = ProcessesConfig(
            enabled=True,
            proc_root=node.proc_root,
            runtime_socket=node.cri_socket_path,
            timeout_seconds=timeout,
        )
        self.attribution = ProcessAttribution(settings, self.pods.holders)

    def tick(self, at: float) -> dict[int, DeviceSample]:
        self.clock.now = at
        self.node.sync()
        self.pods.attribution.refresh()
        self.attribution.runtime.refresh()  # what its thread would have done by now
        devices = self.pods.process(self.source.sample(), at)
        devices = self.attribution.process(devices, at)
        return {device.index: device for device in devices}

    def close(self) -> None:
        self.kubelet.close()


@pytest.fixture
def node(start_source: Callable[..., Any], clock: ManualClock) -> Iterator[Node]:
    source = start_source("shared", processes=True, xid_events=False)
    node = Node(source, clock)
    yield node
    node.close()


def per_pod(readings: Any, family: str) -> dict[str, float]:
    out = {}
    for r in readings:
        if r.family == family:
            labels = dict(r.labels)
            out[labels.get("pod", labels.get("reason", ""))] = r.value
    return out


def test_each_pod_sharing_a_gpu_has_its_own_use_and_no_sum_exceeds_the_gpus(node: Node) -> None:
    node.tick(10.0)
    gpus = node.tick(20.0)  # a window of ten sample periods
    shared = gpus[0]
    memory = per_pod(shared.readings, "gpu_pod_memory_used_bytes")
    share = per_pod(shared.readings, "gpu_pod_utilization_ratio")
    assert {"llm-finetune-0", "embed-batch-0", "notebook-ana"} <= set(memory)
    assert share["llm-finetune-0"] > share["embed-batch-0"] > 0.0 == share["notebook-ana"]
    # A share held with no process at all is measured at zero too.
    assert per_pod(shared.readings, "gpu_pod_processes")["notebook-ben"] == 0.0
    assert share["notebook-ben"] == memory["notebook-ben"] == 0.0
    device = shared.value("gpu_utilization_ratio")
    assert device is not None and sum(share.values()) <= device + 1e-9
    used = shared.value("gpu_memory_used_bytes")
    assert used is not None and sum(memory.values()) <= used
    # MPS: each client is a pod of its own, the server's pod too; the sum stays bounded.
    mps = per_pod(gpus[1].readings, "gpu_pod_processes")
    assert mps["asr-0"] == mps["tts-0"] == 1.0
    mps_share = per_pod(gpus[1].readings, "gpu_pod_utilization_ratio")
    assert mps_share["asr-0"] > 0 and mps_share["tts-0"] > 0
    assert sum(mps_share.values()) <= (gpus[1].value("gpu_utilization_ratio") or 0) + 1e-9


def test_ticks_shorter_than_the_drivers_sample_period_repeat_its_shares(node: Node) -> None:
    # The fake driver's period is 1 s (assumed, as nvml.h does not say): a tick that reads no
    # newer period must not report every process idle (the alert would flap on a busy pod).
    node.tick(10.0)
    ended = per_pod(node.tick(11.0)[0].readings, "gpu_pod_utilization_ratio")
    within = per_pod(node.tick(11.5)[0].readings, "gpu_pod_utilization_ratio")
    assert ended["llm-finetune-0"] > 0 and within == pytest.approx(ended)


def test_a_host_process_is_nobodys_and_an_exclusive_pod_gets_exact_energy(node: Node) -> None:
    node.tick(10.0)
    gpus = node.tick(20.0)
    batch = gpus[3].readings
    assert per_pod(batch, "gpu_unattributed_processes") == {"host": 1.0}
    assert "ollama" not in per_pod(batch, "gpu_pod_processes")
    energy = {
        dict(r.labels)["attribution"]: r.value
        for r in gpus[2].readings
        if r.family == "gpu_pod_energy_joules_total"
    }
    assert set(energy) == {"exclusive"}
    assert energy["exclusive"] > 0


def test_mig_instances_have_memory_and_counts_never_utilization(node: Node) -> None:
    node.tick(10.0)
    mig = node.tick(20.0)[4]
    assert mig.processes is None  # a MIG GPU's processes are its instances'
    by_gi = {i.gpu_instance: i for i in mig.instances}
    assert per_pod(by_gi[1].readings, "gpu_pod_processes") == {"chat-large-0": 1.0}
    assert per_pod(by_gi[1].readings, "gpu_pod_memory_used_bytes")["chat-large-0"] > 0
    assert not [r for i in mig.instances for r in i.readings if "utilization" in r.family]


def test_a_reused_pid_is_not_credited_to_the_old_pod(node: Node) -> None:
    before = node.tick(60.0)[3]
    assert "ocr-0" in per_pod(before.readings, "gpu_pod_processes")
    node.tick(150.0)
    after = node.tick(151.0)[3]
    pods = per_pod(after.readings, "gpu_pod_processes")
    assert "ocr-1" in pods and "ocr-0" not in pods


def test_a_process_vanishing_or_unreadable_mid_read_is_unknown_and_counted(node: Node) -> None:
    assert node.node is not None
    node.tick(10.0)
    node.node.procfs.vanish(48121)  # llm-finetune-0's process exits between NVML and /proc
    gpus = node.tick(11.0)
    assert "llm-finetune-0" not in per_pod(gpus[0].readings, "gpu_pod_processes")
    assert per_pod(gpus[0].readings, "gpu_unattributed_processes") == {"unknown": 1.0}
    node.node.procfs.restore(48121)
    node.node.procfs.deny(48121)
    gpus = node.tick(12.0)
    assert per_pod(gpus[0].readings, "gpu_unattributed_processes") == {"unknown": 1.0}
    errors = {dict(s.labels)["reason"]: s.value for s in node.attribution.series() if s.labels}
    assert errors["proc"] >= 1
    up = next(s.value for s in node.attribution.series() if not s.labels)
    assert up == 0.0
    node.node.procfs.restore(48121)
    gpus = node.tick(13.0)
    assert "llm-finetune-0" in per_pod(gpus[0].readings, "gpu_pod_processes")


def up(node: Node) -> float:
    return next(s.value for s in node.attribution.series() if not s.labels)


def test_outside_the_hosts_pid_namespace_no_pod_has_a_figure_not_even_zero(node: Node) -> None:
    # Without hostPID, NVML hides other containers' processes: every holder would read idle.
    node.tick(10.0)
    assert up(node) == 1.0
    node.node.procfs.set_pid_namespace("pid:[4026532451]")
    gpus = node.tick(11.0)
    per_pod_families = {
        r.family for d in gpus.values() for r in d.readings if r.family.startswith("gpu_pod_")
    }
    assert per_pod_families == {"gpu_pod_info"}  # the allocation's, from the kubelet
    assert not [r for d in gpus.values() for r in d.readings if "unattributed" in r.family]
    assert up(node) == 0.0
    node.node.procfs.set_pid_namespace("pid:[4026531836]")
    gpus = node.tick(12.0)
    assert per_pod(gpus[0].readings, "gpu_pod_processes")["llm-finetune-0"] == 1.0
    assert up(node) == 1.0


@pytest.mark.parametrize("mode", ["down", "garbage"])
def test_a_runtime_down_or_answering_garbage_keeps_known_containers(node: Node, mode: str) -> None:
    assert node.node is not None
    node.tick(10.0)
    node.node.cri.set_mode(mode)  # type: ignore[arg-type]
    assert not node.attribution.runtime.refresh()
    gpus = {d.index: d for d in node.attribution.process(node.source.sample(), 11.0)}
    pods = per_pod(gpus[0].readings, "gpu_pod_processes")
    assert "llm-finetune-0" in pods  # container ids are never reused: the old map stays true
    up = next(s.value for s in node.attribution.series() if not s.labels)
    assert up == 0.0
    errors = {dict(s.labels)["reason"]: s.value for s in node.attribution.series() if s.labels}
    assert errors["runtime"] >= 1


def test_a_hung_runtime_costs_a_refresh_its_timeout_and_nothing_else(
    start_source: Callable[..., Any], clock: ManualClock
) -> None:
    node = Node(start_source("shared", processes=True, xid_events=False), clock, timeout=0.3)
    assert node.node is not None
    node.node.cri.hang_seconds = 30.0
    node.node.cri.set_mode("serving")
    started = time.monotonic()
    try:
        assert not node.attribution.runtime.refresh()
        assert time.monotonic() - started < 5.0
        node.node.cri.hang_seconds = 0.0
        assert node.attribution.runtime.refresh()
    finally:
        node.close()

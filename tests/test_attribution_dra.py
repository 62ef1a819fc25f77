"""DRA devices in pod attribution: `map_claims` on PodResources answers, and
`PodAttribution.claims()` against the fake kubelet over real gRPC (gpu_exporter/sim/kubelet.py),
kept and cleared with the device-plugin map."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from gpu_exporter.collect.k8s.attribution import (
    AttributionSnapshot,
    PodAttribution,
    PodRef,
    map_claims,
    map_devices,
)
from gpu_exporter.collect.k8s.dra import Claim, DraDevice
from gpu_exporter.collect.k8s.podresources.v1 import api_pb2
from gpu_exporter.collect.settings import KubernetesConfig
from gpu_exporter.sim.clock import ManualClock
from gpu_exporter.sim.kubelet import Claimed, FakeKubelet, dra_pod, pod

NVIDIA = "gpu.nvidia.com"
NODE = "node-a"
GPU = "nvidia.com/gpu"
GPU0 = "GPU-8f2c1d90-3e5a-4b17-9c2e-5da9abb51763"


def settings(
    enabled: bool = True, drivers: tuple[str, ...] = (NVIDIA,), **more
) -> KubernetesConfig:
    return KubernetesConfig(dra={"enabled": enabled, "drivers": list(drivers)}, **more)


def device(name: str, pool: str = NODE, driver: str = NVIDIA) -> DraDevice:
    return DraDevice(driver, pool, name)


def claim(namespace: str, pod_name: str, container: str, name: str, claim_ns: str = "") -> Claim:
    return Claim(PodRef(namespace, pod_name, container), claim_ns or namespace, name)


# --- map_claims ------------------------------------------------------------------------------


def test_each_claimed_device_maps_to_the_claim_and_its_container():
    pods = [dra_pod("ml", "train-0", {"main": [Claimed("train-0-gpu", "gpu-0", NODE)]})]
    assert map_claims(pods, settings()) == {
        device("gpu-0"): (claim("ml", "train-0", "main", "train-0-gpu"),)
    }


def test_a_claim_with_several_devices_maps_each():
    pods = [
        dra_pod(
            "ml",
            "train-0",
            {"main": [Claimed("gpus", "gpu-1", NODE), Claimed("gpus", "gpu-0", NODE)]},
        )
    ]
    (answer,) = pods
    assert len(answer.containers[0].dynamic_resources) == 1  # one claim, two devices
    held = claim("ml", "train-0", "main", "gpus")
    assert map_claims(pods, settings()) == {device("gpu-0"): (held,), device("gpu-1"): (held,)}
    assert list(map_claims(pods, settings())) == [device("gpu-0"), device("gpu-1")]  # sorted


def test_an_empty_claim_namespace_is_the_pods():
    pods = [
        dra_pod(
            "ml",
            "p",
            {"c": [Claimed("own", "gpu-0", NODE, namespace=""),
                   Claimed("shared", "gpu-1", NODE, namespace="infra")]},
        )
    ]  # fmt: skip
    assert pods[0].containers[0].dynamic_resources[0].claim_namespace == ""
    assert map_claims(pods, settings()) == {
        device("gpu-0"): (Claim(PodRef("ml", "p", "c"), "ml", "own"),),
        device("gpu-1"): (Claim(PodRef("ml", "p", "c"), "infra", "shared"),),
    }


def test_a_shared_claim_lists_every_pod_and_container_holding_it():
    shared = Claimed("team-gpu", "gpu-3", NODE, namespace="ml")
    pods = [
        dra_pod("ml", "b", {"main": [shared]}),
        dra_pod("ml", "a", {"main": [shared], "sidecar": [shared]}),
    ]
    assert map_claims(pods, settings()) == {
        device("gpu-3"): (
            claim("ml", "a", "main", "team-gpu"),
            claim("ml", "a", "sidecar", "team-gpu"),
            claim("ml", "b", "main", "team-gpu"),
        )
    }


def test_claims_sharing_a_device_by_share_id_are_each_listed():
    pods = [
        dra_pod("ml", "a", {"c": [Claimed("a-claim", "gpu-0", NODE, share_id="s-1")]}),
        dra_pod("ml", "b", {"c": [Claimed("b-claim", "gpu-0", NODE, share_id="s-2")]}),
    ]
    assert map_claims(pods, settings()) == {
        device("gpu-0"): (claim("ml", "a", "c", "a-claim"), claim("ml", "b", "c", "b-claim"))
    }


def test_a_container_with_plugin_devices_and_claims_is_in_both_maps_unchanged():
    both = pod(
        "ml",
        "mixed",
        {"main": [(GPU, [f"{GPU0}::2"])]},
        {"main": [Claimed("extra", "gpu-1", NODE)]},
    )
    config = settings()
    assert map_devices([both], config) == {GPU0: (PodRef("ml", "mixed", "main"),)}
    assert map_devices([both], config) == map_devices([both], settings(enabled=False))
    assert map_claims([both], config) == {device("gpu-1"): (claim("ml", "mixed", "main", "extra"),)}


def test_only_the_configured_drivers_count():
    pods = [
        dra_pod(
            "ml",
            "p",
            {"c": [Claimed("nic", "eth-0", NODE, driver="net.example.com"),
                   Claimed("gpu", "gpu-0", NODE),
                   Claimed("fpga", "fpga-0", NODE, driver="fpga.example.com")]},
        )
    ]  # fmt: skip
    assert list(map_claims(pods, settings())) == [device("gpu-0")]
    both = settings(drivers=(NVIDIA, "fpga.example.com"))
    assert list(map_claims(pods, both)) == [
        device("fpga-0", driver="fpga.example.com"),
        device("gpu-0"),
    ]


def test_devices_without_a_pool_or_name_are_ignored():
    """api.proto: a resource of another kind than a device leaves `device_name` empty."""
    pods = [
        dra_pod(
            "ml",
            "p",
            {"c": [Claimed("a", "", NODE), Claimed("b", "gpu-0", ""), Claimed("c", "gpu-1", NODE)]},
        )
    ]
    assert list(map_claims(pods, settings())) == [device("gpu-1")]


def test_dra_off_maps_no_claims():
    pods = [dra_pod("ml", "p", {"c": [Claimed("gpu", "gpu-0", NODE)]})]
    assert map_claims(pods, settings(enabled=False)) == {}
    assert map_claims(pods, KubernetesConfig()) == {}  # off by default


def test_no_claims_no_pods_no_map():
    assert map_claims([], settings()) == {}
    assert map_claims([pod("ml", "p", {"c": [(GPU, [GPU0])]})], settings()) == {}
    assert map_claims([api_pb2.PodResources(name="p", namespace="ml")], settings()) == {}


# --- PodAttribution.claims() against the fake kubelet ----------------------------------------


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    fake = FakeKubelet().start()
    yield fake
    fake.close()


def make(
    kubelet: FakeKubelet, clock: ManualClock | None = None, enabled: bool = True, **more
) -> PodAttribution:
    config = settings(enabled, socket_path=kubelet.socket_path, timeout_seconds=0.5, **more)
    if clock is None:
        return PodAttribution(config)
    return PodAttribution(config, clock, clock)


TRAIN = [
    pod("ml", "train-0", {"main": [(GPU, [GPU0])]}),
    dra_pod("ml", "infer-0", {"server": [Claimed("infer-0-gpu", "gpu-1", NODE)]}),
]
TRAIN_CLAIMS = {device("gpu-1"): (claim("ml", "infer-0", "server", "infer-0-gpu"),)}
TRAIN_PODS = {GPU0: (PodRef("ml", "train-0", "main"),)}


def test_claims_come_from_the_same_list_call_as_the_device_map(kubelet):
    kubelet.set_pods(TRAIN)
    attribution = make(kubelet)
    assert attribution.claims() == {}  # nothing before the first answer
    assert attribution.refresh()
    assert attribution.claims() == TRAIN_CLAIMS
    assert attribution.pods_by_device() == TRAIN_PODS
    snapshot = attribution.snapshot()
    assert isinstance(snapshot, AttributionSnapshot)
    assert snapshot.claims is attribution.claims()
    assert snapshot.by_device is attribution.pods_by_device()
    assert kubelet.list_calls == 1


def test_claims_are_read_only_and_replaced_at_each_refresh(kubelet):
    kubelet.set_pods(TRAIN)
    attribution = make(kubelet)
    assert attribution.refresh()
    before = attribution.claims()
    with pytest.raises(TypeError):
        before[device("gpu-9")] = ()  # type: ignore[index]

    kubelet.set_pods(TRAIN[:1])  # the DRA pod finished
    assert attribution.refresh()
    assert before == TRAIN_CLAIMS  # a reader's snapshot stays whole
    assert attribution.claims() == {}
    assert attribution.pods_by_device() == TRAIN_PODS


def test_dra_off_reports_no_claims_from_the_kubelet(kubelet):
    kubelet.set_pods(TRAIN)
    attribution = make(kubelet, enabled=False)
    assert attribution.refresh()
    assert attribution.claims() == {}
    assert attribution.pods_by_device() == TRAIN_PODS


def test_one_failed_refresh_keeps_the_claims_with_the_pods(kubelet, clock):
    kubelet.set_pods(TRAIN)
    attribution = make(kubelet, clock)
    assert attribution.refresh()
    before = attribution.snapshot()

    kubelet.stop()
    clock.advance(10)
    assert attribution.refresh() is False
    assert attribution.snapshot() is before  # both maps kept, neither rebuilt
    assert attribution.claims() == TRAIN_CLAIMS


def test_a_hung_kubelet_keeps_the_claims_within_the_grace(kubelet, clock):
    kubelet.set_pods(TRAIN)
    attribution = make(kubelet, clock)
    assert attribution.refresh()
    kubelet.hang_seconds = 5.0
    clock.advance(29)
    assert attribution.refresh() is False  # DEADLINE_EXCEEDED
    assert attribution.claims() == TRAIN_CLAIMS


def test_failing_past_the_grace_clears_claims_and_pods_together(kubelet, clock, caplog):
    caplog.set_level(logging.WARNING, logger="gpu_exporter.collect.k8s.attribution")
    kubelet.set_pods(TRAIN)
    attribution = make(kubelet, clock)
    assert attribution.settings.grace_seconds == 30
    assert attribution.refresh()

    kubelet.stop()
    for _ in range(2):
        clock.advance(10)
        assert attribution.refresh() is False
        assert attribution.claims() == TRAIN_CLAIMS
    clock.advance(10)
    assert attribution.refresh() is False
    assert attribution.claims() == {}
    assert attribution.pods_by_device() == {}
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and "failing for 30 s" in messages[1]

    kubelet.start()
    assert attribution.refresh()
    assert attribution.claims() == TRAIN_CLAIMS


def test_claims_alone_are_dropped_and_logged_past_the_grace(kubelet, clock, caplog):
    """A node whose GPUs all come through DRA: the drop is still logged."""
    caplog.set_level(logging.WARNING, logger="gpu_exporter.collect.k8s.attribution")
    kubelet.set_pods(TRAIN[1:])
    attribution = make(kubelet, clock, stale_after_seconds=0)
    assert attribution.refresh()
    assert attribution.pods_by_device() == {}
    kubelet.stop()
    clock.advance(1)
    assert attribution.refresh() is False
    assert attribution.claims() == {}
    assert "failing for 1 s since the last success" in caplog.text


def test_the_first_answer_logs_how_many_dra_devices(kubelet, caplog):
    caplog.set_level(logging.INFO, logger="gpu_exporter.collect.k8s.attribution")
    kubelet.set_pods(TRAIN)
    assert make(kubelet).refresh()
    assert "(1 devices held by pods, 1 DRA devices)" in caplog.text

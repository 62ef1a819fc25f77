"""Pod attribution against a real gRPC PodResources server on a unix socket (the fake kubelet
of gpu_exporter/sim/kubelet.py)."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path

import grpc
import pytest

from gpu_exporter.collect.k8s.attribution import PodAttribution, PodRef, normalize_device_id
from gpu_exporter.collect.k8s.podresources.v1 import api_pb2, api_pb2_grpc
from gpu_exporter.collect.settings import KubernetesConfig
from gpu_exporter.sim.kubelet import FakeKubelet, pod
from tests.support import unix_channel

GPU0 = "GPU-8f2c1d90-3e5a-4b17-9c2e-5da9abb51763"
GPU1 = "GPU-1b1e4a7c-0c55-4a7e-8d0b-8e3d1f1f3a01"
GPU2 = "GPU-2c2f5b8d-1d66-4b8f-9e1c-9f4e202f4b12"
GPU3 = "GPU-3d306c9e-2e77-4c90-af2d-a05f313f5c23"
MIG_A = "MIG-4e417daf-3f88-5da1-b03e-b16f424f6d34"
MIG_B = "MIG-5f528eb0-4099-6eb2-c14f-c27f535f7e45"
MIG_OLD = f"MIG-{GPU3}/3/0"  # the pre-R470 MIG id form the NVIDIA plugin also accepts

GPU = "nvidia.com/gpu"
REPO = Path(__file__).resolve().parent.parent
PROTO_DIR = REPO / "gpu_exporter" / "collect" / "k8s" / "podresources" / "v1"


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    fake = FakeKubelet().start()
    yield fake
    fake.close()


def make(
    kubelet: FakeKubelet,
    clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
    **settings,
) -> PodAttribution:
    settings.setdefault("timeout_seconds", 1.0)
    # The refresh thread's tests refresh faster than the setting's 1 s minimum allows.
    refresh = settings.pop("refresh_seconds", None)
    validated = KubernetesConfig(socket_path=kubelet.socket_path, **settings)
    if refresh is not None:
        validated = validated.model_copy(update={"refresh_seconds": refresh})
    return PodAttribution(validated, clock, monotonic)


def wait_until(condition: Callable[[], bool], seconds: float = 3.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def sample(attribution: PodAttribution, name: str, **labels: str) -> float | None:
    """A value of attribution's own series, as the exporter would publish it."""
    wanted = tuple(sorted(labels.items()))
    for row in attribution.series():
        if row.name == name and tuple(sorted(row.labels)) == wanted:
            return row.value
    return None


# --- mapping ---------------------------------------------------------------------------------


def test_whole_gpus_map_to_their_container_and_free_gpus_to_nothing(kubelet):
    kubelet.set_pods([pod("train", "job-a", {"trainer": [(GPU, [GPU0])]})])
    attribution = make(kubelet)

    assert attribution.refresh() is True
    assert attribution.pods_by_device() == {GPU0: (PodRef("train", "job-a", "trainer"),)}
    assert GPU1 not in attribution.pods_by_device()


def test_one_pod_holding_several_gpus_labels_each_of_them(kubelet):
    kubelet.set_pods(
        [
            pod("train", "big", {"worker": [(GPU, [GPU1, GPU2, GPU3])]}),
            pod("infer", "small", {"server": [(GPU, [GPU0])], "sidecar": []}),
        ]
    )
    attribution = make(kubelet)
    assert attribution.refresh()

    big = (PodRef("train", "big", "worker"),)
    assert attribution.pods_by_device() == {
        GPU0: (PodRef("infer", "small", "server"),),
        GPU1: big,
        GPU2: big,
        GPU3: big,
    }


def test_mig_devices_are_keyed_by_their_mig_uuid_as_given(kubelet):
    kubelet.set_pods(
        [
            pod("ml", "a", {"c": [("nvidia.com/mig-1g.10gb", [MIG_A])]}),
            pod("ml", "b", {"c": [("nvidia.com/mig-3g.40gb", [MIG_B, MIG_OLD])]}),
        ]
    )
    attribution = make(kubelet)
    assert attribution.refresh()

    assert attribution.pods_by_device() == {
        MIG_A: (PodRef("ml", "a", "c"),),
        MIG_B: (PodRef("ml", "b", "c"),),
        MIG_OLD: (PodRef("ml", "b", "c"),),
    }


def test_time_sliced_gpu_lists_every_sharing_container_once(kubelet):
    kubelet.set_pods(
        [
            pod("team-b", "notebook", {"lab": [(GPU, [f"{GPU0}::3"])]}),
            # Two replicas of one GPU in one container (failRequestsGreaterThanOne: false).
            pod("team-a", "batch", {"main": [(GPU, [f"{GPU0}::0", f"{GPU0}::1"])]}),
            pod("team-a", "mig-shared", {"main": [("nvidia.com/mig-1g.10gb", [f"{MIG_A}::2"])]}),
            pod("team-c", "by-index", {"main": [(GPU, ["1"])]}),
        ]
    )
    attribution = make(kubelet)
    assert attribution.refresh()

    assert attribution.pods_by_device() == {
        GPU0: (PodRef("team-a", "batch", "main"), PodRef("team-b", "notebook", "lab")),
        MIG_A: (PodRef("team-a", "mig-shared", "main"),),
        "1": (PodRef("team-c", "by-index", "main"),),  # not a UUID: kept as given
    }


@pytest.mark.parametrize(
    ("device_id", "physical"),
    [
        (GPU0, GPU0),
        (f"{GPU0}::0", GPU0),
        (f"{GPU0}::12", GPU0),
        (f"{MIG_A}::1", MIG_A),
        (MIG_OLD, MIG_OLD),
        ("0", "0"),
        ("nvidia0", "nvidia0"),
        (f"{GPU0}::x", f"{GPU0}::x"),  # not a replica suffix
        (f" {GPU0} ", GPU0),
    ],
)
def test_normalize_device_id(device_id, physical):
    assert normalize_device_id(device_id) == physical


def test_only_configured_resources_count(kubelet):
    kubelet.set_pods(
        [
            pod(
                "ns",
                "mixed",
                {
                    "c": [
                        ("example.com/foo", ["foo-0"]),
                        ("nvidia.com/gpu.shared", [f"{GPU1}::0"]),
                        (GPU, [GPU0]),
                    ]
                },
            )
        ]
    )
    ref = (PodRef("ns", "mixed", "c"),)

    default = make(kubelet)
    assert default.refresh()
    assert default.pods_by_device() == {GPU0: ref}

    extra = make(kubelet, resource_names=["nvidia.com/gpu", "nvidia.com/gpu.shared"])
    assert extra.refresh()
    assert extra.pods_by_device() == {GPU0: ref, GPU1: ref}

    foo = make(kubelet, resource_names=(), resource_prefixes=("example.com/",))
    assert foo.refresh()
    assert foo.pods_by_device() == {"foo-0": ref}


def test_finished_pod_loses_its_labels_at_the_next_refresh(kubelet):
    kubelet.set_pods(
        [
            pod("a", "done-soon", {"c": [(GPU, [GPU0])]}),
            pod("b", "stays", {"c": [(GPU, [GPU1])]}),
        ]
    )
    attribution = make(kubelet)
    assert attribution.refresh()
    assert set(attribution.pods_by_device()) == {GPU0, GPU1}

    kubelet.set_pods([pod("b", "stays", {"c": [(GPU, [GPU1])]})])
    assert attribution.pods_by_device().keys() == {GPU0, GPU1}  # nothing changes in between
    assert attribution.refresh()
    assert attribution.pods_by_device() == {GPU1: (PodRef("b", "stays", "c"),)}


def test_snapshots_are_read_only_and_replaced_not_mutated(kubelet):
    kubelet.set_pods([pod("a", "p", {"c": [(GPU, [GPU0])]})])
    attribution = make(kubelet)
    assert attribution.refresh()
    before = attribution.pods_by_device()
    with pytest.raises(TypeError):
        before[GPU1] = ()  # type: ignore[index]

    kubelet.set_pods([])
    assert attribution.refresh()
    assert before == {GPU0: (PodRef("a", "p", "c"),)}  # a reader's snapshot stays whole
    assert attribution.pods_by_device() == {}


# --- failures --------------------------------------------------------------------------------


def test_missing_socket_gives_no_labels_and_counts_an_error():
    settings = KubernetesConfig(socket_path="/tmp/kl-does-not-exist/kubelet.sock")
    attribution = PodAttribution(settings)

    assert attribution.refresh() is False
    assert attribution.pods_by_device() == {}
    assert sample(attribution, "gpu_exporter_attribution_up") == 0
    assert sample(attribution, "gpu_exporter_attribution_refreshes_total", result="error") == 1


def test_without_grace_a_stopped_kubelet_clears_labels_then_they_come_back(kubelet, caplog):
    kubelet.set_pods([pod("a", "p", {"c": [(GPU, [GPU0])]})])
    attribution = make(kubelet, stale_after_seconds=0)
    assert attribution.refresh()
    assert GPU0 in attribution.pods_by_device()

    kubelet.stop()  # gRPC removes the socket: "socket missing"
    assert attribution.refresh() is False
    assert attribution.pods_by_device() == {}

    kubelet.leave_stale_socket()  # a crashed kubelet's socket: connection refused
    assert attribution.refresh() is False
    assert attribution.pods_by_device() == {}
    assert "UNAVAILABLE" in caplog.text

    os.unlink(kubelet.socket_path)
    kubelet.start()
    assert attribution.refresh() is True
    assert attribution.pods_by_device() == {GPU0: (PodRef("a", "p", "c"),)}
    assert sample(attribution, "gpu_exporter_attribution_refreshes_total", result="success") == 2
    assert sample(attribution, "gpu_exporter_attribution_refreshes_total", result="error") == 2
    assert sample(attribution, "gpu_exporter_attribution_up") == 1


def test_hanging_kubelet_is_cut_off_at_the_timeout_and_clears_labels_without_grace(kubelet):
    kubelet.set_pods([pod("a", "p", {"c": [(GPU, [GPU0])]})])
    attribution = make(kubelet, timeout_seconds=0.3, stale_after_seconds=0)
    assert attribution.refresh()

    kubelet.hang_seconds = 10.0
    started = time.monotonic()
    assert attribution.refresh() is False
    elapsed = time.monotonic() - started

    assert 0.25 <= elapsed < 1.0
    assert attribution.pods_by_device() == {}
    assert sample(attribution, "gpu_exporter_attribution_up") == 0


# --- the grace period: one failed refresh keeps the labels -----------------------------------


def _stop(kubelet: FakeKubelet) -> None:
    kubelet.stop()  # gRPC removes the socket: "socket missing"


def _stale_socket(kubelet: FakeKubelet) -> None:
    kubelet.stop()
    kubelet.leave_stale_socket()  # connection refused: UNAVAILABLE


def _hang(kubelet: FakeKubelet) -> None:
    kubelet.hang_seconds = 5.0  # DEADLINE_EXCEEDED at timeout_seconds


FAILURES = {"socket missing": _stop, "connection refused": _stale_socket, "hung": _hang}


@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_one_failed_refresh_keeps_every_pod_label(kubelet, clock, failure):
    kubelet.set_pods(
        [pod("a", "p", {"c": [(GPU, [GPU0])]}), pod("b", "q", {"c": [(GPU, [GPU1, GPU2])]})]
    )
    clock.now = 1_700_000_000.0
    attribution = make(kubelet, clock=clock, monotonic=clock, timeout_seconds=0.2)
    assert attribution.refresh()
    before = attribution.pods_by_device()

    FAILURES[failure](kubelet)
    clock.advance(10)
    assert attribution.refresh() is False
    assert attribution.pods_by_device() is before  # the same map: no series ends
    assert sample(attribution, "gpu_exporter_attribution_up") == 0
    last = sample(attribution, "gpu_exporter_attribution_last_success_timestamp_seconds")
    assert last == 1_700_000_000.0  # how old the kept map is


def test_unexpected_errors_also_keep_the_labels_within_the_grace(kubelet, clock, monkeypatch):
    kubelet.set_pods([pod("a", "p", {"c": [(GPU, [GPU0])]})])
    attribution = make(kubelet, monotonic=clock, refresh_seconds=10)
    assert attribution.refresh()

    def explode():
        raise ValueError("corrupt answer")

    monkeypatch.setattr(attribution, "_list", explode)
    clock.advance(29)
    assert attribution.refresh() is False
    assert attribution.pods_by_device() == {GPU0: (PodRef("a", "p", "c"),)}
    clock.advance(1)  # 30 s = 3 refresh intervals after the last success: gone
    assert attribution.refresh() is False
    assert attribution.pods_by_device() == {}


def test_failing_longer_than_the_grace_drops_the_labels(kubelet, clock, caplog):
    caplog.set_level(logging.WARNING, logger="gpu_exporter.collect.k8s.attribution")
    kubelet.set_pods([pod("a", "p", {"c": [(GPU, [GPU0])]})])
    attribution = make(kubelet, monotonic=clock, refresh_seconds=10)
    assert attribution.settings.grace_seconds == 30  # 3 refresh intervals by default
    assert attribution.refresh()

    kubelet.stop()
    for _ in range(2):
        clock.advance(10)
        assert attribution.refresh() is False
        assert GPU0 in attribution.pods_by_device()
    clock.advance(10)
    assert attribution.refresh() is False
    assert attribution.pods_by_device() == {}

    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2  # kept (once, not per refresh), then dropped
    assert "keeping the last known pod labels until 30 s" in messages[0]
    assert "no pod labels until the kubelet answers" in messages[1]
    assert "failing for 30 s" in messages[1]

    kubelet.start()
    assert attribution.refresh()
    assert attribution.pods_by_device() == {GPU0: (PodRef("a", "p", "c"),)}


def test_a_refresh_that_succeeds_in_between_restarts_the_grace(kubelet, clock):
    kubelet.set_pods([pod("a", "p", {"c": [(GPU, [GPU0])]})])
    attribution = make(kubelet, monotonic=clock, stale_after_seconds=15)
    assert attribution.refresh()
    for _ in range(3):  # fail, fail, succeed: never 15 s without a success
        kubelet.stop()
        clock.advance(7)
        assert attribution.refresh() is False
        clock.advance(7)
        assert attribution.refresh() is False
        assert GPU0 in attribution.pods_by_device()
        kubelet.start()
        assert attribution.refresh()


def test_no_success_yet_means_no_labels_to_keep():
    settings = KubernetesConfig(socket_path="/tmp/kl-does-not-exist/kubelet.sock")
    attribution = PodAttribution(settings)
    assert attribution.refresh() is False
    assert attribution.pods_by_device() == {}


def test_a_negative_grace_is_refused():
    with pytest.raises(ValueError, match="stale_after_seconds"):
        KubernetesConfig(stale_after_seconds=-1)


def test_kubelet_without_the_v1_api_is_an_error(caplog):
    old = FakeKubelet(serve_v1=False).start()
    try:
        attribution = make(old)
        assert attribution.refresh() is False
        assert attribution.pods_by_device() == {}
        assert "does not serve the PodResources v1 API" in caplog.text
        assert sample(attribution, "gpu_exporter_attribution_refreshes_total", result="error") == 1
    finally:
        old.close()


def test_logs_once_per_state_change_not_per_refresh(kubelet, caplog):
    caplog.set_level(logging.INFO, logger="gpu_exporter.collect.k8s.attribution")
    kubelet.stop()
    attribution = make(kubelet, timeout_seconds=0.2)

    for _ in range(3):
        attribution.refresh()
    kubelet.start()
    for _ in range(3):
        attribution.refresh()
    kubelet.hang_seconds = 5.0
    for _ in range(2):
        attribution.refresh()

    records = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in records] == [logging.WARNING, logging.INFO, logging.WARNING]
    assert "socket missing" in records[0][1]
    assert "did not answer" in records[2][1]


def test_unexpected_errors_are_counted_not_raised(kubelet, monkeypatch):
    attribution = make(kubelet)

    def explode():
        raise ValueError("corrupt answer")

    monkeypatch.setattr(attribution, "_list", explode)
    assert attribution.refresh() is False
    assert sample(attribution, "gpu_exporter_attribution_refreshes_total", result="error") == 1


# --- self-metrics ----------------------------------------------------------------------------


def test_self_metrics_track_success_failure_and_last_success_time(kubelet, clock):
    clock.now = 1_700_000_000.0
    attribution = make(kubelet, clock=clock)
    assert sample(attribution, "gpu_exporter_attribution_up") == 0
    assert sample(attribution, "gpu_exporter_attribution_last_success_timestamp_seconds") == 0
    assert sample(attribution, "gpu_exporter_attribution_refreshes_total", result="success") == 0

    assert attribution.refresh()
    clock.advance(10)
    assert attribution.refresh()
    kubelet.stop()
    clock.advance(10)
    assert not attribution.refresh()

    assert sample(attribution, "gpu_exporter_attribution_up") == 0
    assert sample(attribution, "gpu_exporter_attribution_refreshes_total", result="success") == 2
    assert sample(attribution, "gpu_exporter_attribution_refreshes_total", result="error") == 1
    last = sample(attribution, "gpu_exporter_attribution_last_success_timestamp_seconds")
    assert last == 1_700_000_010.0


# --- the refresh thread ----------------------------------------------------------------------


def test_thread_refreshes_on_its_own_and_stops(kubelet):
    kubelet.set_pods([pod("a", "p", {"c": [(GPU, [GPU0])]})])
    attribution = make(kubelet, refresh_seconds=0.05)
    attribution.start()
    try:
        assert wait_until(lambda: GPU0 in attribution.pods_by_device())
        kubelet.set_pods([pod("b", "q", {"c": [(GPU, [GPU1])]})])
        assert wait_until(lambda: list(attribution.pods_by_device()) == [GPU1])
    finally:
        started = time.monotonic()
        attribution.stop()
    assert time.monotonic() - started < 1.0
    assert not any(t.name == "pod-attribution" for t in threading.enumerate())
    calls = kubelet.list_calls
    time.sleep(0.15)
    assert kubelet.list_calls == calls


def test_first_refresh_is_done_when_start_returns(kubelet):
    """So the sampler's first tick, started right after, already has the pod labels."""
    kubelet.set_pods([pod("a", "p", {"c": [(GPU, [GPU0])]})])
    attribution = make(kubelet, refresh_seconds=3600)
    attribution.start()
    try:
        assert GPU0 in attribution.pods_by_device()
    finally:
        attribution.stop()
    assert kubelet.list_calls == 1


def test_thread_survives_errors_and_recovers(kubelet, monkeypatch):
    kubelet.set_pods([pod("a", "p", {"c": [(GPU, [GPU0])]})])
    attribution = make(kubelet, refresh_seconds=0.02)
    real_list = attribution._list
    broken = True

    def flaky():
        if broken:
            raise RuntimeError("bug")
        return real_list()

    monkeypatch.setattr(attribution, "_list", flaky)
    attribution.start()
    try:
        errors = "gpu_exporter_attribution_refreshes_total"
        assert wait_until(lambda: (sample(attribution, errors, result="error") or 0) >= 3)
        broken = False
        assert wait_until(lambda: GPU0 in attribution.pods_by_device())
    finally:
        attribution.stop()


def test_fake_kubelet_serves_the_whole_v1_service(kubelet):
    """The fake answers Get and GetAllocatableResources like a kubelet, not only List."""
    kubelet.set_pods([pod("a", "p", {"c": [(GPU, [GPU0])]})])
    kubelet.allocatable = {GPU: [GPU0, GPU1]}
    with unix_channel(kubelet.socket_path) as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        found = stub.Get(api_pb2.GetPodResourcesRequest(pod_name="p", pod_namespace="a"), timeout=2)
        assert found.pod_resources.containers[0].devices[0].device_ids == [GPU0]
        with pytest.raises(grpc.RpcError) as missing:
            stub.Get(api_pb2.GetPodResourcesRequest(pod_name="gone", pod_namespace="a"), timeout=2)
        assert missing.value.code() is grpc.StatusCode.NOT_FOUND
        allocatable = stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(), timeout=2)
        assert list(allocatable.devices[0].device_ids) == [GPU0, GPU1]


# --- the vendored proto and its stubs --------------------------------------------------------


def test_vendored_proto_body_is_upstream_byte_for_byte():
    """Below the added header, the file is upstream's: its git blob id is the one
    `git ls-tree 63b3249 pkg/apis/podresources/v1/api.proto` prints in kubernetes/kubelet."""
    text = (PROTO_DIR / "api.proto").read_bytes()
    body = text[text.index(b"// To regenerate api.pb.go") :]
    digest = hashlib.sha256(body).hexdigest()
    assert digest == "b261f07b951c6ae807c90a3137475733a105c085d3fee62ac62199e0d986c823"
    blob = hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest()
    assert blob == "7436c41596fcac5c0fa6ef6e2231207adece1198"
    assert b"blob 7436c41596fcac5c0fa6ef6e2231207adece1198" in text  # the header says which
    assert b"Licensed under the Apache License, Version 2.0" in text


def test_committed_stubs_match_the_proto(tmp_path):
    """Also catches a `ruff format` run over the generated files (they must stay excluded)."""
    protoc = pytest.importorskip("grpc_tools.protoc")
    stub = (PROTO_DIR / "api_pb2_grpc.py").read_text()
    committed = re.search(r"GRPC_GENERATED_VERSION = ['\"](.+)['\"]", stub)
    assert committed is not None, "api_pb2_grpc.py no longer looks generated"
    if committed[1] != version("grpcio-tools"):
        pytest.skip(f"stubs come from grpcio-tools {committed[1]}, not the one installed")
    proto = "gpu_exporter/collect/k8s/podresources/v1/api.proto"
    args = ["protoc", f"-I{REPO}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}"]
    args += [f"--grpc_python_out={tmp_path}", str(REPO / proto)]
    assert protoc.main(args) == 0
    for name in ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"):
        generated = (tmp_path / os.path.dirname(proto) / name).read_text()
        assert generated == (PROTO_DIR / name).read_text(), f"{name}: run scripts/gen-grpc-stubs.sh"

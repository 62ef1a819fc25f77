"""The simulated node around a scenario's processes: the fake /proc (gpu_exporter/sim/procfs.py)
over scenario time and its faults, and the fake CRI runtime (gpu_exporter/sim/cri.py) through a
real gRPC client with the vendored stubs: its lists, filters and faults; both started by
`sim.install` and removed by `sim.uninstall`."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pynvml as N
import pytest

from gpu_exporter import sim
from gpu_exporter.collect.k8s.cri.v1 import api_pb2 as cri
from gpu_exporter.collect.k8s.cri.v1 import api_pb2_grpc as cri_grpc
from gpu_exporter.sim.clock import ManualClock
from gpu_exporter.sim.cri import EXITED_KEPT_S
from gpu_exporter.sim.node import SYNC_SECONDS, SimulatedNode
from gpu_exporter.sim.processes import container_id, pod_uid, sandbox_id, start_ticks
from gpu_exporter.sim.procfs import entries
from tests.daemon import parse_samples, serve
from tests.support import unix_channel

SCENARIO: dict[str, Any] = {
    "name": "node",
    "devices": [{}, {}],
    "pods": [
        {"namespace": "research", "pod": "notebook-ben", "container": "lab", "gpu": 0},
        {"namespace": "batch", "pod": "ocr-0", "container": "worker", "gpu": 1, "until": 90},
    ],
    "processes": [
        {"pid": 48121, "gpu": 0, "pod": {"namespace": "research", "pod": "tune", "container": "t"}},
        {"pid": 48121, "gpu": 1, "pod": {"namespace": "research", "pod": "tune", "container": "t"}},
        {"pid": 51004, "gpu": 0, "pod": {"namespace": "research", "pod": "tune", "container": "s"}},
        {"pid": 73310, "gpu": 1, "until": 90,
         "pod": {"namespace": "batch", "pod": "ocr-0", "container": "worker"}},
        {"pid": 73310, "gpu": 1, "from": 120,
         "pod": {"namespace": "batch", "pod": "ocr-1", "container": "worker"}},
        {"pid": 2291, "gpu": 1, "name": "Xorg (x) 1", "kind": "graphics"},
    ],
}  # fmt: skip

TUNE = pod_uid("research", "tune")
OCR0, OCR1 = pod_uid("batch", "ocr-0"), pod_uid("batch", "ocr-1")
BEN = pod_uid("research", "notebook-ben")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def node(clock: ManualClock) -> Iterator[SimulatedNode]:
    yield from installed(SCENARIO, clock)


def installed(spec: dict[str, Any], clock: ManualClock) -> Iterator[SimulatedNode]:
    sim.install(spec, clock=clock)
    N.nvmlInit()
    node = sim.installed_node()
    assert node is not None
    try:
        yield node
    finally:
        N.nvmlShutdown()
        sim.uninstall()


def at(node: SimulatedNode, clock: ManualClock, t: float) -> None:
    clock.now = t
    node.sync()


def read(node: SimulatedNode, pid: int, name: str) -> str:
    return Path(node.proc_root, str(pid), name).read_text()


def start_time(stat: str) -> int:
    """Field 22 of a stat line, split after the command name's last ')' as proc(5) advises."""
    return int(stat[stat.rindex(")") + 2 :].split()[19])


# -- /proc --------------------------------------------------------------------------------------


def test_the_tree_holds_the_running_processes_cgroup_and_stat(node, clock) -> None:
    assert entries(node.proc_root) == [2291, 48121, 51004, 73310]
    # The reader is in the host's PID namespace, as the exporter checks: PROC_PID_INIT_INO.
    assert os.readlink(os.path.join(node.proc_root, "self", "ns", "pid")) == "pid:[4026531836]"
    tune_t = container_id(TUNE, "t")
    assert read(node, 48121, "cgroup") == (
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        f"{TUNE.replace('-', '_')}.slice/cri-containerd-{tune_t}.scope\n"
    )
    assert read(node, 2291, "cgroup") == "0::/system.slice/Xorg__x__1.service\n"
    stat = read(node, 2291, "stat")
    assert stat.startswith("2291 (Xorg (x) 1) S 1 ") and stat.endswith("\n")
    assert len(stat[stat.rindex(")") + 2 :].split()) == 50  # 52 fields in all
    assert start_time(stat) == start_ticks(0)
    assert sorted(os.listdir(Path(node.proc_root, "48121"))) == ["cgroup", "stat"]


def test_a_reused_pid_shows_the_new_process_and_a_gap_between(node, clock) -> None:
    before = (read(node, 73310, "cgroup"), start_time(read(node, 73310, "stat")))
    at(node, clock, 100)
    assert 73310 not in entries(node.proc_root)
    at(node, clock, 120)
    after = (read(node, 73310, "cgroup"), start_time(read(node, 73310, "stat")))
    assert container_id(OCR0, "worker") in before[0]
    assert container_id(OCR1, "worker") in after[0]
    assert (before[1], after[1]) == (start_ticks(0), start_ticks(120))


def test_the_tree_is_computed_once_between_two_moments_it_can_change(
    node, clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each per-process NVML call syncs: between a process's start or end (or a fault's) and the
    # next, the tree is the same and is not worked out again; at the moment itself it changes.
    computed: list[float] = []
    wanted = node.procfs._wanted
    monkeypatch.setattr(node.procfs, "_wanted", lambda t: computed.append(t) or wanted(t))
    for t in (1, 30, 89.999):
        at(node, clock, t)
    assert computed == [] and 73310 in entries(node.proc_root)
    at(node, clock, 90)  # ocr-0's process ends: [from, until)
    at(node, clock, 119.5)
    assert computed == [90] and 73310 not in entries(node.proc_root)
    at(node, clock, 120)
    assert computed == [90, 120] and 73310 in entries(node.proc_root)
    node.procfs.vanish(73310)  # a test's fault changes the tree at the same time
    assert computed == [90, 120, 120] and 73310 not in entries(node.proc_root)
    node.procfs.restore(73310)
    assert 73310 in entries(node.proc_root)


def test_each_per_process_nvml_call_brings_the_tree_to_its_time(node, clock) -> None:
    clock.now = 100  # no sync: the tree is still that of time 0
    assert 73310 in entries(node.proc_root)
    assert N.nvmlDeviceGetComputeRunningProcesses(N.nvmlDeviceGetHandleByIndex(1)) != []
    assert 73310 not in entries(node.proc_root)


def test_the_thread_follows_the_clock_without_calls(node, clock) -> None:
    clock.now = 100
    deadline = time.monotonic() + 3
    while 73310 in entries(node.proc_root) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert 73310 not in entries(node.proc_root)


def test_a_sync_failing_ten_times_a_second_logs_once_until_it_succeeds(
    node, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    failing = [True]
    synced = node.cri.sync

    def sync(t: float | None = None) -> None:
        if failing[0]:
            raise OverflowError("cannot convert float infinity to integer")
        synced(t)

    def logged_after(seconds: float) -> int:
        time.sleep(seconds)  # several of the thread's syncs (every SYNC_SECONDS)
        return len([r for r in caplog.records if r.name == "gpu_exporter.sim.node"])

    monkeypatch.setattr(node.cri, "sync", sync)
    with caplog.at_level(logging.ERROR, logger="gpu_exporter.sim.node"):
        assert logged_after(6 * SYNC_SECONDS) == 1
        failing[0] = False
        assert logged_after(4 * SYNC_SECONDS) == 1
        failing[0] = True
        assert logged_after(4 * SYNC_SECONDS) == 2  # failing again after a success


def test_scenario_faults_make_entries_vanish_or_unreadable(clock) -> None:
    faults = [
        {"kind": "proc_vanished", "pid": 48121, "at": 10, "until": 20},
        {"kind": "proc_vanished", "pid": 51004, "at": 10, "until": 20, "files": ["stat"]},
        {"kind": "proc_unreadable", "pid": 2291, "at": 10, "until": 20, "files": ["cgroup"]},
    ]
    for node in installed({**SCENARIO, "faults": faults}, clock):
        at(node, clock, 10)
        assert 48121 not in entries(node.proc_root)  # exited before the read
        assert read(node, 51004, "cgroup")  # exited between the two reads
        with pytest.raises(FileNotFoundError):
            read(node, 51004, "stat")
        with pytest.raises(PermissionError):
            read(node, 2291, "cgroup")
        assert start_time(read(node, 2291, "stat")) == start_ticks(0)
        at(node, clock, 20)
        assert [read(node, pid, "stat")[:5] for pid in (48121, 51004)] == ["48121", "51004"]
        assert read(node, 2291, "cgroup") == "0::/system.slice/Xorg__x__1.service\n"


def test_tests_can_make_entries_vanish_or_unreadable_and_restore_them(node) -> None:
    procfs = node.procfs
    procfs.deny(48121)
    for name in ("cgroup", "stat"):
        with pytest.raises(PermissionError):
            read(node, 48121, name)
    assert procfs.denies_root or os.geteuid() != 0
    procfs.vanish(51004, ["cgroup"])
    with pytest.raises(FileNotFoundError):
        read(node, 51004, "cgroup")
    assert read(node, 51004, "stat")
    procfs.vanish(2291)
    assert 2291 not in entries(node.proc_root)
    for pid in (48121, 51004, 2291):
        procfs.restore(pid)
    assert all(read(node, pid, "cgroup") for pid in (48121, 51004, 2291))
    with pytest.raises(ValueError, match="cgroup, stat"):
        procfs.vanish(2291, ["environ"])


# -- the CRI runtime ---------------------------------------------------------------------------


def rpc(node: SimulatedNode, method: str, request: Any, timeout: float = 5) -> Any:
    with unix_channel(node.cri_socket_path) as channel:
        stub = cri_grpc.RuntimeServiceStub(channel)
        return getattr(stub, method)(request, timeout=timeout)


def containers(node: SimulatedNode, **wanted: Any) -> list[tuple[str, str, str]]:
    """(pod, container, state) of ListContainers with a filter of these fields."""
    request = cri.ListContainersRequest(filter=cri.ContainerFilter(**wanted))
    return sorted(
        (c.labels["io.kubernetes.pod.name"], c.metadata.name, cri.ContainerState.Name(c.state))
        for c in rpc(node, "ListContainers", request).containers
    )


def sandboxes(node: SimulatedNode, **wanted: Any) -> list[tuple[str, str]]:
    request = cri.ListPodSandboxRequest(filter=cri.PodSandboxFilter(**wanted))
    return sorted(
        (s.metadata.name, cri.PodSandboxState.Name(s.state))
        for s in rpc(node, "ListPodSandbox", request).items
    )


def test_containers_carry_the_kubelets_labels_and_the_ids_proc_shows(node) -> None:
    listed = rpc(node, "ListContainers", cri.ListContainersRequest()).containers
    by_name = {(c.labels["io.kubernetes.pod.name"], c.metadata.name): c for c in listed}
    assert sorted(by_name) == [
        ("notebook-ben", "lab"),  # a `pods:` entry without a process
        ("ocr-0", "worker"),  # named by both
        ("tune", "s"),
        ("tune", "t"),
    ]
    tune = by_name["tune", "t"]
    assert tune.id == container_id(TUNE, "t") and tune.id in read(node, 48121, "cgroup")
    assert tune.pod_sandbox_id == sandbox_id(TUNE)
    assert dict(tune.labels) == {
        "io.kubernetes.pod.name": "tune",
        "io.kubernetes.pod.namespace": "research",
        "io.kubernetes.pod.uid": TUNE,
        "io.kubernetes.container.name": "t",
    }
    assert tune.state == cri.CONTAINER_RUNNING and tune.created_at > 0
    assert by_name["ocr-0", "worker"].id in read(node, 73310, "cgroup")
    assert by_name["notebook-ben", "lab"].labels["io.kubernetes.pod.uid"] == BEN
    boxes = rpc(node, "ListPodSandbox", cri.ListPodSandboxRequest()).items
    tune_box = next(b for b in boxes if b.id == sandbox_id(TUNE))
    assert (tune_box.metadata.name, tune_box.metadata.uid, tune_box.metadata.namespace) == (
        "tune",
        TUNE,
        "research",
    )
    assert tune_box.labels["io.kubernetes.pod.uid"] == TUNE
    assert "io.kubernetes.container.name" not in tune_box.labels
    assert len(boxes) == 3


def test_containers_exit_and_are_collected_over_time(node, clock) -> None:
    at(node, clock, 95)
    assert ("ocr-0", "worker", "CONTAINER_EXITED") in containers(node)
    assert ("ocr-0", "SANDBOX_NOTREADY") in sandboxes(node)
    at(node, clock, 120)
    assert ("ocr-1", "worker", "CONTAINER_RUNNING") in containers(node)
    at(node, clock, 90 + EXITED_KEPT_S)
    assert "ocr-0" not in {pod for pod, _, _ in containers(node)}
    assert "ocr-0" not in {pod for pod, _ in sandboxes(node)}


def test_container_filters_are_anded_as_containerds(node, clock) -> None:
    at(node, clock, 95)
    tune_t = container_id(TUNE, "t")
    assert containers(node, id=tune_t) == [("tune", "t", "CONTAINER_RUNNING")]
    assert containers(node, id=tune_t[:12]) == [("tune", "t", "CONTAINER_RUNNING")]  # short id
    assert containers(node, id="") == containers(node)  # empty: no filter
    assert containers(node, id="f" * 64) == []
    running = cri.ContainerStateValue(state=cri.CONTAINER_RUNNING)
    exited = cri.ContainerStateValue(state=cri.CONTAINER_EXITED)
    assert containers(node, state=exited) == [("ocr-0", "worker", "CONTAINER_EXITED")]
    assert len(containers(node, state=running)) == 3
    assert [c for _, c, _ in containers(node, pod_sandbox_id=sandbox_id(TUNE))] == ["s", "t"]
    assert [c for _, c, _ in containers(node, pod_sandbox_id=sandbox_id(TUNE)[:10])] == ["s", "t"]
    assert containers(node, pod_sandbox_id=sandbox_id(TUNE), state=exited) == []
    selector = {"io.kubernetes.pod.namespace": "research", "io.kubernetes.container.name": "t"}
    assert containers(node, label_selector=selector) == [("tune", "t", "CONTAINER_RUNNING")]
    assert containers(node, label_selector={"io.kubernetes.pod.uid": OCR0}) == [
        ("ocr-0", "worker", "CONTAINER_EXITED")
    ]
    assert containers(node, label_selector={"app": "tune"}) == []
    assert containers(node, id=tune_t, label_selector={"io.kubernetes.pod.name": "ocr-0"}) == []


def test_an_ambiguous_short_id_matches_nothing(clock) -> None:
    one, two = "abc1" + "0" * 60, "abc2" + "0" * 60
    spec = {
        "name": "ids",
        "devices": [{}],
        "processes": [
            {"pid": 1, "gpu": 0, "pod": {"namespace": "a", "pod": "p", "container_id": one}},
            {"pid": 2, "gpu": 0, "pod": {"namespace": "a", "pod": "q", "container_id": two}},
        ],
    }
    for node in installed(spec, clock):
        assert containers(node, id="abc") == []  # two match: compared as is
        assert containers(node, id="abc2") == [("q", "main", "CONTAINER_RUNNING")]


def test_sandbox_filters(node, clock) -> None:
    at(node, clock, 95)
    assert sandboxes(node, id=sandbox_id(TUNE)) == [("tune", "SANDBOX_READY")]
    assert sandboxes(node, id=sandbox_id(TUNE)[:8]) == [("tune", "SANDBOX_READY")]
    ready = cri.PodSandboxStateValue(state=cri.SANDBOX_READY)
    not_ready = cri.PodSandboxStateValue(state=cri.SANDBOX_NOTREADY)
    assert sandboxes(node, state=not_ready) == [("ocr-0", "SANDBOX_NOTREADY")]
    assert [name for name, _ in sandboxes(node, state=ready)] == ["notebook-ben", "tune"]
    assert sandboxes(node, label_selector={"io.kubernetes.pod.namespace": "batch"}) == [
        ("ocr-0", "SANDBOX_NOTREADY")
    ]


def test_version_answers_and_other_calls_are_unimplemented(node) -> None:
    version = rpc(node, "Version", cri.VersionRequest(version="v1"))
    assert (version.runtime_name, version.runtime_api_version) == ("containerd", "v1")
    for method, request in [
        ("ContainerStatus", cri.ContainerStatusRequest(container_id="x")),
        ("RunPodSandbox", cri.RunPodSandboxRequest()),
    ]:
        with pytest.raises(grpc.RpcError) as err:
            rpc(node, method, request)
        assert err.value.code() is grpc.StatusCode.UNIMPLEMENTED


def failure(node: SimulatedNode, timeout: float = 2) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        rpc(node, "ListContainers", cri.ListContainersRequest(), timeout=timeout)
    return err.value.code()


def test_down_and_garbage_and_back_from_tests(node) -> None:
    runtime = node.cri
    runtime.set_mode("down")
    assert not os.path.exists(node.cri_socket_path)
    assert failure(node) is grpc.StatusCode.UNAVAILABLE
    runtime.set_mode("garbage")
    with socket.socket(socket.AF_UNIX) as raw:  # what the socket speaks: not HTTP/2
        raw.connect(node.cri_socket_path)
        raw.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        assert raw.recv(100).startswith(b"HTTP/1.1 400 Bad Request")
    assert failure(node) is grpc.StatusCode.UNAVAILABLE
    runtime.set_mode(None)  # the scenario's: serving
    assert runtime.mode == "serving"
    assert len(containers(node)) == 4
    runtime.leave_stale_socket()
    assert os.path.exists(node.cri_socket_path)
    assert failure(node) is grpc.StatusCode.UNAVAILABLE
    runtime.set_mode("serving")
    assert len(containers(node)) == 4


def test_a_hung_runtime_misses_the_deadline_and_stops_at_once(node) -> None:
    node.cri.hang_seconds = 3600  # longer than any sane deadline
    started = time.monotonic()
    assert failure(node, timeout=0.5) is grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 3
    started = time.monotonic()
    node.cri.close()  # releases the blocked call
    assert time.monotonic() - started < 3


def test_scenario_faults_take_the_runtime_down_hang_it_or_garble_it(clock) -> None:
    faults = [
        {"kind": "cri_down", "at": 10, "until": 20},
        {"kind": "cri_garbage", "at": 30, "until": 40},
        {"kind": "cri_hang", "at": 50, "duration": 5},
    ]
    for node in installed({**SCENARIO, "faults": faults}, clock):
        at(node, clock, 10)
        assert node.cri.mode == "down" and failure(node) is grpc.StatusCode.UNAVAILABLE
        at(node, clock, 30)
        assert node.cri.mode == "garbage" and failure(node) is grpc.StatusCode.UNAVAILABLE
        at(node, clock, 45)
        assert len(containers(node)) == 4
        at(node, clock, 50)
        assert failure(node, timeout=0.5) is grpc.StatusCode.DEADLINE_EXCEEDED
        assert node.cri.calls["ListContainers"] >= 2
        at(node, clock, 55)
        assert len(containers(node)) == 4


# -- install and uninstall -----------------------------------------------------------------------


def test_install_exposes_the_paths_and_uninstall_removes_them(clock) -> None:
    fake = sim.install(SCENARIO, clock=clock)
    node = sim.installed_node()
    try:
        assert node is not None
        assert (fake.proc_root, fake.cri_socket_path) == (node.proc_root, node.cri_socket_path)
        assert fake.proc_root is not None and fake.cri_socket_path is not None
        assert os.path.isdir(fake.proc_root) and os.path.exists(fake.cri_socket_path)
        assert len(fake.cri_socket_path) < 108  # sun_path
    finally:
        sim.uninstall()
    assert sim.installed_node() is None
    assert not os.path.exists(fake.proc_root)
    assert not os.path.exists(os.path.dirname(fake.cri_socket_path))
    assert not node._thread.is_alive()


def test_a_scenario_without_processes_has_no_node(clock) -> None:
    fake = sim.install("mixed", clock=clock)
    try:
        assert sim.installed_node() is None
        assert (fake.proc_root, fake.cri_socket_path) == (None, None)
    finally:
        sim.uninstall()


def test_installing_again_replaces_the_node(clock) -> None:
    first = sim.install(SCENARIO, clock=clock)
    second = sim.install(SCENARIO, clock=clock)
    try:
        assert first.proc_root is not None and not os.path.exists(first.proc_root)
        assert second.proc_root is not None and os.path.isdir(second.proc_root)
    finally:
        sim.uninstall()


def test_serve_simulate_shared_runs_with_its_node(tmp_path: Path) -> None:
    """Today's daemon shows the shared scenario's GPUs and pods; the node starts and stops with
    it (the daemon's attribution of processes reads it once wired)."""
    with serve(tmp_path, "--simulate", "shared", "--interval", "0.5") as daemon:
        daemon.wait_ready(30)
        samples = parse_samples(daemon.metrics_text())
        uuids = {
            series.split('uuid="')[1].split('"')[0]
            for series in samples
            if series.startswith("gpu_up{") and 'uuid="GPU-' in series
        }
        assert len(uuids) == 5
        assert any('pod="llm-finetune-0"' in series for series in samples), daemon.output()
    assert "Traceback" not in daemon.output()


# -- the built-in `shared` scenario ----------------------------------------------------------------


def test_the_shared_scenario_shows_what_its_comments_say(clock) -> None:
    for node in installed(sim.load_scenario("shared"), clock):
        gpus = [N.nvmlDeviceGetHandleByIndex(i) for i in range(5)]
        compute = [{p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(h)} for h in gpus]
        mps = [{p.pid for p in N.nvmlDeviceGetMPSComputeRunningProcesses(h)} for h in gpus]
        assert compute == [{48121, 48877, 51004}, {39012}, {60233}, {73310, 2291}, {81442, 81990}]
        assert mps == [set(), {40517, 40533}, set(), set(), set()]
        at(node, clock, 30.5)
        # Time-sliced: the idle notebook is never sampled; the fourth share has no process.
        busy = {s.pid for s in N.nvmlDeviceGetProcessesUtilizationInfo(gpus[0], 0)}
        assert busy == {48121, 48877}
        assert {s.pid for s in N.nvmlDeviceGetProcessesUtilizationInfo(gpus[1], 0)} == {
            40517,
            40533,
        }
        with pytest.raises(N.NVMLError_NotSupported):  # MIG on
            N.nvmlDeviceGetProcessesUtilizationInfo(gpus[4], 0)
        assert {
            (p.pid, p.gpuInstanceId) for p in N.nvmlDeviceGetComputeRunningProcesses(gpus[4])
        } == {
            (81442, 1),
            (81990, 5),
        }
        # The PID of ocr-0 is gone between 90 and 120 s, then ocr-1's.
        first = read(node, 73310, "cgroup")
        at(node, clock, 100)
        assert {p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(gpus[3])} == {2291}
        assert 73310 not in entries(node.proc_root)
        at(node, clock, 120)
        assert read(node, 73310, "cgroup") != first
        assert read(node, 2291, "cgroup") == "0::/system.slice/ollama.service\n"
        pods = {pod for pod, _, _ in containers(node)}
        assert {
            "notebook-ben",
            "ocr-0",
            "ocr-1",
            "nvidia-device-plugin-mps-control-daemon-x7k2p",
        } <= pods

"""A fake kubelet: a real gRPC server for the PodResources v1 API on a unix socket.

`serve --simulate` and `diagnose --simulate` run one for a scenario with `pods:`, so the
daemon's production attribution path (a gRPC List() every refresh) reads them; each List()
reports the pods active at that scenario time (`from`/`until`, on the fake NVML's clock). A pod
entry with `claim:` is reported as the kubelet reports a device allocated through Dynamic
Resource Allocation: under the container's `dynamic_resources`, not its `devices`. Tests set the
pods it reports (`set_pods` with `pod()`, whose `claims` builds DRA devices, or `set_schedule`
for a list that changes over time), make List() hang (`hang_seconds`), stop and restart it on
the same socket, or start it without the v1 service (an old kubelet).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent import futures
from typing import Any, NamedTuple

import grpc

from gpu_exporter.collect.k8s.attribution import normalize_device_id
from gpu_exporter.collect.k8s.podresources.v1 import api_pb2, api_pb2_grpc
from gpu_exporter.sim.dra import DRIVER
from gpu_exporter.sim.spec import DraSpec, Scenario

# container name -> [(resource name, [device ids])]
Containers = Mapping[str, Iterable[tuple[str, Iterable[str]]]]

NODE_NAME: str = DraSpec.model_fields["node_name"].default  # a scenario's `dra.node_name`


class Claimed(NamedTuple):
    """One device a container holds through a ResourceClaim: one `ClaimResource` of the
    container's `DynamicResource` for that claim."""

    claim: str  # the ResourceClaim object's name
    device: str  # the driver's device name (gpu_exporter/sim/dra.py)
    pool: str = NODE_NAME  # NVIDIA's driver names its pool after the node
    driver: str = DRIVER
    namespace: str | None = None  # the claim's; None: the pod's (the kubelet always fills it)
    share_id: str | None = None  # a share of a device with consumable capacity


# container name -> [devices held through claims]
ClaimedContainers = Mapping[str, Iterable[Claimed]]


def cdi_device_name(driver: str, device: str) -> str:
    """A CDI name for the device, as NVIDIA's driver forms its kind: `k8s.<driver>/device`
    (k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/cdi.go, `cdiDeviceKind`)."""
    return f"k8s.{driver}/device={device}"


def dynamic_resources(
    pod_namespace: str, claimed: Iterable[Claimed]
) -> list[api_pb2.DynamicResource]:
    """One `DynamicResource` per claim (namespace, name), in order of first appearance, with
    one `ClaimResource` per device allocated through it."""
    by_claim: dict[tuple[str, str], api_pb2.DynamicResource] = {}
    for entry in claimed:
        namespace = pod_namespace if entry.namespace is None else entry.namespace
        resource = by_claim.get((namespace, entry.claim))
        if resource is None:
            resource = api_pb2.DynamicResource(claim_name=entry.claim, claim_namespace=namespace)
            by_claim[(namespace, entry.claim)] = resource
        resource.claim_resources.append(
            api_pb2.ClaimResource(
                cdi_devices=[api_pb2.CDIDevice(name=cdi_device_name(entry.driver, entry.device))],
                driver_name=entry.driver,
                pool_name=entry.pool,
                device_name=entry.device,
                share_id=entry.share_id,
            )
        )
    return list(by_claim.values())


def pod(
    namespace: str,
    name: str,
    containers: Containers,
    claims: ClaimedContainers | None = None,
) -> api_pb2.PodResources:
    """A pod as List() reports it: each container's device-plugin `devices` (`containers`) and
    DRA `dynamic_resources` (`claims`); a container may have either or both."""
    claims = claims or {}
    return api_pb2.PodResources(
        name=name,
        namespace=namespace,
        containers=[
            api_pb2.ContainerResources(
                name=container,
                devices=[
                    api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids))
                    for resource, ids in containers.get(container, ())
                ],
                cpu_ids=[0, 1],  # unrelated fields a real kubelet also fills
                dynamic_resources=dynamic_resources(namespace, claims.get(container, ())),
            )
            for container in dict.fromkeys([*containers, *claims])
        ],
    )


def dra_pod(namespace: str, name: str, claims: ClaimedContainers) -> api_pb2.PodResources:
    """A pod whose containers hold devices only through ResourceClaims."""
    return pod(namespace, name, {}, claims)


class _Lister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    def List(self, request: Any, context: Any) -> api_pb2.ListPodResourcesResponse:
        self.kubelet.list_calls += 1
        if self.kubelet.hang_seconds:
            # Interruptible, so stopping the server does not wait out the hang.
            self.kubelet.release.wait(self.kubelet.hang_seconds)
        return api_pb2.ListPodResourcesResponse(pod_resources=self.kubelet.pods())

    def GetAllocatableResources(
        self, request: Any, context: Any
    ) -> api_pb2.AllocatableResourcesResponse:
        devices = [
            api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids))
            for resource, ids in self.kubelet.allocatable.items()
        ]
        return api_pb2.AllocatableResourcesResponse(devices=devices, cpu_ids=[0, 1, 2, 3])

    def Get(self, request: Any, context: Any) -> api_pb2.GetPodResourcesResponse:
        for found in self.kubelet.pods():
            if (found.namespace, found.name) == (request.pod_namespace, request.pod_name):
                return api_pb2.GetPodResourcesResponse(pod_resources=found)
        context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_name} not found")
        raise AssertionError("unreachable: context.abort raises")


class FakeKubelet:
    """The server; `socket_path` is where the daemon's `kubernetes.socket_path` points."""

    def __init__(self, serve_v1: bool = True) -> None:
        # Under /tmp with a short prefix: unix socket paths must fit in 107 bytes.
        self.directory = tempfile.mkdtemp(prefix="kl", dir="/tmp")
        self.socket_path = os.path.join(self.directory, "kubelet.sock")
        self.serve_v1 = serve_v1
        self.allocatable: dict[str, list[str]] = {}
        self.hang_seconds = 0.0
        self.release = threading.Event()
        self.list_calls = 0
        self._pods: list[api_pb2.PodResources] = []
        self._schedule: Callable[[], list[api_pb2.PodResources]] | None = None
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None

    def set_pods(self, pods: Iterable[api_pb2.PodResources]) -> None:
        """A fixed list, reported until changed (replaces a schedule)."""
        with self._lock:
            self._pods = list(pods)
            self._schedule = None

    def set_schedule(self, pods_now: Callable[[], list[api_pb2.PodResources]]) -> None:
        """Report `pods_now()` at every List(): pods that change over time."""
        with self._lock:
            self._schedule = pods_now

    def pods(self) -> list[api_pb2.PodResources]:
        with self._lock:
            schedule, pods = self._schedule, list(self._pods)
        return schedule() if schedule is not None else pods

    def start(self) -> FakeKubelet:
        self.release.clear()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        if self.serve_v1:
            api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Lister(self), server)
        if not server.add_insecure_port("unix://" + self.socket_path):
            raise RuntimeError(f"could not bind {self.socket_path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        self.release.set()
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None  # gRPC unlinks the socket file on stop

    def leave_stale_socket(self) -> None:
        """A socket file nobody listens on, as a crashed kubelet leaves: connect is refused."""
        with socket.socket(socket.AF_UNIX) as stale:
            stale.bind(self.socket_path)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def scenario_pods(scenario: Scenario, t: float | None = None) -> list[api_pb2.PodResources]:
    """The scenario's `pods:` as the kubelet reports them (one container entry per device, a
    claim's devices under `dynamic_resources`): those active at scenario time `t`
    (`from` <= t < `until`), or every entry when `t` is None."""
    node_name = (scenario.dra or DraSpec()).node_name
    devices: dict[tuple[str, str], dict[str, list[tuple[str, list[str]]]]] = {}
    claims: dict[tuple[str, str], dict[str, list[Claimed]]] = {}
    for spec in scenario.pods:
        if t is not None and not spec.active(t):
            continue
        key = (spec.namespace, spec.pod)
        containers = devices.setdefault(key, {})
        claimed = claims.setdefault(key, {})
        claim = spec.claim
        if claim is None:
            containers.setdefault(spec.container, []).append((spec.resource, [spec.device_id]))
            continue
        claimed.setdefault(spec.container, []).append(
            Claimed(
                claim=claim.name,
                device=spec.dra_device,
                pool=claim.pool or node_name,
                driver=claim.driver,
                namespace=claim.namespace or spec.namespace,
            )
        )
    return [
        pod(namespace, name, containers, claims[namespace, name])
        for (namespace, name), containers in devices.items()
    ]


def describe(scenario: Scenario, t: float) -> str:
    """What the fake kubelet reports at scenario time `t`, counted as pod attribution counts
    it (a time-slice replica's id is its GPU's; "N devices held by pods"): "6 pods holding 7
    devices at 0 s (7 pods in the scenario, which come and go with from/until)"."""
    active = [spec for spec in scenario.pods if spec.active(t)]
    pods = {(spec.namespace, spec.pod) for spec in active}
    devices = {normalize_device_id(spec.device_id) for spec in active if spec.claim is None}
    claimed = sum(1 for spec in active if spec.claim is not None)
    everyone = {(spec.namespace, spec.pod) for spec in scenario.pods}
    through_dra = f" and {_count(claimed, 'DRA device')}" if claimed else ""
    return (
        f"{_count(len(pods), 'pod')} holding {_count(len(devices), 'device')}{through_dra} "
        f"at {t:.0f} s ({_count(len(everyone), 'pod')} in the scenario, which come and go with "
        "from/until)"
    )


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"


def start_for(scenario: Scenario, clock: Callable[[], float] | None = None) -> FakeKubelet | None:
    """A running fake kubelet reporting the scenario's pods active at `clock()` (scenario
    seconds: pass the fake NVML's clock; by default real time since this call), or None when
    the scenario has no pods."""
    if not scenario.pods:
        return None
    now = clock if clock is not None else _seconds_since(time.monotonic())
    kubelet = FakeKubelet()
    kubelet.set_schedule(lambda: scenario_pods(scenario, now()))
    return kubelet.start()


def _seconds_since(start: float) -> Callable[[], float]:
    def clock() -> float:
        return time.monotonic() - start

    return clock

"""A fake kubelet: a real gRPC server for the PodResources v1 API on a unix socket.

`serve --simulate` and `diagnose --simulate` run one for a scenario with `pods:`, so the
daemon's production attribution path (a gRPC List() every refresh) reads them; each List()
reports the pods active at that scenario time (`from`/`until`, on the fake NVML's clock). Tests
set the pods it reports (`set_pods`, or `set_schedule` for a list that changes over time), make
List() hang (`hang_seconds`), stop and restart it on the same socket, or start it without the v1
service (an old kubelet).
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
from typing import Any

import grpc

from gpu_exporter.collect.k8s.podresources.v1 import api_pb2, api_pb2_grpc
from gpu_exporter.sim.spec import Scenario

# container name -> [(resource name, [device ids])]
Containers = Mapping[str, Iterable[tuple[str, Iterable[str]]]]


def pod(namespace: str, name: str, containers: Containers) -> api_pb2.PodResources:
    return api_pb2.PodResources(
        name=name,
        namespace=namespace,
        containers=[
            api_pb2.ContainerResources(
                name=container,
                devices=[
                    api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids))
                    for resource, ids in devices
                ],
                cpu_ids=[0, 1],  # unrelated fields a real kubelet also fills
            )
            for container, devices in containers.items()
        ],
    )


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
    """The scenario's `pods:` as the kubelet reports them (one container entry per device): those
    active at scenario time `t` (`from` <= t < `until`), or every entry when `t` is None."""
    by_pod: dict[tuple[str, str], dict[str, list[tuple[str, list[str]]]]] = {}
    for spec in scenario.pods:
        if t is not None and not spec.active(t):
            continue
        containers = by_pod.setdefault((spec.namespace, spec.pod), {})
        containers.setdefault(spec.container, []).append((spec.resource, [spec.device_id]))
    return [pod(namespace, name, containers) for (namespace, name), containers in by_pod.items()]


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

"""A fake kubelet: a real gRPC server for the PodResources v1 API on a unix socket.

Tests set the pods it reports (`set_pods`), make List() hang (`hang_seconds`), stop and
restart it on the same socket, or start it without the v1 service (an old kubelet).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterable, Mapping
from concurrent import futures

import grpc

from gpu_exporter.k8s.podresources.v1 import api_pb2, api_pb2_grpc

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

    def List(self, request, context):
        self.kubelet.list_calls += 1
        if self.kubelet.hang_seconds:
            # Interruptible, so stopping the server does not wait out the hang.
            self.kubelet.release.wait(self.kubelet.hang_seconds)
        return api_pb2.ListPodResourcesResponse(pod_resources=self.kubelet.pods())

    def GetAllocatableResources(self, request, context):
        devices = [
            api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids))
            for resource, ids in self.kubelet.allocatable.items()
        ]
        return api_pb2.AllocatableResourcesResponse(devices=devices, cpu_ids=[0, 1, 2, 3])

    def Get(self, request, context):
        for found in self.kubelet.pods():
            if (found.namespace, found.name) == (request.pod_namespace, request.pod_name):
                return api_pb2.GetPodResourcesResponse(pod_resources=found)
        context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_name} not found")


class FakeKubelet:
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
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None

    def set_pods(self, pods: Iterable[api_pb2.PodResources]) -> None:
        with self._lock:
            self._pods = list(pods)

    def pods(self) -> list[api_pb2.PodResources]:
        with self._lock:
            return list(self._pods)

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

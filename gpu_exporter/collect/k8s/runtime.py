"""Which pod and container a container id belongs to: the container runtime's CRI API.

The runtime (containerd, CRI-O, cri-dockerd) serves `runtime.v1.RuntimeService` on a unix
socket on every Kubernetes node; it needs no cluster credentials, only the socket. `ListContainers`
gives each container's id, its sandbox and the labels the kubelet sets on it
(`io.kubernetes.pod.name`, `io.kubernetes.pod.namespace`, `io.kubernetes.pod.uid`,
`io.kubernetes.container.name`: kubernetes pkg/kubelet/types/labels.go); `ListPodSandbox` gives
each sandbox's name, namespace and UID, used where a container lacks a label. The map
container id -> pod is rebuilt every `refresh_seconds` on a thread of its own, and sooner (at
most once a second) when a lookup asks for a container it does not have, so a tick never waits
on the runtime.

A failed refresh (socket missing, the runtime hung past `timeout_seconds`, something else on
the socket) keeps the last map: container ids are 64 random hex digits that the runtime never
gives twice, so a stale entry can only name the container's own pod, and containers that started
since are `unknown` until the runtime answers again. `gpu_exporter_process_attribution_up` says so.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from gpu_exporter.collect.k8s.attribution import PodRef
from gpu_exporter.collect.k8s.processes import ContainerRef
from gpu_exporter.collect.k8s.rpc import RpcError, StatusCode, UnixChannel

log = logging.getLogger(__name__)

# The kubelet's labels on every container it creates (pkg/kubelet/types/labels.go).
POD_NAME = "io.kubernetes.pod.name"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
POD_UID = "io.kubernetes.pod.uid"
CONTAINER_NAME = "io.kubernetes.container.name"
# Where runtimes listen by default (kubeadm's constants_unix.go), tried in this order by "auto".
KNOWN_SOCKETS = (
    "/run/containerd/containerd.sock",
    "/var/run/containerd/containerd.sock",
    "/var/run/crio/crio.sock",
    "/var/run/cri-dockerd.sock",
)
# A lookup of an unknown container asks for a refresh at most this often.
MIN_REFRESH_GAP_SECONDS = 1.0
# The kubelet's own limit for CRI answers (16 MiB, kubernetes pkg/kubelet/cri/remote,
# maxMsgSize): a node with many containers may answer ListContainers with more than gRPC's 4 MiB
# default.
_MAX_ANSWER_BYTES = 16 * 1024 * 1024
# The CRI service (api.proto: `package runtime.v1; service RuntimeService`).
_SERVICE = "/runtime.v1.RuntimeService/"
_OK = "ok"


def resolve_socket(setting: str) -> str:
    """The socket to use: the setting, or for "auto" the first known runtime socket that exists
    (the first one when none does, so the error names a real default)."""
    if setting != "auto":
        return setting.removeprefix("unix://")
    return next((path for path in KNOWN_SOCKETS if os.path.exists(path)), KNOWN_SOCKETS[0])


def map_containers(containers: Any, sandboxes: Any) -> dict[str, ContainerRef]:
    """Container id -> its pod, from ListContainers' and ListPodSandbox's answers."""
    by_sandbox = {sandbox.id: sandbox.metadata for sandbox in sandboxes}
    out = {}
    for container in containers:
        labels = container.labels
        sandbox = by_sandbox.get(container.pod_sandbox_id)
        namespace = labels.get(POD_NAMESPACE) or (sandbox.namespace if sandbox else "")
        pod = labels.get(POD_NAME) or (sandbox.name if sandbox else "")
        uid = labels.get(POD_UID) or (sandbox.uid if sandbox else "")
        name = labels.get(CONTAINER_NAME) or container.metadata.name
        if namespace and pod and uid and name:  # not a Kubernetes container otherwise
            out[container.id] = ContainerRef(PodRef(namespace, pod, name), uid)
    return out


class RuntimeContainers:
    """The latest container id -> pod map; see the module docstring."""

    def __init__(
        self,
        socket: str,
        refresh_seconds: float,
        timeout_seconds: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.socket = resolve_socket(socket)
        self.refresh_seconds = refresh_seconds
        self.timeout_seconds = timeout_seconds
        self._monotonic = monotonic
        self._containers: Mapping[str, ContainerRef] = MappingProxyType({})
        self.up = False
        self.failures = 0  # refreshes that failed, since start
        self._state: str | None = None  # _OK or the last failure's kind: a change is logged
        self._refresh_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._asked_at = float("-inf")
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Refresh now (bounded by `timeout_seconds`), then on a daemon thread."""
        if self._thread is not None:
            return
        self._stopping.clear()
        self.refresh()
        self._thread = threading.Thread(target=self._run, name="cri-runtime", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=self.timeout_seconds + 1.0)

    def lookup(self, container_id: str) -> ContainerRef | None:
        """The container's pod, or None (asking the thread for an early refresh)."""
        found = self._containers.get(container_id)
        if found is None and self._thread is not None:
            now = self._monotonic()
            if now - self._asked_at >= MIN_REFRESH_GAP_SECONDS:
                self._asked_at = now
                self._wake.set()
        return found

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self.refresh_seconds)
            self._wake.clear()
            if not self._stopping.is_set():
                self.refresh()

    def refresh(self) -> bool:
        """One ListContainers and one ListPodSandbox; True when the map is the runtime's now.
        Never raises."""
        with self._refresh_lock:
            try:
                containers, sandboxes = self._list()
                mapped = map_containers(containers, sandboxes)
            except Exception as error:  # the thread must survive anything the socket says
                self._failed(error)
                return False
            self._containers = MappingProxyType(mapped)
            self.up = True
            if self._state != _OK:
                log.info(
                    "process attribution: the container runtime at %s answered (%d containers)",
                    self.socket,
                    len(mapped),
                )
            self._state = _OK
            return True

    def _list(self) -> tuple[Any, Any]:
        # Only where per-process attribution is on: the CRI's messages cost about 1 MiB.
        from gpu_exporter.collect.k8s.cri.v1 import api_pb2

        if not os.path.exists(self.socket):
            raise FileNotFoundError(self.socket)
        # A fresh connection per refresh, as for the kubelet: nothing of a runtime's restart
        # lingers. Both calls on it, each with the whole timeout.
        timeout = self.timeout_seconds
        with UnixChannel(os.path.abspath(self.socket), _MAX_ANSWER_BYTES) as channel:
            containers = channel.call(
                _SERVICE + "ListContainers",
                api_pb2.ListContainersRequest(),
                api_pb2.ListContainersResponse,
                timeout,
            )
            sandboxes = channel.call(
                _SERVICE + "ListPodSandbox",
                api_pb2.ListPodSandboxRequest(),
                api_pb2.ListPodSandboxResponse,
                timeout,
            )
        return containers.containers, sandboxes.items

    def _failed(self, error: Exception) -> None:
        self.up = False
        self.failures += 1
        kind, message = _explain(error)
        if kind != self._state:
            log.warning(
                "process attribution: the container runtime at %s failed (%s); containers "
                "already known keep their pods, new ones are unattributed until it answers",
                self.socket,
                message,
            )
        self._state = kind


def _explain(error: Exception) -> tuple[str, str]:
    """(state key, message) for a failed refresh; the key decides when to log again."""
    if isinstance(error, FileNotFoundError):
        return "missing", "socket missing"
    if not isinstance(error, RpcError):
        return type(error).__name__, f"unexpected error: {error!r}"
    code = error.code()
    if code is StatusCode.DEADLINE_EXCEEDED:
        return code.name, "no answer in time"
    if code is StatusCode.UNIMPLEMENTED:
        return code.name, "the socket does not serve the CRI runtime v1 API"
    return code.name, f"{code.name}: {error.details()}"

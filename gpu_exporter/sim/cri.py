"""A fake container runtime: a real gRPC server of the CRI's `runtime.v1.RuntimeService` on a
unix socket, as containerd serves it to the kubelet, for the containers of the scenario's pods.

It answers `ListContainers` and `ListPodSandbox` (and `Version`, which clients call to probe a
runtime); every other RPC answers UNIMPLEMENTED, as the generated base servicer does. It lists
every container of every pod a process names (`processes:`) and of the `pods:` section, with
the labels the kubelet puts on them (pkg/kubelet/types/labels.go: `io.kubernetes.pod.name`,
`io.kubernetes.pod.namespace`, `io.kubernetes.pod.uid`, `io.kubernetes.container.name`), under
the ids the fake /proc's cgroups name (`sim/processes.py` derives both). Filters are honoured
as containerd's CRI plugin does (container_list.go, sandbox_list.go): an id or sandbox id
may be a unique prefix, `state` and `label_selector` (every pair must match) are ANDed.

Over scenario time: a container runs from the first `from` to the last `until` of the
processes and pod entries that name it, then is listed as EXITED (its sandbox NOTREADY) for
`EXITED_KEPT_S` more seconds, as the kubelet leaves dead containers to its garbage collector
(the length is assumed), then is gone.

Faults, from the scenario (`cri_down`, `cri_hang`, `cri_garbage`) or from tests
(`set_mode`, `hang_seconds`): down (no socket: connect fails, ENOENT), hung (calls block for the
fault's duration or `hang_seconds`, released at once by `stop`), garbage (the socket speaks
HTTP/1.1, as the Docker API's socket does when given for containerd's), and a stale socket file
nobody listens on (`leave_stale_socket`, as a crashed runtime leaves). `sync(t)` switches the
socket to what scenario time t asks for; the node's thread calls it (`sim/node.py`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from concurrent import futures
from dataclasses import dataclass
from typing import Any, Literal

import grpc

from gpu_exporter.collect.k8s.cri.v1 import api_pb2, api_pb2_grpc
from gpu_exporter.sim.processes import container_id, pod_uid, sandbox_id
from gpu_exporter.sim.spec import Scenario

__all__ = ["EXITED_KEPT_S", "LABELS", "FakeCriRuntime", "Mode"]

# Dead containers (and their sandboxes) stay listed this long after their last process ends.
EXITED_KEPT_S = 60.0

# The kubelet's labels on a container (pkg/kubelet/types/labels.go), and on a sandbox the first
# three (with the pod's own labels, of which the scenario has none).
LABELS = (
    "io.kubernetes.pod.name",
    "io.kubernetes.pod.namespace",
    "io.kubernetes.pod.uid",
    "io.kubernetes.container.name",
)

Mode = Literal["serving", "down", "garbage"]

# What a Docker API socket answers a gRPC client (its HTTP/2 preface is no HTTP/1.1 request).
_NOT_GRPC = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\nContent-Length: 11\r\n\r\n400 Bad Req"
)


@dataclass(frozen=True)
class _Container:
    id: str
    sandbox: str
    namespace: str
    pod: str
    uid: str
    name: str
    start: float
    end: float  # inf: for the rest of the run

    def labels(self) -> dict[str, str]:
        values = (self.pod, self.namespace, self.uid, self.name)
        return dict(zip(LABELS, values, strict=True))


@dataclass(frozen=True)
class _Sandbox:
    id: str
    namespace: str
    pod: str
    uid: str
    start: float
    end: float

    def labels(self) -> dict[str, str]:
        return dict(zip(LABELS[:3], (self.pod, self.namespace, self.uid), strict=True))


def _phase(start: float, end: float, t: float) -> int | None:
    """0: running, 1: exited (kept), None: not listed."""
    if t < start:
        return None
    if t < end:
        return 0
    return 1 if t < end + EXITED_KEPT_S else None


def _containers(scenario: Scenario) -> tuple[list[_Container], list[_Sandbox]]:
    """Every container the scenario's processes and pods name, with its lifetime."""
    spans: dict[tuple[str, str], list[Any]] = {}  # (uid, name) -> [start, end, id, ns, pod]

    def extend(uid: str, name: str, cid: str, ns: str, pod: str, start: float, end: float) -> None:
        span = spans.setdefault((uid, name), [start, end, cid, ns, pod])
        span[0], span[1] = min(span[0], start), max(span[1], end)

    for proc in scenario.processes:
        if proc.pod is not None:
            p = proc.pod
            extend(p.uid, p.container, p.container_id, p.namespace, p.pod, proc.start, proc.end)
    for entry in scenario.pods:
        end = float("inf") if entry.until is None else entry.until
        # The sandbox of a process's pod that runs at the same time, else the derived UID.
        uid = next(
            (
                proc.pod.uid
                for proc in scenario.processes
                if proc.pod is not None
                and (proc.pod.namespace, proc.pod.pod) == (entry.namespace, entry.pod)
                and proc.start < end
                and entry.start < proc.end
            ),
            pod_uid(entry.namespace, entry.pod),
        )
        known = spans.get((uid, entry.container))
        cid = known[2] if known else container_id(uid, entry.container)
        extend(uid, entry.container, cid, entry.namespace, entry.pod, entry.start, end)
    containers = [
        _Container(cid, sandbox_id(uid), ns, pod, uid, name, start, end)
        for (uid, name), (start, end, cid, ns, pod) in spans.items()
    ]
    sandboxes: dict[str, _Sandbox] = {}
    for c in containers:
        known_box = sandboxes.get(c.uid)
        start = min(c.start, known_box.start) if known_box else c.start
        end = max(c.end, known_box.end) if known_box else c.end
        sandboxes[c.uid] = _Sandbox(c.sandbox, c.namespace, c.pod, c.uid, start, end)
    return containers, list(sandboxes.values())


def _resolve(wanted: str, ids: Iterable[str]) -> str:
    """containerd's short ids: a unique prefix stands for the whole id; else compared as is."""
    ids = list(ids)
    if wanted in ids:
        return wanted
    matches = [i for i in ids if i.startswith(wanted)]
    return matches[0] if len(matches) == 1 else wanted


def _selected(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


class _Service(api_pb2_grpc.RuntimeServiceServicer):
    def __init__(self, runtime: FakeCriRuntime) -> None:
        self.runtime = runtime

    def Version(self, request: Any, context: Any) -> Any:
        self.runtime.wait_if_hung("Version")
        return api_pb2.VersionResponse(
            version="0.1.0",
            runtime_name="containerd",
            runtime_version="v2.1.4",
            runtime_api_version="v1",
        )

    def ListContainers(self, request: Any, context: Any) -> Any:
        t = self.runtime.wait_if_hung("ListContainers")
        return api_pb2.ListContainersResponse(containers=self.runtime.list_containers(request, t))

    def ListPodSandbox(self, request: Any, context: Any) -> Any:
        t = self.runtime.wait_if_hung("ListPodSandbox")
        return api_pb2.ListPodSandboxResponse(items=self.runtime.list_sandboxes(request, t))


class _Garbage:
    """A unix socket that answers every connection with an HTTP/1.1 error and closes it."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        self._sock.listen(16)
        self._sock.settimeout(0.05)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="fake-cri-garbage", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(0.5)
                with contextlib.suppress(OSError):
                    conn.recv(4096)
                    conn.sendall(_NOT_GRPC)

    def close(self) -> None:
        self._stopped.set()
        self._thread.join(5)
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)


class FakeCriRuntime:
    """The runtime; `socket_path` is its endpoint (`unix://` + it, as crictl's)."""

    def __init__(self, scenario: Scenario, clock: Callable[[], float]) -> None:
        # Under /tmp with a short prefix: unix socket paths must fit in 107 bytes.
        self.directory = tempfile.mkdtemp(prefix="cri", dir="/tmp")
        self.socket_path = os.path.join(self.directory, "containerd.sock")
        self._scenario = scenario
        self._clock = clock
        self._epoch_ns = time.time_ns()  # created_at: this + scenario time
        self._containers, self._sandboxes = _containers(scenario)
        self.hang_seconds = 0.0  # tests: every call blocks this long (0: not at all)
        self.release = threading.Event()  # set to let blocked calls go (stop does)
        self.calls: Counter[str] = Counter()
        self._count_lock = threading.Lock()  # apart: a switch holds _lock while calls end
        self._lock = threading.Lock()
        self._forced: Mode | None = None
        self._mode: Mode | None = None  # None: not started (or stopped)
        self._server: grpc.Server | None = None
        self._garbage: _Garbage | None = None

    # -- what it lists -----------------------------------------------------------------------

    def list_containers(self, request: Any, t: float) -> list[Any]:
        wanted = request.filter if request.HasField("filter") else api_pb2.ContainerFilter()
        by_id = _resolve(wanted.id, (c.id for c in self._containers)) if wanted.id else ""
        box = wanted.pod_sandbox_id
        box = _resolve(box, (s.id for s in self._sandboxes)) if box else ""
        out = []
        for c in self._containers:
            phase = _phase(c.start, c.end, t)
            if phase is None:
                continue
            state = api_pb2.CONTAINER_RUNNING if phase == 0 else api_pb2.CONTAINER_EXITED
            if (
                (by_id and c.id != by_id)
                or (box and c.sandbox != box)
                or (wanted.HasField("state") and wanted.state.state != state)
                or not _selected(c.labels(), wanted.label_selector)
            ):
                continue
            image = f"sha256:{zlib.crc32(c.name.encode()):08x}" + "0" * 56
            out.append(
                api_pb2.Container(
                    id=c.id,
                    pod_sandbox_id=c.sandbox,
                    metadata=api_pb2.ContainerMetadata(name=c.name, attempt=0),
                    image=api_pb2.ImageSpec(image=image),
                    image_ref=image,
                    image_id=image,
                    state=state,
                    created_at=self._epoch_ns + int(c.start * 1e9),
                    labels=c.labels(),
                    annotations={
                        "io.kubernetes.container.hash": f"{zlib.crc32(c.id.encode()):08x}",
                        "io.kubernetes.container.restartCount": "0",
                        "io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
                        "io.kubernetes.container.terminationMessagePolicy": "File",
                        "io.kubernetes.pod.terminationGracePeriod": "30",
                    },
                )
            )
        return out

    def list_sandboxes(self, request: Any, t: float) -> list[Any]:
        wanted = request.filter if request.HasField("filter") else api_pb2.PodSandboxFilter()
        by_id = _resolve(wanted.id, (s.id for s in self._sandboxes)) if wanted.id else ""
        out = []
        for s in self._sandboxes:
            phase = _phase(s.start, s.end, t)
            if phase is None:
                continue
            state = api_pb2.SANDBOX_READY if phase == 0 else api_pb2.SANDBOX_NOTREADY
            if (
                (by_id and s.id != by_id)
                or (wanted.HasField("state") and wanted.state.state != state)
                or not _selected(s.labels(), wanted.label_selector)
            ):
                continue
            out.append(
                api_pb2.PodSandbox(
                    id=s.id,
                    metadata=api_pb2.PodSandboxMetadata(
                        name=s.pod, uid=s.uid, namespace=s.namespace, attempt=0
                    ),
                    state=state,
                    created_at=self._epoch_ns + int(s.start * 1e9),
                    labels=s.labels(),
                    annotations={"kubernetes.io/config.source": "api"},
                )
            )
        return out

    def wait_if_hung(self, rpc: str) -> float:
        """Count the call, block it while a hang holds, and return the scenario time it then
        answers for."""
        t = self._clock()
        with self._count_lock:
            self.calls[rpc] += 1
        hang = max(
            [self.hang_seconds]
            + [f.duration for f in self._scenario.faults if f.kind == "cri_hang" and f.active(t)]
        )
        if hang > 0:
            # Interruptible: stopping the server does not wait out the hang.
            self.release.wait(hang)
            t = self._clock()
        return t

    # -- the socket --------------------------------------------------------------------------

    @property
    def mode(self) -> Mode | None:
        """What the socket does now: serving, down, garbage (None: stopped)."""
        return self._mode

    def start(self) -> FakeCriRuntime:
        self.sync()
        return self

    def set_mode(self, mode: Mode | None) -> None:
        """Tests: serve, go down or speak garbage until told otherwise (None: the scenario's
        faults decide again)."""
        with self._lock:
            self._forced = mode
        self.sync()

    def sync(self, t: float | None = None) -> None:
        """Make the socket do what scenario time `t` (default: now) asks for."""
        t = self._clock() if t is None else t
        with self._lock:
            self._switch(self._forced or self._mode_at(t))

    def _mode_at(self, t: float) -> Mode:
        for fault in self._scenario.faults:
            if fault.kind == "cri_down" and fault.active(t):
                return "down"
        for fault in self._scenario.faults:
            if fault.kind == "cri_garbage" and fault.active(t):
                return "garbage"
        return "serving"

    def _switch(self, mode: Mode | None) -> None:
        if mode == self._mode:
            return
        self._close_socket()
        if mode == "serving":
            self.release.clear()
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
            api_pb2_grpc.add_RuntimeServiceServicer_to_server(_Service(self), server)
            if not server.add_insecure_port("unix://" + self.socket_path):
                raise RuntimeError(f"could not bind {self.socket_path}")
            server.start()
            self._server = server
        elif mode == "garbage":
            self._garbage = _Garbage(self.socket_path)
        self._mode = mode

    def _close_socket(self) -> None:
        self.release.set()  # hung calls answer now
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None  # gRPC unlinks the socket file on stop
        if self._garbage is not None:
            self._garbage.close()
            self._garbage = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    def leave_stale_socket(self) -> None:
        """Tests: stop, and leave a socket file nobody listens on (connect is refused)."""
        self.set_mode("down")
        with socket.socket(socket.AF_UNIX) as stale:
            stale.bind(self.socket_path)

    def stop(self) -> None:
        with self._lock:
            self._close_socket()
            self._mode = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

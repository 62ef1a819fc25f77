"""The daemon's gRPC client (gpu_exporter/collect/k8s/rpc.py) against real gRPC servers (grpcio)
on unix sockets: answers, the statuses gRPC's own client would report for each failure, the
deadline and the receive limit; and the daemon's attribution reading a kubelet and a container
runtime served from another process without loading grpcio."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import pytest

from gpu_exporter.collect.k8s.attribution import map_devices
from gpu_exporter.collect.k8s.cri.v1 import api_pb2 as cri_pb2
from gpu_exporter.collect.k8s.podresources.v1 import api_pb2
from gpu_exporter.collect.k8s.rpc import (
    DEFAULT_MAX_RECEIVE_BYTES,
    RpcError,
    StatusCode,
    UnixChannel,
    encode_timeout,
)
from gpu_exporter.collect.k8s.runtime import map_containers
from gpu_exporter.collect.settings import KubernetesConfig
from gpu_exporter.sim.cri import FakeCriRuntime
from gpu_exporter.sim.kubelet import scenario_pods, start_for
from gpu_exporter.sim.scenario import load_scenario

REPO = Path(__file__).resolve().parent.parent
LIST = "/v1.PodResourcesLister/List"
Request = api_pb2.ListPodResourcesRequest
Answer = api_pb2.ListPodResourcesResponse
Handler = Callable[[Any, grpc.ServicerContext], Any]


def answer_of(pods: int, name_bytes: int = 8) -> Any:
    return Answer(
        pod_resources=[
            api_pb2.PodResources(name="p" * name_bytes, namespace=f"ns{i}") for i in range(pods)
        ]
    )


def answer_sized(size: int) -> Any:
    """An answer whose serialized form is exactly `size` bytes (one pod, its name padded)."""
    answer = answer_of(1, 1)
    answer.pod_resources[0].name = "p" * (size - answer.ByteSize() + 1)
    while answer.ByteSize() > size:  # the name's length varint grew a byte
        answer.pod_resources[0].name = answer.pod_resources[0].name[:-1]
    assert answer.ByteSize() == size
    return answer


class Server:
    """A grpcio server on a unix socket in a fresh directory, answering `List` with `handler`
    (set per test); released hangs end at teardown, so nothing outlives the test."""

    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="rpc", dir="/tmp")  # paths fit 107 bytes
        self.path = os.path.join(self.directory, "api.sock")
        self.handler: Handler = lambda request, context: answer_of(1)
        self.release = threading.Event()
        self.seen_remaining: list[float | None] = []
        self._server: grpc.Server | None = None

    def start(self, serve_list: bool = True) -> Server:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        if serve_list:

            def list_pods(request: Any, context: grpc.ServicerContext) -> Any:
                self.seen_remaining.append(context.time_remaining())
                return self.handler(request, context)

            handler = grpc.unary_unary_rpc_method_handler(
                list_pods,
                request_deserializer=Request.FromString,
                response_serializer=Answer.SerializeToString,
            )
            service = grpc.method_handlers_generic_handler(
                "v1.PodResourcesLister", {"List": handler}
            )
            server.add_generic_rpc_handlers((service,))
        # grpcio's default send limit is unlimited; its receive limit is what we test ours against.
        assert server.add_insecure_port("unix://" + self.path)
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        self.release.set()
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture
def server() -> Iterator[Server]:
    running = Server().start()
    yield running
    running.close()


def call(path: str, timeout: float = 2.0, limit: int = DEFAULT_MAX_RECEIVE_BYTES) -> Any:
    with UnixChannel(path, limit) as channel:
        return channel.call(LIST, Request(), Answer, timeout)


def failure(path: str, timeout: float = 2.0, limit: int = DEFAULT_MAX_RECEIVE_BYTES) -> RpcError:
    with pytest.raises(RpcError) as failed:
        call(path, timeout, limit)
    return failed.value


# --- answers ----------------------------------------------------------------------------------


def test_an_answer_arrives_whole(server: Server) -> None:
    server.handler = lambda request, context: answer_of(3)
    assert call(server.path) == answer_of(3)


def test_an_answer_larger_than_the_flow_control_windows_arrives_whole(server: Server) -> None:
    big = answer_of(20_000, 40)  # about 1 MiB: the server waits for window updates
    assert big.ByteSize() > 1_000_000
    server.handler = lambda request, context: big
    assert call(server.path, limit=2 * 1024 * 1024) == big


def test_the_deadline_goes_to_the_server_as_grpc_timeout(server: Server) -> None:
    call(server.path, timeout=3.0)
    remaining = server.seen_remaining[-1]
    assert remaining is not None and 2.0 < remaining <= 3.0


def test_several_calls_share_one_channel_and_a_server_status_leaves_it_usable(
    server: Server,
) -> None:
    outcomes = iter([None, "not found", None])

    def handler(request: Any, context: grpc.ServicerContext) -> Any:
        if next(outcomes) is not None:
            context.abort(grpc.StatusCode.NOT_FOUND, "pod gone")
        return answer_of(2)

    server.handler = handler
    with UnixChannel(server.path) as channel:
        assert channel.call(LIST, Request(), Answer, 2.0) == answer_of(2)
        with pytest.raises(RpcError) as failed:
            channel.call(LIST, Request(), Answer, 2.0)
        assert failed.value.code() is StatusCode.NOT_FOUND
        assert channel.call(LIST, Request(), Answer, 2.0) == answer_of(2)


def test_an_empty_answer_is_an_answer(server: Server) -> None:
    server.handler = lambda request, context: Answer()
    assert call(server.path) == Answer()


# --- the statuses of failures -----------------------------------------------------------------


def test_the_servers_status_and_message_come_through_percent_decoded(server: Server) -> None:
    message = "pod é/100% not found\ttab"

    def handler(request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, message)

    server.handler = handler
    error = failure(server.path)
    assert error.code() is StatusCode.FAILED_PRECONDITION
    assert error.details() == message


def test_a_server_without_the_method_is_unimplemented() -> None:
    old = Server().start(serve_list=False)  # a kubelet older than the v1 API
    try:
        assert failure(old.path).code() is StatusCode.UNIMPLEMENTED
    finally:
        old.close()


def test_a_socket_nobody_listens_on_is_unavailable(server: Server) -> None:
    server.stop()  # grpcio unlinks its socket: connecting finds no file
    absent = failure(server.path)
    assert absent.code() is StatusCode.UNAVAILABLE and "No such file" in absent.details()
    with socket.socket(socket.AF_UNIX) as stale:  # a crashed server's socket file
        stale.bind(server.path)
        refused = failure(server.path)
    assert refused.code() is StatusCode.UNAVAILABLE and "refused" in refused.details()


def test_a_hung_server_is_cut_off_at_the_deadline(server: Server) -> None:
    server.handler = lambda request, context: server.release.wait(10) and answer_of(1)
    started = time.monotonic()
    error = failure(server.path, timeout=0.3)
    elapsed = time.monotonic() - started
    assert error.code() is StatusCode.DEADLINE_EXCEEDED
    assert 0.25 <= elapsed < 1.0


def test_an_answer_over_the_limit_is_resource_exhausted_and_one_at_it_arrives(
    server: Server,
) -> None:
    limit = 100_000
    server.handler = lambda request, context: answer_sized(limit)
    assert call(server.path, limit=limit).ByteSize() == limit
    server.handler = lambda request, context: answer_sized(limit + 1)
    error = failure(server.path, limit=limit)
    assert error.code() is StatusCode.RESOURCE_EXHAUSTED
    assert f"({limit + 1} vs. {limit})" in error.details()


def test_the_default_limit_is_grpcs_4_mib(server: Server) -> None:
    server.handler = lambda request, context: answer_sized(4 * 1024 * 1024 + 1)
    assert failure(server.path).code() is StatusCode.RESOURCE_EXHAUSTED


@contextlib.contextmanager
def raw_server(answer: Callable[[socket.socket], None]) -> Iterator[str]:
    """A unix socket that hands each connection to `answer`, then closes it."""
    directory = tempfile.mkdtemp(prefix="rpc", dir="/tmp")
    path = os.path.join(directory, "raw.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(4)
    listener.settimeout(0.05)
    stopped = threading.Event()

    def serve() -> None:
        while not stopped.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2.0)
                with contextlib.suppress(OSError):
                    answer(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        stopped.set()
        thread.join(5)
        listener.close()
        shutil.rmtree(directory, ignore_errors=True)


def test_a_socket_answering_http1_is_unavailable() -> None:
    def http1(conn: socket.socket) -> None:  # as a Docker API socket answers a gRPC client
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")

    with raw_server(http1) as path:
        error = failure(path)
    assert error.code() is StatusCode.UNAVAILABLE
    assert "HTTP/1.1 400 Bad Request" in error.details()


def http2_server(reply: Callable[[h2.connection.H2Connection, int], None]) -> Any:
    """`raw_server`'s handler for an HTTP/2 server that is not gRPC: `reply` answers the first
    request's stream."""

    def answer(conn: socket.socket) -> None:
        server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        server.initiate_connection()
        conn.sendall(server.data_to_send())
        while data := conn.recv(65536):
            for event in server.receive_data(data):
                if isinstance(event, h2.events.RequestReceived) and event.stream_id:
                    reply(server, event.stream_id)
            conn.sendall(server.data_to_send())

    return answer


@pytest.mark.parametrize(
    ("http_status", "code"),
    [(503, StatusCode.UNAVAILABLE), (404, StatusCode.UNIMPLEMENTED), (500, StatusCode.UNKNOWN)],
)
def test_an_http2_answer_without_grpc_status_maps_its_http_status(
    http_status: int, code: StatusCode
) -> None:
    def reply(server: h2.connection.H2Connection, stream: int) -> None:
        headers = [(":status", str(http_status)), ("content-type", "text/plain")]
        server.send_headers(stream, headers, end_stream=True)

    with raw_server(http2_server(reply)) as path:
        error = failure(path)
    assert error.code() is code
    assert f"HTTP status {http_status}" in error.details()


def test_a_stream_the_server_refuses_is_unavailable() -> None:
    def reply(server: h2.connection.H2Connection, stream: int) -> None:
        server.reset_stream(stream, h2.errors.ErrorCodes.REFUSED_STREAM)

    with raw_server(http2_server(reply)) as path:
        assert failure(path).code() is StatusCode.UNAVAILABLE


def test_a_socket_that_hangs_up_is_unavailable() -> None:
    with raw_server(lambda conn: None) as path:
        assert failure(path).code() is StatusCode.UNAVAILABLE


def test_a_socket_that_accepts_and_never_answers_is_cut_off_at_the_deadline() -> None:
    with raw_server(lambda conn: conn.recv(4096) and time.sleep(0.6)) as path:
        started = time.monotonic()
        assert failure(path, timeout=0.3).code() is StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 0.9


def test_grpc_timeout_is_whole_milliseconds_up_to_eight_digits() -> None:
    assert encode_timeout(2.0) == "2000m"
    assert encode_timeout(0.0001) == "1m"
    assert encode_timeout(50_000.0) == "50000000m"
    assert encode_timeout(100_000.5) == "100001S"  # 9 digits of milliseconds: seconds


# --- the daemon's attribution, without grpcio -------------------------------------------------

_ATTRIBUTION = """
import json, sys
from gpu_exporter.collect.k8s.attribution import PodAttribution
from gpu_exporter.collect.k8s.runtime import RuntimeContainers
from gpu_exporter.collect.settings import KubernetesConfig
pods = PodAttribution(KubernetesConfig(enabled=True, socket_path=sys.argv[1], timeout_seconds=5))
runtime = RuntimeContainers(sys.argv[2], refresh_seconds=60, timeout_seconds=5)
pods.start()
runtime.start()
pods.stop()
runtime.stop()
print(json.dumps({
    "devices": {d: [repr(p) for p in held] for d, held in pods.pods_by_device().items()},
    "containers": sorted(c for c in runtime._containers),
    "grpc": sorted(m for m in sys.modules if m == "grpc" or m.startswith(("grpc.", "_grpc"))),
}))
"""


def test_attribution_reads_a_kubelet_and_a_runtime_without_loading_grpcio() -> None:
    """What a production daemon loads: the kubelet and the runtime run in this process (on
    grpcio), the attribution in a fresh interpreter, as the daemon runs it."""
    scenario = load_scenario("shared")
    kubelet = start_for(scenario, lambda: 60.0)
    assert kubelet is not None
    runtime = FakeCriRuntime(scenario, lambda: 60.0).start()
    try:
        done = subprocess.run(
            [sys.executable, "-c", _ATTRIBUTION, kubelet.socket_path, runtime.socket_path],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    finally:
        kubelet.close()
        runtime.close()
    assert done.returncode == 0, done.stderr
    read = json.loads(done.stdout.strip().splitlines()[-1])
    devices = map_devices(scenario_pods(scenario, 60.0), KubernetesConfig())
    assert len(devices) >= 4
    assert read["devices"] == {d: [repr(p) for p in held] for d, held in devices.items()}
    containers = map_containers(
        runtime.list_containers(cri_pb2.ListContainersRequest(), 60.0),
        runtime.list_sandboxes(cri_pb2.ListPodSandboxRequest(), 60.0),
    )
    assert len(containers) >= 4
    assert read["containers"] == sorted(containers)
    assert read["grpc"] == []

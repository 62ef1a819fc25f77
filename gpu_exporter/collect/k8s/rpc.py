"""Unary gRPC calls over a unix socket, synchronous, on h2 (HTTP/2 framing, HPACK, flow control).

The daemon's gRPC is one request and one answer at a time, from a refresh thread, to the kubelet
(PodResources) and to the container runtime (CRI). gRPC over HTTP/2 (grpc/grpc
doc/PROTOCOL-HTTP2.md): a POST to `/<package>.<Service>/<Method>` with `content-type:
application/grpc`, `te: trailers` and the deadline as `grpc-timeout`; each message framed as a
one-byte compressed flag and a four-byte big-endian length; the outcome in the `grpc-status` and
percent-encoded `grpc-message` trailers, or in the response headers themselves when there is no
message ("Trailers-Only"). The HTTP/2 protocol itself is the h2 library's; this module adds only
that framing, the deadline and the receive limit.

A failure raises `RpcError` with the status gRPC's own client reports for it (grpc/grpc
doc/statuscodes.md): a socket that refuses, closes, or speaks something other than HTTP/2 is
UNAVAILABLE (as a Docker API socket does, answering HTTP/1.1 400); no answer by the deadline is
DEADLINE_EXCEEDED; an answer longer than the receive limit is RESOURCE_EXHAUSTED, known from its
length prefix before it is read; a status the server sends (UNIMPLEMENTED from a kubelet without
the method) is passed on with its message.
"""

from __future__ import annotations

import contextlib
import enum
import math
import socket
import struct
import time
from typing import TypeVar
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.events
import h2.exceptions
from google.protobuf.message import DecodeError, Message

__all__ = ["DEFAULT_MAX_RECEIVE_BYTES", "RpcError", "StatusCode", "UnixChannel"]

Answer = TypeVar("Answer", bound=Message)

# gRPC's default limit on a received message (grpc/grpc include/grpc/impl/channel_arg_names.h,
# GRPC_DEFAULT_MAX_RECV_MESSAGE_LENGTH).
DEFAULT_MAX_RECEIVE_BYTES = 4 * 1024 * 1024
_PREFIX = struct.Struct(">?I")  # compressed flag, message length
_SETTINGS_FRAME = 0x4  # RFC 9113 section 3.4: the server's preface is a SETTINGS frame
_FRAME_TYPE_AT = 3  # a frame header: 24-bit length, then the type (RFC 9113 section 4.1)
_PREFACE_KEPT = 64  # enough of an HTTP/1 answer to name its status line
_READ_BYTES = 65536
_TIMEOUT_DIGITS = 99_999_999  # grpc-timeout: at most 8 digits (PROTOCOL-HTTP2.md)


class StatusCode(enum.IntEnum):
    """gRPC status codes (grpc/grpc doc/statuscodes.md); names as grpcio's StatusCode."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


# An answer without grpc-status: its HTTP status says what went wrong (grpc/grpc
# doc/http-grpc-status-mapping.md); any other is UNKNOWN.
_HTTP_STATUS = {
    400: StatusCode.INTERNAL,
    401: StatusCode.UNAUTHENTICATED,
    403: StatusCode.PERMISSION_DENIED,
    404: StatusCode.UNIMPLEMENTED,
    429: StatusCode.UNAVAILABLE,
    502: StatusCode.UNAVAILABLE,
    503: StatusCode.UNAVAILABLE,
    504: StatusCode.UNAVAILABLE,
}

# A stream reset by the server, by its HTTP/2 error code (PROTOCOL-HTTP2.md, "Errors"); others
# are INTERNAL.
_RESET = {
    0x7: StatusCode.UNAVAILABLE,  # REFUSED_STREAM: not processed, safe to retry
    0x8: StatusCode.CANCELLED,  # CANCEL
    0xB: StatusCode.RESOURCE_EXHAUSTED,  # ENHANCE_YOUR_CALM
    0xC: StatusCode.PERMISSION_DENIED,  # INADEQUATE_SECURITY
}


class RpcError(Exception):
    """A call that did not return its answer; `code()` and `details()` as on grpcio's errors."""

    def __init__(self, code: StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def encode_timeout(seconds: float) -> str:
    """`grpc-timeout`: whole milliseconds rounded up, or seconds past 8 digits of them."""
    millis = max(1, math.ceil(seconds * 1000))
    if millis <= _TIMEOUT_DIGITS:
        return f"{millis}m"
    return f"{min(math.ceil(seconds), _TIMEOUT_DIGITS)}S"


class UnixChannel:
    """One HTTP/2 connection to a unix socket for sequential unary calls, opened by the first
    call (within its deadline) and closed by `close()` or the `with` block's end. A call that
    fails on the connection itself closes it; the next one connects again."""

    def __init__(self, path: str, max_receive_bytes: int = DEFAULT_MAX_RECEIVE_BYTES) -> None:
        self.path = path
        self.max_receive_bytes = max_receive_bytes
        self._sock: socket.socket | None = None
        self._h2: h2.connection.H2Connection | None = None
        self._preface: bytes | None = b""  # the server's first bytes until the first frame's type

    def __enter__(self) -> UnixChannel:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        sock, conn, self._sock, self._h2 = self._sock, self._h2, None, None
        if sock is None:
            return
        with contextlib.suppress(OSError, h2.exceptions.ProtocolError):
            if conn is not None:
                conn.close_connection()  # GOAWAY: the server forgets the connection at once
                sock.setblocking(False)  # best effort: never wait on a server to read it
                sock.sendall(conn.data_to_send())
        sock.close()

    def call(
        self, method: str, request: Message, answer_type: type[Answer], timeout: float
    ) -> Answer:
        """`method` ("/package.Service/Method") with `request`; its answer, or RpcError."""
        deadline = time.monotonic() + timeout
        try:
            return self._call(method, request, answer_type, timeout, deadline)
        except _ServerStatus:
            raise  # the server's answer: the connection is fine
        except RpcError:
            self.close()  # mid-answer: the connection is in an unknown state
            raise
        except TimeoutError:
            self.close()
            raise RpcError(StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        except h2.exceptions.ProtocolError as error:
            self.close()
            raise RpcError(StatusCode.UNAVAILABLE, f"HTTP/2 protocol error: {error}") from None
        except OSError as error:
            self.close()
            reason = error.strerror or str(error)
            raise RpcError(StatusCode.UNAVAILABLE, f"unix:{self.path}: {reason}") from None

    def _call(
        self,
        method: str,
        request: Message,
        answer_type: type[Answer],
        timeout: float,
        deadline: float,
    ) -> Answer:
        sock, conn = self._connection(deadline)
        stream = conn.get_next_available_stream_id()
        payload = request.SerializeToString()
        conn.send_headers(
            stream,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", method),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                ("grpc-timeout", encode_timeout(timeout)),
                ("user-agent", "gpu-exporter"),
            ],
        )
        answer = _Answer(stream, self.max_receive_bytes)
        unsent = _PREFIX.pack(False, len(payload)) + payload
        while not answer.ended:
            unsent = self._send_some(conn, stream, unsent)
            _send(sock, conn.data_to_send(), deadline)
            for event in conn.receive_data(self._receive(sock, deadline)):
                answer.handle(conn, event)
        return answer.result(answer_type)

    def _connection(self, deadline: float) -> tuple[socket.socket, h2.connection.H2Connection]:
        if self._sock is not None and self._h2 is not None:
            return self._sock, self._h2
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(_remaining(deadline))
            sock.connect(self.path)
        except BaseException:
            sock.close()
            raise
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        conn.initiate_connection()
        self._sock, self._h2, self._preface = sock, conn, b""
        return sock, conn

    @staticmethod
    def _send_some(conn: h2.connection.H2Connection, stream: int, unsent: bytes) -> bytes:
        """Queue as much of the request as the server's flow-control window takes."""
        while unsent:
            size = min(len(unsent), conn.local_flow_control_window(stream))
            size = min(size, conn.max_outbound_frame_size)
            if size <= 0:
                break  # the rest goes when the server opens its window
            conn.send_data(stream, unsent[:size], end_stream=size == len(unsent))
            unsent = unsent[size:]
        return unsent

    def _receive(self, sock: socket.socket, deadline: float) -> bytes:
        sock.settimeout(_remaining(deadline))
        data = sock.recv(_READ_BYTES)
        if not data:
            raise RpcError(StatusCode.UNAVAILABLE, "the server closed the connection")
        if self._preface is not None:
            # h2 would wait for the rest of a "frame" as long as an HTTP/1 status line spells;
            # the type byte of the first frame already tells.
            self._preface += data[: _PREFACE_KEPT - len(self._preface)]
            if len(self._preface) > _FRAME_TYPE_AT:
                if self._preface[_FRAME_TYPE_AT] != _SETTINGS_FRAME:
                    said = ""
                    if self._preface.startswith(b"HTTP/"):
                        line = self._preface.split(b"\r\n", 1)[0].decode("ascii", "replace")
                        said = f": it answers HTTP/1 ({line})"
                    raise RpcError(StatusCode.UNAVAILABLE, f"not an HTTP/2 server{said}")
                self._preface = None
        return data


class _ServerStatus(RpcError):
    """A status the server sent: the connection itself is fine."""


class _Answer:
    """What the server has said on one stream so far."""

    def __init__(self, stream: int, max_receive_bytes: int) -> None:
        self.stream = stream
        self.max_receive_bytes = max_receive_bytes
        self.ended = False
        self.http_status = 0
        self.content_type = b""
        self.grpc_status: bytes | None = None
        self.grpc_message = b""
        self.body = bytearray()

    def handle(self, conn: h2.connection.H2Connection, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ConnectionTerminated):
            if not self.ended:
                raise RpcError(
                    StatusCode.UNAVAILABLE,
                    f"the server ended the connection (HTTP/2 GOAWAY, error {event.error_code})",
                )
            return
        if isinstance(event, h2.events.DataReceived) and event.stream_id is not None:
            # Any stream's data counts against the connection's window: keep it open.
            conn.acknowledge_received_data(event.flow_controlled_length or 0, event.stream_id)
        if getattr(event, "stream_id", self.stream) != self.stream:
            return
        if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
            self._headers(event.headers or [])
        elif isinstance(event, h2.events.DataReceived):
            self._data(event.data or b"")
        elif isinstance(event, h2.events.StreamEnded):
            self.ended = True
        elif isinstance(event, h2.events.StreamReset):
            code = _RESET.get(int(event.error_code or 0), StatusCode.INTERNAL)
            raise RpcError(code, f"the server reset the stream (HTTP/2 error {event.error_code})")

    def _headers(self, headers: list[tuple[bytes, bytes]]) -> None:
        for name, value in headers:
            if name == b":status":
                self.http_status = int(value)
            elif name == b"content-type":
                self.content_type = value
            elif name == b"grpc-status":
                self.grpc_status = value
            elif name == b"grpc-message":
                self.grpc_message = value

    def _data(self, data: bytes) -> None:
        self.body += data
        if len(self.body) < _PREFIX.size:
            return
        _, length = _PREFIX.unpack_from(self.body)
        if length > self.max_receive_bytes:
            raise RpcError(
                StatusCode.RESOURCE_EXHAUSTED,
                f"Received message larger than max ({length} vs. {self.max_receive_bytes})",
            )
        if len(self.body) > _PREFIX.size + length:
            raise RpcError(StatusCode.INTERNAL, "more than one message answered a unary call")

    def result(self, answer_type: type[Answer]) -> Answer:
        if self.grpc_status is None:
            if self.http_status != 200:
                code = _HTTP_STATUS.get(self.http_status, StatusCode.UNKNOWN)
                raise RpcError(code, f"HTTP status {self.http_status}, not a gRPC answer")
            raise RpcError(StatusCode.UNKNOWN, "the answer ended without grpc-status")
        try:
            code = StatusCode(int(self.grpc_status))
        except ValueError:
            code = StatusCode.UNKNOWN
        if code is not StatusCode.OK:
            message = unquote(self.grpc_message.decode("ascii", "replace"), errors="replace")
            raise _ServerStatus(code, message)
        if not self.content_type.startswith(b"application/grpc"):
            raise RpcError(StatusCode.UNKNOWN, f"content-type {self.content_type!r}, not gRPC")
        if len(self.body) < _PREFIX.size:
            raise RpcError(StatusCode.INTERNAL, "no message answered a unary call")
        compressed, length = _PREFIX.unpack_from(self.body)
        if len(self.body) != _PREFIX.size + length:
            raise RpcError(StatusCode.INTERNAL, "the answer's message was cut short")
        if compressed:  # never asked for: no grpc-accept-encoding was sent
            raise RpcError(StatusCode.INTERNAL, "a compressed answer to an uncompressed call")
        answer = answer_type()
        try:
            answer.ParseFromString(bytes(memoryview(self.body)[_PREFIX.size :]))
        except DecodeError as error:
            raise RpcError(StatusCode.INTERNAL, f"the answer does not parse: {error}") from None
        return answer


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _send(sock: socket.socket, data: bytes, deadline: float) -> None:
    if data:
        sock.settimeout(_remaining(deadline))
        sock.sendall(data)

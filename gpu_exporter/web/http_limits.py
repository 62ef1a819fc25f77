"""Connection limits for uvicorn's h11 protocol, and logging that a flood cannot blow up.

uvicorn has no header-read timer: a client that sends half a request header (slowloris) keeps
its connection, and a file descriptor, for ever; and its `limit_concurrency` answers 503 to
everyone once attackers hold the slots, probes included. Here:

- header-read timeout: a connection must have sent a whole request (header, and body if any:
  no endpoint takes one) within `header_read_timeout` of connecting, or of the first byte of
  its next request; otherwise it is closed (Go's http.Server ReadHeaderTimeout);
- idle timeout: uvicorn's keep-alive timer, `idle_timeout` after a response;
- a cap on open connections; a new one past it first closes the oldest connection that has no
  request in flight (one still sending its request first, then an idle kept-alive one), so a
  kubelet probe or a scrape gets through a slowloris; only when every connection has a request
  in flight is the new one refused;
- a connection closed for the cap with a request coming (the one still sending it, the new one
  refused) is answered 503 with `Retry-After` and closed once the client has read the answer
  (`_answer_and_close`); an idle one is closed, as keep-alive connections are;
- a request head over 16 KiB is answered 414 or 431 (gpu_exporter/web/request_head.py) and
  closed the same way;
- the cap stays below the open-file limit (RLIMIT_NOFILE less `FD_RESERVE`), and asyncio
  accepts at most `ACCEPT_BATCH` connections before their protocols run, so a flood meets the
  cap, not EMFILE (at EMFILE asyncio stops accepting for a second: probes would wait); the
  connections answered and closing are bounded by `closing_cap`;
- `RateLimitFilter`: one line per kind of message per `LOG_INTERVAL_SECONDS`, with a count of
  the ones left out, on uvicorn's and asyncio's loggers and ours.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from gpu_exporter.support.ratelimit import RateLimit
from gpu_exporter.web.request_head import (
    HEAD_LIMIT,
    HEADER_FIELDS_TOO_LARGE,
    URI_TOO_LONG,
    RequestHead,
)

log = logging.getLogger("gpu_exporter.http")

# Descriptors kept for everything but HTTP clients (NVML's device files, the log, the rule and
# web-config files, Alertmanager and kubelet sockets: about 15), for the connections accepted
# but not yet handed to their protocols (asyncio takes a few loop turns, ACCEPT_BATCH a turn),
# and for ACCEPT_BATCH connections closing for the cap when the limit leaves no other room.
FD_RESERVE = 80
# asyncio accepts up to this many connections in one go before their protocols run (it is the
# `backlog` given to create_server); the kernel's listen queue is LISTEN_BACKLOG (uvicorn's).
ACCEPT_BATCH = 16
LISTEN_BACKLOG = 2048
LOG_INTERVAL_SECONDS = 60.0
# A connection answered and closing: the time its client has to send its request and read the
# answer, and how many such connections there may be at once (fewer near the open-file limit).
LINGER_SECONDS = 2.0
MAX_CLOSING = 1024
RETRY_AFTER_SECONDS = 1
# The loggers a flood of bad clients writes to: uvicorn's protocol errors ("Invalid HTTP
# request received."), asyncio's accept and TLS handshake errors, and ours.
FLOOD_LOGGERS = ("uvicorn.error", "asyncio", log.name)


def _answer(status: int, reason: str, text: str, *headers: str) -> bytes:
    body = text.encode() + b"\n"
    head = [
        f"HTTP/1.1 {status} {reason}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
        *headers,
        "Connection: close",
    ]
    return "\r\n".join(head).encode() + b"\r\n\r\n" + body


_TOO_MANY_CONNECTIONS = _answer(
    503, "Service Unavailable", "too many connections", f"Retry-After: {RETRY_AFTER_SECONDS}"
)
_HEAD_TOO_LARGE = {
    URI_TOO_LONG: _answer(414, "URI Too Long", f"request line over {HEAD_LIMIT} bytes"),
    HEADER_FIELDS_TOO_LARGE: _answer(
        431, "Request Header Fields Too Large", f"request header over {HEAD_LIMIT} bytes"
    ),
}
# h11's states of the client while its request is still coming in.
_READING = (h11.IDLE, h11.SEND_BODY)


@dataclass(frozen=True)
class Limits:
    header_read_timeout: float
    idle_timeout: float
    max_connections: int
    max_closing: int = ACCEPT_BATCH  # answered connections waiting for their client to close


def connection_cap(configured: int, open_file_limit: int | None = None) -> int:
    """`configured`, lowered to leave `FD_RESERVE` descriptors under RLIMIT_NOFILE."""
    if open_file_limit is None:
        open_file_limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if open_file_limit == resource.RLIM_INFINITY:
        return configured
    return max(1, min(configured, open_file_limit - FD_RESERVE))


def closing_cap(cap: int, open_file_limit: int | None = None) -> int:
    """How many connections answered for the cap may wait for their clients to close: the
    descriptors left over `cap` and `FD_RESERVE`, at least `ACCEPT_BATCH` (which the reserve
    holds), at most `MAX_CLOSING`."""
    if open_file_limit is None:
        open_file_limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if open_file_limit == resource.RLIM_INFINITY:
        return MAX_CLOSING
    return max(ACCEPT_BATCH, min(MAX_CLOSING, open_file_limit - FD_RESERVE - cap))


class Connections:
    """The open HTTP connections, which of them may be closed to make room, and those answered
    and closing."""

    def __init__(self, limits: Limits, accept_peer: Callable[[Any], bool] | None = None) -> None:
        self.limits = limits
        # Called with each new transport (after the TLS handshake); False closes it.
        self.accept_peer = accept_peer
        self.open: set[LimitedH11Protocol] = set()
        # No request in flight, oldest first: still reading a request, or idle between two.
        self.reading: OrderedDict[LimitedH11Protocol, None] = OrderedDict()
        self.idle: OrderedDict[LimitedH11Protocol, None] = OrderedDict()
        # Answered (503, 414, 431), waiting for the client to close, oldest first; not open.
        self.closing: OrderedDict[LimitedH11Protocol, None] = OrderedDict()

    def admit(self, connection: LimitedH11Protocol) -> bool:
        if len(self.open) >= self.limits.max_connections:
            victim, reading = self._oldest_waiting()
            if victim is None:
                log.warning(
                    "%d connections open, each with a request in flight: new ones get 503",
                    self.limits.max_connections,
                )
                return False
            log.warning(
                "%d connections open: closing the oldest without a request in flight",
                self.limits.max_connections,
            )
            victim.close_for_cap(reading)
        self.open.add(connection)
        return True

    def _oldest_waiting(self) -> tuple[LimitedH11Protocol | None, bool]:
        """The oldest connection still reading its request, else the oldest idle one; and
        whether it is reading."""
        if self.reading:
            return next(iter(self.reading)), True
        if self.idle:
            return next(iter(self.idle)), False
        return None, False

    def mark(self, connection: LimitedH11Protocol, state: str) -> None:
        """`state`: "reading", "idle" or "busy" (a request in flight)."""
        self.reading.pop(connection, None)
        self.idle.pop(connection, None)
        if state == "reading":
            self.reading[connection] = None
        elif state == "idle":
            self.idle[connection] = None

    def start_closing(self, connection: LimitedH11Protocol) -> None:
        """`connection` is answered: it no longer counts as open; past `max_closing` such
        connections, the oldest (whose client has had longest to read its answer) is reset."""
        self.open.discard(connection)
        self.mark(connection, "busy")
        self.closing[connection] = None
        while len(self.closing) > self.limits.max_closing:
            oldest, _ = self.closing.popitem(last=False)
            oldest.reset()

    def forget(self, connection: LimitedH11Protocol) -> None:
        self.open.discard(connection)
        self.mark(connection, "busy")
        self.closing.pop(connection, None)


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header-read timer, a bounded request head and a place in
    `Connections`."""

    connections_registry: ClassVar[Connections]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_timer: asyncio.TimerHandle | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._admitted = False  # uvicorn's connection_made ran: its state is to be cleaned up
        self._closing = False  # answered: what the client sends now is read and dropped
        self._head = RequestHead()
        registry = self.connections_registry
        if registry.accept_peer is not None and not registry.accept_peer(transport):
            transport.abort()
            return
        if not registry.admit(self):
            self.transport = transport
            self._answer_and_close(_TOO_MANY_CONNECTIONS)
            return
        self._admitted = True
        super().connection_made(transport)
        self._start_reading()

    def data_received(self, data: bytes) -> None:
        if self._closing or not self._admitted:
            return
        if self._header_timer is None and self.conn.their_state is h11.IDLE:
            self._start_reading()  # the first byte of the next request
        if self.conn.their_state is h11.IDLE:  # no request in flight: these bytes start one
            refusal = self._head.feed(data)
            if refusal is not None:
                log.warning(
                    "refused a request whose %s is over %d bytes",
                    "request line" if refusal == URI_TOO_LONG else "header",
                    HEAD_LIMIT,
                )
                self._answer_and_close(_HEAD_TOO_LARGE[refusal])
                return
        super().data_received(data)
        self._after_events()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # also handles a pipelined request already received
        if self._admitted and not self.transport.is_closing():
            self._after_events()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        self.connections_registry.forget(self)
        if self._admitted:
            super().connection_lost(exc)

    def drop(self) -> None:
        """Close now, without a response (a connection that sent no whole request in time)."""
        self._stop_timer()
        self.connections_registry.forget(self)
        self.transport.abort()

    def close_for_cap(self, reading: bool) -> None:
        """Make room: a connection still reading its request is answered 503; an idle one is
        closed as keep-alive connections are (a request crossing the close is the client's to
        retry, as with any idle close)."""
        if reading:
            self._answer_and_close(_TOO_MANY_CONNECTIONS)
            return
        self._stop_timer()
        self.connections_registry.forget(self)
        self.transport.close()

    def reset(self) -> None:
        """Close an answered connection at once (too many are waiting for their clients)."""
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        self.transport.abort()

    def _answer_and_close(self, answer: bytes) -> None:
        """Send `answer` and close once the client has read it: the write side at once, the
        connection when the client closes its side (uvicorn's eof_received lets the transport
        close) or after LINGER_SECONDS. Whatever the client sends meanwhile (its request) is
        read and dropped: closing a socket with unread data sends a reset, and a client that
        gets the reset before it reads the answer sees an empty reply."""
        self._stop_timer()
        if self._admitted:
            self._unset_keepalive_if_required()
        self._closing = True
        self.connections_registry.start_closing(self)
        self.transport.write(answer)
        if self.transport.can_write_eof():  # not over TLS: there the client's close ends it
            self.transport.write_eof()
        self.transport.resume_reading()  # reading may be paused by uvicorn's flow control
        self._linger = self.loop.call_later(LINGER_SECONDS, self.reset)

    def _after_events(self) -> None:
        if self.transport.is_closing():
            self._stop_timer()
            return
        state = self.conn.their_state
        if state not in _READING:  # a whole request received: in flight until answered
            self._stop_timer()
            self.connections_registry.mark(self, "busy")
        elif self._header_timer is None:
            # Between requests; bytes already buffered are the start of the next one.
            if self.conn.trailing_data[0]:
                self._start_reading()
            else:
                self.connections_registry.mark(self, "idle")

    def _start_reading(self) -> None:
        self._stop_timer()
        self.connections_registry.mark(self, "reading")
        self._header_timer = self.loop.call_later(
            self.connections_registry.limits.header_read_timeout, self._header_timed_out
        )

    def _stop_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if self.conn.their_state in _READING and not self.transport.is_closing():
            log.warning(
                "closed a connection that sent no whole request within %gs",
                self.connections_registry.limits.header_read_timeout,
            )
            self.drop()


def protocol_class(connections: Connections) -> type[LimitedH11Protocol]:
    """A protocol class bound to `connections` (uvicorn builds protocols from a class)."""
    return type("LimitedH11Protocol", (LimitedH11Protocol,), {"connections_registry": connections})


class RateLimitFilter(logging.Filter):
    """Passes the first record of each kind per `interval` seconds; the next one that passes
    says how many were left out. A kind is the logger, the first line of the message template
    and the exception's type: a fixed set, since arguments (addresses, fds) are not in it."""

    MAX_KINDS = 256  # more kinds than this: the oldest is forgotten

    def __init__(self, interval: float = LOG_INTERVAL_SECONDS) -> None:
        super().__init__()
        self._limit = RateLimit(interval, max_keys=self.MAX_KINDS)

    def filter(self, record: logging.LogRecord) -> bool:
        exc_type = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else ""
        passed = self._limit.allow((record.name, str(record.msg).split("\n", 1)[0], exc_type))
        if passed is None:
            return False
        if passed.left_out:
            record.msg, record.args = record.getMessage() + passed.note, None
        return True


def install_log_limits(interval: float = LOG_INTERVAL_SECONDS) -> Callable[[], None]:
    """Rate-limit `FLOOD_LOGGERS`; returns the undo."""
    installed = []
    for name in FLOOD_LOGGERS:
        logger, limiter = logging.getLogger(name), RateLimitFilter(interval)
        logger.addFilter(limiter)
        installed.append((logger, limiter))

    def undo() -> None:
        for logger, limiter in installed:
            logger.removeFilter(limiter)

    return undo

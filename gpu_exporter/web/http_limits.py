"""Connection limits for uvicorn's h11 protocol, and logging that a flood cannot blow up.

uvicorn has no header-read timer: a client that sends half a request header (slowloris) keeps
its connection, and a file descriptor, for ever; and its `limit_concurrency` answers 503 to
everyone once attackers hold the slots, probes included. Here:

- header-read timeout: a connection must have sent a whole request (header, and body if any:
  no endpoint takes one) within `header_read_timeout` of connecting, or of the first byte of
  its next request; otherwise it is closed (Go's http.Server ReadHeaderTimeout);
- idle timeout: uvicorn's keep-alive timer, `idle_timeout` after a response;
- a cap on open connections; a new one past it first closes the oldest connection that has no
  request in flight (one still sending its header first, then an idle kept-alive one), so a
  kubelet probe or a scrape gets through a slowloris; only when every connection has a request
  in flight is the new one answered a fast 503 and closed;
- the cap stays below the open-file limit (RLIMIT_NOFILE less `FD_RESERVE`), and asyncio
  accepts at most `ACCEPT_BATCH` connections before their protocols run, so a flood meets the
  cap, not EMFILE (at EMFILE asyncio stops accepting for a second: probes would wait);
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

log = logging.getLogger("gpu_exporter.http")

# Descriptors kept for everything but HTTP clients (NVML's device files, the log, the rule and
# web-config files, Alertmanager and kubelet sockets: about 10) and for one accept batch.
FD_RESERVE = 64
# asyncio accepts up to this many connections in one go before their protocols run (it is the
# `backlog` given to create_server); the kernel's listen queue is LISTEN_BACKLOG (uvicorn's).
ACCEPT_BATCH = 16
LISTEN_BACKLOG = 2048
LOG_INTERVAL_SECONDS = 60.0
# The loggers a flood of bad clients writes to: uvicorn's protocol errors ("Invalid HTTP
# request received."), asyncio's accept and TLS handshake errors, and ours.
FLOOD_LOGGERS = ("uvicorn.error", "asyncio", log.name)

_REJECTION = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 20\r\n"
    b"Connection: close\r\n\r\n"
    b"too many connections"
)
# h11's states of the client while its request is still coming in.
_READING = (h11.IDLE, h11.SEND_BODY)


@dataclass(frozen=True)
class Limits:
    header_read_timeout: float
    idle_timeout: float
    max_connections: int


def connection_cap(configured: int, open_file_limit: int | None = None) -> int:
    """`configured`, lowered to leave `FD_RESERVE` descriptors under RLIMIT_NOFILE."""
    if open_file_limit is None:
        open_file_limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if open_file_limit == resource.RLIM_INFINITY:
        return configured
    return max(1, min(configured, open_file_limit - FD_RESERVE))


class Connections:
    """The open HTTP connections, and which of them may be closed to make room."""

    def __init__(self, limits: Limits, accept_peer: Callable[[Any], bool] | None = None) -> None:
        self.limits = limits
        # Called with each new transport (after the TLS handshake); False closes it.
        self.accept_peer = accept_peer
        self.open: set[LimitedH11Protocol] = set()
        # No request in flight, oldest first: still reading a request, or idle between two.
        self.reading: OrderedDict[LimitedH11Protocol, None] = OrderedDict()
        self.idle: OrderedDict[LimitedH11Protocol, None] = OrderedDict()

    def admit(self, connection: LimitedH11Protocol) -> bool:
        if len(self.open) >= self.limits.max_connections:
            victim = self._oldest_waiting()
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
            victim.drop()
        self.open.add(connection)
        return True

    def _oldest_waiting(self) -> LimitedH11Protocol | None:
        for waiting in (self.reading, self.idle):
            if waiting:
                return next(iter(waiting))
        return None

    def mark(self, connection: LimitedH11Protocol, state: str) -> None:
        """`state`: "reading", "idle" or "busy" (a request in flight)."""
        self.reading.pop(connection, None)
        self.idle.pop(connection, None)
        if state == "reading":
            self.reading[connection] = None
        elif state == "idle":
            self.idle[connection] = None

    def forget(self, connection: LimitedH11Protocol) -> None:
        self.open.discard(connection)
        self.mark(connection, "busy")


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header-read timer and a place in `Connections`."""

    connections_registry: ClassVar[Connections]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_timer: asyncio.TimerHandle | None = None
        self._admitted = False
        registry = self.connections_registry
        if registry.accept_peer is not None and not registry.accept_peer(transport):
            transport.abort()
            return
        if not registry.admit(self):
            transport.write(_REJECTION)
            transport.close()
            return
        self._admitted = True
        super().connection_made(transport)
        self._start_reading()

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        if self._header_timer is None and self.conn.their_state is h11.IDLE:
            self._start_reading()  # the first byte of the next request
        super().data_received(data)
        self._after_events()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # also handles a pipelined request already received
        if self._admitted and not self.transport.is_closing():
            self._after_events()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return
        self._stop_timer()
        self.connections_registry.forget(self)
        super().connection_lost(exc)

    def drop(self) -> None:
        """Close now, without a response (an idle or half-sent connection, to make room)."""
        self._stop_timer()
        self.connections_registry.forget(self)
        self.transport.abort()

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

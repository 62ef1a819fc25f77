"""The HTTP server: uvicorn, with our signal handling, idle wake-ups and connection limits.

`run` serves an ASGI app until SIGTERM/SIGINT; `WebSettings` holds the HTTP limits and the
web-config file (TLS, basic auth), with their defaults written once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import uvicorn


@dataclass(frozen=True)
class WebSettings:
    """HTTP limits and security. Defaults: see the README's "Security and limits" section."""

    # exporter-toolkit web-configuration file (tls_server_config, basic_auth_users); None: plain
    # HTTP without authentication.
    web_config_file: str | None = None
    # A connection must have sent a request's whole header within this time (slowloris).
    header_read_timeout_seconds: float = 5.0
    # A kept-alive connection with no request in flight is closed after this time.
    idle_timeout_seconds: float = 60.0
    # Open connections at most; past it, new ones get a fast 503 (and the oldest connection
    # still sending its header is closed first, so probes get through a slowloris).
    max_connections: int = 256
    # /healthz and /readyz without basic auth, for kubelet probes (TLS still applies).
    probes_without_auth: bool = True


def run(app: Any, host: str, port: int, settings: WebSettings, log_level: str) -> None:
    """Serve `app` on HOST:PORT until a signal or `should_exit`."""
    import uvicorn

    server = server_class()(
        uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False)
    )
    server.run()


def server_class() -> type[uvicorn.Server]:
    import asyncio
    import contextlib

    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server with two changes.

        Signals: uvicorn re-raises SIGTERM/SIGINT after its own shutdown, which would skip our
        cleanup (sampler, notifier flush, NVML shutdown) and exit 143 instead of 0.

        Idle wake-ups: uvicorn's main loop wakes every 0.1 s to poll `should_exit` and, every
        tenth time, refresh the Date header (about 2 ms of CPU a second, idle). Here it wakes
        just after each second turns, which is all the Date header needs (uvicorn's may lag
        by up to a second), and at once when `should_exit` is set, by a signal handler or
        anyone else. So SIGTERM stops the server as promptly as before; only a reached
        `limit_max_requests` (unused here) may be noticed up to a second later.
        """

        _wake: Callable[[], None] | None = None

        @property
        def should_exit(self) -> bool:
            return self._should_exit

        @should_exit.setter
        def should_exit(self, value: bool) -> None:
            self._should_exit = value
            wake = self._wake
            if value and wake is not None:
                wake()

        async def main_loop(self) -> None:
            loop, stop = asyncio.get_running_loop(), asyncio.Event()

            def wake() -> None:
                # Thread-safe, and right for a signal handler too: that runs while the loop
                # may be blocked in select(), which only the self-pipe write ends.
                loop.call_soon_threadsafe(stop.set)

            self._wake = wake
            try:
                # Counter 0: uvicorn refreshes the Date header when counter % 10 == 0.
                while not await self.on_tick(0):
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), seconds_to_next_second())
            finally:
                self._wake = None

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                try:
                    yield
                finally:
                    self._captured_signals.clear()

    return Server


def seconds_to_next_second() -> float:
    # 1 ms past the turn, so that time.time() there already is in the next second.
    return 1.001 - time.time() % 1.0


def cannot_listen(host: str, port: int) -> str:
    """Why binding HOST:PORT fails (checked before starting, so the error is ours to word)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        return exc.strerror or str(exc)
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            return exc.strerror or str(exc)
    return ""

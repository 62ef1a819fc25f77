"""The HTTP server: uvicorn, with our signal handling, idle wake-ups and connection limits.

`run` serves an ASGI app until SIGTERM/SIGINT with the `web:` settings' limits
(gpu_exporter/web/settings.py) and the web-config file's TLS and basic auth. The limits are
gpu_exporter/web/http_limits.py's, TLS and basic auth gpu_exporter/web/web_config.py's,
auth.py's and password_check.py's; the web config is reloaded when one of its files changes
(checked at each wake-up, once a second) and on SIGHUP.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import uvicorn

    from gpu_exporter.web.settings import WebConfig
    from gpu_exporter.web.web_config import LiveWebConfig

log = logging.getLogger("gpu_exporter.http")


def run(
    app: Any,
    host: str,
    port: int,
    settings: WebConfig,
    web_config_file: str | None,
    log_level: str,
    also: tuple[str, int, Any] | None = None,
) -> None:
    """Serve `app` on HOST:PORT until a signal or `should_exit`, with TLS and basic auth from
    `web_config_file` (None: plain HTTP without authentication); with `also` (HOST, PORT, APP),
    that app on a second listener of the same server (same limits, TLS and auth).

    Raises `web_config.WebConfigError` (a ValueError naming file, line and field) before
    serving anything when the web-config file cannot be used, and `ListenError` (naming the
    address) when a listener's address cannot be bound.
    """
    import uvicorn

    from gpu_exporter.web import http_limits
    from gpu_exporter.web.auth import WebSecurity
    from gpu_exporter.web.web_config import LiveWebConfig

    live = LiveWebConfig(web_config_file)
    cap = http_limits.connection_cap(settings.max_connections)
    if cap < settings.max_connections:
        log.warning(
            "max_connections %d lowered to %d: the open-file limit is %d, %d of them kept for "
            "everything but HTTP clients",
            settings.max_connections,
            cap,
            cap + http_limits.FD_RESERVE,
            http_limits.FD_RESERVE,
        )
    limits = http_limits.Limits(
        settings.header_read_timeout_seconds,
        settings.idle_timeout_seconds,
        cap,
        http_limits.closing_cap(cap),
    )
    connections = http_limits.Connections(limits, _peer_check(live))
    tls = live.ssl_context
    if also is not None:
        app = ByPort(app, also[1], also[2])
    security = WebSecurity(app, live, settings.probes_without_auth)
    config = uvicorn.Config(
        security,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        http=http_limits.protocol_class(connections),
        # uvicorn's keep-alive timer is the idle timeout; it takes whole seconds.
        timeout_keep_alive=max(1, math.ceil(settings.idle_timeout_seconds)),
        ssl_context_factory=(lambda _config, _default: tls) if tls is not None else None,
        backlog=http_limits.ACCEPT_BATCH,
    )
    undo_log_limits = http_limits.install_log_limits()
    server: Any = server_class()(config)
    server.handshake_timeout = settings.header_read_timeout_seconds
    server.listen_backlog = http_limits.LISTEN_BACKLOG
    server.on_wake = live.check
    sockets = None
    if also is not None:
        # One server on two sockets, bound here (uvicorn's own binding of a second Config
        # would reset its logging): each listener's requests go to its app by local port.
        sockets = _bind_all([(host, port), (also[0], also[1])])
        log.info("serving on %s:%d and, dcgm-exporter compatible, on %s:%d", host, port, *also[:2])
    try:
        with _reload_on_sighup(live, server):
            server.run(sockets=sockets)
    finally:
        security.passwords.close()
        undo_log_limits()
        for listening in sockets or ():
            listening.close()


class ByPort:
    """ASGI: requests that arrived on local port `port` go to `other`, the rest to `app`."""

    def __init__(self, app: Any, port: int, other: Any) -> None:
        self.app, self.port, self.other = app, port, other

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        server = scope.get("server") if scope["type"] in ("http", "websocket") else None
        target = self.other if server is not None and server[1] == self.port else self.app
        await target(scope, receive, send)


def web_config_problem(web_config_file: str | None) -> str:
    """Why the web-config file cannot be used ("" when it can, or when there is none), to
    check before starting."""
    from gpu_exporter.web.web_config import WebConfigError, load_web_config

    if web_config_file is None:
        return ""
    try:
        load_web_config(web_config_file)
    except WebConfigError as exc:
        return str(exc)
    return ""


def serves_tls(web_config_file: str | None) -> bool:
    """Whether the daemon serves HTTPS: its web-config file turns TLS on (checked before by
    web_config_problem; an unreadable file counts as plain HTTP here)."""
    from gpu_exporter.web.web_config import WebConfigError, load_web_config

    if web_config_file is None:
        return False
    try:
        return load_web_config(web_config_file).ssl_context is not None
    except WebConfigError:
        return False


def _peer_check(live: LiveWebConfig) -> Callable[[Any], bool] | None:
    if live.ssl_context is None:
        return None

    def allowed(transport: Any) -> bool:
        config = live.current
        if config.peer_allowed(transport.get_extra_info("peercert")):
            return True
        log.warning("closed a TLS connection: its certificate names none of client_allowed_sans")
        return False

    return allowed


@contextlib.contextmanager
def _reload_on_sighup(live: LiveWebConfig, server: Any) -> Iterator[None]:
    """SIGHUP also reloads the web config; whatever handled it before (the rules) still runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGHUP)

    def handle(signum: int, frame: Any) -> None:
        live.request_reload()
        server.wake_up()
        if callable(before):
            before(signum, frame)

    signal.signal(signal.SIGHUP, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, before)


def server_class() -> type[uvicorn.Server]:
    import asyncio
    import functools

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

        Also: `on_wake` is called at each wake-up (the web config's reload check), and a TLS
        handshake must be done within `handshake_timeout` (asyncio's default is 60 s, which a
        slowloris of half-done handshakes would enjoy).
        """

        _wake: Callable[[], None] | None = None
        on_wake: Callable[[], None] | None = None
        handshake_timeout: float | None = None
        listen_backlog: int | None = None

        def wake_up(self) -> None:
            wake = self._wake
            if wake is not None:
                wake()

        async def startup(self, sockets: Any = None) -> None:
            if self.config.ssl is None or self.handshake_timeout is None:
                await super().startup(sockets)
            else:
                # uvicorn passes no ssl_handshake_timeout to create_server: bind it here.
                loop = asyncio.get_running_loop()
                bound = functools.partial(
                    loop.create_server, ssl_handshake_timeout=self.handshake_timeout
                )
                setattr(loop, "create_server", bound)  # noqa: B010 - an instance attribute
                try:
                    await super().startup(sockets)
                finally:
                    delattr(loop, "create_server")
            if self.listen_backlog is not None:
                # asyncio accepts up to `backlog` connections per loop iteration before any
                # protocol runs (config.backlog is kept small, so the connection cap acts
                # before EMFILE); the kernel's queue gets the larger backlog.
                for server in getattr(self, "servers", ()):
                    for listening in server.sockets:
                        with listening.dup() as same_socket:
                            same_socket.listen(self.listen_backlog)

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
                    stop.clear()
                    if self.on_wake is not None:
                        try:
                            self.on_wake()
                        except Exception:  # a reload bug must not stop serving
                            log.exception("web config check failed; serving on")
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


class ListenError(OSError):
    """An address that cannot be bound; the message says why (and, from `run`, which)."""


def bind_listener(host: str, port: int) -> socket.socket:
    """A TCP socket bound to HOST:PORT's first address, as uvicorn binds one (SO_REUSEADDR,
    inheritable); listening starts when the server starts."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ListenError(exc.strerror or str(exc)) from exc
    family, kind, proto, _, address = infos[0]
    bound = socket.socket(family, kind, proto)
    try:
        bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        bound.bind(address)
    except OSError as exc:
        bound.close()
        raise ListenError(exc.strerror or str(exc)) from exc
    bound.set_inheritable(True)
    return bound


def _bind_all(addresses: list[tuple[str, int]]) -> list[socket.socket]:
    bound: list[socket.socket] = []
    for host, port in addresses:
        try:
            bound.append(bind_listener(host, port))
        except ListenError as exc:
            for other in bound:
                other.close()
            raise ListenError(f"{host}:{port}: {exc}") from exc
    return bound


def cannot_listen(host: str, port: int) -> str:
    """Why binding HOST:PORT fails (checked before starting, so the error is ours to word)."""
    try:
        bind_listener(host, port).close()
    except ListenError as exc:
        return str(exc)
    return ""

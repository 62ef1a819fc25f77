"""A threaded HTTP(S) server on 127.0.0.1 for tests and benchmarks, always stopped on exit.

    with LocalServer(Handler) as server:
        httpx.get(server.url + "/path")

No pytest here: the benchmarks import it too.
"""

from __future__ import annotations

import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # refused TLS handshakes and dropped clients are what some tests provoke


class LocalServer:
    def __init__(
        self,
        handler: type[BaseHTTPRequestHandler],
        port: int = 0,
        tls: ssl.SSLContext | None = None,
        poll_seconds: float = 0.05,
    ) -> None:
        self._server = _QuietServer(("127.0.0.1", port), handler)
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self.port: int = self._server.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(poll_seconds,), daemon=True
        )

    def __enter__(self) -> LocalServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

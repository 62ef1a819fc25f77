"""Basic auth and response headers from the web config, as ASGI middleware.

As prometheus/exporter-toolkit web/handler.go does it: 401 with `WWW-Authenticate: Basic`;
an unknown user is checked against a dummy hash, so it costs what a wrong password costs. The
checks themselves are gpu_exporter/web/password_check.py's: a failing client whose lane is
full is answered 429 with `Retry-After`, not made to wait.
"""

from __future__ import annotations

from typing import Any

from gpu_exporter.web.password_check import PasswordCheck, Verdict
from gpu_exporter.web.web_config import LiveWebConfig

# Paths open without auth when probes_without_auth is set (kubelet sends no credentials).
PROBE_PATHS = frozenset({"/healthz", "/readyz"})
_UNAUTHORIZED_BODY = b"Unauthorized\n"
_BUSY_BODY = b"Too Many Requests: retry later\n"
RETRY_AFTER_SECONDS = 1  # the slow lane's waiting checks take about half a second at cost 10


class WebSecurity:
    """ASGI middleware: basic auth (when the web config has users) and its response headers."""

    def __init__(self, app: Any, live: LiveWebConfig, probes_without_auth: bool) -> None:
        self.app, self.live = app, live
        self.open_paths = PROBE_PATHS if probes_without_auth else frozenset()
        self.passwords = PasswordCheck()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        config = self.live.current
        if config.headers:
            send = _adding_headers(send, config.headers)
        if config.users and scope["path"] not in self.open_paths:
            authorization = _header(scope, b"authorization")
            client = scope.get("client")  # (address, port): the connection
            connection = (str(client[0]), int(client[1])) if client else None
            verdict = await self.passwords.check(config.users, authorization, connection)
            if verdict is Verdict.DENIED:
                await _refuse(send, 401, _UNAUTHORIZED_BODY, (b"www-authenticate", b"Basic"))
                return
            if verdict is Verdict.BUSY:
                retry = (b"retry-after", str(RETRY_AFTER_SECONDS).encode())
                await _refuse(send, 429, _BUSY_BODY, retry)
                return
        await self.app(scope, receive, send)


def _header(scope: Any, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def _adding_headers(send: Any, headers: tuple[tuple[bytes, bytes], ...]) -> Any:
    async def send_with_headers(message: Any) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *headers]}
        await send(message)

    return send_with_headers


async def _refuse(send: Any, status: int, body: bytes, header: tuple[bytes, bytes]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                header,
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})

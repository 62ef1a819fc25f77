"""Basic auth and response headers from the web config, as ASGI middleware.

As prometheus/exporter-toolkit web/handler.go does it: 401 with `WWW-Authenticate: Basic`;
an unknown user is checked against a dummy hash, so it costs what a wrong password costs;
bcrypt runs one at a time (a flood of wrong passwords takes one core, not all), here on a
worker thread so the event loop keeps answering. Unlike the toolkit, only successes are
cached (a bounded LRU of digests of user, hash and password), so wrong passwords cannot grow
or churn the cache and a scrape with the right password costs one bcrypt per process.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from gpu_exporter.web.web_config import LiveWebConfig

# Paths open without auth when probes_without_auth is set (kubelet sends no credentials).
PROBE_PATHS = frozenset({"/healthz", "/readyz"})
_UNAUTHORIZED_BODY = b"Unauthorized\n"


class PasswordCheck:
    """bcrypt with a cache of verified (user, hash, password) digests."""

    CACHE_SIZE = 64  # users x password versions in use at once; a handful in practice

    def __init__(self) -> None:
        self._verified: OrderedDict[bytes, None] = OrderedDict()
        self._bcrypt = threading.Lock()
        self._dummies: dict[bytes, bytes] = {}  # hash prefix ($2y$10$) -> a hash of that cost

    async def allowed(self, users: Mapping[str, bytes], authorization: bytes | None) -> bool:
        credentials = basic_credentials(authorization)
        if credentials is None:
            return False
        user, password = credentials
        hashed = users.get(user)
        key = hashlib.sha256(b"\0".join((user.encode(), hashed or b"", password))).digest()
        if hashed is not None and key in self._verified:
            self._verified.move_to_end(key)
            return True
        if hashed is None:  # the dummy costs what a real user's check costs
            await asyncio.to_thread(self._check_unknown, password, next(iter(users.values())))
            return False
        if not await asyncio.to_thread(self._check, password, hashed):
            return False
        self._verified[key] = None
        while len(self._verified) > self.CACHE_SIZE:
            self._verified.popitem(last=False)
        return True

    def _check(self, password: bytes, hashed: bytes) -> bool:
        import bcrypt  # only with basic auth configured

        with self._bcrypt:
            try:
                return bcrypt.checkpw(password, hashed)
            except ValueError:  # a password over bcrypt's 72 bytes: refused, as Go's bcrypt
                return False

    def _check_unknown(self, password: bytes, like: bytes) -> None:
        """An unknown user's check, against a dummy hash of `like`'s cost (made here, on the
        worker thread: hashing at cost 14 takes a second, which the event loop must not)."""
        import bcrypt

        prefix = like[:7]  # "$2y$10$"
        with self._bcrypt:
            if prefix not in self._dummies:
                rounds = int(prefix[4:6])
                self._dummies[prefix] = bcrypt.hashpw(b"no such user", bcrypt.gensalt(rounds))
        self._check(password, self._dummies[prefix])


def basic_credentials(authorization: bytes | None) -> tuple[str, bytes] | None:
    """(user, password) from `Authorization: Basic ...`, None when absent or malformed."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True)
        user, colon, password = decoded.partition(b":")
        name = user.decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (name, password) if colon else None


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
            if not await self.passwords.allowed(config.users, authorization):
                await _unauthorized(send)
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


async def _unauthorized(send: Any) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"www-authenticate", b"Basic"),
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(_UNAUTHORIZED_BODY)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": _UNAUTHORIZED_BODY})
